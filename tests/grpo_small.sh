#!/usr/bin/env bash
# graphs/grpo.graph and graphs/rloo.graph with small settings, and the reward_function's edges:
#  - both jobs run end to end (SFT, then the critic-free loop) and print the held-out lines;
#  - a user's Python scorer (graphs/examples/gsm8k_reward.py) gives the built-in gsm8k rule's numbers;
#  - a scorer that crashes, hangs, prints a word or answers two lines per question stops the run with
#    the node, the sample and why;
#    with on_error = "zero" the run goes on and counts them;
#  - REINFORCE++ runs, and GRPO with the policy on 2 ZeRO-3 ranks;
#  - a critic-free run resumes from its step-3 checkpoint with the uninterrupted run's lines, and a
#    resume whose reward, estimator, sampling or schedule changed is refused, naming each;
#  - GRPO without a reference model runs (reference = false), and its inconsistent settings are refused;
#  - num_generations = 1 for GRPO, and GAE without a critic, are refused before anything runs;
#  - prompts + answers past the policy's context are refused at the first batch.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
python3 "$root/tools/make_addition_data.py" --out "$out/addition.jsonl" --digits 1 --count 100 > /dev/null
# no checkpoints and no policy output unless a case sets them (the graphs' own are under the source's out/)
data=(--set node.prompts.data="$out/addition.jsonl" --set node.prompts.iterations=2 --set node.prompts.eval_prompts=16
      --set node.prompts.per_device_generation_batch_size=4 --set node.reward.format_score=0.25
      --set node.generator.temperature=0.5 --set graph.checkpoint_dir= --set node.policy.output=)
fail() { echo "grpo_small: $*"; exit 1; }
# The jobs after the first start from its SFT model (a copy of the graph whose sft node is a
# model_source), so SFT runs once.
from_sft() {  # from_sft GRAPH: $out/GRAPH with [node.sft] reading $out/sft.bin
  python3 - "$root/graphs/$1" "$out/$1" "$out/sft.bin" <<'PY'
import re, sys
src, dst, model = sys.argv[1:]
text = open(src).read()
text = re.sub(r"\[node\.sft\]\n(?:(?!\[).*\n)*", f'[node.sft]\nkind = "model_source"\nmodel = "{model}"\n\n', text)
open(dst, "w").write(text)
PY
}
run() {  # run NAME GRAPH ARGS...: the job's stdout in $out/NAME.log, stderr in $out/NAME.err
  local name=$1 graph=$2; shift 2
  "$flowrun" "$graph" --no-progress "${data[@]}" "$@" > "$out/$name.log" 2> "$out/$name.err"
}
results() { grep -E "iter [0-9]+ reward|held-out (before|after)" "$out/$1.log" | sed 's/ gen [0-9]* tok.*//'; }

run grpo "$root/graphs/grpo.graph" --set node.sft.data="$out/addition.jsonl" --set node.sft.steps=120 \
  --set node.sft.learning_rate=3e-3 \
  --set node.sft.output="$out/sft.bin" || { tail -20 "$out/grpo.err"; fail "grpo.graph failed"; }
cat "$out/grpo.log"
for want in "step 1 sft\] held-out loss" "held-out before: mean reward" "iter 1 reward" "held-out mean reward"; do
  grep -q "$want" "$out/grpo.log" || fail "missing in grpo.graph's output: $want"
done
grep -q "critic_loss" "$out/grpo.log" && fail "a critic-free run printed a critic loss"
# the first rollouts are scored before any update, by a policy that is the reference: the KL is 0, as
# both take log-probs at the sampling temperature (0.5 here; TRL and veRL divide the logits by it)
grep -qE "iter 0 reward [0-9.-]+ kl 0.0000 " "$out/grpo.log" || fail "the policy and the reference disagree before any update"
from_sft grpo.graph
from_sft rloo.graph
g=$out/grpo.graph

# prompts + answers longer than the policy's context (512): refused when the graph is checked, before step 1
# trains, naming both settings and the bound (the scorers failed on T = 513 before; then the generator refused
# them at its first batch, after step 1)
if run toolong "$g" --set node.generator.max_answer_seq_len=600; then fail "answers past the context were accepted"; fi
grep -qE "error: node 'generator': max_prompt_seq_len [0-9]+ \(node 'prompts'\) \+ max_answer_seq_len 600 = [0-9]+ exceed the policy's context, 512 positions \(.*\): the answers alone leave no room for a prompt" "$out/toolong.err" ||
  { tail -5 "$out/toolong.err"; fail "the error does not name the settings and the bound"; }
grep -qE "hint: lower max_answer_seq_len to [0-9]+" "$out/toolong.err" ||
  { tail -5 "$out/toolong.err"; fail "the hint does not name the bound"; }
grep -q "step 1 sft" "$out/toolong.log" && fail "step 1 trained before the plan was refused"
grep -q "iter 0 reward" "$out/toolong.log" && fail "an iteration ran with answers past the context"

# answers of one token (max_answer_seq_len 1, which GRPO allows: a group keeps its one-token answers): the
# held-out passes score every prompt of the split's 4, before and after (they dropped answers of at most one token,
# as DS-Chat's training does, so an empty answer was not a wrong one and the two passes compared other prompts)
run short "$g" --set node.generator.max_answer_seq_len=1 || { tail -20 "$out/short.err"; fail "the one-token run failed"; }
for pass in before after; do
  grep -qE "held-out $pass: mean reward .* answer length 1\.0 \(4 prompts\)" "$out/short.log" ||
    fail "the held-out pass $pass left prompts out: $(grep "held-out $pass" "$out/short.log")"
done

# RLOO with a linear learning-rate schedule over updates of 8 rows: planned over 2 iterations x 32 rows / 8 = 8
# updates, but filter_groups keeps only the groups whose rewards differ (8 rows, one update, each), so the
# schedule stops short: the end of the run says how far, with the last update's rate (transformers' linear
# without warmup: update k at (N - k) / N of actor_learning_rate 3e-4)
run rloo "$out/rloo.graph" --set node.policy.lr_scheduler_type=linear --set node.policy.per_device_training_batch_size=8 ||
  { tail -20 "$out/rloo.err"; fail "rloo.graph failed"; }
grep -q "held-out mean reward" "$out/rloo.log" || fail "rloo.graph printed no held-out result"
grep -qF "[step 3 ppo] policy: learning rate linear over 8 updates (2 iterations x 1 ppo_epochs x 4 mini-batches of 8 rows)" \
  "$out/rloo.log" || fail "the RLOO policy did not plan 8 updates: $(grep 'learning rate' "$out/rloo.log")"
applied=$(grep -oE "iter [0-9]+ reward .* groups [0-9]+/4" "$out/rloo.log" | awk '{ split($NF, g, "/"); n += g[1] } END { print n }')
[ -n "$applied" ] && [ "$applied" -lt 8 ] || fail "filter_groups kept every group: the short schedule is not shown ($applied)"
python3 - "$out/rloo.log" "$applied" <<'PY' || fail "the short schedule's report is wrong: $(grep 'were applied' "$out/rloo.log")"
import re, sys
log, n = open(sys.argv[1]).read(), int(sys.argv[2])
lr = 3e-4 * (8 - (n - 1)) / 8
m = re.search(r"\[step 3 ppo\] policy: (\d+) of the 8 updates the learning-rate schedule was planned over were applied .* "
              r"the last update ran at (\S+), (\d+)% of actor_learning_rate", log)
assert m and int(m[1]) == n and abs(float(m[2]) - lr) <= 0.005 * lr and int(m[3]) == round(100 * lr / 3e-4), (m and m.groups(), n, lr)
print(f"RLOO with filter_groups: {n} of 8 planned updates applied; the last at {lr:.3e}, as the report says")
PY

# nothing to learn (every reward 0, so every advantage 0), the KL loss on: the policy stays the reference,
# bit for bit, so the KL is exactly 0 throughout (the reference scored each group's prompt once, which
# differed by 3e-8, and AdamW made that noise into full steps: a held-out KL of 0.158 after two updates)
# (the graph's overlong punishment off: every reward 0, whatever the answers' length)
run still "$g" --set node.experience.filter_groups=false --set node.reward.reward=command --set node.reward.overlong_max_length=0 \
  --set "node.reward.command=python3 -c 'import sys
for _ in sys.stdin: print(0, flush=True)'" --set node.policy.per_device_training_batch_size=4 ||
  { tail -20 "$out/still.err"; fail "the all-zero-reward run failed"; }
grep -q "use_kl_loss" "$root/graphs/grpo.graph" || fail "grpo.graph no longer sets use_kl_loss: this case proves nothing"
grep -E "iter [0-9]+ reward|held-out (before|after)" "$out/still.log" | grep -vE "(kl|KL to reference) 0\.0000[, ]" &&
  fail "a policy with nothing to learn moved away from the reference"
grep -q "held-out after: .*KL to reference 0.0000," "$out/still.log" || fail "no held-out KL in the all-zero-reward run"
echo "every reward 0 with the KL loss on: the KL stays exactly 0"

# the same job scored by a Python function: the same rewards, so the same numbers (format_score
# 0.25 makes the rewards of a barely trained model non-zero)
run base "$g" || { tail -20 "$out/base.err"; fail "the job from the SFT model failed"; }
run py "$g" --set node.reward.reward=command \
  --set node.reward.command="python3 $root/graphs/examples/gsm8k_reward.py --format_score 0.25" ||
  { tail -20 "$out/py.err"; fail "the Python scorer's run failed"; }
results base | grep -q "reward 0.[0-9]*[1-9]" || fail "the rewards are all 0: the comparison would prove nothing"
[ "$(results base)" = "$(results py)" ] || { diff <(results base) <(results py); fail "the Python scorer gave other numbers"; }

# REINFORCE++ (the KL penalty inside the reward, batch-whitened returns) on the same job
run rpp "$g" --set node.experience.advantage_estimator=reinforce_plus_plus --set node.experience.kl_ctl=0.05 ||
  { tail -20 "$out/rpp.err"; fail "REINFORCE++ failed"; }
grep -q "iter 1 reward" "$out/rpp.log" || fail "REINFORCE++ printed no iteration"
# the policy on 2 ranks at ZeRO-3: DAPO's filter leaves rows that not every rank gets, the ranks stay in step
run ranks "$g" --set node.policy.replicas=2 --set node.policy.actor_zero_stage=3 ||
  { tail -20 "$out/ranks.err"; fail "the policy on 2 ZeRO-3 ranks failed"; }
grep -q "actor_loss" "$out/ranks.log" || fail "the 2-rank policy never trained"

# without a reference model (veRL with neither use_kl_in_reward nor use_kl_loss, as DAPO): the graph
# less its reference node and edges and its kl_ctl line (unwritten, grpo's kl_ctl is 0: veRL's
# use_kl_in_reward = false), reference = false; the job runs and its KL reads 0. A reference
# edge with reference = false, reference = true without one, kl_ctl > 0 or the policy's KL loss
# without a reference are refused before anything runs.
python3 - "$g" "$out/noref.graph" <<'PY'
import re, sys
text = open(sys.argv[1]).read().replace(", reference.init", "").replace(", reference.rollouts", "")
text = re.sub(r'\s*"reference\.scored -> experience\.ref_logprobs",', "", text)
text = re.sub(r"\[node\.reference\]\n(?:(?!\[).*\n)*", "", text)
text, n = re.subn(r"\nkl_ctl = .*\n", "\n", text)
assert n == 1, "the GRPO graph's kl_ctl line"
open(sys.argv[2], "w").write(text)
PY
noref=(--set node.experience.reference=false --set node.policy.use_kl_loss=false)
run noref "$out/noref.graph" "${noref[@]}" || { tail -20 "$out/noref.err"; fail "GRPO without a reference failed"; }
grep -q "iter 1 reward [0-9.-]* kl 0.0000 " "$out/noref.log" || { cat "$out/noref.log"; fail "no iteration without a reference"; }
grep -q "held-out mean reward" "$out/noref.log" || fail "GRPO without a reference printed no held-out result"
# the graph's kl_loss_coef, with use_kl_loss = false given here: it changes nothing, and the run says so
grep -q "node 'policy': kl_loss_coef = 0.001 changes nothing: use_kl_loss = false turns the KL loss off" "$out/noref.err" ||
  { cat "$out/noref.err"; fail "kl_loss_coef with the KL loss off was not named"; }
# the KL in the reward beside the KL loss (the graph's use_kl_loss = true): penalised twice; warned when the graph is
# checked, not refused (veRL prints a notice too)
run twice "$g" --check --set node.experience.kl_ctl=0.05 || { cat "$out/twice.err"; fail "kl_ctl beside the KL loss was refused"; }
grep -qF "node 'experience': kl_ctl = 0.05 puts the KL to the reference in the reward, and the policy 'policy' has use_kl_loss = true: the KL is penalised twice" "$out/twice.err" "$out/twice.log" ||
  { cat "$out/twice.err"; fail "kl_ctl beside the KL loss was not warned"; }
if grep -qF "penalised twice" "$out/grpo.err"; then fail "grpo.graph (kl_ctl 0) was warned of a KL in the reward"; fi
if run noref_edge "$g" "${noref[@]}"; then fail "reference = false with a reference edge was accepted"; fi
grep -q "reference = false, but an edge brings log-probs" "$out/noref_edge.err" || { cat "$out/noref_edge.err"; fail "no reason given for the reference edge"; }
if run noref_true "$out/noref.graph" --set node.policy.use_kl_loss=false; then fail "reference = true without an edge was accepted"; fi
grep -q "no edge brings the reference's log-probs" "$out/noref_true.err" || { cat "$out/noref_true.err"; fail "no reason given for the missing reference"; }
if run noref_kl "$out/noref.graph" "${noref[@]}" --set node.experience.kl_ctl=0.1 --set node.policy.use_kl_loss=true; then
  fail "a KL without a reference was accepted"
fi
grep -q "kl_ctl = 0.1 puts a KL to the reference in the reward" "$out/noref_kl.err" || { cat "$out/noref_kl.err"; fail "no reason given for kl_ctl"; }
grep -q "has use_kl_loss = true: its KL loss needs the reference" "$out/noref_kl.err" || { cat "$out/noref_kl.err"; fail "no reason given for use_kl_loss"; }
# unwritten, REINFORCE++'s kl_ctl is 0.001: refused without a reference, saying whose default it is
if run noref_rpp "$out/noref.graph" "${noref[@]}" --set node.experience.advantage_estimator=reinforce_plus_plus; then
  fail "REINFORCE++'s default KL without a reference was accepted"
fi
grep -q "kl_ctl = 0.001 (unwritten: advantage_estimator reinforce_plus_plus's default) puts a KL to the reference" \
  "$out/noref_rpp.err" || { cat "$out/noref_rpp.err"; fail "the refusal does not say the KL is the estimator's default"; }
# a temperature above 0 but below 1e-6: logits / T overflow a float (NaN log-probs at 1e-38), refused when checked
if run tiny_t "$g" --set node.generator.temperature=1e-38; then fail "temperature 1e-38 was accepted"; fi
grep -q "temperature = 1e-38 is above 0 but below 1e-6" "$out/tiny_t.err" || { cat "$out/tiny_t.err"; fail "no reason for the tiny temperature"; }

# the loop's tokenizers must read ids alike: a rule reward with another one scored every answer 0 (exit 0);
# a copy of the same tokenizer elsewhere is the same tokenizer
set +e
run tokmix "$g" --set node.reward.tokenizer="$root/tests/fixtures/hf_chat/qwen2"
rc=$?
set -e
[ $rc -eq 2 ] || { tail -5 "$out/tokmix.err"; fail "a reward tokenizer unlike the generator's: exit $rc, not 2"; }
grep -qF "and node 'reward' (reward_function) with $root/tests/fixtures/hf_chat/qwen2: they differ (902 tokens against 512)" \
  "$out/tokmix.err" || { cat "$out/tokmix.err"; fail "the refusal does not name the reward's tokenizer"; }
# and the SFT model the loop starts from (trained on another tokenizer's ids, the policy read tok512's)
set +e
run tokmix2 "$root/graphs/grpo.graph" --set node.sft.data="$out/addition.jsonl" --set node.sft.output= \
  --set node.sft.tokenizer="$root/tests/fixtures/hf_chat/qwen2"
rc=$?
set -e
[ $rc -eq 2 ] || { tail -5 "$out/tokmix2.err"; fail "an sft tokenizer unlike the generator's: exit $rc, not 2"; }
grep -qF "and node 'sft' (sft_trainer) with $root/tests/fixtures/hf_chat/qwen2" "$out/tokmix2.err" ||
  { cat "$out/tokmix2.err"; fail "the refusal does not name the sft tokenizer"; }

# step-3 checkpoints without a critic: a run that committed iterations 2 and 4, cut back to its
# commit of iteration 2, resumes there and prints the uninterrupted run's lines from iteration 2 on
ck=(--set node.prompts.iterations=4 --set node.controller.save_checkpoint_steps=2 --set node.experience.filter_groups=false)
run ck_a "$g" "${ck[@]}" --set graph.checkpoint_dir="$out/ck_a" || { tail -20 "$out/ck_a.err"; fail "the checkpointing run failed"; }
grep -q "checkpoint after iteration 3" "$out/ck_a.log" || fail "no checkpoint was committed after iteration 3"
cp -r "$out/ck_a" "$out/ck_b"
python3 - "$out/ck_b/step3.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["committed"] = [p for p in c["committed"] if p["iteration"] == 2]
assert c["committed"], "no commit of iteration 2"
json.dump(c, open(sys.argv[1], "w"))
PY
run ck_b "$g" "${ck[@]}" --set graph.checkpoint_dir="$out/ck_b" || { tail -20 "$out/ck_b.err"; fail "the resumed run failed"; }
grep -q "resuming after iteration 1 " "$out/ck_b.log" || fail "the run did not resume after iteration 1"
from2() { results "$1" | grep -v "held-out before" | awk '{ if ($4 == "iter" && $5 + 0 < 2) next; print }'; }
diff <(from2 ck_a) <(from2 ck_b) || fail "the resumed run's lines differ from the uninterrupted run's"
# a resume with the reward, the estimator, the sampling or the schedule changed is refused, naming
# each node and setting (another format_score printed a held-out "gain" of nothing but the scale)
for change in "reward format_score 0.25 -> 0.9|node.reward.format_score=0.9" \
              "experience advantage_estimator \"grpo\" -> \"rloo\"|node.experience.advantage_estimator=rloo" \
              "generator temperature 0.5 -> 2.0|node.generator.temperature=2.0" \
              "controller max_staleness 0 -> 1|node.controller.max_staleness=1"; do
  want=${change%%|*} set=${change#*|} node=${want%% *} what=${want#* }
  rm -rf "$out/ck_c" && cp -r "$out/ck_a" "$out/ck_c"
  if run ck_c "$g" "${ck[@]}" --set graph.checkpoint_dir="$out/ck_c" --set "$set"; then fail "a resume with $set was accepted"; fi
  grep -qF "node '$node': resuming from $out/ck_c/$node.settings.json with settings changed: $what; set them back, or delete $out/ck_c to start step 3 afresh" "$out/ck_c.err" ||
    { grep -i error "$out/ck_c.err" | head -3; fail "the refusal of $set does not name it"; }
  grep -q "iter 4 reward" "$out/ck_c.log" && fail "a refused resume trained"
done
# safe changes resume: on_error (the stop message advises it), and a copy of the tokenizer elsewhere
# (compared by its bytes; its other path was refused)
rm -rf "$out/ck_c" && cp -r "$out/ck_a" "$out/ck_c" && cp "$(readlink -f "${FLOWRUN_ASSETS:-$root/../shared/assets}")/model/stories260K/tok512.model" "$out/tok_copy.model"
run ck_c "$g" "${ck[@]}" --set graph.checkpoint_dir="$out/ck_c" --set node.reward.on_error=zero \
  --set node.generator.tokenizer="$out/tok_copy.model" || { grep -i error "$out/ck_c.err" | head -3; fail "a safe resume was refused"; }
# the prompts file is recorded by its bytes too: a copy elsewhere resumes, the same file edited (one row's
# question changed) is refused (it resumed without a word, on other prompts)
cp "$out/addition.jsonl" "$out/add_copy.jsonl"
rm -rf "$out/ck_c" && cp -r "$out/ck_a" "$out/ck_c"
run ck_c "$g" "${ck[@]}" --set graph.checkpoint_dir="$out/ck_c" --set node.prompts.data="$out/add_copy.jsonl" ||
  { grep -i error "$out/ck_c.err" | head -3; fail "a resume from a copy of the prompts file was refused"; }
sed -i '1s/+/-/' "$out/add_copy.jsonl"
cmp -s "$out/addition.jsonl" "$out/add_copy.jsonl" && fail "the edit changed nothing"
rm -rf "$out/ck_c" && cp -r "$out/ck_a" "$out/ck_c"
if run ck_c "$g" "${ck[@]}" --set graph.checkpoint_dir="$out/ck_c" --set node.prompts.data="$out/add_copy.jsonl"; then
  fail "a resume with an edited prompts file was accepted"
fi
grep -qF "node 'prompts': resuming from $out/ck_c/prompts.settings.json with settings changed: data \"$out/addition.jsonl\" -> \"$out/add_copy.jsonl\" (other bytes)" \
  "$out/ck_c.err" || { grep -i error "$out/ck_c.err" | head -3; fail "the refusal does not name the edited data"; }

# a scorer that crashes: the run stops, naming the node, the sample and the exit status
if run crash "$g" --set node.reward.reward=command --set node.reward.command="python3 -c 'import sys; sys.exit(3)'"; then
  fail "a crashing scorer did not stop the run"
fi
grep -q "node 'reward'.*sample 0.*exited with status 3" "$out/crash.err" || { tail -5 "$out/crash.err"; fail "the crash error does not name node, sample and status"; }
# one that prints a word, and one that hangs
if run word "$g" --set node.reward.reward=command --set node.reward.command="sed -u s/.*/hello/"; then fail "a word was taken as a reward"; fi
grep -q 'answered "hello", which is not a number' "$out/word.err" || { tail -5 "$out/word.err"; fail "no clear error for a word"; }
if run hang "$g" --set node.reward.reward=command --set node.reward.command="sleep 60" --set node.reward.timeout_s=0.5 \
     --set node.reward.startup_timeout_s=0.5; then
  fail "a hanging scorer did not stop the run"
fi
grep -q "gave no answer within 1 s (killed) (its first answer, which includes its start-up: timeout_s + startup_timeout_s = 1 s; raise startup_timeout_s" "$out/hang.err" ||
  { tail -5 "$out/hang.err"; fail "no clear error for a timeout"; }
# one that takes longer to start than timeout_s (imports, a model to load): its first answer gets
# startup_timeout_s more, the others timeout_s (it could never answer before)
run slow "$g" --set node.reward.reward=command --set node.reward.timeout_s=0.5 --set node.reward.startup_timeout_s=10 \
  --set node.reward.command="python3 -c 'import sys, time; time.sleep(1.5); [print(0.5, flush=True) for _ in sys.stdin]'" ||
  { tail -5 "$out/slow.err"; fail "a scorer slow to start never answered"; }
# one that answers two lines per question: never a shifted reward, the run stops saying so
if run shift "$g" --set node.reward.reward=command --set node.reward.command="sed -u 's/.*/1\n2/'"; then
  fail "a scorer answering two lines per question was taken"
fi
grep -q "out of step\|more than one line\|after its previous answer" "$out/shift.err" || { tail -5 "$out/shift.err"; fail "no clear error for extra lines"; }
# on_error = "zero": the run completes and says how many samples scored 0 (max_consecutive_errors = 0: no limit)
run zero "$g" --set node.reward.reward=command --set node.reward.command="yes hello" \
  --set node.reward.on_error=zero --set node.reward.max_consecutive_errors=0 ||
  { tail -5 "$out/zero.err"; fail "on_error = zero did not go on"; }
grep -q "sample(s) scored 0 after an error" "$out/zero.log" || fail "on_error = zero did not count the samples"
# ... but a scorer that fails every sample stops the run after max_consecutive_errors (10) in a row: with a
# timeout each failure waited timeout_s + startup_timeout_s (hours per batch), and all-zero runs ended with 0
if run broken "$g" --set node.reward.reward=command --set node.reward.command="yes hello" --set node.reward.on_error=zero; then
  fail "a scorer that failed every sample did not stop the run"
fi
grep -q "the command failed on 10 samples in a row, max_consecutive_errors" "$out/broken.err" ||
  { tail -5 "$out/broken.err"; fail "no clear error for a scorer that fails every sample"; }
# a flaky scorer (every other answer not a number) goes on, each failure scored 0
run flaky "$g" --set node.reward.reward=command --set node.reward.on_error=zero \
  --set "node.reward.command=python3 -c 'import sys
for i, _ in enumerate(sys.stdin): print(1 if i % 2 else \"x\", flush=True)'" ||
  { tail -5 "$out/flaky.err"; fail "a flaky scorer stopped the run"; }
grep -q "sample(s) scored 0 after an error" "$out/flaky.log" || fail "the flaky scorer's failures were not counted"

# refused before running: GRPO with groups of one, GAE without a critic
if run one "$g" --set node.generator.num_generations=1; then fail "num_generations = 1 was accepted for GRPO"; fi
grep -q "num_generations = 1 per prompt: a group of one has no baseline" "$out/one.err" || { cat "$out/one.err"; fail "no reason given for num_generations = 1"; }
if run gae "$g" --set node.experience.advantage_estimator=gae; then fail "GAE without a critic was accepted"; fi
grep -q "needs the critic's values" "$out/gae.err" || { cat "$out/gae.err"; fail "no reason given for GAE without a critic"; }
echo "grpo_small: ok"
