#!/usr/bin/env bash
# The controller's max_staleness (docs/rlhf.md "Asynchronous RLHF") on graphs/grpo.graph, small:
#  - max_staleness = 0 set explicitly gives the default's run bit for bit: the same printed
#    figures (rewards, KL, losses, held-out results) and the same saved policy bytes;
#  - max_staleness = 1 (wait) completes, its lines carry the version and staleness of each
#    batch (never above 1), and its held-out reward is a finite number;
#  - max_staleness = 1 with two policy ranks at ZeRO-2 completes (the ranks work in one order);
#  - max_staleness = 1 with staleness_policy = "drop" completes too;
#  - eval_prompts = 0 skips the held-out passes and reports every iteration, at 0 and 1.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "max_staleness_small: $*"; exit 1; }
python3 "$root/tools/make_addition_data.py" --out "$out/addition.jsonl" --digits 1 --count 100 > /dev/null
data=(--set node.prompts.data="$out/addition.jsonl" --set node.prompts.iterations=3 --set node.prompts.eval_prompts=16
      --set node.prompts.per_device_generation_batch_size=4 --set node.reward.format_score=0.25
      --set node.generator.temperature=0.5)
run() {  # run NAME ARGS...: the job's stdout in $out/NAME.log, stderr in $out/NAME.err
  local name=$1; shift
  "$flowrun" "$root/graphs/grpo.graph" --no-progress "${data[@]}" --set node.sft.data="$out/addition.jsonl" \
    --set node.sft.steps=40 --set node.sft.learning_rate=3e-3 --set node.policy.output="$out/$name.bin" \
    --set graph.checkpoint_dir= --set node.sft.output= "$@" \
    > "$out/$name.log" 2> "$out/$name.err" || { tail -20 "$out/$name.err"; fail "the run $name failed"; }
}
# the figures a run prints: step 3's iteration and held-out lines without their speeds and times (the
# lines of nodes starting side by side, such as sft's first held-out loss and the prompt loader's note on
# its held-out split, come in either order: they made this comparison fail one run in twenty under load)
figures() {
  grep -E "^\[step 3 ppo\] (iter [0-9]+ reward|held-out)" "$out/$1.log" | sed -E 's/ gen [0-9]+ tok.*//; s/, [0-9.]+ s$//'
}

run default
run s0 --set node.controller.max_staleness=0
figures default | grep -q "iter 2 reward" || { cat "$out/default.log"; fail "the default run printed no iteration 2"; }
[ "$(figures default)" = "$(figures s0)" ] || { diff <(figures default) <(figures s0); fail "max_staleness = 0 printed other figures"; }
cmp "$out/default.bin" "$out/s0.bin" || fail "max_staleness = 0 saved another policy"

run s1 --set node.controller.max_staleness=1
cat "$out/s1.log"
grep -qE "iter 2 reward .* policy v[0-9]+ staleness [01]( |$)" "$out/s1.log" || fail "max_staleness = 1: no version and staleness on the iteration lines"
grep -E "staleness [2-9]" "$out/s1.log" && fail "max_staleness = 1 trained a batch staler than 1"
after=$(sed -nE 's/.*held-out after: mean reward (-?[0-9]+\.[0-9]+) .*/\1/p' "$out/s1.log")
[ -n "$after" ] || fail "max_staleness = 1: no finite held-out reward after training"

# two policy ranks at ZeRO-2: the rollouts of k + 1 and the experience of k reach the ranks in either order,
# and ranks that took them as they came called different collectives (one run in five failed: "the ranks
# called different collectives"); now each rank works in trainer_order's sequence. Twice, with
# generation_batches = 2 (an empty experience batch for each first batch of two) the second time.
run s1ranks --set node.controller.max_staleness=1 --set node.policy.replicas=2 --set node.policy.actor_zero_stage=2 \
  --set node.policy.per_device_training_batch_size=8
run s1ranks_gb2 --set node.controller.max_staleness=1 --set node.policy.replicas=2 --set node.policy.actor_zero_stage=2 \
  --set node.policy.per_device_training_batch_size=8 --set node.experience.generation_batches=2 --set node.prompts.iterations=4
for r in s1ranks s1ranks_gb2; do
  grep -q "held-out mean reward" "$out/$r.log" || fail "max_staleness = 1, 2 policy ranks ($r): no held-out result"
done

run s1drop --set node.controller.max_staleness=1 --set node.controller.staleness_policy=drop
grep -q "held-out mean reward" "$out/s1drop.log" || fail "max_staleness = 1, drop: no held-out result"
# eval_prompts = 0: no held-out passes (a line says so); the loader's last batch is then a
# training batch, and at max_staleness = 1 its end of stream must not overtake the batches still
# in flight (it did: the run ended after iteration 1 with exit 0)
for s in 0 1; do
  run noeval$s --set node.prompts.eval_prompts=0 --set node.controller.max_staleness=$s
  grep -q "no held-out prompts (eval_prompts = 0" "$out/noeval$s.log" || fail "eval_prompts = 0: no line saying so"
  grep -q "step 3 ppo\] held-out" "$out/noeval$s.log" && fail "eval_prompts = 0 ran a held-out pass"
  [ "$(grep -cE "iter [0-9]+ reward" "$out/noeval$s.log")" = 3 ] ||
    { cat "$out/noeval$s.log"; fail "eval_prompts = 0, max_staleness = $s: not every iteration was reported"; }
done
echo "max_staleness_small: ok (held-out after at max_staleness = 1: $after)"
