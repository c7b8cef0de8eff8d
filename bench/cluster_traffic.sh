#!/usr/bin/env bash
# Measures what crosses processes per PPO iteration when graphs/rlhf.graph (small settings) runs over 1-4
# processes on 127.0.0.1 (docs/scaling.md): data and control messages (CAF) and communicator bytes (the bulk
# plane, gloo). Each placement runs twice, with 2 and 6 PPO iterations; the difference / 4 is the cost of one
# iteration, without the start-up (model hand-over from steps 1 and 2, wiring) and the held-out batches.
# Usage: bench/cluster_traffic.sh [build/bin/flowrun]
set -euo pipefail
flowrun=${1:-build/bin/flowrun}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
echo "bench-secret-$$-$RANDOM" > "$out/secret"
small=(--no-progress --threads 2 --set graph.checkpoint_dir= --set node.sft.steps=3 --set node.rm.steps=3 --set node.prompts.eval_prompts=4)
declare -A placements=(
  [1]=""
  [2]="--set node.generator.on=w1 --set node.reward.on=w1 --set node.critic.on=w1"
  [3]="--set node.sft.on=w1 --set node.rm.on=w1 --set node.prompts.on=w1 --set node.generator.on=w1 --set node.ppo_controller.on=w2 --set node.reward.on=w2 --set node.critic.on=w2"
  [4]="--set node.sft.on=w1 --set node.rm.on=w1 --set node.prompts.on=w1 --set node.generator.on=w2 --set node.ppo_controller.on=w2 --set node.reward.on=w3 --set node.critic.on=w3"
)
# total data msgs, payload bytes, control msgs, heartbeat msgs, bulk payloads, communicator bytes of one run
measure() {  # procs iterations
  local procs=$1 iters=$2 nodes=$(( $1 - 1 ))
  local args=(${placements[$procs]})
  if (( nodes == 0 )); then
    "$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set node.prompts.iterations="$iters" \
      --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm" --set node.policy.output="$out/ppo.bin" \
      > /dev/null 2> "$out/run.err"
    echo "0 0 0 0 0 0"
    return
  fi
  local pids=()
  for i in $(seq 1 $nodes); do
    rm -f "$out/w$i.port"
    "$flowrun" node --listen 127.0.0.1:0 --secret-file "$out/secret" --port-file "$out/w$i.port" --once --threads 2 \
      > /dev/null 2> "$out/w$i.err" &
    pids+=($!)
  done
  { echo "[cluster]"; echo "heartbeat_ms = 500"
    for i in $(seq 1 $nodes); do
      for _ in $(seq 1 200); do [[ -s "$out/w$i.port" ]] && break; sleep 0.05; done
      echo "[cluster.nodes.w$i]"; echo "address = \"127.0.0.1:$(cat "$out/w$i.port")\""
    done; } > "$out/cluster.toml"
  "$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set node.prompts.iterations="$iters" "${args[@]}" \
    --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm" --set node.policy.output="$out/ppo.bin" \
    --cluster "$out/cluster.toml" --secret-file "$out/secret" > /dev/null 2> "$out/run.err"
  wait "${pids[@]}"
  grep -o "total .*" "$out/run.err" | sed -E 's/total ([0-9]+) data messages, ([0-9]+) payload bytes, ([0-9]+) control messages, ([0-9]+) heartbeat messages(, ([0-9]+) bulk payloads \(([0-9]+) tensors, ([0-9]+) communicator bytes\))?.*/\1 \2 \3 \4 \6 \8/' \
    | awk '{ print $1, $2, $3, $4, ($5 == "" ? 0 : $5), ($6 == "" ? 0 : $6) }'
}
printf "| processes | placement (rest on main) | per PPO iteration: data msgs | payload bytes | control msgs | bulk payloads | communicator bytes | whole run (6 iterations): communicator bytes |\n"
printf "|---|---|---|---|---|---|---|---|\n"
for procs in 1 2 3 4; do
  read -r d2 b2 c2 h2 p2 x2 <<< "$(measure "$procs" 2)"
  read -r d6 b6 c6 h6 p6 x6 <<< "$(measure "$procs" 6)"
  desc=$(sed -E 's/--set node\.([a-z_]+)\.on=(w[0-9])/\1→\2/g' <<< "${placements[$procs]}")
  [[ -z "$desc" ]] && desc="all on main"
  printf "| %d | %s | %s | %s | %s | %s | %s | %s |\n" "$procs" "$desc" \
    "$(( (d6 - d2) / 4 ))" "$(( (b6 - b2) / 4 ))" "$(( (c6 - c2) / 4 ))" "$(( (p6 - p2) / 4 ))" "$(( (x6 - x2) / 4 ))" "$x6"
done
