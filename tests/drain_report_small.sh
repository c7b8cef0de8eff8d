#!/usr/bin/env bash
# One Ctrl-C drains: every message in flight is handled, so a node inside a long call (here a reward
# command that never answers, until its timeout_s) holds the drain up. The run says so every 10 s, naming
# the node, how long it has been busy and in what phase, and how to stop at once; then the command's
# timeout ends the call (an error of the command: exit 1).
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
python3 "$root/tools/make_addition_data.py" --out "$out/addition.jsonl" > /dev/null
"$flowrun" "$root/graphs/grpo.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.steps=1 \
  --set node.sft.data="$out/addition.jsonl" --set node.prompts.data="$out/addition.jsonl" \
  --set node.sft.output="$out/sft.bin" --set node.policy.output= --set node.prompts.eval_prompts=8 --set node.reward.reward=command --set "node.reward.command=cat > /dev/null" \
  --set node.reward.timeout_s=20 --set node.reward.startup_timeout_s=1 > "$out/log" 2> "$out/err" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
# step 1 done: step 3's held-out pass generates 8 answers and asks the command to score them
for _ in $(seq 1 600); do grep -q "step 1 sft\] held-out loss .* ->" "$out/log" 2>/dev/null && break; sleep 0.05; done
sleep 2
kill -INT $pid
set +e
wait $pid
rc=$?
set -e
trap - EXIT
grep -E "draining" "$out/err" | cut -c1-200
# the call ends when the command's timeout does: an error of the command (on_error = "fail"), exit 1
[ $rc -eq 1 ] || { tail -5 "$out/err"; echo "exit $rc, not 1"; exit 1; }
grep -q "node 'reward' failed in on_message: .*the command gave no answer within 21 s (killed)" "$out/err" ||
  { tail -5 "$out/err"; echo "the drain did not end with the command's timeout"; exit 1; }
grep -qE "still draining after 10 s: node 'reward' busy [0-9]+ s \(scoring\); again to stop now" "$out/err" ||
  { echo "no report of the node the drain waits for"; exit 1; }
echo "drain_report_small: ok"
