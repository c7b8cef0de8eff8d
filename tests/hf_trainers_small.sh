#!/usr/bin/env bash
# DeepSpeed-Chat's steps on Hugging Face models (issue 16, "every model a user brings"):
# graphs/sft.graph, rm.graph and ppo.graph with small settings on tiny random HF folders
# of OPT, GPT-2 and LLaMA (made by make_tiny_hf). For each family every step trains,
# writes an HF folder (config.json of the family, model.safetensors, the tokenizer files;
# the reward model with v_head.weight), and the folder, reloaded through load_model,
# gives the outputs of the model in memory at save time within 1e-5 (verify_output).
# Then saves that cannot succeed are refused before anything trains, naming the node,
# the setting and the fix.
set -euo pipefail
flowrun=$1 make_tiny_hf=$2 root=$3 out=$4
rm -rf "$out" && mkdir -p "$out"
"$make_tiny_hf" "$out/models"
data=data/hh-rlhf/harmless-base-test.dschat.jsonl

fail() { echo "hf_trainers_small: $*"; exit 1; }

run() {  # NAME GRAPH ARGS...: run a graph, keep its output in $out/NAME.log / .err
  local name=$1 graph=$2
  shift 2
  "$flowrun" "$root/graphs/$graph" --no-progress "$@" > "$out/$name.log" 2> "$out/$name.err" ||
    { echo "flowrun $graph ($name) failed:"; tail -20 "$out/$name.err"; exit 1; }
  cat "$out/$name.log"
}

# The verify_output line of STEP in LOG: the difference must be at most 1e-5.
check_reload() {
  local log=$1 step=$2
  local line
  line=$(grep -F "[$step] saved" "$log") || fail "$log: no '[$step] saved ... reloaded' line"
  echo "$line" | grep -q "as a Hugging Face folder" || fail "$log: not saved as a Hugging Face folder: $line"
  awk -v l="$line" 'BEGIN { n = split(l, w, " "); d = w[n] + 0; exit !(d <= 1e-5) }' ||
    fail "$log: the reloaded model differs by more than 1e-5: $line"
}

# An HF folder of FAMILY with its tokenizer (TOKFILE) and config.json of the family.
check_folder() {
  local dir=$1 family=$2 tokfile=$3
  for f in config.json model.safetensors "$tokfile"; do
    [ -f "$dir/$f" ] || fail "$dir: $f is missing"
  done
  [ ! -e "$dir/flowrun_config.json" ] || fail "$dir: written as a flowrun folder, not HF"
  # a bare SentencePiece model needs tokenizer_config.json for transformers' AutoTokenizer
  [ "$tokfile" != tokenizer.model ] || grep -q '"tokenizer_class": "LlamaTokenizer"' "$dir/tokenizer_config.json" ||
    fail "$dir: no tokenizer_config.json naming LlamaTokenizer"
  grep -q "\"model_type\": \"$family\"" "$dir/config.json" || fail "$dir/config.json: model_type is not $family"
}

# The tensor names and shapes of safetensors file $1 equal those of $2 (plus v_head.weight when $3 = vhead):
# what transformers' save_pretrained wrote for OPT (the input), and for GPT-2 and LLaMA what save_hf writes
# (test_hf checks those names against transformers' own).
same_tensors() {
  python3 - "$1" "$2" "${3:-}" <<'PY' || fail "$1: tensors differ from $2"
import json, struct, sys
def header(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: v["shape"] for k, v in h.items()}
got, want = header(sys.argv[1]), header(sys.argv[2])
if sys.argv[3] == "vhead":
    want["v_head.weight"] = [1, got.get("v_head.weight", [0, 0])[1]]  # (1, C): C checked by load_model
if got != want:
    print({k: (got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)})
    sys.exit(1)
PY
}

for family in opt gpt2 llama; do
  m=$out/models/$family o=$out/$family
  case $family in
    llama) tokfile=tokenizer.model ;;
    *) tokfile=vocab.json ;;
  esac
  run "$family-sft" sft.graph --set node.sft.model="$m" --set node.sft.tokenizer="$m" --set node.sft.data=$data \
    --set node.sft.steps=4 --set node.sft.per_device_train_batch_size=4 --set node.sft.max_seq_len=64 \
    --set node.sft.print_every=2 --set node.sft.output="$o/sft" --set node.sft.verify_output=true
  grep -q "step 1 sft\] held-out loss" "$out/$family-sft.log" || fail "$family: step 1 did not finish"
  check_reload "$out/$family-sft.log" "step 1 sft"
  check_folder "$o/sft" "$family" "$tokfile"
  same_tensors "$o/sft/model.safetensors" "$m/model.safetensors"

  run "$family-rm" rm.graph --set node.rm.model="$m" --set node.rm.tokenizer="$m" --set node.rm.data=$data \
    --set node.rm.steps=4 --set node.rm.per_device_train_batch_size=4 --set node.rm.max_seq_len=64 \
    --set node.rm.print_every=2 --set node.rm.output="$o/rm" --set node.rm.verify_output=true
  grep -q "step 2 rm\] held-out accuracy" "$out/$family-rm.log" || fail "$family: step 2 did not finish"
  check_reload "$out/$family-rm.log" "step 2 rm"
  check_folder "$o/rm" "$family" "$tokfile"
  same_tensors "$o/rm/model.safetensors" "$m/model.safetensors" vhead

  run "$family-ppo" ppo.graph --set node.actor_model.model="$o/sft" --set node.reward_model.model="$o/rm" \
    --set node.prompts.tokenizer="$o/sft" --set node.generator.tokenizer="$o/sft" --set node.prompts.data=$data \
    --set node.prompts.iterations=2 --set node.prompts.eval_prompts=4 \
    --set node.prompts.per_device_generation_batch_size=4 --set node.prompts.max_prompt_seq_len=32 \
    --set node.generator.max_answer_seq_len=16 --set node.policy.per_device_training_batch_size=4 \
    --set node.critic.per_device_training_batch_size=4 \
    --set node.policy.output="$o/ppo" --set node.policy.verify_output=true
  grep -q "step 3 ppo\] iter 1 reward" "$out/$family-ppo.log" || fail "$family: step 3 did not train"
  check_reload "$out/$family-ppo.log" "step 3 ppo"
  check_folder "$o/ppo" "$family" "$tokfile"
  same_tensors "$o/ppo/model.safetensors" "$m/model.safetensors"
done

# flowrun's own `convert --to hf` output trains too (the new-user trial's std::bad_alloc), and stays HF.
"$flowrun" convert --from llama2c model/stories260K/stories260K.bin --to hf "$out/stories-hf" \
  --tokenizer model/stories260K/tok512.model > /dev/null 2>&1 || fail "flowrun convert --to hf failed"
run stories-hf-sft sft.graph --set node.sft.model="$out/stories-hf" --set node.sft.tokenizer="$out/stories-hf" \
  --set node.sft.steps=2 --set node.sft.output="$out/stories-hf-sft" --set node.sft.verify_output=true
check_reload "$out/stories-hf-sft.log" "step 1 sft"
check_folder "$out/stories-hf-sft" llama tokenizer.model

# Refused before training, at graph validation: exit status 1 and the message on stderr.
refused() {  # NAME WANT GRAPH ARGS...
  local name=$1 want=$2 graph=$3
  shift 3
  if "$flowrun" "$root/graphs/$graph" --no-progress "$@" > "$out/$name.log" 2> "$out/$name.err"; then
    fail "$name: the run was not refused"
  fi
  grep -qF "$want" "$out/$name.err" || { cat "$out/$name.err"; fail "$name: the error does not say '$want'"; }
  if grep -q "step 1 sft\] step\|step 2 rm\] step\|step 3 ppo\] iter" "$out/$name.log"; then
    fail "$name: it trained before refusing"
  fi
  echo "refused as expected ($name): $(grep -F "$want" "$out/$name.err" | head -1)"
}
m=$out/models/gpt2
refused sft-hf-to-bin "node 'sft': output \"$out/x.bin\" cannot be written: the model is saved as a Hugging Face folder" \
  sft.graph --set node.sft.model="$m" --set node.sft.tokenizer="$m" --set node.sft.output="$out/x.bin"
touch "$out/a_file"
refused sft-unwritable "(above the output '$out/a_file/sft') is not a folder" \
  sft.graph --set node.sft.model="$m" --set node.sft.tokenizer="$m" --set node.sft.output="$out/a_file/sft"
refused rm-llama2c-bin "saved as a flowrun model folder (it was given as a llama2.c file, which cannot hold its value head)" \
  rm.graph --set node.rm.output="$out/rm.bin"
refused sft-on-rm "node 'sft': $out/llama/rm has a value head (a reward model), and step 1 sft trains a language model" \
  sft.graph --set node.sft.model="$out/llama/rm" --set node.sft.tokenizer="$out/llama/rm" --set node.sft.output="$out/x_sft"
grep -q "held-out" "$out/sft-on-rm.log" && fail "sft-on-rm: a held-out pass ran before the refusal"
refused ppo-hf-to-bin "node 'policy': output \"$out/ppo.bin\" cannot be written" \
  ppo.graph --set node.actor_model.model="$out/llama/sft" --set node.reward_model.model="$out/llama/rm" \
  --set node.policy.output="$out/ppo.bin"
refused ppo-critic-to-bin "node 'critic': output \"$out/critic.bin\" cannot be written" \
  ppo.graph --set node.actor_model.model="$out/llama/sft" --set node.reward_model.model="$out/llama/rm" \
  --set node.policy.output="$out/x_ppo" --set node.critic.output="$out/critic.bin"
# step 3's tokenizers against the policy's model: one with more ids than its embedding failed mid-run in the
# embedding; a foreign one with fewer trained on another vocabulary and stopped at its EOS, without a word
refused ppo-tok-too-big "node 'generator' reads token ids with the tokenizer" \
  ppo.graph --set node.actor_model.model="$out/gpt2/sft" --set node.reward_model.model="$out/gpt2/rm" \
  --set node.policy.output="$out/x_ppo"
grep -qF "(512 tokens), and the model $out/gpt2/sft has 400 embedding rows: it is not the model's tokenizer (the model of node 'policy', from node 'actor_model')" \
  "$out/ppo-tok-too-big.err" || { cat "$out/ppo-tok-too-big.err"; fail "ppo-tok-too-big: no embedding rows named"; }
# the reward model and the critic read the same ids: a GPT-2 reward model under a LLaMA policy failed mid-run
refused ppo-tok-reward "has 400 embedding rows: it is not the model's tokenizer (the model of node 'reward', from node 'reward_model')" \
  ppo.graph --set node.actor_model.model="$out/llama/sft" --set node.reward_model.model="$out/gpt2/rm" \
  --set node.prompts.tokenizer="$out/llama/sft" --set node.generator.tokenizer="$out/llama/sft" --set node.policy.output="$out/x_ppo"
refused ppo-tok-foreign "and the model $out/llama/sft has a tokenizer of its own in its folder: they differ" \
  ppo.graph --set node.actor_model.model="$out/llama/sft" --set node.reward_model.model="$out/llama/rm" \
  --set node.prompts.tokenizer="$m" --set node.generator.tokenizer="$m" --set node.policy.output="$out/x_ppo"
# ... and a trainer's: the shipped sft.graph's tok512 (512 ids) on a GPT-2 folder (400) failed in start in
# embedding_forward; on another family's folder it trained on the wrong vocabulary without a word
refused sft-tok-too-big "node 'sft' reads its data with the tokenizer" \
  sft.graph --set node.sft.model="$m" --set node.sft.output="$out/x_sft"
grep -qF "has 400 embedding rows: it is not the model's tokenizer" "$out/sft-tok-too-big.err" ||
  { cat "$out/sft-tok-too-big.err"; fail "sft-tok-too-big: no embedding rows named"; }
# the rows a llama2.c file's header gives (stories260K: 512) against a tokenizer with 902 ids
refused sft-tok-llama2c "stories260K.bin has 512 embedding rows: it is not the model's tokenizer" \
  sft.graph --set node.sft.tokenizer="$root/tests/fixtures/hf_chat/qwen2" --set node.sft.output="$out/x_sft.bin"
refused rm-tok-foreign "and the model $out/models/llama has a tokenizer of its own in its folder: they differ" \
  rm.graph --set node.rm.model="$out/models/llama" --set node.rm.tokenizer="$m" --set node.rm.output="$out/x_rm"

# generate and chat read an HF folder's own tokenizer unless --tokenizer says otherwise (stories260K's
# tok512.model, the llama2.c default, has 512 ids and this GPT-2 400: its ids fail in the embedding),
# and a tokenizer with more ids than the model's embedding is refused, naming both and the fix
"$flowrun" generate --model "$m" --prompt "Once upon a time" --max_new_tokens 4 > "$out/gen.log" 2> "$out/gen.err" ||
  { cat "$out/gen.err"; fail "generate on an HF folder failed"; }
grep -qF "tokenizer: $m (the model's own" "$out/gen.err" || { cat "$out/gen.err"; fail "generate did not take the folder's tokenizer"; }
grep -q "^Once upon a time" "$out/gen.log" || { cat "$out/gen.log"; fail "generate printed no text after the prompt"; }
printf 'Hello\nquit\n' | "$flowrun" chat --model "$m" --max_new_tokens 4 > "$out/chat.log" 2> "$out/chat.err" ||
  { cat "$out/chat.err"; fail "chat on an HF folder failed"; }
grep -qF "tokenizer: $m (the model's own" "$out/chat.err" || { cat "$out/chat.err"; fail "chat did not take the folder's tokenizer"; }
if "$flowrun" generate --model "$m" --tokenizer model/stories260K/tok512.model --prompt "Once" > "$out/gen2.log" \
  2> "$out/gen2.err"; then fail "generate with a tokenizer larger than the model was not refused"; fi
grep -qF "the tokenizer model/stories260K/tok512.model has 512 tokens, and the model $m has 400 embedding rows: it is not the model's tokenizer; give the model's own with --tokenizer" \
  "$out/gen2.err" || { cat "$out/gen2.err"; fail "the refusal does not name the tokenizer, the model and the fix"; }
# eval prompts answers both models from one tokenization: two models of other tokenizers are refused (the
# first folder's tokenizer read stories260K's prompts, exit 0)
if "$flowrun" eval prompts --baseline "$m" --finetuned model/stories260K/stories260K.bin --n 1 --max_new_tokens 4 \
  > "$out/ev2.log" 2> "$out/ev2.err"; then fail "eval prompts took two models of other tokenizers"; fi
grep -qF "the baseline $m reads text with the tokenizer $m and the fine-tuned model/stories260K/stories260K.bin with" \
  "$out/ev2.err" || { cat "$out/ev2.err"; fail "the refusal does not name both models' tokenizers"; }
echo "hf_trainers_small: ok"
