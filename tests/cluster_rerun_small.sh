#!/usr/bin/env bash
# The coordinator (the `flowrun` run process) killed with SIGKILL in the middle of a cluster run and started again at
# once, as a user or a supervisor does, against the same two node daemons (docs/reliability.md):
#   1. three times in a row, a run killed during step 1 (working on w1) is re-run at once, and the re-run's handshakes
#      with both nodes succeed. Before runtime/actor/socket_numbers.h they failed ("did not answer the cluster
#      handshake"): CAF 0.17 names a connection by its descriptor number, and a daemon that had not yet forgotten
#      the dead coordinator's connection took the new one, which got the same number, for the dead one;
#   2. a re-run killed right after its handshakes, while the nodes wire their replicas, leaves both nodes serving
#      (the session released the actor table under a replica still reading it: a segfault of the daemon);
#   3. a last run on the same nodes goes to the end, exit 0, with its steps on w1 and w2.
# Usage: cluster_rerun_small.sh FLOWRUN SOURCE_DIR WORK_DIR
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
echo "rerun-secret-$$-$RANDOM" > "$out/secret"
source "$(dirname "$0")/cluster_lib.sh"  # daemons, cluster_file
daemons ""
cluster_file "$out/cluster.toml"
split=(--cluster "$out/cluster.toml" --secret-file "$out/secret" --set node.prompts.on=w1 --set node.ppo_controller.on=w2
       --set node.sft.on=w1 --set node.rm.on=w1 --set node.generator.on=w1 --set node.reward.on=w2 --set node.critic.on=w2)
# long enough that the kill lands in step 1, with steps 1 and 2 training on w1
long=(--no-progress --threads 2 --set node.sft.steps=480 --set node.rm.steps=750 --set node.prompts.iterations=240)
outputs() { echo --set graph.checkpoint_dir="$out/$1-ck" --set node.sft.output="$out/$1-sft.bin" \
  --set node.rm.output="$out/$1-rm" --set node.policy.output="$out/$1-ppo.bin"; }
# wait_for FILE PATTERN COUNT SECONDS PID: until FILE holds COUNT lines matching PATTERN; fails if PID exits first
wait_for() {
  for _ in $(seq 1 $(( $4 * 20 ))); do
    [[ "$(grep -c -- "$2" "$1" 2>/dev/null || true)" -ge "$3" ]] && return 0
    kill -0 "$5" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
alive() { for p in "${pids[@]:0:2}"; do kill -0 "$p" 2>/dev/null || { echo "a node daemon died:"; tail -5 "$out/w1.err" "$out/w2.err"; exit 1; }; done; }

echo "== 1. killed during step 1, re-run at once (3 times)"
for trial in 1 2 3; do
  seen=$(grep -c "step 1 sft\] step 20/" "$out/w1.out" || true)
  "$flowrun" "$root/graphs/rlhf.graph" "${long[@]}" $(outputs "t$trial") "${split[@]}" \
    > "$out/first$trial.log" 2> "$out/first$trial.err" &
  first=$!
  wait_for "$out/w1.out" "step 1 sft\] step 20/" $((seen + 1)) 120 "$first" \
    || { echo "trial $trial: step 1 did not reach step 20 on w1:"; tail -5 "$out/first$trial.err"; exit 1; }
  kill -9 "$first"; wait "$first" 2>/dev/null || true
  "$flowrun" "$root/graphs/rlhf.graph" "${long[@]}" $(outputs "t$trial") "${split[@]}" \
    > "$out/rerun$trial.log" 2> "$out/rerun$trial.err" &
  rerun=$!
  # the default connect_timeout_ms is 10 s; a lost handshake fails the run then
  wait_for "$out/rerun$trial.err" "authenticated; actors there" 2 30 "$rerun" \
    || { echo "trial $trial: the re-run's handshakes failed:"; grep -v "^edge \|^node \|^  " "$out/rerun$trial.err" | tail -5; exit 1; }
  echo "  trial $trial: the re-run authenticated with w1 and w2"
  kill -9 "$rerun"; wait "$rerun" 2>/dev/null || true
  alive
done

echo "== 2. a re-run killed right after its handshakes leaves the nodes serving"
# trial 3's re-run was killed as soon as both handshakes were logged, while the nodes wired its replicas
sleep 2
alive
echo "  both node daemons still run"

echo "== 3. a run to the end on the same nodes"
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --threads 2 --set node.sft.steps=3 --set node.rm.steps=3 \
  --set node.prompts.iterations=4 --set node.prompts.eval_prompts=4 $(outputs last) "${split[@]}" \
  > "$out/last.log" 2> "$out/last.err" || { echo "the last run failed:"; tail -10 "$out/last.err"; exit 1; }
grep -q "^\[step 1 sft\] step 3/3" "$out/w1.out" || { echo "step 1 of the last run did not run on w1"; exit 1; }
grep -q "^\[step 3 ppo\] held-out mean reward" "$out/w2.out" || { echo "step 3 of the last run did not finish on w2"; tail -5 "$out/w2.out"; exit 1; }
[[ -s "$out/last-ppo.bin" ]] || { echo "the last run wrote no policy"; exit 1; }
alive
echo "  the last run finished (exit 0) with steps 1-2 on w1 and the controller on w2"
