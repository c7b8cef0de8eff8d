#!/usr/bin/env bash
# graphs/rlhf.graph with small settings: all three steps run, results print,
# the trained models are written, and the eval tools read them.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set graph.checkpoint_dir="$out/checkpoints" \
  --set node.sft.steps=10 --set node.rm.steps=10 --set node.prompts.iterations=3 --set node.prompts.eval_prompts=8 \
  --set node.sft.eval_fraction=0.3 --set node.rm.eval_fraction=0.3 --set node.prompts.eval_fraction=0.3 \
  --set node.rm.max_seq_len=80 \
  --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm" --set node.policy.output="$out/ppo.bin" \
  --set node.critic.output="$out/critic" --set node.critic.verify_output=true \
  --set node.policy.unsup_data=data/tinystories/tinystories_train_head.txt \
  --set node.policy.tokenizer=model/stories260K/tok512.model --set node.policy.per_device_training_batch_size=4 \
  --set node.generator.print_answers=true --set node.generator.print_answers_interval=2 \
  --set node.ppo_controller.save_checkpoint_steps=3 \
  > "$out/log" 2> "$out/err" || { echo "flowrun failed:"; tail -20 "$out/err"; exit 1; }
cat "$out/log"
# step 3's last checkpoint (iteration 3) as a model (convert --from zero, DeepSpeed's zero_to_fp32.py) is the
# trained actor the policy saved, byte for byte; the critic's (a value head) is refused, naming its output
"$flowrun" convert --from zero "$out/checkpoints/policy" --to llama2c "$out/conv/policy.bin" > "$out/conv.log" 2>&1 ||
  { tail -2 "$out/conv.log"; exit 1; }
cmp "$out/conv/policy.bin" "$out/ppo.bin" || { echo "the policy's last checkpoint is not its saved actor"; exit 1; }
if "$flowrun" convert --from zero "$out/checkpoints/critic" --to hf "$out/conv/critic" > "$out/conv_c.log" 2>&1; then
  echo "the critic's checkpoint was converted as a language model"; exit 1
fi
grep -q "is a value model's checkpoint" "$out/conv_c.log" || { tail -1 "$out/conv_c.log"; exit 1; }
# a finished step's checkpoint folder is gone: the error names its output; --to inside a checkpoint folder refused
# (a step that finishes removes it, whatever it holds)
if "$flowrun" convert --from zero "$out/checkpoints/sft" --to hf "$out/conv/sft" > "$out/conv_s.log" 2>&1; then
  echo "a finished step's removed checkpoints were converted"; exit 1
fi
grep -q "that step finished (.*sft.done.json) and its checkpoints were removed: its model is its output, .*sft.bin" \
  "$out/conv_s.log" || { tail -1 "$out/conv_s.log"; exit 1; }
if "$flowrun" convert --from zero "$out/checkpoints/policy" --to hf "$out/checkpoints/policy/export" > "$out/conv_in.log" 2>&1; then
  echo "a conversion into the checkpoint folder it reads was accepted"; exit 1
fi
grep -q "is in the checkpoint folder .*policy it reads" "$out/conv_in.log" || { tail -1 "$out/conv_in.log"; exit 1; }
# step 3 with a LoRA-only policy (only_optimize_lora): its checkpoint holds the adapter; the base is the step-1
# model, checked by the weights the policy started from (init_weights: the pretrained model as the base merged
# without a word); --to lora needs no base
lr=("$root/graphs/rlhf.graph" --no-progress -q --set graph.checkpoint_dir="$out/lck" --set node.sft.steps=10
    --set node.rm.steps=10 --set node.prompts.iterations=2 --set node.ppo_controller.save_checkpoint_steps=2
    --set node.policy.actor_lora_dim=4 --set node.policy.only_optimize_lora=true --set node.sft.output="$out/lsft.bin"
    --set node.rm.output="$out/lrm" --set node.policy.output="$out/lppo.bin" --set node.critic.output="$out/lcritic")
"$flowrun" "${lr[@]}" > "$out/lrun.log" 2>&1 || { tail -3 "$out/lrun.log"; exit 1; }
if "$flowrun" convert --from zero "$out/lck/policy" --base model/stories260K/stories260K.bin --to llama2c "$out/conv/lwrong.bin" > "$out/conv_lw.log" 2>&1; then
  echo "the pretrained model was taken as the LoRA policy's base"; exit 1
fi
grep -q "is not the model .* run started from (its weights differ from the run's init_weights record)" "$out/conv_lw.log" ||
  { tail -1 "$out/conv_lw.log"; exit 1; }
"$flowrun" convert --from zero "$out/lck/policy" --base "$out/lsft.bin" --to llama2c "$out/conv/lppo.bin" > "$out/conv_l.log" 2>&1 ||
  { tail -2 "$out/conv_l.log"; exit 1; }
cmp "$out/conv/lppo.bin" "$out/lppo.bin" || { echo "the LoRA policy's checkpoint on its base is not its saved actor"; exit 1; }
"$flowrun" convert --from zero "$out/lck/policy" --to lora "$out/conv/lad" > "$out/conv_la.log" 2>&1 || { tail -2 "$out/conv_la.log"; exit 1; }
[[ -f "$out/conv/lad/adapter_model.safetensors" ]] || { echo "no adapter written"; exit 1; }
echo "convert --from zero: a finished step named; into a checkpoint refused; a LoRA policy on the wrong base refused, on its own = its actor"
# DS-Chat's --print_answers: iterations 0 and 2 of 3 (interval 2), each of the 8 rows' prompt and answer as
# text; HH-RLHF prompts end with the turn the answer continues
for it in 0 2; do
  [ "$(grep -c "^--- prompt --> iter=$it, row=[0-7]: \".*Assistant:\"$" "$out/log")" = 8 ] ||
    { echo "print_answers: not 8 prompts of iteration $it ending with Assistant:"; exit 1; }
  [ "$(grep -cE "^--- ans    --> iter=$it, row=[0-7]: \".+\"$" "$out/log")" = 8 ] ||
    { echo "print_answers: not 8 answers of iteration $it"; exit 1; }
done
grep -q "^--- prompt --> iter=1," "$out/log" && { echo "print_answers printed iteration 1 (interval 2)"; exit 1; }
# step 1 says what tokenizing did, as step 2 does (how many were cut, how many lost their whole prompt)
grep -qE "\[sft\[0\]\] \[info\] [0-9]+ of [0-9]+ examples, [0-9]+ truncated" "$out/err" ||
  { grep sft "$out/err" | head -5; echo "step 1 printed no tokenization report"; exit 1; }
for want in "step 1 sft\] held-out loss" "step 2 rm\] held-out accuracy" "step 3 ppo\] iter 2 reward" \
            "unsup_loss" "held-out mean reward"; do
  grep -q "$want" "$out/log" || { echo "missing in the output: $want"; exit 1; }
done
"$flowrun" eval prompts --baseline "$out/sft.bin" --finetuned "$out/ppo.bin" --n 2 --max_new_tokens 8 > "$out/eval"
grep -c "fine-tuned" "$out/eval" | grep -qx 2 || { echo "eval prompts did not print 2 answers"; exit 1; }
# eval reward without split options scores rm_trainer's own held-out pairs (the folder's flowrun_data.json
# records its split: eval_fraction 0.3 (every step's: one held-out share) and max_seq_len 80 here, not the
# command's defaults 0.1 and 96)
"$flowrun" eval reward --model "$out/rm" > "$out/eval_rm" 2> "$out/eval_rm.err"
trained=$(sed -nE 's/^\[step 2 rm\] held-out accuracy ([0-9.]+) .* over ([0-9]+) pairs.*/\2 \1/p' "$out/log")
evaled=$(sed -nE 's/^held-out pairs ([0-9]+): accuracy ([0-9.]+) .*/\1 \2/p' "$out/eval_rm")
[ -n "$trained" ] && [ "$trained" = "$evaled" ] ||
  { cat "$out/eval_rm" "$out/eval_rm.err"; echo "eval reward scored other pairs than rm_trainer's: '$evaled' vs '$trained'"; exit 1; }
echo "eval reward: $evaled (pairs, accuracy), as rm_trainer's held-out pass"
# rm_agrees NAME SAID SETTINGS...: rm.graph for 3 steps at max_seq_len 64 with SETTINGS into $out/NAME, then eval reward of
# the folder must give rm_trainer's held-out pairs and accuracy and log SAID (what it took from flowrun_data.json)
rm_agrees() {
  local name=$1 said=$2
  shift 2
  "$flowrun" "$root/graphs/rm.graph" --no-progress --set node.rm.steps=3 --set node.rm.max_seq_len=64 "$@" \
    --set node.rm.output="$out/$name" > "$out/$name.log" 2> "$out/$name.err" ||
    { tail -3 "$out/$name.err"; echo "the rm.graph run $name failed"; exit 1; }
  "$flowrun" eval reward --model "$out/$name" > "$out/eval_$name" 2> "$out/eval_$name.err"
  local trained evaled
  trained=$(sed -nE 's/^\[step 2 rm\] held-out accuracy ([0-9.]+) .* over ([0-9]+) pairs.*/\2 \1/p' "$out/$name.log")
  evaled=$(sed -nE 's/^held-out pairs ([0-9]+): accuracy ([0-9.]+) .*/\1 \2/p' "$out/eval_$name")
  [ -n "$trained" ] && [ "$trained" = "$evaled" ] && grep -q "$said" "$out/eval_$name.err" ||
    { cat "$out/eval_$name" "$out/eval_$name.err"; echo "eval reward of $name is not rm_trainer's: '$evaled' vs '$trained'"; exit 1; }
  echo "eval reward of $name: $evaled (pairs, accuracy), as rm_trainer's held-out pass"
}
# ... with the truncation it trained with (DS-Chat's "end" here): it read every folder with prompt_start (held-out
# accuracy 0.141 in training, 0.489 from eval reward)
rm_agrees rm_end "truncation end" --set node.rm.truncation=end
# ... and with the chat template it trained with (apply_chat_template: it scored the plain text, 0.174 against
# training's 0.000 on the Qwen2 fixture)
qwen="$root/tests/fixtures/hf_chat/qwen2"
rm_agrees rm_chat "the model trained with apply_chat_template = true" --set node.rm.model="$qwen" \
  --set node.rm.tokenizer="$qwen" --set node.rm.apply_chat_template=true
grep -q "tokenizer: .*tok512.model (the one the model trained with, from $out/rm/flowrun_data.json)" "$out/eval_rm.err" ||
  { cat "$out/eval_rm.err"; echo "eval reward did not take the tokenizer the reward model trained with"; exit 1; }
grep -q "written before the data split took DS-Chat's row order" "$out/eval_rm.err" &&
  { cat "$out/eval_rm.err"; echo "eval reward warned of an old split order on a folder trained now"; exit 1; }
# the trained critic is saved as DS-Chat saves OUTPUT_DIR/critic: a reward-model folder that reloads to the same
# outputs, with other weights than the reward model it started from (step 3 trained it), which eval reward scores
grep -qF "[step 3 ppo] saved $out/critic as a flowrun model folder; reloaded: max |output difference| 0" "$out/log" ||
  { grep -i critic "$out/log" | tail -3; echo "the critic's output was not saved and reloaded"; exit 1; }
cmp -s "$out/critic/model.safetensors" "$out/rm/model.safetensors" && { echo "the critic's output is the reward model's"; exit 1; }
"$flowrun" eval reward --model "$out/critic" --tokenizer model/stories260K/tok512.model --max_seq_len 80 \
  > "$out/eval_critic" 2> "$out/eval_critic.err" || { cat "$out/eval_critic.err"; echo "eval reward did not read the critic"; exit 1; }
grep -qE "^held-out pairs [0-9]+: accuracy [0-9.]+" "$out/eval_critic" || { cat "$out/eval_critic"; echo "eval reward scored nothing"; exit 1; }
# a folder trained before the split took DS-Chat's row order (its record has no data_split_order) held out
# other pairs: eval reward says so
rm -rf "$out/rm_old" && cp -r "$out/rm" "$out/rm_old"
python3 -c 'import json, sys; p = sys.argv[1]; j = json.load(open(p)); del j["data_split_order"]; json.dump(j, open(p, "w"))' \
  "$out/rm_old/flowrun_data.json"
"$flowrun" eval reward --model "$out/rm_old" > "$out/eval_rm_old" 2> "$out/eval_rm_old.err"
grep -q "flowrun_data.json was written before the data split took DS-Chat's row order .*: the pairs held out now are not the ones the model held out" \
  "$out/eval_rm_old.err" || { cat "$out/eval_rm_old.err"; echo "eval reward did not warn of the old split order"; exit 1; }
# what the eval tools refuse before any work, naming the fix (they failed mid-way, printed nothing with
# exit 0, or spoke of internal names)
refused() {  # WANT COMMAND...: exit status 1 or 2 and WANT on stderr
  local want=$1; shift
  if "$flowrun" "$@" > "$out/refused.log" 2> "$out/refused.err"; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" "$out/refused.err" || { echo "flowrun $*: the error does not say '$want':"; cat "$out/refused.err"; exit 1; }
}
refused "--max_prompt_seq_len 512 + --max_new_tokens 8 = 520 tokens do not fit" \
  eval prompts --baseline "$out/sft.bin" --finetuned "$out/ppo.bin" --max_prompt_seq_len 512 --max_new_tokens 8
refused "--data_split \"1,1,0\" gives step 3 no share of the data" \
  eval prompts --baseline "$out/sft.bin" --finetuned "$out/ppo.bin" --data_split 1,1,0
refused "--step: Value 4 not in range 1 to 3" eval reward --model "$out/rm" --step 4
refused "--max_seq_len 100000 exceeds the model's 512 positions" eval reward --model "$out/rm" --max_seq_len 100000
refused "$out/rm/model.safetensors is one file of a model folder: give the folder, $out/rm" \
  eval reward --model "$out/rm/model.safetensors"
# a step-1 row without an answer names the file (it said "row 0 has no answer" alone)
printf '{"prompt":"p"}\n{"prompt":"q"}\n' > "$out/prompts_only.jsonl"
if "$flowrun" "$root/graphs/sft.graph" --no-progress --set node.sft.data="$out/prompts_only.jsonl" --set node.sft.data_split=1,0,0 \
     --set node.sft.eval_fraction=0 --set node.sft.per_device_train_batch_size=1 --set node.sft.output="$out/none.bin" \
     > "$out/noanswer.log" 2>&1; then
  echo "SFT on rows without answers was accepted"; exit 1
fi
grep -qF "node 'sft': data $out/prompts_only.jsonl holds prompt only (RL prompts) rows" "$out/noanswer.log" ||
  { tail -3 "$out/noanswer.log"; echo "the no-answer error does not name the file"; exit 1; }
# and a mix_data file of prompts is named, not the data file beside it (a review: "data.jsonl ... row 21 has no
# answer", a row of the blended share)
if "$flowrun" "$root/graphs/sft.graph" --no-progress --set "node.sft.mix_data=[\"$out/prompts_only.jsonl\"]" \
     --set node.sft.output="$out/none.bin" > "$out/noanswer_mix.log" 2>&1; then
  echo "SFT with a mix_data file without answers was accepted"; exit 1
fi
grep -qF "node 'sft': mix_data file $out/prompts_only.jsonl holds prompt only (RL prompts) rows" "$out/noanswer_mix.log" ||
  { tail -3 "$out/noanswer_mix.log"; echo "the no-answer error does not name the mix_data file"; exit 1; }
# prompt_overflow = "drop" that leaves too few prompts says so (it said the share had 0 rows)
if "$flowrun" "$root/graphs/rlhf.graph" --no-progress --set graph.checkpoint_dir= --set node.sft.steps=2 --set node.rm.steps=2 \
     --set node.prompts.prompt_overflow=drop --set node.prompts.max_prompt_seq_len=12 --set node.sft.output="$out/d1.bin" \
     --set node.rm.output="$out/d2" --set node.policy.output="$out/d3.bin" > "$out/drop.log" 2>&1; then
  echo "a prompt_overflow drop that left no prompt was accepted"; exit 1
fi
grep -q "prompt_overflow = \"drop\" dropped 830 of the share's 830 training prompts (longer than max_prompt_seq_len = 12)" \
  "$out/drop.log" || { grep error "$out/drop.log" | head -2; echo "the drop's refusal does not say why"; exit 1; }
echo "rlhf_small: ok"
