#!/usr/bin/env bash
# Steps 1 and 2's checkpoints (issue 17, "resume keeps the sample order"): graphs/rlhf.graph on
# the first 200 HH-RLHF rows (step 1: 36 training rows, batches of 9 = 4 updates per epoch;
# step 2: 64 pairs, batches of 8 with gradient_accumulation_steps 2 = 4 updates per epoch), each
# step over 4+ epochs, step 3 one iteration.
#   1. The uninterrupted run, without checkpoints: the reference lines and models.
#   2. SIGKILL in the middle of step 1 (checkpoints every 2 updates; before it, a second run on the same
#      checkpoint_dir is refused, naming the first), then the same command:
#      step 1 resumes at its last commit, every step-1/2 line after it equals the uninterrupted
#      run's, the saved models are byte-identical.
#   3. SIGKILL in the middle of step 2 (step 1 finished), its commit of update 6 made the newest
#      and corrupted: it is refused by name, and the one before, update 4 (exactly an epoch's
#      end), used: step 1 is not redone, step 2 resumes at update 4 and runs the remaining epochs
#      with the uninterrupted run's number of updates and lines; same model.
#   4. SIGINT during step 1 or 2: exit 130 with a line naming the last committed checkpoint; a
#      resume with another learning_rate is refused naming it; the same command resumes there.
set -Eeuo pipefail
trap 'echo "dschat_resume_small: failed at line $LINENO"' ERR
bg=
trap '[ -z "$bg" ] || kill -9 $bg 2>/dev/null || true' EXIT  # never leave a run behind
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "dschat_resume_small: $*"; exit 1; }
data="$out/hh200.jsonl"
for a in "${FLOWRUN_ASSETS:-}" ../shared/assets "$root/../shared/assets"; do  # assets_root()'s order
  [ -n "$a" ] && [ -e "$a/README.md" ] && break
done
head -n 200 "$a/data/hh-rlhf/harmless-base-test.dschat.jsonl" > "$data"
args() {  # DIR [SAVE_EVERY]: the command line of a run whose state lives in DIR
  echo --no-progress --set graph.checkpoint_dir="$1/ckpt" \
    --set node.sft.data="$data" --set node.rm.data="$data" --set node.prompts.data="$data" \
    --set node.sft.steps=18 --set node.sft.per_device_train_batch_size=9 --set node.sft.print_every=1 \
    --set node.rm.steps=24 --set node.rm.gradient_accumulation_steps=2 --set node.rm.print_every=1 \
    --set node.sft.save_checkpoint_steps="${2:-0}" --set node.rm.save_checkpoint_steps="${2:-0}" \
    --set node.sft.keep_checkpoints=20 --set node.rm.keep_checkpoints=20 \
    --set node.prompts.iterations=1 --set node.prompts.eval_prompts=4 \
    --set node.sft.output="$1/sft.bin" --set node.rm.output="$1/rm" --set node.policy.output=
}
# STEP LOG [FROM]: the step's update lines from update FROM+1 on (no timings) and its final line
lines() {
  grep -E "^\[$1\] (step [0-9]+/|held-out (loss .* ->|accuracy .* over))" "$2" |
    sed -E 's/ \([0-9]+ tokens\/s\)$//; s/[,;] [0-9.]+ s$//' |
    awk -v n="${3:-0}" '{ if ($4 == "step" && $5 + 0 <= n) next; print }'
}
run() {  # DIR NAME [SAVE_EVERY]: the run in the foreground
  "$flowrun" "$root/graphs/rlhf.graph" $(args "$1" "${3:-0}") > "$out/$2.log" 2> "$out/$2.err" ||
    { echo "run $2 failed:"; tail -20 "$out/$2.err"; exit 1; }
}
# DIR NAME SIGNAL PATTERN...: start the run with checkpoints every 2 updates, send SIGNAL once its
# log shows each PATTERN in turn (each on a line after the previous one's); leaves the exit code in $rc
run_until() {
  local dir=$1 name=$2 sig=$3
  shift 3
  "$flowrun" "$root/graphs/rlhf.graph" $(args "$dir" 2) > "$out/$name.log" 2> "$out/$name.err" &
  local pid=$! at=0 n
  bg=$pid
  for pat in "$@"; do
    n=
    local until=$((SECONDS + 120))
    while [ $SECONDS -lt $until ] && kill -0 $pid 2>/dev/null; do
      n=$(awk -v at=$at -v pat="$pat" 'NR > at && $0 ~ pat { print NR; exit }' "$out/$name.log" 2>/dev/null || true)
      [ -n "$n" ] && break
      sleep 0.02
    done
    [ -n "$n" ] || n=$(awk -v at=$at -v pat="$pat" 'NR > at && $0 ~ pat { print NR; exit }' "$out/$name.log")
    [ -n "$n" ] || fail "$name: never printed '$pat' (see $out/$name.err)"
    at=$n
  done
  kill -"$sig" $pid 2>/dev/null || true  # (it may have ended)
  [ "$sig" = STOP ] && return  # stopped, not ended: the caller kills it ($bg)
  rc=0
  wait $pid || rc=$?
  bg=
}
resumed_at() {  # STEP LOG: k of "resumed at update k of n"
  grep -oE "^\[$1\] resumed at update [0-9]+ of" "$2" | awk '{ print $7 }'
}
same() {  # STEP REF_LOG LOG FROM
  diff <(lines "$1" "$2" "$4") <(lines "$1" "$3") || fail "$1: the lines after the resume at update $4 differ"
  echo "$1: $(lines "$1" "$3" | grep -c ' step ') updates after the resume at update $4, as the uninterrupted run's"
}

# 1. uninterrupted, no checkpoints
run "$out/a" a
for s in "step 1 sft" "step 2 rm"; do
  [ "$(lines "$s" "$out/a.log" | grep -c ' step ')" = $([ "$s" = "step 1 sft" ] && echo 18 || echo 24) ] ||
    fail "$s: the uninterrupted run did not print all its updates"
done
grep -qE "^\[step (1 sft|2 rm)\] checkpoint" "$out/a.log" && fail "save_checkpoint_steps 0 saved a checkpoint"
grep -E "^\[step 1 sft\] [0-9]+ train|^\[step 2 rm\] [0-9]+ train" "$out/a.log"

# 2. SIGKILL in step 1, after its commit at update 4. Before the kill, stopped: a second run on its
#    checkpoint_dir is refused, naming it (both wrote the same .tmp names and renamed each other's)
run_until "$out/b" b1 STOP "^\\[step 1 sft\\] checkpoint at update 4 "
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/b" 2) > "$out/b_second.log" 2> "$out/b_second.err" &&
  fail "a second run on the checkpoint_dir in use was accepted"
grep -qF "[graph] checkpoint_dir '$out/b/ckpt' is in use by another flowrun run (run id " "$out/b_second.err" &&
  grep -qF ", pid $bg on host " "$out/b_second.err" ||
  fail "the second run's refusal does not name the first: $(grep -i error "$out/b_second.err" | head -2)"
echo "a second run on the same checkpoint_dir: $(grep -o "is in use by another flowrun run ([^)]*)" "$out/b_second.err" | head -1)"
kill -9 $bg
wait $bg 2>/dev/null || true
bg=
grep -q "^\[step 1 sft\] held-out loss .* ->" "$out/b1.log" && fail "killed too late (step 1 had finished)"
run "$out/b" b2 2
k=$(resumed_at "step 1 sft" "$out/b2.log")
[ -n "$k" ] && [ "$k" -ge 4 ] || fail "step 1 did not resume at update 4 or later: $(grep 'step 1' "$out/b2.log" | head -3)"
grep -m1 "^\[step 1 sft\] resumed at" "$out/b2.log"
same "step 1 sft" "$out/a.log" "$out/b2.log" "$k"
if k2=$(resumed_at "step 2 rm" "$out/b2.log") && [ -n "$k2" ]; then
  same "step 2 rm" "$out/a.log" "$out/b2.log" "$k2"
fi
cmp "$out/a/sft.bin" "$out/b/sft.bin" || fail "step 1's model after the resume differs from the uninterrupted run's"
for f in "$out"/a/rm/*; do cmp "$f" "$out/b/rm/$(basename "$f")" || fail "step 2's $(basename "$f") differs"; done
[ -e "$out/b/ckpt/sft" ] && fail "step 1's checkpoints were left after it finished"

# 3. SIGKILL in step 2 (step 1 done); resume at its commit of update 4, an epoch's end
run_until "$out/c" c1 9 "^\\[step 1 sft\\] held-out loss .* ->" "^\\[step 2 rm\\] checkpoint at update ([6-9]|1[0-9]|2[0-2]) "
grep -q "^\[step 1 sft\] held-out loss .* ->" "$out/c1.log" || fail "step 1 had not finished when step 2 committed"
grep -q "^\[step 2 rm\] held-out accuracy .* over" "$out/c1.log" && fail "killed too late (step 2 had finished)"
# the commit of update 6 made the newest, one byte of its tensors flipped: refused by name, and
# the one before it, update 4, used
echo "step_00000006" > "$out/c/ckpt/rm/latest"
shard=$(ls "$out/c/ckpt/rm/step_00000006"/*.safetensors)
python3 -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(-5, 2); b = f.read(1); f.seek(-5, 2); f.write(bytes([b[0] ^ 0xff]))" "$shard"
run "$out/c" c2 2
grep "^\[step 2 rm\] checkpoint refused: " "$out/c2.log" | grep -qF "$shard is corrupt (CRC-32" ||
  fail "the corrupt step-2 checkpoint was not refused by name: $(grep 'step 2 rm' "$out/c2.log" | head -2)"
echo "refused: $(basename "$shard") of step_00000006 (CRC-32)"
grep -q "^\[step 1 sft\] resumed: " "$out/c2.log" || fail "step 1 was trained again after the crash in step 2"
[ "$(resumed_at "step 2 rm" "$out/c2.log")" = 4 ] || fail "step 2 did not resume at update 4: $(grep 'step 2' "$out/c2.log" | head -3)"
same "step 2 rm" "$out/a.log" "$out/c2.log" 4
[ "$(lines "step 2 rm" "$out/c2.log" | grep -c ' step ')" = 20 ] || fail "step 2 did not run 20 updates after update 4"
for f in "$out"/a/rm/*; do cmp "$f" "$out/c/rm/$(basename "$f")" || fail "step 2's $(basename "$f") differs"; done

# 4. SIGINT once step 1 has committed (the runtime stops at its next check: in step 1 or 2); step 3, not
#    begun, says nothing of what it kept (it said "no checkpoint was saved ... set [graph] checkpoint_dir").
#    Once step 1 has finished, step 3's generator and policy start on its model while step 2 trains: a
#    SIGINT that lands in step 2 then finds step 3 begun, and its only true line is that it kept nothing
run_until "$out/d" d1 INT "^\\[step 1 sft\\] checkpoint at update 2 "
[ $rc -eq 130 ] || fail "SIGINT: exit code $rc, not 130"
line=$(grep -E "^\[step (1 sft|2 rm)\] interrupted at update" "$out/d1.log" | head -1) ||
  fail "SIGINT: no line saying what was kept: $(tail -3 "$out/d1.log")"
echo "$line"
s=$(echo "$line" | grep -oE "^\[step (1 sft|2 rm)\]" | tr -d '[]') node=$(echo "$line" | awk '{ print $3 }' | tr -d ']')
echo "$line" | grep -qE "the last committed checkpoint is $out/d/ckpt/$node/step_[0-9]+; the same command resumes there" ||
  fail "SIGINT: the line names no checkpoint of $node"
if l3=$(grep "^\[step 3 ppo\] interrupted" "$out/d1.log"); then
  grep -q "^\[step 1 sft\] held-out loss .* ->" "$out/d1.log" ||
    fail "SIGINT in $s: step 3, which had not begun (step 1 had not finished), said what it kept: $l3"
  [[ $l3 == "[step 3 ppo] interrupted before step 3's first commit in $out/d/ckpt: nothing of step 3 is kept"* ]] ||
    fail "SIGINT in $s after step 1 finished: step 3, which had committed nothing, said: $l3"
  echo "step 3 had begun on step 1's model: $l3"
fi
kept=$(echo "$line" | grep -oE "step_[0-9]+" | sed -E 's/step_0*//')
rc=0
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/d" 2) --set node.$node.learning_rate=2e-3 > "$out/d2.log" 2> "$out/d2.err" ||
  rc=$?
[ $rc -ne 0 ] || fail "a resume with another learning_rate was accepted"
grep -qE "resuming from .*$node/step_[0-9]+ with settings changed: learning_rate 0.001 -> 0.002; set them back" \
  "$out/d2.err" || fail "the refusal does not name learning_rate: $(grep -i error "$out/d2.err" | head -2)"
echo "$s: learning_rate 0.001 -> 0.002 refused"
run "$out/d" d3 2
[ "$(resumed_at "$s" "$out/d3.log")" = "$kept" ] || fail "after SIGINT $s did not resume at update $kept"
same "$s" "$out/a.log" "$out/d3.log" "$kept"
cmp "$out/a/sft.bin" "$out/d/sft.bin" || fail "step 1's model after SIGINT and resume differs"
for f in "$out"/a/rm/*; do cmp "$f" "$out/d/rm/$(basename "$f")" || fail "step 2's $(basename "$f") differs"; done

# 5. a finished run with LoRA in step 1 (its llama2.c output holds the merged weights, which reload within
#    rounding only): the same command again takes step 1 from the exact copy of its trained tensors that
#    the done marker names, trains nothing, and step 3 finds the initial weights it committed with
lora=(--set node.sft.lora_dim=4 --set node.ppo_controller.save_checkpoint_steps=1 --set node.sft.steps=4
      --set node.rm.steps=4)
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/e") "${lora[@]}" > "$out/e1.log" 2> "$out/e1.err" ||
  { tail -20 "$out/e1.err"; fail "the LoRA run failed"; }
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/e") "${lora[@]}" > "$out/e2.log" 2> "$out/e2.err" ||
  { tail -20 "$out/e2.err"; fail "the rerun of the finished LoRA run failed"; }
grep -q "^\[step 1 sft\] resumed: " "$out/e2.log" || fail "the rerun trained the LoRA step 1 again"
grep -q "^\[step 1 sft\] step " "$out/e2.log" && fail "the rerun printed step 1 updates"
grep -q "held-out mean reward" "$out/e2.log" || fail "the rerun did not print step 3's results"
echo "LoRA step 1: not trained again on the rerun ($(grep -c 'resumed:' "$out/e2.log") steps taken as saved)"
# an output replaced since (here by the base model) is not taken for the trained one: step 1 trains again,
# to the same weights, so step 3 still finds the weights it committed with
cp "$a/model/stories260K/stories260K.bin" "$out/e/sft.bin"
"$flowrun" "$root/graphs/rlhf.graph" $(args "$out/e") "${lora[@]}" > "$out/e3.log" 2> "$out/e3.err" ||
  { tail -20 "$out/e3.err"; fail "the rerun after the output was replaced failed"; }
grep -q "^\[step 1 sft\] resumed: " "$out/e3.log" && fail "a replaced step-1 output was taken as the trained model"
grep -q "node 'sft': $out/e/sft.bin changed since the run that wrote it" "$out/e3.err" ||
  { grep -i warn "$out/e3.err" | head -3; fail "no line says the output changed"; }
grep -q "held-out mean reward" "$out/e3.log" || fail "step 3 did not print its results after step 1 trained again"
# 5. a trainer without an output keeps nothing to load: with a checkpoint_dir, its run says that a rerun trains it
#    again, and how not to (grpo.graph's sft node had no output, and each resume retrained it without a word)
"$flowrun" "$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir="$out/noout/ckpt" --set node.sft.data="$data" \
  --set node.sft.steps=2 --set node.sft.output= > "$out/noout.log" 2> "$out/noout.err" ||
  { tail -5 "$out/noout.err"; fail "the step-1 run without an output failed"; }
grep -q "\[step 1 sft\] has no output: a rerun of this graph (a resume from $out/noout/ckpt) trains it again; set the node's output" \
  "$out/noout.err" || fail "a step-1 run without an output, with a checkpoint_dir, did not say that a rerun trains again"
# 6. SIGTERM (a scheduler's preemption) before the first scheduled checkpoint, and SIGINT with no
#    save_checkpoint_steps: the drain commits the update it stopped at, the line names that commit, and the same
#    command resumes after it. Before, both said "interrupted ... before its first checkpoint" (or "no checkpoint
#    was saved") and the rerun trained the step again from update 0.
f6=("$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir="$out/f/ckpt" --set node.sft.data="$data"
    --set node.sft.steps=400 --set node.sft.print_every=1 --set node.sft.output="$out/f/sft.bin")
drained_at() {  # NAME SIGNAL EXIT_CODE SAVE_EVERY: sets $drained, the update the drain committed, checked
  "$flowrun" "${f6[@]}" --set node.sft.save_checkpoint_steps="$4" > "$out/$1.log" 2> "$out/$1.err" &
  bg=$!
  for _ in $(seq 1 1200); do  # three updates printed by this run
    [ "$(grep -c "^\[step 1 sft\] step " "$out/$1.log" 2>/dev/null)" -ge 3 ] && break
    sleep 0.05
  done
  kill -"$2" $bg
  local rc=0
  wait $bg || rc=$?
  bg=
  [ $rc -eq "$3" ] || fail "$1: SIG$2 exit code $rc, not $3: $(tail -2 "$out/$1.err")"
  local k
  k=$(grep -oE "^\[step 1 sft\] stopping at update [0-9]+ of 400: committing it$" "$out/$1.log" | awk '{ print $7 }')
  [ -n "$k" ] || fail "$1: SIG$2 committed nothing: $(grep -E 'interrupted|checkpoint' "$out/$1.log")"
  grep -q "^\[step 1 sft\] step $k/400" "$out/$1.log" || fail "$1: the commit of update $k, never printed as trained"
  grep -q "^\[step 1 sft\] step $((k + 1))/400" "$out/$1.log" && fail "$1: update $((k + 1)) trained after the commit"
  local d
  d=$(printf "%s/f/ckpt/sft/step_%08d" "$out" "$k")
  grep -qxF "[step 1 sft] interrupted at update $k of 400: the last committed checkpoint is $d; the same command resumes there" \
    "$out/$1.log" || fail "$1: the line after the drain's commit: $(grep interrupted "$out/$1.log")"
  drained=$k
}
drained_at f1 TERM 143 300
k=$drained
echo "SIGTERM at update $k of 400 (checkpoints every 300): committed, exit 143"
drained_at f2 INT 130 0  # the resumed run, interrupted again: no save_checkpoint_steps, still committed
k2=$drained
grep -q "^\[step 1 sft\] resumed at update $k of 400 from $out/f/ckpt/sft/step_" "$out/f2.log" ||
  fail "after SIGTERM at update $k the same command did not resume there: $(grep -m1 resum "$out/f2.log")"
grep -q "^\[step 1 sft\] step $((k + 1))/400" "$out/f2.log" || fail "the resume's first update is not $((k + 1))"
[ "$k2" -gt "$k" ] || fail "the second drain committed update $k2, not after $k"
# the updates after the drain's commit are the uninterrupted run's (its first k2 updates, no checkpoints)
"$flowrun" "${f6[@]}" --set graph.checkpoint_dir= --set node.sft.output= > "$out/f0.log" 2> "$out/f0.err" &
bg=$!
for _ in $(seq 1 1200); do grep -q "^\[step 1 sft\] step $k2/400" "$out/f0.log" && break; sleep 0.05; done
kill -9 $bg; wait $bg 2>/dev/null || true
bg=
diff <(lines "step 1 sft" "$out/f2.log") <(lines "step 1 sft" "$out/f0.log" "$k" | head -n $((k2 - k))) ||
  fail "the updates after the drain's commit of update $k differ from the uninterrupted run's"
echo "resumed at update $k (updates $((k + 1))-$k2 as the uninterrupted run's); SIGINT at update $k2 with save_checkpoint_steps 0: committed, exit 130"
# 6b. the drain at the step's last updates: the commit is of the update it stopped at, the last one included (its
#     held-out pass and output not yet made: the drain committed nothing, and the rerun trained the step again), and
#     the resume ends the step with the uninterrupted run's output, byte for byte
l6=("$root/graphs/sft.graph" --no-progress --set node.sft.data="$data" --set node.sft.steps=12 --set node.sft.print_every=1)
"$flowrun" "${l6[@]}" --set graph.checkpoint_dir= --set node.sft.output="$out/l6_ref.bin" > "$out/l6_ref.log" 2>&1 ||
  fail "the 12-update reference run failed: $(tail -2 "$out/l6_ref.log")"
"$flowrun" "${l6[@]}" --set graph.checkpoint_dir="$out/l6/ckpt" --set node.sft.output="$out/l6/sft.bin" \
  > "$out/l6_1.log" 2> "$out/l6_1.err" &
bg=$!
for _ in $(seq 1 1200); do grep -q "^\[step 1 sft\] step 11/12" "$out/l6_1.log" 2>/dev/null && break; sleep 0.01; done
kill -TERM $bg 2>/dev/null || true  # (the step may have ended: said below)
rc=0; wait $bg || rc=$?
bg=
k=$(sed -n 's/^\[step 1 sft\] stopping at update \([0-9]*\) of 12: committing it$/\1/p' "$out/l6_1.log")
if [ -z "$k" ]; then  # the signal came after the last update's held-out pass began: the step ended as a whole
  grep -q "^\[step 1 sft\] held-out loss .* ->" "$out/l6_1.log" ||
    fail "SIGTERM at update 11-12 of 12 committed nothing and did not end the step: $(grep interrupted "$out/l6_1.log")"
  echo "SIGTERM at the end of step 1: it had ended (exit $rc)"
else
  [ $rc -eq 143 ] || fail "SIGTERM at update $k of 12: exit $rc, not 143"
  [[ -e "$out/l6/sft.bin" ]] && fail "an interrupted step wrote its output"
  "$flowrun" "${l6[@]}" --set graph.checkpoint_dir="$out/l6/ckpt" --set node.sft.output="$out/l6/sft.bin" \
    > "$out/l6_2.log" 2>&1 || fail "the resume after SIGTERM at update $k of 12 failed: $(tail -2 "$out/l6_2.log")"
  grep -q "^\[step 1 sft\] resumed at update $k of 12" "$out/l6_2.log" || fail "not resumed at update $k of 12"
  cmp "$out/l6_ref.bin" "$out/l6/sft.bin" || fail "the step resumed at update $k of 12 saved another model"
  echo "SIGTERM at update $k of 12: committed (exit 143); the resume saved the uninterrupted run's model"
fi
# 6c. a drain in the held-out pass before training (nothing trained yet) stops the pass at its next batch: it went on
#     to the pass's end (a minute on a large held-out share), past a scheduler's grace before its SIGKILL
"$flowrun" "$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir="$out/h6/ckpt" \
  --set node.sft.data="$a/data/hh-rlhf/harmless-base-test.dschat.jsonl" --set node.sft.data_split=10,0,0 \
  --set node.sft.eval_fraction=0.5 --set node.sft.steps=4 --set node.sft.output="$out/h6/sft.bin" \
  > "$out/h6.log" 2> "$out/h6.err" &
bg=$!
for _ in $(seq 1 3000); do grep -q "memory plan" "$out/h6.err" 2>/dev/null && break; sleep 0.01; done
kill -TERM $bg
t0=$SECONDS rc=0
wait $bg || rc=$?
bg=
[ $rc -eq 143 ] || fail "SIGTERM in the held-out pass before training: exit $rc, not 143: $(tail -2 "$out/h6.err")"
grep -qxF "[step 1 sft] interrupted in the held-out pass before training: nothing was trained; the same command trains this step" \
  "$out/h6.log" || fail "SIGTERM in the held-out pass before training: $(cat "$out/h6.log")"
grep -q "held-out loss" "$out/h6.log" && fail "the held-out pass before training ran to its end in a drain"
(( SECONDS - t0 <= 10 )) || fail "the drain in the held-out pass took $((SECONDS - t0)) s"
echo "SIGTERM in the held-out pass before training (half of 2,307 rows held out): stopped in $((SECONDS - t0)) s, exit 143"
# 6d. the same with sft and rm both in their pass (rlhf.graph): on 2 cores every CAF worker is inside one, and the
#     coordinator's drain waited for a free worker: both passes ran to their end and step 1 trained its updates
#     before the drain began. The replicas now see the signal at once (actor::interrupt)
h7=(--set node.sft.data_split=4,4,2 --set node.rm.data_split=4,4,2 --set node.prompts.data_split=4,4,2
    --set node.sft.eval_fraction=0.8 --set node.rm.eval_fraction=0.8 --set node.prompts.eval_fraction=0.8)
for n in sft rm prompts; do h7+=(--set "node.$n.data=$a/data/hh-rlhf/harmless-base-test.dschat.jsonl"); done
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set graph.checkpoint_dir="$out/h7/ckpt" "${h7[@]}" \
  --set node.sft.steps=4 --set node.rm.steps=4 --set node.sft.output="$out/h7/sft.bin" --set node.rm.output="$out/h7/rm" \
  --set node.policy.output="$out/h7/ppo.bin" > "$out/h7.log" 2> "$out/h7.err" &
bg=$!
for _ in $(seq 1 3000); do [ "$(grep -c "memory plan" "$out/h7.err" 2>/dev/null)" -ge 2 ] && break; sleep 0.01; done
kill -TERM $bg
rc=0
wait $bg || rc=$?
bg=
[ $rc -eq 143 ] || fail "SIGTERM in both held-out passes: exit $rc, not 143: $(tail -2 "$out/h7.err")"
for t in "step 1 sft" "step 2 rm"; do
  grep -qxF "[$t] interrupted in the held-out pass before training: nothing was trained; the same command trains this step" \
    "$out/h7.log" || fail "SIGTERM in both held-out passes: [$t] did not stop in its pass: $(grep -F "[$t]" "$out/h7.log" | tail -2)"
done
echo "SIGTERM with sft and rm both in their held-out pass (80% of their shares): both stopped in it, exit 143"
# 7. save_lora failing after the output (here its .tmp name taken by a folder; a full disk did it): no done marker
#    is written, so the same command resumes at the last checkpoint and writes the adapter. The marker came first:
#    every rerun said "training skipped" with exit 0 and the adapter was never written.
mkdir -p "$out/g7/ad/adapter_model.safetensors.tmp"
g7=("$root/graphs/sft.graph" --no-progress --set graph.checkpoint_dir="$out/g7/ck" --set node.sft.data="$data"
    --set node.sft.steps=6 --set node.sft.save_checkpoint_steps=2 --set node.sft.lora_dim=4
    --set node.sft.only_optimize_lora=true --set node.sft.save_lora="$out/g7/ad" --set node.sft.output="$out/g7/sft.bin")
"$flowrun" "${g7[@]}" > "$out/g7_1.log" 2>&1 && fail "save_lora into a taken .tmp name succeeded"
grep -q "adapter_model.safetensors.tmp: cannot create" "$out/g7_1.log" || fail "the failed adapter save: $(tail -1 "$out/g7_1.log")"
[[ -e "$out/g7/ck/sft.done.json" ]] && fail "a done marker was written before save_lora"
rmdir "$out/g7/ad/adapter_model.safetensors.tmp"
"$flowrun" "${g7[@]}" > "$out/g7_2.log" 2>&1 || fail "the rerun after the failed adapter save: $(tail -2 "$out/g7_2.log")"
grep -q "^\[step 1 sft\] resumed at update 4 of 6" "$out/g7_2.log" || fail "the rerun did not resume: $(grep -m1 resum "$out/g7_2.log")"
[[ -f "$out/g7/ad/adapter_model.safetensors" && -f "$out/g7/ck/sft.done.json" ]] || fail "the rerun wrote no adapter or marker"
[[ -e "$out/g7/ck/sft" ]] && fail "the finished step's mid-run checkpoints were kept"
echo "save_lora failed after the output: the rerun resumed at update 4 and wrote the adapter"
# a finished step's checkpoint folder that a stopped run left (between its done marker and their removal) is
# removed by the rerun that takes the output as saved (step 3 read such a folder as its own trainer's)
mkdir -p "$out/g7/ck/sft/step_00000002" && echo step_00000002 > "$out/g7/ck/sft/latest"
"$flowrun" "${g7[@]}" > "$out/g7_3.log" 2>&1 || fail "the third run: $(tail -2 "$out/g7_3.log")"
grep -q "^\[step 1 sft\] resumed: " "$out/g7_3.log" || fail "the third run trained again"
[[ -e "$out/g7/ck/sft" ]] && fail "the left step-1 checkpoint folder was kept"
echo "a finished step's left checkpoint folder: removed by the rerun"
# the adapter removed after the run: the rerun, which trains nothing, writes it again from the trained tensors (it
# checked only the merged output, and exited 0 without the adapter); byte for byte the run's
cp "$out/g7/ad/adapter_model.safetensors" "$out/g7_adapter.safetensors"
rm -rf "$out/g7/ad"
"$flowrun" "${g7[@]}" > "$out/g7_4.log" 2>&1 || fail "the rerun without the adapter: $(tail -2 "$out/g7_4.log")"
grep -q "^\[step 1 sft\] resumed: " "$out/g7_4.log" || fail "the rerun without the adapter trained again"
grep -q "(it was missing: written from the trained weights)" "$out/g7_4.log" || fail "the missing adapter was not written"
cmp "$out/g7/ad/adapter_model.safetensors" "$out/g7_adapter.safetensors" || fail "the rewritten adapter differs"
# a folder of the node's name that holds a step-3 trainer's checkpoints (another graph's trainer of the same name on
# this checkpoint_dir: here part 5's policy's) is left, and said (the rerun removed it whatever it held)
[[ -d "$out/e/ckpt/policy" ]] || fail "part 5 left no step-3 policy checkpoint to copy"
cp -r "$out/e/ckpt/policy" "$out/g7/ck/sft"
"$flowrun" "${g7[@]}" > "$out/g7_5.log" 2>&1 || fail "the rerun beside a foreign folder: $(tail -2 "$out/g7_5.log")"
diff -r "$out/e/ckpt/policy" "$out/g7/ck/sft" > /dev/null || fail "a step-3 trainer's folder of the node's name was removed"
grep -q "holds a step-3 trainer's checkpoints" "$out/g7_5.log" || fail "the step-3 folder was not said"
echo "the adapter removed after the run: written again (the same bytes); a foreign folder of the node's name: left"
# a stopped step 1's checkpoint as a model (DeepSpeed's zero_to_fp32.py): convert --from zero of the step-10 checkpoint
# of a long run killed later is, byte for byte, the output of the same run given 10 steps (a constant LR: one
# schedule for both), its lora_dim adapter merged as the trainer merges it; generate --zero_checkpoint reads it too.
# A reward model's checkpoint (a v_head) is refused, naming its output.
echo "== convert --from zero and generate --zero_checkpoint of a stopped SFT run; a reward model's refused"
zs=("$root/graphs/sft.graph" --no-progress -q --set node.sft.lr_scheduler_type=constant --set node.sft.lora_dim=4)
"$flowrun" "${zs[@]}" --set graph.checkpoint_dir="$out/z/a" --set node.sft.steps=10 --set node.sft.output="$out/z/a.bin" \
  > "$out/z_a.log" 2>&1 || fail "the 10-step SFT run: $(tail -2 "$out/z_a.log")"
zlong() {  # zlong GRAPH NAME ARGS...: a long run of NAME, killed once its step-10 checkpoint is committed
  local graph=$1 name=$2; shift 2
  "$flowrun" "$graph" --no-progress -q --set graph.checkpoint_dir="$out/z/$name" --set node.$name.save_checkpoint_steps=10 \
    --set node.$name.keep_checkpoints=100000 \
    "$@" > "$out/z_$name.log" 2>&1 &
  local pid=$!
  # (every checkpoint kept: the step-10 one stays however many follow before the kill)
  for _ in $(seq 1 1200); do [[ -f "$out/z/$name/$name/latest" ]] && break; sleep 0.05; done
  kill -9 $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  [[ -f "$out/z/$name/$name/step_00000010/shard_00000-of-00001.msgpack" ]] || fail "$name: no step-10 checkpoint"
}
zlong "${zs[0]}" sft "${zs[@]:1}" --set node.sft.steps=100000 --set node.sft.output="$out/z/b.bin"
"$flowrun" convert --from zero "$out/z/sft/sft/step_00000010" --to llama2c "$out/z/conv/m.bin" > "$out/z_conv.log" 2>&1 ||
  fail "convert --from zero: $(tail -2 "$out/z_conv.log")"
cmp "$out/z/a.bin" "$out/z/conv/m.bin" || fail "the consolidated step-10 checkpoint is not the 10-step run's output"
zgen() { "$flowrun" generate --prompt "Human: hi" --temperature 0 --max_new_tokens 16 "$@" 2> /dev/null; }
[[ "$(zgen --zero_checkpoint "$out/z/sft/sft/step_00000010")" == "$(zgen --model "$out/z/a.bin")" ]] ||
  fail "generate --zero_checkpoint of the SFT checkpoint is not the 10-step output's"
zlong "$root/graphs/rm.graph" rm --set node.rm.steps=100000 --set node.rm.output="$out/z/rm_out"
if "$flowrun" convert --from zero "$out/z/rm/rm" --to hf "$out/z/rm_hf" > "$out/z_rm.log" 2>&1; then
  fail "a reward model's checkpoint was converted to a language model"
fi
grep -q "is a value model's checkpoint (a reward model or critic: it has a v_head)" "$out/z_rm.log" || fail "$(tail -1 "$out/z_rm.log")"
echo "  the step-10 checkpoint = the 10-step run's output (bytes), for convert and generate; a reward model's refused"
echo "dschat_resume_small: ok"
