#!/usr/bin/env bash
# A Hugging Face model folder with tokenizer.json and a chat template, end to end (issue 22):
# graphs/sft.graph, rm.graph, dpo.graph and ppo.graph with apply_chat_template = true on the tiny random Llama 3
# and Qwen2 folders of tests/fixtures/hf_chat (made by tests/fixtures/make_hf_chat_fixtures.py, with
# Llama 3.1's and Qwen2.5's real templates). For each folder:
#  - the text each step prints for its first training row (sft, rm: prompt + chosen; prompts: the
#    generation prompt) is, byte for byte, transformers' apply_chat_template of that row (its sha256
#    in tests/fixtures/hf_chat/expected.json, for the first 48 rows of the HH-RLHF test file);
#  - sft trains: every loss finite, the held-out loss falls; rm and PPO train, rewards and KL finite;
#  - every saved HF folder reloads to the outputs of the model in memory (verify_output, <= 1e-5) and
#    carries tokenizer.json and the chat template (PPO reads its prompts' template from the sft output).
#  - flowrun eval reward / eval prompts with --apply_chat_template print their first held-out row as
#    transformers renders it, and eval reward's figures are rm_trainer's held-out ones.
# GSM8K rows through graphs/grpo.graph on the Qwen2 folder: sft's and prompts' rendered rows are
# transformers' (the question as the user's message); a folder whose template is chat_template.jinja.
# Then apply_chat_template is refused, before training and naming the file and the fix, for a
# tokenizer that is a file, a folder without a template, and a template that cannot render; and
# flowrun eval's --apply_chat_template for a tokenizer that is a file.
# Needs python3 (standard library only) to read the log's JSON strings and the fixture.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "hf_chat_small: $*"; exit 1; }
fixtures=$root/tests/fixtures/hf_chat
for a in "${FLOWRUN_ASSETS:-}" ../shared/assets "$root/../shared/assets"; do  # assets_root()'s order
  [ -n "$a" ] && [ -e "$a/README.md" ] && break
done
data=$out/rows.jsonl
rows=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data_rows"])' "$fixtures/expected.json")
head -n "$rows" "$a/data/hh-rlhf/harmless-base-test.dschat.jsonl" > "$data"
gsm8k=$out/gsm8k.jsonl
head -n "$rows" "$a/data/gsm8k/test.jsonl" > "$gsm8k"

run() {  # NAME GRAPH ARGS...: run a graph, keep its output in $out/NAME.log / .err
  local name=$1 graph=$2
  shift 2
  "$flowrun" "$root/graphs/$graph" --no-progress "$@" > "$out/$name.log" 2> "$out/$name.err" ||
    { echo "flowrun $graph ($name) failed:"; tail -20 "$out/$name.err"; exit 1; }
  cut -c1-240 "$out/$name.log"
}

# LOG MODEL KIND(full|prompt) [ROWS(data_rows|gsm8k_rows)]: the log's "chat template ...: data row R of ... renders as "..."" line is
# transformers' rendering of row R (sha256 from the fixture).
check_render() {
  python3 - "$1" "$fixtures/expected.json" "$2" "$3" "${4:-data_rows}" <<'PY' || fail "$1: the rendered row is not transformers'"
import hashlib, json, re, sys
log, exp, model, kind, rows = sys.argv[1:6]
want_rows = json.load(open(exp, encoding="utf-8"))["models"][model][rows]
n = 0
for line in open(log, encoding="utf-8"):
    m = re.search(r" chat template \S+: data row (\d+) of \S+ renders as (\".*\")$", line.rstrip("\n"))
    if not m:
        continue
    row, text = int(m.group(1)), json.loads(m.group(2))
    got, want = hashlib.sha256(text.encode()).hexdigest(), want_rows[row][kind + "_sha256"]
    if got != want:
        print(f"row {row} rendered as {text!r}: sha256 {got}, transformers' {want}")
        sys.exit(1)
    print(f"{log}: row {row} rendered ({len(text)} chars) = transformers' apply_chat_template (sha256 {got[:16]}...)")
    n += 1
if n != 1:
    print(f"{log}: {n} rendered-row lines, expected 1")
    sys.exit(1)
PY
}

# The verify_output line of STEP in LOG: the reloaded folder's outputs within 1e-5.
check_reload() {
  local line
  line=$(grep -F "[$2] saved" "$1") || fail "$1: no '[$2] saved ... reloaded' line"
  echo "$line" | grep -q "as a Hugging Face folder" || fail "$1: not saved as a Hugging Face folder: $line"
  awk -v l="$line" 'BEGIN { n = split(l, w, " "); d = w[n] + 0; exit !(d <= 1e-5) }' ||
    fail "$1: the reloaded model differs by more than 1e-5: $line"
}

# DIR carries the tokenizer and the chat template of SRC.
check_folder() {
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    [ -f "$1/$f" ] || fail "$1: $f is missing"
  done
  cmp -s "$1/tokenizer.json" "$2/tokenizer.json" || fail "$1/tokenizer.json differs from $2's"
  python3 -c 'import json,sys; a,b=(json.load(open(p+"/tokenizer_config.json")) for p in sys.argv[1:]); sys.exit(a.get("chat_template")!=b["chat_template"])' \
    "$1" "$2" || fail "$1/tokenizer_config.json does not carry $2's chat_template"
}

for model in llama3 qwen2; do
  m=$fixtures/$model o=$out/$model
  run "$model-sft" sft.graph --set node.sft.model="$m" --set node.sft.tokenizer="$m" --set node.sft.data="$data" \
    --set node.sft.apply_chat_template=true --set node.sft.data_split=4,2,4 --set node.sft.steps=16 \
    --set node.sft.learning_rate=1e-2 --set node.sft.per_device_train_batch_size=4 --set node.sft.max_seq_len=128 \
    --set node.sft.print_every=1 --set node.sft.output="$o/sft" --set node.sft.verify_output=true
  check_render "$out/$model-sft.log" "$model" full
  # every printed loss finite, 16 of them; the held-out loss falls
  awk '/\[step 1 sft\] step [0-9]+\/16 loss/ { n++; v = $7 + 0; if ($7 !~ /^[0-9.]+$/ || v <= 0) bad = 1 }
       END { exit !(n == 16 && !bad) }' "$out/$model-sft.log" || fail "$model: not 16 finite sft losses"
  line=$(grep -F "[step 1 sft] held-out loss" "$out/$model-sft.log" | grep -F -- "->") || fail "$model: no held-out loss line"
  awk -v l="$line" 'BEGIN { split(l, w, " "); b = w[6] + 0; a = w[8] + 0; exit !(a < b - 0.05) }' ||
    fail "$model: the held-out loss did not fall by 0.05: $line"
  check_reload "$out/$model-sft.log" "step 1 sft"
  check_folder "$o/sft" "$m"

  run "$model-rm" rm.graph --set node.rm.model="$m" --set node.rm.tokenizer="$m" --set node.rm.data="$data" \
    --set node.rm.apply_chat_template=true --set node.rm.data_split=4,2,4 --set node.rm.steps=6 \
    --set node.rm.per_device_train_batch_size=4 --set node.rm.max_seq_len=128 --set node.rm.print_every=1 \
    --set node.rm.output="$o/rm" --set node.rm.verify_output=true
  check_render "$out/$model-rm.log" "$model" full
  grep -q "step 2 rm\] held-out accuracy .* over" "$out/$model-rm.log" || fail "$model: step 2 did not finish"
  check_reload "$out/$model-rm.log" "step 2 rm"
  check_folder "$o/rm" "$m"

  # flowrun eval reward --apply_chat_template on the saved reward model: its first held-out pair renders as
  # transformers' does, and its figures are rm_trainer's own held-out ones after training (the same rows through
  # the same template, the same weights reloaded within 1e-5): pairs equal, accuracy within one pair, means
  # within 0.002 (rm prints 3 decimals)
  "$flowrun" eval reward --model "$o/rm" --tokenizer "$o/rm" --data "$data" --data_split 4,2,4 --max_seq_len 128 \
    --apply_chat_template > "$out/$model-eval-reward.log" 2> "$out/$model-eval-reward.err" ||
    { tail "$out/$model-eval-reward.err"; fail "$model: eval reward --apply_chat_template failed"; }
  check_render "$out/$model-eval-reward.log" "$model" full
  python3 - "$out/$model-rm.log" "$out/$model-eval-reward.log" <<'PY' || fail "$model: eval reward's figures are not rm_trainer's"
import re, sys
rm = re.search(r"held-out accuracy ([0-9.]+) ± [0-9.]+ over (\d+) pairs; mean chosen (-?[0-9.]+), rejected (-?[0-9.]+)",
               open(sys.argv[1], encoding="utf-8").read())
ev = re.search(r"held-out pairs (\d+): accuracy ([0-9.]+) ± [0-9.]+ \(stderr\), mean chosen score (-?[0-9.]+), "
               r"mean rejected score (-?[0-9.]+)", open(sys.argv[2], encoding="utf-8").read())
assert rm and ev, (rm, ev)
acc, pairs, ch, rj = float(rm[1]), int(rm[2]), float(rm[3]), float(rm[4])
print(f"rm_trainer: {pairs} pairs, accuracy {acc}, chosen {ch}, rejected {rj}; eval reward: {ev[0]}")
assert int(ev[1]) == pairs
assert abs(float(ev[2]) - acc) <= 1.0 / pairs + 1e-3
assert abs(float(ev[3]) - ch) <= 2e-3 and abs(float(ev[4]) - rj) <= 2e-3
PY

  # DPO from the sft output (its template travelled with it): the first loss is ln 2 = 0.6931 (policy =
  # reference, every margin 0: -log sigmoid(0))
  run "$model-dpo" dpo.graph --set node.dpo.model="$o/sft" --set node.dpo.tokenizer="$o/sft" --set node.dpo.data="$data" \
    --set node.dpo.apply_chat_template=true --set node.dpo.data_split=4,2,4 --set node.dpo.steps=4 \
    --set node.dpo.per_device_train_batch_size=4 --set node.dpo.max_seq_len=128 --set node.dpo.print_every=1 \
    --set node.dpo.output="$o/dpo" --set node.dpo.verify_output=true
  check_render "$out/$model-dpo.log" "$model" full
  grep -q "^\[step 2 dpo\] step 1/4 loss 0.6931 " "$out/$model-dpo.log" || fail "$model: DPO's first loss is not ln 2"
  check_reload "$out/$model-dpo.log" "step 2 dpo"
  check_folder "$o/dpo" "$m"

  # step 3 reads its prompts' chat template from the sft output folder
  run "$model-ppo" ppo.graph --set node.actor_model.model="$o/sft" --set node.reward_model.model="$o/rm" \
    --set node.prompts.tokenizer="$o/sft" --set node.generator.tokenizer="$o/sft" --set node.prompts.data="$data" \
    --set node.prompts.apply_chat_template=true --set node.prompts.data_split=4,2,4 --set node.prompts.iterations=3 \
    --set node.prompts.eval_prompts=4 --set node.prompts.per_device_generation_batch_size=4 \
    --set node.prompts.max_prompt_seq_len=64 --set node.generator.max_answer_seq_len=16 \
    --set node.policy.per_device_training_batch_size=4 --set node.critic.per_device_training_batch_size=4 \
    --set node.policy.output="$o/ppo" --set node.policy.verify_output=true
  check_render "$out/$model-ppo.log" "$model" prompt
  # flowrun eval prompts --apply_chat_template: its first held-out prompt renders as transformers' does
  "$flowrun" eval prompts --baseline "$m" --finetuned "$o/ppo" --tokenizer "$o/sft" --data "$data" --data_split 4,2,4 \
    --apply_chat_template --n 2 --max_prompt_seq_len 64 --max_new_tokens 4 > "$out/$model-eval-prompts.log" \
    2> "$out/$model-eval-prompts.err" || { tail "$out/$model-eval-prompts.err"; fail "$model: eval prompts failed"; }
  check_render "$out/$model-eval-prompts.log" "$model" prompt
  [ "$(grep -c -- "---------- fine-tuned" "$out/$model-eval-prompts.log")" = 2 ] || fail "$model: eval prompts: not 2 answers"
  awk '/\[step 3 ppo\] iter [0-9]+ reward/ { n++; for (i = 7; i <= 13; i += 2) if ($i !~ /^-?[0-9.]+$/) bad = 1 }
       END { exit !(n == 3 && !bad) }' "$out/$model-ppo.log" || fail "$model: not 3 PPO iterations with finite numbers"
  check_reload "$out/$model-ppo.log" "step 3 ppo"
  check_folder "$o/ppo" "$m"
done

# GSM8K through graphs/grpo.graph (its sft and prompts read {question, answer} rows): the question is the
# user's message; sft trains on it and the answer, GRPO on the generation prompt.
m=$fixtures/qwen2
run gsm8k-grpo grpo.graph --set graph.checkpoint_dir= --set node.sft.output= --set node.policy.output= \
  --set node.sft.model="$m" --set node.sft.tokenizer="$m" --set node.sft.data="$gsm8k" \
  --set node.sft.apply_chat_template=true --set node.sft.data_split=4,2,4 --set node.sft.steps=4 \
  --set node.sft.per_device_train_batch_size=4 --set node.sft.max_seq_len=128 --set node.sft.print_every=1 \
  --set node.prompts.tokenizer="$m" --set node.prompts.data="$gsm8k" --set node.prompts.apply_chat_template=true \
  --set node.prompts.data_split=4,2,4 --set node.prompts.max_prompt_seq_len=64 \
  --set node.prompts.per_device_generation_batch_size=4 --set node.prompts.iterations=2 --set node.prompts.eval_prompts=4 \
  --set node.generator.tokenizer="$m" --set node.generator.max_answer_seq_len=8 --set node.generator.num_generations=4 \
  --set node.reward.tokenizer="$m" --set node.policy.per_device_training_batch_size=16
grep "\[step 1 sft\] chat template" "$out/gsm8k-grpo.log" > "$out/gsm8k-sft.log" || fail "grpo: sft printed no rendered row"
grep "\[step 3 prompts\] chat template" "$out/gsm8k-grpo.log" > "$out/gsm8k-prompts.log" ||
  fail "grpo: prompts printed no rendered row"
check_render "$out/gsm8k-sft.log" qwen2 full gsm8k_rows
check_render "$out/gsm8k-prompts.log" qwen2 prompt gsm8k_rows
grep -q "iter 1 reward" "$out/gsm8k-grpo.log" || fail "grpo: no second iteration"

# A folder whose template is chat_template.jinja (as newer transformers save it; it wins over the key):
# read from there, and saved on beside the trained model.
j=$out/jinja_folder
mkdir -p "$j"
cp "$fixtures/qwen2/config.json" "$fixtures/qwen2/model.safetensors" "$fixtures/qwen2/tokenizer.json" "$j/"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); open(sys.argv[2]+"/chat_template.jinja","w").write(c.pop("chat_template")); json.dump(c, open(sys.argv[2]+"/tokenizer_config.json","w"))' \
  "$fixtures/qwen2/tokenizer_config.json" "$j"
run jinja-sft sft.graph --set node.sft.model="$j" --set node.sft.tokenizer="$j" --set node.sft.data="$data" \
  --set node.sft.apply_chat_template=true --set node.sft.data_split=4,2,4 --set node.sft.steps=2 \
  --set node.sft.output="$out/jinja_sft"
grep -qF "chat template $j/chat_template.jinja: data row" "$out/jinja-sft.log" || fail "chat_template.jinja was not read"
check_render "$out/jinja-sft.log" qwen2 full
cmp -s "$j/chat_template.jinja" "$out/jinja_sft/chat_template.jinja" || fail "chat_template.jinja was not saved on"
# the same rows as TRL's conversational {"messages": [...]} (the HH turns as user / assistant messages, the chosen
# answer last): the same rendering, transformers' (they were refused as an unknown layout)
python3 - "$data" "$out/rows_messages.jsonl" <<'PY'
import json, re, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1], encoding="utf-8"):
        r = json.loads(line)
        parts = re.split(r"\n\n(Human|Assistant):", r["prompt"])
        msgs = [{"role": "user" if role == "Human" else "assistant", "content": text.strip()}
                for role, text in zip(parts[1::2], parts[2::2])]
        if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1]["content"]:
            msgs.pop()
        msgs.append({"role": "assistant", "content": r["chosen"].strip()})
        out.write(json.dumps({"messages": msgs}) + "\n")
PY
run messages-sft sft.graph --set node.sft.model="$fixtures/qwen2" --set node.sft.tokenizer="$fixtures/qwen2" \
  --set node.sft.data="$out/rows_messages.jsonl" --set node.sft.apply_chat_template=true --set node.sft.data_split=4,2,4 \
  --set node.sft.steps=2 --set node.sft.output="$out/messages_sft"
grep -q "rows loaded (messages (TRL conversational))" "$out/messages-sft.err" || fail "the messages rows were not read as such"
check_render "$out/messages-sft.log" qwen2 full

# Refused before training, naming the file and the fix.
refused() {  # NAME WANT ARGS...
  local name=$1 want=$2
  shift 2
  if "$flowrun" "$root/graphs/sft.graph" --no-progress "$@" > "$out/$name.log" 2> "$out/$name.err"; then
    fail "$name: the run was not refused"
  fi
  grep -qF -- "$want" "$out/$name.err" || { cat "$out/$name.err"; fail "$name: the error does not say '$want'"; }
  if grep -q "step 1 sft\] step" "$out/$name.log"; then fail "$name: it trained before refusing"; fi
  echo "refused as expected ($name): $(grep -F -- "$want" "$out/$name.err" | head -1 | cut -c1-300)"
}
m=$fixtures/qwen2
base=(--set node.sft.model="$m" --set node.sft.data="$data" --set node.sft.apply_chat_template=true
      --set node.sft.data_split=4,2,4 --set node.sft.output="$out/refused")
refused tokenizer-file "tokenizer \"$m/tokenizer.json\" is not a folder: set tokenizer to the model folder" \
  "${base[@]}" --set node.sft.tokenizer="$m/tokenizer.json"
mkdir -p "$out/no_template"
cp "$m/tokenizer.json" "$out/no_template/"
# the model's tokenizer_config.json without its chat_template: the same tokenizer (a foreign one is refused first)
python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j.pop("chat_template"); json.dump(j, open(sys.argv[2], "w"))' \
  "$m/tokenizer_config.json" "$out/no_template/tokenizer_config.json"
refused no-template "node 'sft': apply_chat_template = true: $out/no_template/tokenizer_config.json: no chat_template" \
  "${base[@]}" --set node.sft.tokenizer="$out/no_template"
grep -qF "or set apply_chat_template = false" "$out/no-template.err" || fail "no-template: no fix named"
mkdir -p "$out/bad_template"
cp "$m/tokenizer.json" "$out/bad_template/"
python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["chat_template"] = "{% for m in messages %}{{ m.content | shout }}{% endfor %}"; json.dump(j, open(sys.argv[2], "w"))' \
  "$m/tokenizer_config.json" "$out/bad_template/tokenizer_config.json"
refused bad-template "$out/bad_template/tokenizer_config.json:chat_template:1:" \
  "${base[@]}" --set node.sft.tokenizer="$out/bad_template"
grep -qF "shout" "$out/bad-template.err" || fail "bad-template: the error does not name the filter"
# flowrun eval --apply_chat_template is refused the same way, naming the option and the fix
if "$flowrun" eval reward --model "$out/qwen2/rm" --tokenizer "$m/tokenizer.json" --data "$data" --apply_chat_template \
  > "$out/eval-refused.log" 2> "$out/eval-refused.err"; then
  fail "eval reward --apply_chat_template with a tokenizer file was not refused"
fi
want="flowrun eval: --apply_chat_template renders the rows with the chat template of a Hugging Face model folder, but --tokenizer \"$m/tokenizer.json\" is not a folder"
grep -qF -- "$want" "$out/eval-refused.err" || { cat "$out/eval-refused.err"; fail "eval-refused: the error does not say '$want'"; }
grep -qF "or drop --apply_chat_template" "$out/eval-refused.err" || fail "eval-refused: no fix named"
echo "hf_chat_small: ok"
