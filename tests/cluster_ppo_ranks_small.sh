#!/usr/bin/env bash
# Step 3's ranks across processes (issue 16, "data parallelism in step 3": inproc threads, gloo
# processes): graphs/rlhf.graph at small settings over 3 processes on 127.0.0.1, the policy's
# 2 ranks on main and w1 at ZeRO stage 3 and the critic's 2 ranks on w1 and w2 at stage 2, their
# gradients and gathered blocks meeting over gloo. Every step-3 number equals the
# single-process, 1-rank, stage-0 run's within 1e-4 (the global batch is split, not changed).
# Usage: cluster_ppo_ranks_small.sh FLOWRUN SOURCE_DIR WORK_DIR
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
echo "ppo-ranks-secret-$$-$RANDOM" > "$out/secret"
fail() { echo "cluster_ppo_ranks_small: $*"; exit 1; }
small=(--no-progress --threads 2 --set graph.checkpoint_dir= --set node.sft.steps=3 --set node.rm.steps=3
       --set node.prompts.iterations=3 --set node.prompts.eval_prompts=4 --set node.policy.output=
       --set node.sft.output= --set node.rm.output=)
source "$(dirname "$0")/cluster_lib.sh"  # daemons, cluster_file
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" > "$out/single.log" 2> "$out/single.err" ||
  { echo "single-process run failed:"; tail -20 "$out/single.err"; exit 1; }
daemons "" --once
cluster_file "$out/cluster.toml"
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --cluster "$out/cluster.toml" --secret-file "$out/secret" \
  --set node.policy.replicas=2 --set node.policy.on=main,w1 --set node.policy.comm_backend=gloo \
  --set node.policy.actor_zero_stage=3 \
  --set node.critic.replicas=2 --set node.critic.on=w1,w2 --set node.critic.comm_backend=gloo \
  --set node.critic.critic_zero_stage=2 > "$out/cluster.log" 2> "$out/cluster.err" ||
  { echo "cluster run failed:"; tail -20 "$out/cluster.err"; exit 1; }
wait "${pids[@]}" || { echo "a --once node did not exit cleanly"; cat "$out/w1.err" "$out/w2.err"; exit 1; }
grep -q "policy memory rank 0/2 stage 3" "$out/cluster.log" || fail "the policy did not run on 2 ranks at stage 3"
grep -q "critic memory rank 0/2 stage 2" "$out/w1.out" || fail "the critic's rank 0 did not run on w1 at stage 2"
numbers() {
  grep -E '^\[step 3 ppo\] (held-out|iter)' "$1" |
    sed -E 's/ gen [0-9]+ tok\/s.*//; s/, [0-9.]+ s$//' | grep -oE -- '-?[0-9]+\.[0-9]+' | tr '\n' ' '
}
python3 - "$(numbers "$out/single.log")" "$(numbers "$out/cluster.log")" <<'PY' || fail "the cluster run's numbers differ"
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
assert len(a) == len(b) > 20, (len(a), len(b))
worst = max(abs(float(x) - float(y)) for x, y in zip(a, b))
print(f"policy on main+w1 (stage 3), critic on w1+w2 (stage 2), over gloo: {len(a)} numbers, "
      f"largest difference from 1 process, 1 rank: {worst:.1e}")
sys.exit(0 if worst <= 1e-4 + 1e-9 else 1)
PY
echo "cluster_ppo_ranks_small: ok"
