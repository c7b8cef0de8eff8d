#!/usr/bin/env bash
# The actor's EMA in step 3 (DS-Chat's --enable_ema and its OUTPUT_DIR/actor_ema): graphs/rlhf.graph at
# small settings with the policy's enable_ema and ema_output.
#   1. After one PPO update the saved EMA is DS-Chat's moving_average of it, element for element:
#      ema = beta x the step-1 model + (1 - beta) x the trained actor, beta 0.992
#      (DeepSpeed-Chat step3 main.py: moving_average(actor, actor_ema, beta=0.992), torch.lerp).
#   2. A LoRA-only actor (only_optimize_lora) keeps the EMA of its adapter: the saved EMA (merged) moves
#      from the base, much less than the actor; a run resumed from a checkpoint after iteration 1
#      saves the uninterrupted run's EMA byte for byte (the adapter's EMA is in the checkpoint);
#      verify_output reloads the saved EMA and its logits match the EMA's within 1e-4.
#   3. Two mini-batches in one iteration are two EMA steps, as DS-Chat's moving_average after every
#      train_rlhf: ema = beta^2 init + beta (1 - beta) a1 + (1 - beta) a2, so the first update's weights
#      a1 it implies moved from init (one step per iteration would imply a1 = init).
#   4. ema_output without enable_ema, and ema_output at another output's path (the actor's, step 1's), are
#      refused when the graph is checked.
#   5. flowrun train --output-dir DIR with enable_ema saves DIR/step3-models/actor_ema, as DS-Chat's train.py.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "ppo_ema_small: $*"; exit 1; }
# py ARGS... <<'PY': python3 on the script read from stdin, after a prelude: sys, and three llama2.c files
# ARGS (7 int32 of header, then float32 weights) read as `files`, a list of (header bytes, float array)
py() {
  python3 -c "$(printf '%s\n' 'import sys' 'from array import array' 'files = []' \
    'for p in sys.argv[1:]:' '    raw = open(p, "rb").read()' '    w = array("f")' '    w.frombytes(raw[28:])' \
    '    files.append((raw[:28], w))' \
    'assert len(set(h for h, _ in files)) == 1, "the files hold other shapes"'; cat)" "$@"
}
args() {  # DIR: a small run whose files live in DIR
  echo --no-progress --set node.sft.steps=4 --set node.rm.steps=4 --set node.prompts.eval_prompts=0 \
    --set node.sft.output="$1/sft.bin" --set node.rm.output="$1/rm" --set node.policy.output="$1/ppo.bin" \
    --set node.policy.enable_ema=true --set node.policy.ema_output="$1/ema.bin"
}

# 1. one update: the EMA is beta init + (1 - beta) actor
mkdir -p "$out/one"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/one") --set graph.checkpoint_dir= --set node.prompts.iterations=1 \
  > "$out/one.log" 2> "$out/one.err" || { echo "the run failed:"; tail -20 "$out/one.err"; exit 1; }
grep -q "^\[step 3 ppo\] the actor's EMA (beta 0.992) saved to $out/one/ema.bin" "$out/one.log" ||
  fail "no line says the EMA was saved"
py "$out/one/sft.bin" "$out/one/ppo.bin" "$out/one/ema.bin" <<'PY' || fail "the EMA is not DS-Chat's moving average"
init, actor, ema = (w for _, w in files)
beta = 0.992
bad = moved = 0
for w0, w1, e in zip(init, actor, ema):
    want = beta * w0 + (1 - beta) * w1
    tol = 4e-7 * (abs(w0) + abs(w1)) + 1e-12  # float32 rounding of beta w0 + (1 - beta) w1
    bad += abs(e - want) > tol
    moved += (1 - beta) * abs(w1 - w0) > 10 * tol  # where neither init nor actor would pass for the EMA
print(f"EMA after one update: {len(ema)} weights, {bad} off beta init + (1 - beta) actor; "
      f"{moved} where the update moved it past 10x the tolerance")
sys.exit(0 if bad == 0 and moved > len(ema) // 10 else 1)
PY

# 2. LoRA-only: the adapter's EMA, and a resume that saves the same EMA
lora() {  # DIR: the LoRA run's settings, its checkpoints in DIR/ckpt, one commit per iteration, all kept
  echo --set node.policy.actor_lora_dim=4 --set node.policy.only_optimize_lora=true \
    --set graph.checkpoint_dir="$1/ckpt" --set node.ppo_controller.save_checkpoint_steps=1 \
    --set node.ppo_controller.keep_checkpoints=3 --set node.prompts.iterations=3
}
mkdir -p "$out/lora"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/lora") $(lora "$out/lora") --set node.policy.verify_output=true \
  > "$out/lora.log" 2> "$out/lora.err" || { echo "the LoRA run failed:"; tail -20 "$out/lora.err"; exit 1; }
# verify_output reloads the EMA's file (the adapter merged into it) and compares its logits with the EMA's
d=$(sed -n "s#^\[step 3 ppo\] the actor's EMA (beta 0.992) saved to $out/lora/ema.bin; reloaded: max |output difference| ##p" \
  "$out/lora.log")
[ -n "$d" ] && python3 -c "import sys; sys.exit(0 if float('$d') < 1e-4 else 1)" ||
  fail "verify_output did not reload the EMA, or its reload differs ('$d')"
echo "verify_output: the EMA's file reloaded, max |output difference| $d"
py "$out/lora/sft.bin" "$out/lora/ppo.bin" "$out/lora/ema.bin" <<'PY' || fail "the LoRA EMA is not a decayed move"
base, actor, ema = (w for _, w in files)
d_actor = max(abs(a - b) for a, b in zip(actor, base))
d_ema = max(abs(e - b) for e, b in zip(ema, base))
print(f"LoRA EMA after 3 updates: largest move from the base {d_ema:.3g}, the actor's {d_actor:.3g}")
# after 3 updates the adapter's EMA holds about 3 x (1 - 0.992) of the trained B: its product moves far less
sys.exit(0 if 0 < d_ema < 0.1 * d_actor else 1)
PY
cp -r "$out/lora" "$out/lora2"
python3 - "$out/lora2/ckpt/step3.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["committed"] = [p for p in j["committed"] if p["iteration"] <= 1]
json.dump(j, open(sys.argv[1], "w"))
PY
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/lora2") $(lora "$out/lora2") > "$out/lora2.log" 2> "$out/lora2.err" ||
  { echo "the LoRA resume failed:"; tail -20 "$out/lora2.err"; exit 1; }
grep -q "resuming after iteration 0 " "$out/lora2.log" || fail "the LoRA run did not resume after iteration 0"
cmp "$out/lora/ema.bin" "$out/lora2/ema.bin" || fail "the resumed LoRA run's EMA differs from the uninterrupted run's"
cmp "$out/lora/ppo.bin" "$out/lora2/ppo.bin" || fail "the resumed LoRA run's actor differs from the uninterrupted run's"
echo "LoRA: the resumed run saved the uninterrupted run's EMA and actor byte for byte"

# 3. two mini-batches of 4 rows in one iteration: two EMA steps
mkdir -p "$out/two"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/two") --set graph.checkpoint_dir= --set node.prompts.iterations=1 \
  --set node.policy.per_device_training_batch_size=4 > "$out/two.log" 2> "$out/two.err" ||
  { echo "the two-mini-batch run failed:"; tail -20 "$out/two.err"; exit 1; }
py "$out/two/sft.bin" "$out/two/ppo.bin" "$out/two/ema.bin" <<'PY' || fail "two mini-batches were not two EMA steps"
init, a2, ema = (w for _, w in files)
b = 0.992
moved = 0
for w0, w2, e in zip(init, a2, ema):
    a1 = (e - b * b * w0 - (1 - b) * w2) / (b * (1 - b))  # the first update's weight these imply
    noise = 4e-7 * (abs(w0) + abs(w2) + abs(e)) / (b * (1 - b)) + 1e-12  # float32 rounding, magnified
    moved += abs(a1 - w0) > 5 * noise
print(f"two mini-batches: the implied first update moved {moved} of {len(ema)} weights past 5x the rounding")
sys.exit(0 if moved > len(ema) // 10 else 1)
PY

# 4. refused when the graph is checked
set +e
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set node.policy.ema_output="$out/x.bin" > "$out/r1.log" 2>&1
rc1=$?
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set node.policy.enable_ema=true \
  --set node.policy.output="$out/same.bin" --set node.policy.ema_output="$out/same.bin" > "$out/r2.log" 2>&1
rc2=$?
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set node.policy.enable_ema=true \
  --set node.sft.output="$out/sft.bin" --set node.policy.ema_output="$out/sft.bin" > "$out/r3.log" 2>&1
rc3=$?
set -e
[ $rc1 = 2 ] && grep -q "ema_output = \"$out/x.bin\" but enable_ema = false: no EMA is kept" "$out/r1.log" ||
  { cat "$out/r1.log"; fail "ema_output without enable_ema was not refused"; }
[ $rc2 = 2 ] && grep -q "saves to '$out/same.bin', as '.*' of node 'policy' does" "$out/r2.log" ||
  { cat "$out/r2.log"; fail "ema_output = output was not refused"; }
[ $rc3 = 2 ] && grep -q "saves to '$out/sft.bin', as 'output' of node 'sft' does" "$out/r3.log" ||
  { cat "$out/r3.log"; fail "ema_output = step 1's output was not refused"; }
echo "refused: ema_output without enable_ema, and ema_output at the actor's or step 1's output"

# 5. flowrun train --output-dir: DS-Chat's layout, the EMA in step3-models/actor_ema
"$flowrun" train --step 1 2 3 --output-dir "$out/tr" --set node.sft.steps=2 --set node.rm.steps=2 \
  --set node.prompts.iterations=1 --set node.prompts.eval_prompts=0 --set node.policy.enable_ema=true \
  > "$out/tr.log" 2> "$out/tr.err" || { echo "flowrun train failed:"; tail -20 "$out/tr.err"; exit 1; }
[ -s "$out/tr/step3-models/actor_ema.bin" ] || fail "flowrun train --output-dir saved no step3-models/actor_ema.bin"
cmp -s "$out/tr/step3-models/actor_ema.bin" "$out/tr/step3-models/actor.bin" && fail "the saved EMA is the actor"
echo "flowrun train --output-dir: step3-models/actor_ema.bin saved beside actor.bin"
