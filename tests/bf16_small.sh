#!/usr/bin/env bash
# dtype = bf16 across DS-Chat's steps (DS-Chat's --dtype bf16): every model in bf16, so the models that
# stand for one another give the same numbers before any update.
# - Steps 1 and 2 run in bf16 (the model rounded before the engine, held-out passes in bf16).
# - Step 3: the reference model's dtype is honoured: it rounds its weights as the policy's engine does and
#   runs its products in the same precision (bf16 products where the CPU has AVX512_BF16 or AMX,
#   runtime/kernels/cpu/gemm_bf16.h), so at iteration 0 the policy's log-probs equal the reference's bit for
#   bit and the KL signal is exactly 0, also with the reference sharded at ZeRO-3. With the reference left in
#   fp32 it is not. At actor_zero_stage 3 the generator samples from the same (bf16) weights as at stage 0:
#   iteration 0's reward is the same.
# - DPO: the reference is the starting model rounded as the policy is, scored in its precision: the first
#   update's loss is ln 2 and both rewards 0, as in fp32.
# - A reference left in fp32 against the bf16 policy is named in a warning (DS-Chat's --dtype is one for all).
# - A DeepSpeed JSON's bf16 section wins over a node's other dtype (fp32 too, when written), with a warning
#   naming both.
# - flowrun eval reward scores in the recorded dtype: rm_trainer's held-out figures.
# - The log names each model's precision (the trainers' memory plans, the frozen scorers' model ready line).
# - fp16: an update skipped for overflowed gradients is named on the log with the new loss scale; a DeepSpeed
#   JSON's fp16 section sets the scaling.
# - A dtype that is none of fp32, bf16, fp16 is refused when the graph is checked, naming the setting (on a
#   policy or critic it was refused only after steps 1 and 2 had trained).
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
bf16=(--set node.policy.dtype=bf16 --set node.critic.dtype=bf16 --set node.reward.dtype=bf16)
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set graph.checkpoint_dir= \
  --set node.sft.steps=4 --set node.rm.steps=4 --set node.prompts.iterations=1 --set node.prompts.eval_prompts=0 \
  --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm" --set node.policy.output="$out/ppo.bin" \
  --set node.sft.dtype=bf16 --set node.rm.dtype=bf16 \
  "${bf16[@]}" --set node.reference.dtype=bf16 --metrics "$out/bf16.jsonl" --metrics-interval 1 \
  > "$out/log" 2> "$out/err" || { echo "flowrun failed:"; tail -20 "$out/err"; exit 1; }
grep "step 3 ppo\] iter" "$out/log"
signal_at() {  # METRICS NODE SIGNAL STEP: the signal's value at that step, full precision
  python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("node") == sys.argv[2] and r.get("signal") == sys.argv[3] and r.get("step") == int(sys.argv[4]):
        print(repr(r["value"])); break' "$@"
}
first_kl() { signal_at "$1" ppo_controller kl 0; }
# flowrun eval reward on the bf16-trained reward model: the dtype recorded in its flowrun_data.json, so the
# held-out scores are rm_trainer's own (its products in bf16)
after=$(grep -oE "\[step 2 rm\] held-out accuracy .* over [0-9]+ pairs; mean chosen [-0-9.]+, rejected [-0-9.]+" "$out/log")
want=$(echo "$after" | sed -E 's/.*accuracy ([0-9.]+) .* over ([0-9]+) pairs; mean chosen ([-0-9.]+), rejected ([-0-9.]+)/\1 \2 \3 \4/')
"$flowrun" eval reward --model "$out/rm" > "$out/eval_rm.log" 2> "$out/eval_rm.err" ||
  { echo "flowrun eval reward failed:"; tail -5 "$out/eval_rm.err"; exit 1; }
grep -q "dtype bf16 (.*flowrun_data.json recorded the training's" "$out/eval_rm.err" ||
  { echo "eval reward did not take the recorded dtype:"; cat "$out/eval_rm.err"; exit 1; }
python3 - "$out/eval_rm.log" $want <<'PY' || exit 1
import re, sys
m = re.search(r"held-out pairs (\d+): accuracy ([0-9.]+) .* mean chosen score ([-0-9.]+), mean rejected score ([-0-9.]+)",
              open(sys.argv[1]).read())
got = [float(m[2]), int(m[1]), float(m[3]), float(m[4])]
want = [float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])]
# the trainer prints 3 decimals, eval 4: equal within their rounding
if got[1] != want[1] or any(abs(a - b) > 6e-4 for a, b in zip(got[::2] + got[3:], want[::2] + want[3:])):
    sys.exit(f"eval reward on the bf16 model: {got}, rm_trainer's held-out pass: {want}")
print(f"eval reward in the recorded bf16: {got}, rm_trainer's: {want}")
PY
# a data file with a malformed line: eval reward names the line it skipped, as rm_trainer does (it said nothing)
printf '%s\n' '{"prompt": "Human: hi\n\nAssistant:", "chosen": "", "rejected": " no"}' \
  '{"prompt": "Human: yes?\n\nAssistant:", "chosen": " yes", "rejected": " no"}' > "$out/odd.jsonl"
"$flowrun" eval reward --model "$out/rm" --data "$out/odd.jsonl" --data_split 0,1,0 --eval_fraction 0.9 \
  > "$out/eval_odd.log" 2> "$out/eval_odd.err" || { echo "flowrun eval reward failed:"; tail -5 "$out/eval_odd.err"; exit 1; }
grep -q 'odd.jsonl: 1 rows loaded (prompt/chosen/rejected) of 2 lines; 1 malformed (line 1: empty "chosen")' \
  "$out/eval_odd.err" || { echo "eval reward did not name the malformed line:"; cat "$out/eval_odd.err"; exit 1; }
grep -q "held-out pairs 1:" "$out/eval_odd.log" || { echo "eval reward on the odd file:"; cat "$out/eval_odd.log"; exit 1; }
# pairs whose answers tokenize alike (one chosen equal to its rejected): they score alike and count as wrong, said
# (a --max_seq_len that cut every answer away gave "accuracy 0.000" without a word)
printf '%s\n' '{"prompt": "Human: hi\n\nAssistant:", "chosen": " no", "rejected": " no"}' > "$out/same.jsonl"
"$flowrun" eval reward --model "$out/rm" --data "$out/same.jsonl" --data_split 0,1,0 --eval_fraction 0.9 \
  > "$out/eval_same.log" 2> "$out/eval_same.err" || { echo "flowrun eval reward failed:"; tail -5 "$out/eval_same.err"; exit 1; }
grep -q "1 of the 1 held-out pairs have chosen equal to rejected after tokenization (max_seq_len [0-9]*): they score alike and count as wrong: the accuracy below says nothing of the model" \
  "$out/eval_same.err" || { echo "eval reward did not say the pairs tie:"; cat "$out/eval_same.err"; exit 1; }
# the log names each model's precision: the trainers' memory plans, the frozen scorers' "model ready"
for who in sft rm; do
  grep -q "\[$who\[0\]\] \[info\] memory plan: rank 0/1 stage 0, bf16: params" "$out/err" ||
    { echo "the $who node's log does not name bf16"; grep "memory plan" "$out/err"; exit 1; }
done
for who in reference reward; do
  grep -q "\[$who\[0\]\] \[info\] model ready: .*ZeRO stage 0, bf16)" "$out/err" ||
    { echo "the $who node's log does not name bf16"; grep "model ready" "$out/err"; exit 1; }
done
kl=$(first_kl "$out/bf16.jsonl")
[ "$kl" = "0.0" ] || { echo "all in bf16: the first KL is $kl, not 0 (the reference's forward is not the policy's)"; exit 1; }
"$flowrun" "$root/graphs/ppo.graph" --no-progress --set graph.checkpoint_dir= \
  --set node.actor_model.model="$out/sft.bin" --set node.reward_model.model="$out/rm" \
  --set node.prompts.iterations=1 --set node.prompts.eval_prompts=0 --set node.policy.output="$out/ppo2.bin" \
  "${bf16[@]}" --set node.reference.dtype=fp32 --metrics "$out/mixed.jsonl" --metrics-interval 1 \
  > "$out/log2" 2> "$out/err2" || { echo "flowrun failed:"; tail -20 "$out/err2"; exit 1; }
kl2=$(first_kl "$out/mixed.jsonl")
python3 -c "import sys; sys.exit(0 if abs(float('$kl2')) > 0 else 1)" ||
  { echo "the reference in fp32 against a bf16 policy: the first KL is $kl2, the same as in bf16"; exit 1; }
grep -qF "step 3's models have different dtypes (policy bf16, reference fp32, reward bf16, critic bf16)" "$out/err2" ||
  { echo "no warning named the reference left in fp32:"; grep -i dtype "$out/err2"; exit 1; }
grep -q "different dtypes" "$out/err" && { echo "warned of different dtypes with every model in bf16"; exit 1; }
# the reference sharded (ZeRO-3 over 2 replicas: its engine gathers the layers rounded to bf16)
"$flowrun" "$root/graphs/ppo.graph" --no-progress --set graph.checkpoint_dir= \
  --set node.actor_model.model="$out/sft.bin" --set node.reward_model.model="$out/rm" \
  --set node.prompts.iterations=1 --set node.prompts.eval_prompts=0 --set node.policy.output="$out/ppo3.bin" \
  "${bf16[@]}" --set node.reference.dtype=bf16 --set node.reference.zero_stage=3 --set node.reference.replicas=2 \
  --metrics "$out/zero3.jsonl" --metrics-interval 1 > "$out/log4" 2> "$out/err4" ||
  { echo "flowrun failed:"; tail -20 "$out/err4"; exit 1; }
kl3=$(first_kl "$out/zero3.jsonl")
[ "$kl3" = "0.0" ] || { echo "the reference at ZeRO-3 in bf16: the first KL is $kl3, not 0"; exit 1; }
echo "first KL: all bf16 $kl, reference in fp32 $kl2, reference at ZeRO-3 in bf16 $kl3"
if "$flowrun" "$root/graphs/ppo.graph" --no-progress --set graph.checkpoint_dir= \
  --set node.actor_model.model="$out/sft.bin" --set node.reward_model.model="$out/rm" \
  --set node.reference.dtype=bf17 > "$out/log3" 2> "$out/err3"; then
  echo "dtype = bf17 was accepted"; exit 1
fi
grep -qF "node.reference.dtype=bf17:1:22: error: dtype = \"bf17\" is none of fp32, bf16, fp16" "$out/err3" ||
  { cat "$out/err3"; echo "the refusal does not name the node and the choices"; exit 1; }
# the policy at ZeRO-3 (one rank): the generator gathers the bf16 working weights, as below stage 3
reward_of() { sed -nE 's/^\[step 3 ppo\] iter 0 reward ([-0-9.]+) .*/\1/p' "$1"; }
"$flowrun" "$root/graphs/ppo.graph" --no-progress --set graph.checkpoint_dir= \
  --set node.actor_model.model="$out/sft.bin" --set node.reward_model.model="$out/rm" \
  --set node.prompts.iterations=1 --set node.prompts.eval_prompts=0 --set node.policy.output="$out/ppo5.bin" \
  "${bf16[@]}" --set node.reference.dtype=bf16 --set node.policy.actor_zero_stage=3 > "$out/log5" 2> "$out/err5" ||
  { echo "flowrun failed:"; tail -20 "$out/err5"; exit 1; }
r0=$(reward_of "$out/log"); r3=$(reward_of "$out/log5")
[ -n "$r0" ] && [ "$r0" = "$r3" ] ||
  { echo "iteration 0's reward at actor_zero_stage 3 is '$r3', at stage 0 '$r0': the generator's weights differ"; exit 1; }
echo "iteration 0's reward at actor_zero_stage 0 and 3: $r0 $r3"
# DPO in bf16: the first update's loss is ln 2 and its rewards exactly 0 (the reference is the policy before
# it), in full precision; and where the CPU has bf16 dot products its products are oneDNN's bf16 ones
# (ONEDNN_VERBOSE names each matmul it runs: bf16 weights on a bf16 kernel), elsewhere none are
ONEDNN_VERBOSE=1 "$flowrun" "$root/graphs/dpo.graph" --no-progress --set graph.checkpoint_dir= \
  --set node.dpo.model="$out/sft.bin" --set node.dpo.steps=1 --set node.dpo.print_every=1 --set node.dpo.dtype=bf16 \
  --set node.dpo.output="$out/dpo.bin" --metrics "$out/dpo.jsonl" --metrics-interval 1 \
  > "$out/dpo.log" 2> "$out/dpo.err" || { echo "flowrun failed:"; tail -20 "$out/dpo.err"; exit 1; }
grep "step 2 dpo\] step 1/1" "$out/dpo.log"
loss=$(signal_at "$out/dpo.jsonl" dpo loss 1) chosen=$(signal_at "$out/dpo.jsonl" dpo rewards/chosen 1)
rejected=$(signal_at "$out/dpo.jsonl" dpo rewards/rejected 1)
python3 -c "import math,sys; sys.exit(0 if abs(float('$loss') - math.log(2)) < 1e-6 else 1)" &&
  [ "$chosen" = "0.0" ] && [ "$rejected" = "0.0" ] ||
  { echo "DPO in bf16: the first update's loss is '$loss' (not ln 2) or its rewards '$chosen' '$rejected' (not 0)"; exit 1; }
bf16_products=$(grep -c "exec,cpu,matmul,.*bf16" "$out/dpo.log" || true)
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  [ "$bf16_products" -gt 0 ] || { echo "this CPU has bf16 dot products, and no oneDNN bf16 matmul ran"; exit 1; }
else
  [ "$bf16_products" -eq 0 ] || { echo "oneDNN bf16 matmuls ran on a CPU without bf16 dot products"; exit 1; }
fi
echo "DPO in bf16: first loss $loss, rewards $chosen $rejected; oneDNN bf16 matmuls run: $bf16_products"
# a misspelt dtype on a step-3 node: refused at the start, before step 1 trains
if "$flowrun" "$root/graphs/rlhf.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.steps=3 \
  --set node.rm.steps=3 --set node.sft.output="$out/s6.bin" --set node.rm.output="$out/rm6" \
  --set node.policy.output="$out/p6.bin" --set node.critic.dtype=bf17 > "$out/log6" 2> "$out/err6"; then
  echo "critic dtype = bf17 was accepted"; exit 1
fi
grep -qF "node.critic.dtype=bf17:1:19: error: dtype = \"bf17\" is none of fp32, bf16, fp16" "$out/err6" ||
  { tail -5 "$out/err6"; echo "the refusal does not name the node and the choices"; exit 1; }
grep -q "step 1 sft\]" "$out/log6" && { echo "step 1 started before the critic's dtype was refused"; exit 1; }
# torch's name for it: the refusal says which spelling was meant
if "$flowrun" "$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.dtype=torch.bfloat16 \
  > "$out/log7" 2> "$out/err7"; then echo "dtype = torch.bfloat16 was accepted"; exit 1; fi
grep -qF 'is none of fp32, bf16, fp16 (DS-Chat'"'"'s --dtype); did you mean bf16?' "$out/err7" ||
  { tail -3 "$out/err7"; echo "the refusal of torch.bfloat16 does not name bf16"; exit 1; }
# a DeepSpeed JSON whose bf16 section is on wins over a node's dtype = fp16 or a written fp32, and the node
# says so; a dtype that agrees with it, or none written (the default fp32, which the JSON replaces as it does
# every setting), says nothing
echo '{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "bf16": {"enabled": true}}' > "$out/ds.json"
for dt in fp16 bf16 fp32 default; do
  own=(--set node.sft.dtype=$dt)
  [ $dt = default ] && own=()
  "$flowrun" "$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.steps=1 \
    "${own[@]}" --set node.sft.deepspeed_config="$out/ds.json" --set node.sft.output="$out/ds_$dt.bin" \
    > "$out/ds_$dt.log" 2> "$out/ds_$dt.err" || { echo "flowrun failed:"; tail -20 "$out/ds_$dt.err"; exit 1; }
done
for dt in fp16 fp32; do
  grep -qF "node 'sft': dtype = \"$dt\", but $out/ds.json makes it bf16" "$out/ds_$dt.err" ||
    { tail -5 "$out/ds_$dt.err"; echo "dtype = $dt written under a bf16 JSON: no warning"; exit 1; }
done
cat "$out/ds_bf16.err" "$out/ds_default.err" | grep -q "and the JSON wins" && { echo "a warning where nothing conflicts"; exit 1; }
cmp "$out/ds_fp16.bin" "$out/ds_bf16.bin" || { echo "the JSON did not win: the fp16 run's model differs"; exit 1; }
# fp16 at a learning rate that blows the model up: the updates whose gradients overflow are skipped, and the
# log says so at each (DeepSpeed's "OVERFLOW! Skipping step"), not only the metrics' grad_norm
"$flowrun" "$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.steps=4 \
  --set node.sft.dtype=fp16 --set node.sft.learning_rate=10 --set node.sft.print_every=1 \
  --set node.sft.output="$out/fp16hot.bin" > "$out/fp16.log" 2> "$out/fp16.err" ||
  { echo "flowrun failed:"; tail -20 "$out/fp16.err"; exit 1; }
grep -qF "fp16 gradients overflowed: 1 update skipped, loss scale now 32768" "$out/fp16.log" ||
  { grep "step 1 sft" "$out/fp16.log"; echo "fp16 updates skipped without a line saying so"; exit 1; }
grep "overflowed" "$out/fp16.log" | head -2
# a DeepSpeed JSON's fp16 section sets the scaling: dynamic from 2^30 here, which overflows at once and halves
# (the defaults' 2^16 were used)
echo '{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
       "fp16": {"enabled": true, "initial_scale_power": 30}}' > "$out/ds16.json"
"$flowrun" "$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.steps=3 \
  --set node.sft.deepspeed_config="$out/ds16.json" --set node.sft.learning_rate=10 --set node.sft.print_every=1 \
  --set node.sft.output="$out/fp16json.bin" > "$out/fp16json.log" 2> "$out/fp16json.err" ||
  { echo "flowrun failed:"; tail -20 "$out/fp16json.err"; exit 1; }
grep -qF "fp16 gradients overflowed: 1 update skipped, loss scale now 536870912" "$out/fp16json.log" ||
  { grep "step 1 sft" "$out/fp16json.log"; echo "the JSON's initial_scale_power was not used"; exit 1; }
echo "bf16_small: ok"
