#!/usr/bin/env bash
# Step 3 on the engine's ranks (issue 16, "same numbers at any stage and rank count"):
# graphs/rlhf.graph at small settings, once with the policy and critic on 1 rank at ZeRO
# stage 0, then on 2 ranks (replicas = 2, inproc) at stages 1, 2 and 3 (at stage 3 the frozen
# reference and reward models on 2 ranks at ZeRO-3 too). The global batch is
# split, not changed, so every number of every step-3 line (rewards, KL, losses, answer
# lengths, the held-out rewards) equals the 1-rank run's within 1e-4 (+ the printed
# rounding). At stage 3 the hybrid engine's gather bytes equal the ring's theory, and the
# policy's params + grads + optimizer bytes per rank are at most 0.55x stage 0's.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "ppo_ranks_small: $*"; exit 1; }
common=(--no-progress --set graph.checkpoint_dir= --set node.sft.steps=10 --set node.rm.steps=10 --set node.prompts.iterations=3
        --set node.prompts.eval_prompts=8 --set node.policy.output= --set node.sft.output= --set node.rm.output=
        --set node.policy.unsup_data=data/tinystories/tinystories_train_head.txt
        --set node.policy.tokenizer=model/stories260K/tok512.model
        --set node.policy.per_device_training_batch_size=3 --set node.critic.per_device_training_batch_size=3)
run() {  # NAME ARGS...
  local name=$1
  shift
  "$flowrun" "$root/graphs/rlhf.graph" "${common[@]}" "$@" > "$out/$name.log" 2> "$out/$name.err" ||
    { echo "flowrun ($name) failed:"; tail -20 "$out/$name.err"; exit 1; }
  grep -F "[step 3 ppo]" "$out/$name.log" | grep -v memory > "$out/$name.step3"
}
# the numbers of the step-3 lines, without the speeds and gather figures (they differ by design)
numbers() {
  sed -e 's/ gen [0-9.]* tok\/s.*//' -e 's/, [0-9.]* s$//' "$1" | grep -oE -- '-?[0-9]+\.[0-9]+|-?[0-9]+' | tr '\n' ' '
}
run r1s0
[ "$(wc -l < "$out/r1s0.step3")" -ge 6 ] || fail "the 1-rank run printed too few step-3 lines"
ref=$(numbers "$out/r1s0.step3")
for stage in 1 2 3; do
  # at stage 3 the frozen reference and reward models are sharded too (ZeRO-3 inference)
  frozen=()
  [ "$stage" = 3 ] && frozen=(--set node.reference.replicas=2 --set node.reference.zero_stage=3
                              --set node.reward.replicas=2 --set node.reward.zero_stage=3)
  run "r2s$stage" --set node.policy.replicas=2 --set node.critic.replicas=2 \
    --set node.policy.actor_zero_stage=$stage --set node.critic.critic_zero_stage=$stage "${frozen[@]}"
  got=$(numbers "$out/r2s$stage.step3")
  python3 - "$ref" "$got" "$stage" <<'PY' || fail "2 ranks at stage $3 differ from 1 rank at stage 0"
import sys
ref, got, stage = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3]
assert len(ref) == len(got) and len(ref) > 20, (len(ref), len(got))
worst = max(abs(float(a) - float(b)) for a, b in zip(ref, got))
print(f"2 ranks, stage {stage}: {len(ref)} numbers, largest difference from 1 rank stage 0: {worst:.1e}")
sys.exit(0 if worst <= 1e-4 + 1e-9 else 1)
PY
done
# stage 3: the hybrid engine's gathers, counted, equal the ring's theory
grep -q "hybrid-engine gather" "$out/r2s3.step3" || fail "no hybrid-engine gather figure at stage 3"
grep -o "hybrid-engine gather [0-9.]* MB/rank (theory [0-9.]*)" "$out/r2s3.step3" | head -1
grep -o "hybrid-engine gather [0-9.]* MB/rank (theory [0-9.]*)" "$out/r2s3.step3" |
  awk '{ if ($3 != substr($6, 1, length($6) - 1)) bad = 1 } END { exit bad }' || fail "gather bytes differ from theory"
# memory: params + grads + optimizer per rank at stage 3 over 2 ranks vs stage 0 on 1 rank
state() { grep -F "[step 3 ppo] policy memory" "$1" | sed -E 's/.*params ([0-9.]+) MB.*grads ([0-9.]+) MB, optimizer ([0-9.]+) MB.*/\1 \2 \3/' | awk '{ print $1 + $2 + $3 }'; }
s0=$(state "$out/r1s0.log") s3=$(state "$out/r2s3.log")
[ -n "$s0" ] && [ -n "$s3" ] || fail "no policy memory lines"
awk -v a="$s3" -v b="$s0" 'BEGIN { printf "policy params+grads+optimizer per rank: stage 0 x1 %.3f MB, stage 3 x2 %.3f MB (%.2fx)\n", b, a, a / b; exit !(a <= 0.55 * b) }' ||
  fail "stage 3 on 2 ranks holds more than 0.55x of stage 0's state"
# the frozen models at stage 3 hold half their weights per rank
grep -F "[step 3 ppo] reference memory rank 0/2 stage 3: params 0.520 MB" "$out/r2s3.log" ||
  fail "the reference model is not sharded over 2 ranks at stage 3"
echo "ppo_ranks_small: ok"
