#!/usr/bin/env bash
# Step-3 checkpoints (issue 16, "resume"): graphs/rlhf.graph at small settings, committing a
# checkpoint every 2 PPO iterations into [graph] checkpoint_dir.
#   1. SIGKILL in the middle of step 3, then the same command: steps 1 and 2 are not redone,
#      step 3 resumes from the last commit, and every step-3 line printed after it equals the
#      uninterrupted run's; so do its saved actor and the actor's EMA (enable_ema), byte for byte.
#   2. A corrupt checkpoint (one byte of the policy's newest shard flipped) is refused, naming
#      the file, and the previous commit is used: the lines after it equal the uninterrupted run's.
#   3. A 1-rank stage-0 checkpoint resumes on 2 ranks at ZeRO stage 3 (policy) and 2 (critic):
#      the lines after it equal the uninterrupted run's within 1e-4, and the actor's EMA, gathered
#      from the 2 ranks' pieces, within 1e-5.
#   5. SIGINT during step 3, after an iteration no checkpoint was due at: the drain commits it (the
#      binary before kept the commit before it); exit 130 with a line naming the last committed
#      checkpoint, from which the same command resumes (with the uninterrupted run's lines); without a
#      checkpoint_dir (5b) the iteration in flight still reports.
#   0. The policy and critic follow DS-Chat's step-3 learning-rate schedules (cosine with warmup, linear):
#      the policy's printed rates are transformers' cosine over the run's 12 updates; every resume below
#      continues them (the lines after it, with their rates, equal the uninterrupted run's).
#   6. A resume whose settings changed: actor_learning_rate, lr_scheduler_type, the reference model's dtype and the prompts'
#      per_device_generation_batch_size are refused, naming them with both values, and so are
#      fewer iterations than the checkpoint has done, and another [graph] seed (the generator samples with it);
#      critic_zero_stage is safe and the run resumes.
#  6b. Step 3 with LoRA (actor and critic, only_optimize_lora) resumes, and a changed only_optimize_lora
#      is refused naming it.
#   7. Step 1 retrained after step 3's checkpoint (no step-3 setting changed): the resume is refused.
#   8. The asset folder through a symbolic link (another spelling of the same files): accepted.
#   4. Non-finite values (actor_learning_rate 1e30: the next scoring overflows) stop the run with a
#      message naming the node, the iteration and the tensor; no commit follows the failure.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "ppo_resume_small: $*"; exit 1; }
args() {  # DIR: the command line of a run whose state lives in DIR
  echo --no-progress --set graph.checkpoint_dir="$1/ckpt" --set node.ppo_controller.save_checkpoint_steps=2 \
    --set node.sft.steps=6 --set node.rm.steps=6 --set node.prompts.iterations=6 --set node.prompts.eval_prompts=4 \
    --set node.sft.output="$1/sft.bin" --set node.rm.output="$1/rm" --set node.policy.output="$1/ppo.bin" \
    --set node.policy.unsup_data=data/tinystories/tinystories_train_head.txt \
    --set node.policy.tokenizer=model/stories260K/tok512.model \
    --set node.policy.per_device_training_batch_size=4 --set node.critic.per_device_training_batch_size=4 \
    --set node.policy.lr_scheduler_type=cosine --set node.policy.num_warmup_steps=3 \
    --set node.critic.lr_scheduler_type=linear --set node.policy.enable_ema=true --set node.policy.ema_output="$1/ema.bin"
}
# the step-3 iteration and held-out-after lines without timings
lines() { grep -E '^\[step 3 ppo\] (iter [0-9]+ reward|held-out after|held-out mean)' "$1" |
          sed -E 's/ gen [0-9]+ tok\/s train [0-9]+ tok\/s//; s/ hybrid-engine gather.*//; s/, [0-9.]+ s$//'; }
after() {  # LOG ITER: A's lines from iteration ITER on
  lines "$1" | awk -v n="$2" '{ if ($4 == "iter" && $5 + 0 < n) next; print }'
}
# LOG SIGNAL LINE COMMAND...: runs COMMAND in the background, its stdout through a FIFO into LOG and
# its stderr into LOG's .err, and sends SIGNAL the moment a line containing LINE is read; returns when
# the command's stdout closes (every line it printed is in LOG), leaving its pid in $pid. Polling
# the log file and then sleeping up to 0.2 s landed after the end of step 3 on a Zen 5 host, where
# an iteration here takes 45 ms (one run in six failed alone); a read on a FIFO wakes on the line.
signal_on_line() {
  local log=$1 sig=$2 want=$3 line sent=0
  shift 3
  rm -f "$log.fifo" && mkfifo "$log.fifo"
  "$@" > "$log.fifo" 2> "${log%.log}.err" &
  pid=$!
  while IFS= read -r line || [[ -n $line ]]; do  # (a last line without a newline too)
    printf '%s\n' "$line" >> "$log"
    if ((!sent)) && [[ $line == *"$want"* ]]; then
      kill -"$sig" $pid 2>/dev/null || true
      sent=1
    fi
  done < "$log.fifo"
  rm -f "$log.fifo"
}
mkdir -p "$out/a" "$out/b"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/a") > "$out/a.log" 2> "$out/a.err" ||
  { echo "uninterrupted run failed:"; tail -20 "$out/a.err"; exit 1; }
grep -q "checkpoint after iteration 5" "$out/a.log" || fail "the uninterrupted run committed no checkpoint after iteration 5"
[ "$(lines "$out/a.log" | grep -c ' iter ')" = 6 ] || fail "the uninterrupted run did not print 6 iterations"
# DS-Chat's step-3 schedule (rlhf_engine.py: transformers.get_scheduler over num_total_iters): 6 iterations x
# 1 ppo_epoch x 8 rows / 4 per update = 12 updates; the line of iteration k prints the rate of its last
# update, number 2k + 1. The expected rates from transformers/optimization.py's
# get_cosine_schedule_with_warmup (num_cycles 0.5), written out here: k < W: k / W; else
# 0.5 (1 + cos(pi (k - W) / (N - W)))
grep -qF "[step 3 ppo] policy: learning rate cosine over 12 updates (6 iterations x 1 ppo_epochs x 2 mini-batches of 4 rows), 3 warmup updates" \
  "$out/a.log" || fail "the policy did not plan its schedule over 12 updates: $(grep 'learning rate' "$out/a.log")"
grep -qF "[step 3 ppo] critic: learning rate linear over 12 updates" "$out/a.log" || fail "the critic planned no linear schedule"
python3 - "$out/a.log" <<'PY' || fail "the printed learning rates are not transformers' cosine with 3 warmup updates of 12"
import math, re, sys
got = [float(x) for x in re.findall(r"^\[step 3 ppo\] iter \d+ .* lr (\S+) ", open(sys.argv[1]).read(), re.M)]
def cosine(k, W=3, N=12, lr=1e-4):
    return lr * (k / W if k < W else 0.5 * (1 + math.cos(math.pi * (k - W) / (N - W))))
want = [cosine(2 * i + 1) for i in range(6)]
assert len(got) == 6 and all(abs(g - w) <= 0.005 * w for g, w in zip(got, want)), (got, want)
print("policy learning rates " + " ".join(f"{g:.2e}" for g in got) + ": transformers' cosine, warmup 3 of 12")
PY

# 1. SIGKILL once step 3 has committed a checkpoint, at one of four lines (iterations numbered from
#    0, as the log's "iter K" lines): right after the commit of iteration 1 or of iteration 3, or
#    right after iteration 2 or 3 printed its line (during iteration 3, or before or during the commit
#    of iteration 3): the run resumes after iteration 1 or 3
triggers=("checkpoint after iteration 1" "iter 2 reward" "iter 3 reward" "checkpoint after iteration 3")
trigger=${triggers[RANDOM % 4]}
signal_on_line "$out/b1.log" 9 "[step 3 ppo] $trigger" \
  "$flowrun" "$root/graphs/rlhf.graph" $(args "$out/b") --metrics "$out/b.metrics.jsonl"
wait $pid 2>/dev/null || true
grep -q "checkpoint after iteration 1" "$out/b1.log" || fail "no checkpoint was committed"
grep -qF "[step 3 ppo] $trigger" "$out/b1.log" || fail "step 3 never printed '$trigger'"
grep -q "held-out after" "$out/b1.log" && fail "killed too late (step 3 had finished)"
cp "$out/b.metrics.jsonl" "$out/b1.metrics.jsonl"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/b") --metrics "$out/b.metrics.jsonl" > "$out/b2.log" 2> "$out/b2.err" ||
  { echo "the resumed run failed:"; tail -20 "$out/b2.err"; exit 1; }
for step in "step 1 sft" "step 2 rm"; do
  grep -q "^\[$step\] resumed: " "$out/b2.log" || fail "$step was trained again after the crash"
done
from=$(grep -oE "resuming after iteration [0-9]+" "$out/b2.log" | awk '{ print $4 }')
[ -n "$from" ] || fail "the second run did not resume step 3"
echo "killed during step 3 (at '$trigger'); resumed after iteration $from"
diff <(after "$out/a.log" $((from + 1))) <(lines "$out/b2.log") || fail "the resumed run's lines differ from the uninterrupted run's"
cmp "$out/a/ppo.bin" "$out/b/ppo.bin" || fail "the resumed run's policy differs from the uninterrupted run's"
cmp "$out/a/ema.bin" "$out/b/ema.bin" || fail "the resumed run's actor EMA differs from the uninterrupted run's"
# the resumed run appended to the killed run's --metrics file (kept whole: step 1's loss curve is
# only there), and the report's reward curve has each iteration once: those the killed run wrote
# before the resume point (iterations 0..from: from + 1 of them; the runtime writes records every 50 ms, so a kill can beat the last
# ones to the file) and every one from the resume point on
# (up to its last whole line: the kill may have cut the last one, which the resumed run drops)
whole=$(python3 -c "import sys; t = open(sys.argv[1], 'rb').read(); print(t.rfind(b'\n') + 1)" "$out/b1.metrics.jsonl")
cmp -s <(head -c "$whole" "$out/b1.metrics.jsonl") <(head -c "$whole" "$out/b.metrics.jsonl") ||
  fail "the resumed run did not keep the killed run's metrics file"
grep -q '"node":"sft"' "$out/b1.metrics.jsonl" || fail "the killed run's metrics hold no step-1 record"
expect=$(python3 - "$out/b1.metrics.jsonl" $((from + 1)) <<'PY'
import json, sys
before = set()
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue  # the line a kill cut
    if r.get("signal") == "reward" and r.get("node") == "ppo_controller" and 0 <= r["step"] < int(sys.argv[2]):
        before.add(r["step"])
print(len(before) + 6 - int(sys.argv[2]))
PY
)
"$flowrun" report "$out/b.metrics.jsonl" -o "$out/b_report" > /dev/null || fail "flowrun report failed on the resumed run's metrics"
grep -E "^\| reward \| $expect \|" "$out/b_report/REPORT.md" > /dev/null ||
  fail "the report's reward curve is not $expect points: $(grep -E '^\| reward ' "$out/b_report/REPORT.md")"
echo "metrics: the resumed run appended to the killed run's file; the report has $expect reward points, each once"

# 2. a corrupt newest checkpoint: refused by name, the previous commit used
newest=$(ls -d "$out/b/ckpt/policy"/step_* | sort | tail -1)
shard=$(ls "$newest"/*.safetensors | head -1)
python3 -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(-5, 2); b = f.read(1); f.seek(-5, 2); f.write(bytes([b[0] ^ 0xff]))" "$shard"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/b") > "$out/b3.log" 2> "$out/b3.err" ||
  { echo "the run after the corruption failed:"; tail -20 "$out/b3.err"; exit 1; }
grep -F "$(basename "$shard")" "$out/b3.log" | grep -q "refused" || fail "the corrupt shard was not named: $(grep checkpoint "$out/b3.log")"
grep "refused" "$out/b3.log" | head -1 | cut -c1-200
from=$(grep -oE "resuming after iteration [0-9]+" "$out/b3.log" | awk '{ print $4 }')
[ "$from" = 3 ] || fail "after the corruption the run resumed after iteration '$from', not 3"
diff <(after "$out/a.log" $((from + 1))) <(lines "$out/b3.log") || fail "the lines after the older commit differ"

# 3. another world size and stage: a's commit of iteration 4 on 2 ranks
cp -r "$out/a" "$out/c"
python3 - "$out/c/ckpt/step3.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["committed"] = [p for p in j["committed"] if p["iteration"] <= 4]
json.dump(j, open(sys.argv[1], "w"))
PY
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/c") --set node.policy.replicas=2 --set node.policy.actor_zero_stage=3 \
  --set node.critic.replicas=2 --set node.critic.critic_zero_stage=2 > "$out/c.log" 2> "$out/c.err" ||
  { echo "the 2-rank resume failed:"; tail -20 "$out/c.err"; exit 1; }
grep -q "resuming after iteration 3 " "$out/c.log" || fail "the 2-rank run did not resume after iteration 3"
grep -q "^\[step 1 sft\] trains again, though it finished in $out/c/ckpt before: its output is now $out/c/sft.bin, not $out/a/sft.bin" \
  "$out/c.log" || fail "step 1 trained again in the copied run without a line saying why"
python3 - <(after "$out/a.log" 4) <(lines "$out/c.log") <<'PY' || fail "the 2-rank resume differs by more than 1e-4"
import re, sys
a, c = open(sys.argv[1]).read(), open(sys.argv[2]).read()
na, nc = re.findall(r"-?\d+\.\d+", a), re.findall(r"-?\d+\.\d+", c)
assert len(na) == len(nc) > 10, (len(na), len(nc))
worst = max(abs(float(x) - float(y)) for x, y in zip(na, nc))
print(f"1-rank checkpoint resumed on 2 ranks (stages 3 and 2): largest difference {worst:.1e} over {len(na)} numbers")
sys.exit(0 if worst <= 1e-4 + 1e-9 else 1)
PY
python3 - "$out/a/ema.bin" "$out/c/ema.bin" <<'PY' || fail "the 2-rank resume's actor EMA differs by more than 1e-5"
import sys
from array import array
a, c = array("f"), array("f")
a.frombytes(open(sys.argv[1], "rb").read()[28:])  # llama2.c files: 7 int32 of header, then float32
c.frombytes(open(sys.argv[2], "rb").read()[28:])
assert len(a) == len(c) > 0
worst = max(abs(x - y) for x, y in zip(a, c))
print(f"the actor's EMA gathered from 2 ranks at stage 3: largest difference {worst:.1e} from the 1-rank run's")
sys.exit(0 if worst <= 1e-5 else 1)
PY
# 4. non-finite values stop the step; nothing is committed after
set +e
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/d") --set node.ppo_controller.save_checkpoint_steps=1 \
  --set node.policy.actor_learning_rate=1e30 --set node.policy.unsup_data= \
  --set node.policy.per_device_training_batch_size=8 > "$out/d.log" 2> "$out/d.err"
rc=$?
set -e
[ $rc -ne 0 ] || fail "a run whose policy blew up exited 0"
# "non-finite value in TENSOR ... in node NAME, iteration N" (a score) or "node 'NAME', iteration N,
# mini-batch rows [a, b): zero_engine: non-finite loss ..." (an update)
msg=$(grep "failed in on_message" "$out/d.err" | grep "non-finite" | grep -oE "iteration [0-9]+.*" | head -1)
[ -n "$msg" ] || fail "no message naming the node, iteration and tensor: $(grep -i error "$out/d.err" | head -3)"
echo "stopped: $(grep "failed in on_message" "$out/d.err" | head -1 | cut -c1-250)"
bad=$(echo "$msg" | awk '{ print $2 }' | tr -d ',')
python3 - "$out/d/ckpt/step3.json" "$bad" <<'PY' || fail "a checkpoint was committed after the failing iteration"
import json, os, sys
if not os.path.exists(sys.argv[1]):
    print(f"nothing committed; the failure was in iteration {sys.argv[2]}")
    sys.exit(0)
done = [p["iteration"] for p in json.load(open(sys.argv[1]))["committed"]]
print(f"committed iterations {done}; the failure was in iteration {sys.argv[2]}")
sys.exit(0 if max(done) <= int(sys.argv[2]) else 1)  # commit J = J iterations done: at most the failing one
PY
# 5. SIGINT as iteration 1 reports (commits after 1, 3 and 5): the drain lets iteration 2 report and commits it
# (or 3 where the loader's next batch was already on its way; the binary before kept only the commit after 1);
# it says what is kept; the same command resumes there
mkdir -p "$out/e"
signal_on_line "$out/e1.log" INT "[step 3 ppo] iter 1 reward" "$flowrun" "$root/graphs/rlhf.graph" $(args "$out/e")
set +e
wait $pid
rc=$?
set -e
grep -q "held-out after" "$out/e1.log" && fail "SIGINT came after step 3 had finished (rc $rc)"
[ $rc -eq 130 ] || fail "SIGINT: exit code $rc, not 130"
line=$(grep -F "[step 3 ppo] interrupted: the last committed checkpoint is after iteration" "$out/e1.log") ||
  fail "SIGINT: no line saying what was kept: $(tail -3 "$out/e1.log")"
echo "$line"
kept=$(echo "$line" | grep -oE "iteration [0-9]+" | awk '{ print $2 }')
# the binary before the drain's commit kept iteration 1: the update of iteration 2 was lost
[ "$kept" -ge 2 ] || fail "SIGINT during iteration 2 kept only iteration $kept: the drain committed nothing"
if [ "$kept" = 2 ]; then
  grep -qF "[step 3 ppo] stopping after iteration 2: saving and committing it" "$out/e1.log" ||
    fail "SIGINT: no line saying the drain commits iteration 2"
fi
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/e") > "$out/e2.log" 2> "$out/e2.err" ||
  { echo "the run after SIGINT failed:"; tail -20 "$out/e2.err"; exit 1; }
grep -q "resuming after iteration $kept " "$out/e2.log" || fail "after SIGINT the run did not resume after iteration $kept"
diff <(after "$out/a.log" $((kept + 1))) <(lines "$out/e2.log") || fail "the lines after SIGINT and resume differ"
# 5b. the same without a checkpoint_dir: nothing is kept, and the iteration in flight still reports (the controller
# ended with the prompts and its line was lost: "iter 0", "iter 1", then "interrupted")
mkdir -p "$out/e0"
signal_on_line "$out/e0.log" INT "[step 3 ppo] iter 1 reward" "$flowrun" "$root/graphs/rlhf.graph" $(args "$out/e0") \
  --set graph.checkpoint_dir=
set +e
wait $pid
rc=$?
set -e
[ $rc -eq 130 ] || fail "SIGINT without a checkpoint_dir: exit code $rc, not 130"
grep -q "^\[step 3 ppo\] iter 2 reward" "$out/e0.log" || fail "SIGINT without a checkpoint_dir: iteration 2's report was lost"
grep -qF "[step 3 ppo] interrupted: no checkpoint was saved, nothing of step 3 is kept (set [graph] checkpoint_dir: a drain" \
  "$out/e0.log" || fail "SIGINT without a checkpoint_dir: $(tail -2 "$out/e0.log")"
# 6. settings changed since the checkpoint
refused() {  # NAME WHAT PATTERN DIR ARGS...: the run in DIR with ARGS fails, its stderr matching PATTERN
  local name=$1 what=$2 pattern=$3 dir=$4
  shift 4
  if "$flowrun" "$root/graphs/rlhf.graph" $(args "$dir") "$@" > "$out/$name.log" 2> "$out/$name.err"; then
    fail "a resume with $what was accepted"
  fi
  grep -q "$pattern" "$out/$name.err" || fail "the refusal of $what does not say so: $(grep -i error "$out/$name.err" | head -2)"
}
refused f1 "another actor_learning_rate" \
  "resuming from .* with settings changed: actor_learning_rate 0.0001 -> 0.0002; set them back" \
  "$out/a" --set node.policy.actor_learning_rate=2e-4
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/a") --set node.critic.critic_zero_stage=2 > "$out/f2.log" 2> "$out/f2.err" ||
  fail "a resume with another critic_zero_stage was refused: $(grep -i error "$out/f2.err" | head -2)"
# staleness_policy acts only at max_staleness >= 1: at 0 (this run's), a change is no change, and is named
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/a") --set node.ppo_controller.staleness_policy=drop > "$out/stale.log" 2> "$out/stale.err" ||
  fail "a resume at max_staleness = 0 with another staleness_policy was refused: $(grep -i error "$out/stale.err" | head -2)"
grep -q 'staleness_policy = "drop" has no effect at max_staleness = 0' "$out/stale.err" ||
  fail "staleness_policy = drop at max_staleness = 0 was not named as doing nothing"
# refused when the policy starts, with every node at the job's start (here step 1's output is gone, so step 1
# trains again meanwhile; the failure stops it): the policy refused only once the model came, after step 1 had
# retrained whole
cp -r "$out/a" "$out/r" && rm "$out/r/sft.bin"
refused f1b "another actor_learning_rate, step 1's output gone" \
  "node 'policy' failed in start: node 'policy': resuming from .* with settings changed: actor_learning_rate 0.0001 -> 0.0002; set them back" \
  "$out/r" --set node.policy.actor_learning_rate=2e-4
refused f3 "another per_device_generation_batch_size (other prompts would follow)" \
  "with settings changed: per_device_generation_batch_size 8 -> 2; set them back" \
  "$out/a" --set node.prompts.per_device_generation_batch_size=2
refused f4 "fewer iterations than the checkpoint's" "holds step 3 after iteration 5 (6 iterations done), more than iterations = 3" \
  "$out/a" --set node.prompts.iterations=3
refused f5s "another graph seed (the generator samples with the node seed it gives)" \
  "resuming from .* with .graph. seed changed (this node's seed [0-9]* -> [0-9]*): set the graph's seed back" \
  "$out/a" --set graph.seed=99
refused f5 "the reference model in another dtype (other KL penalties would follow)" \
  "node 'reference': resuming from .* with settings changed: dtype \"fp32\" -> \"bf16\"; set them back" \
  "$out/a" --set node.reference.dtype=bf16
# a setting newer than the checkpoint's record (prompt_overflow here, taken out of the record as flowrun
# before it wrote), left at its default: no change (it was refused as "(not set) -> keep_end", and no value
# could set it back); given another value, refused
cp -r "$out/a" "$out/n"
python3 -c 'import json,sys; p=sys.argv[1]; r=json.load(open(p)); r.pop("prompt_overflow"); json.dump(r, open(p, "w"))' \
  "$out/n/ckpt/prompts.settings.json"
refused f6 "prompt_overflow drop on a record without it" \
  "node 'prompts': resuming from .* with settings changed: prompt_overflow (not set) -> \"drop\"; set them back" \
  "$out/n" --set node.prompts.prompt_overflow=drop
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/n") --set node.prompts.iterations=8 > "$out/f7.log" 2> "$out/f7.err" ||
  fail "a resume whose record predates prompt_overflow (at its default) was refused: $(grep -i error "$out/f7.err" | head -2)"
grep -q "resuming after iteration 5 " "$out/f7.log" || fail "the resume whose record predates prompt_overflow did not resume"
# 8 iterations where the checkpoint planned 6: the schedule stretches to 16 updates, and the run says so
grep -q "the checkpoint's schedule spanned 12 updates and this run's spans 16 (iterations changed): the learning rate continues at update 12" \
  "$out/f7.err" || fail "a longer resumed run did not say its schedule changed: $(grep -i schedule "$out/f7.err" | head -2)"
refused f9 "another lr_scheduler_type (the rates after the checkpoint would differ)" \
  "node 'policy': resuming from .* with settings changed: lr_scheduler_type \"cosine\" -> \"linear\"; set them back" \
  "$out/a" --set node.policy.lr_scheduler_type=linear
echo "settings changed: actor_learning_rate, lr_scheduler_type, per_device_generation_batch_size, the reference's dtype and fewer iterations refused, critic_zero_stage and staleness_policy (at max_staleness 0) accepted"
# the same for steps 1-2's done markers (a setting sft_trainer gained since, at its default): step 1 is taken as
# saved and step 3 resumes (step 1 was retrained, or refused under step 3's checkpoint). The copy's markers
# name a's outputs, which the run is pointed at (read only: they are taken as saved)
cp -r "$out/a" "$out/m"
python3 - "$out/m/ckpt/sft.done.json" <<'PY'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
d["settings_record"].pop("truncation")
# the marker's fingerprint as the older flowrun wrote it: FNV-1a 64 of kind + "\n" + the record (compact, sorted)
h = 0xcbf29ce484222325
for b in ("sft_trainer\n" + json.dumps(d["settings_record"], separators=(",", ":"), sort_keys=True, ensure_ascii=False)).encode():
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
d["settings"] = "%016x" % h
json.dump(d, open(p, "w"))
PY
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/m") --set node.prompts.iterations=8 --set node.sft.output="$out/a/sft.bin" \
  --set node.rm.output="$out/a/rm" > "$out/f8.log" 2> "$out/f8.err" ||
  fail "a done marker that predates truncation (at its default) refused the resume: $(grep -i error "$out/f8.err" | head -2)"
grep -q "^\[step 1 sft\] resumed: " "$out/f8.log" || fail "step 1 trained again for a setting newer than its done marker"
grep -q "resuming after iteration 5 " "$out/f8.log" || fail "step 3 did not resume after a done marker that predates a setting"
echo "a setting newer than the record: at its default accepted, another value refused (step 3's records and steps 1-2's done markers)"
# 6b. LoRA in step 3 (actor_lora_dim, critic_lora_dim, only_optimize_lora): a LoRA checkpoint resumes,
#     and a changed only_optimize_lora is refused naming it (it was refused by the config hash alone,
#     "config hash differs", which names nothing and offers only deleting the checkpoint)
cp -r "$out/a" "$out/l"
rm -rf "$out/l/ckpt/step3.json" "$out/l/ckpt/policy" "$out/l/ckpt/critic"
for f in "$out/l/ckpt/"*.settings.json; do rm "$f"; done
lora=(--set node.policy.actor_lora_dim=4 --set node.critic.critic_lora_dim=4 --set node.policy.only_optimize_lora=true
      --set node.critic.only_optimize_lora=true)
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/l") "${lora[@]}" --set node.prompts.iterations=2 > "$out/l1.log" \
  2> "$out/l1.err" || { echo "the step-3 LoRA run failed:"; tail -20 "$out/l1.err"; exit 1; }
grep -q "checkpoint after iteration 1" "$out/l1.log" || fail "the step-3 LoRA run committed no checkpoint"
refused l2 "another only_optimize_lora (the whole actor would train)" \
  "node 'policy': resuming from .* with settings changed: only_optimize_lora true -> false; set them back" \
  "$out/l" "${lora[@]}" --set node.prompts.iterations=4 --set node.policy.only_optimize_lora=false
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/l") "${lora[@]}" --set node.prompts.iterations=4 > "$out/l3.log" \
  2> "$out/l3.err" || { echo "the step-3 LoRA resume failed:"; tail -20 "$out/l3.err"; exit 1; }
grep -q "resuming after iteration 1 " "$out/l3.log" || fail "the step-3 LoRA run did not resume after iteration 1"
[ "$(lines "$out/l3.log" | grep -c ' iter ')" = 2 ] || fail "the step-3 LoRA resume did not run iterations 2-3"
echo "step-3 LoRA: resumed after iteration 1; a changed only_optimize_lora refused, naming it"
# 7. step 1 would train again under step 3's checkpoint (one more SFT step): no step-3 setting
#    changed, but the policy would continue from weights trained on the old step-1 model while the
#    reference is the new one. Refused by step 1, naming the change, before it trains and replaces
#    its output (step 3 refused it only after step 1 had overwritten sft.bin).
cp -r "$out/a" "$out/g"
sum_before=$(cksum < "$out/g/sft.bin")
refused g1 "a retrained step-1 model" \
  "node 'sft': step 3 has a checkpoint in .* and this step would train again (its settings changed: steps 6 -> 7)" \
  "$out/g" --set node.sft.steps=7
grep -q "\[step 1 sft\] step 1/" "$out/g1.log" && fail "step 1 trained before the refusal"
[ "$(cksum < "$out/g/sft.bin")" = "$sum_before" ] || fail "the refused run replaced sft.bin"
# without step 1's done marker (nothing says it finished here) it trains again; the policy's own check
# of the weights it gets then refuses the resume
rm "$out/g/ckpt/sft.done.json"
refused g2 "a retrained step-1 model (no done marker)" \
  "continues from other initial weights than the model this node got now" "$out/g" --set node.sft.steps=7
echo "step 1 would train again: refused before training, sft.bin kept; without its marker the policy refuses"
# 7b. settings that change nothing trained (printing, the ZeRO stage, the checkpoint schedule): steps 1-2
#     take their outputs, step 3 resumes (they were in the done marker's fingerprint: refused)
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/a") --set node.sft.print_every=3 --set node.sft.zero_stage=2 \
  --set node.rm.keep_checkpoints=3 --set node.rm.gradient_checkpointing=true > "$out/g3.log" 2> "$out/g3.err" ||
  fail "a rerun with only safe settings changed failed: $(grep -i error "$out/g3.err" | head -2)"
for step in "step 1 sft" "step 2 rm"; do
  grep -q "^\[$step\] resumed: " "$out/g3.log" || fail "$step trained again for a change of print_every or zero_stage"
done
echo "safe settings changed: steps 1-2 taken as saved"
# 8. the same command with the asset folder spelled another way (a symbolic link to it, as
#    ../shared/assets is from another working directory): the same files, so steps 1-2 are not
#    redone and step 3 resumes (the settings records hold paths with their links resolved)
assets=
for a in "${FLOWRUN_ASSETS:-}" ../shared/assets "$root/../shared/assets"; do  # assets_root()'s order
  [ -n "$a" ] && [ -e "$a/README.md" ] && assets=$(readlink -f "$a") && break
done
[ -n "$assets" ] || fail "no asset folder: set FLOWRUN_ASSETS (default ../shared/assets)"
ln -sfn "$assets" "$out/assets_link"
FLOWRUN_ASSETS="$out/assets_link" "$flowrun" "$root/graphs/rlhf.graph" $(args "$out/a") > "$out/h1.log" 2> "$out/h1.err" ||
  fail "the same run through a linked asset folder was refused: $(grep -i error "$out/h1.err" | head -2)"
for step in "step 1 sft" "step 2 rm"; do
  grep -q "^\[$step\] resumed: " "$out/h1.log" || fail "$step was trained again through the linked asset folder"
done
echo "the asset folder through a link: steps 1-2 kept, step 3 resumed"
# 9. the last iteration is committed whatever save_checkpoint_steps is: a finished run of 7 iterations (at 2)
#    resumes after iteration 6, trains nothing and prints the held-out figures again (it resumed after
#    iteration 5 and trained iteration 6 again)
cp -r "$out/a" "$out/k"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/k") --set node.prompts.iterations=7 > "$out/k1.log" 2> "$out/k1.err" ||
  { tail -5 "$out/k1.err"; fail "the 7-iteration run failed"; }
grep -q "checkpoint after iteration 6 " "$out/k1.log" || fail "the last iteration (6) was not committed: $(grep checkpoint "$out/k1.log")"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/k") --set node.prompts.iterations=7 > "$out/k2.log" 2> "$out/k2.err" ||
  { tail -5 "$out/k2.err"; fail "the finished run's rerun failed"; }
grep -q "resuming after iteration 6 " "$out/k2.log" || fail "the finished run did not resume after its last iteration"
grep -q " iter [0-9]* reward" "$out/k2.log" && fail "the finished run trained again"
grep -q "held-out after" "$out/k2.log" || fail "the finished run did not print its held-out figures again"
echo "a finished run of 7 iterations at save_checkpoint_steps 2: committed after its last, resumed there"
echo "ppo_resume_small: ok"
