#!/usr/bin/env bash
# graphs/dpo.graph with small settings, from stories260K itself (the graph's own start is
# sft.graph's output): the data summary, the held-out lines before and after print, and the
# trained policy is written and reloads; a SIGKILL after a checkpoint resumes to the same lines
# and the same model (the reference stays the starting model); a dataset of identical pairs is refused.
set -euo pipefail
bg=
trap '[ -z "$bg" ] || kill -9 $bg 2>/dev/null || true' EXIT  # never leave a run behind
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
"$flowrun" "$root/graphs/dpo.graph" --no-progress --set node.dpo.model=model/stories260K/stories260K.bin \
  --set node.dpo.steps=4 --set node.dpo.print_every=2 --set node.dpo.output="$out/dpo.bin" \
  --set node.dpo.verify_output=true --metrics "$out/m.jsonl" --metrics-interval 1 > "$out/log" 2> "$out/err" ||
  { echo "flowrun failed:"; tail -20 "$out/err"; exit 1; }
cat "$out/log"
# the line of step 4 (print_every 2) gives every figure as its mean over steps 3 and 4, the rewards too
# (they were step 4's alone beside the others' means), and TRL's rewards/margins is a signal
python3 - "$out/m.jsonl" "$out/log" <<'PY' || exit 1
import json, re, sys
sig = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("node") == "dpo" and "signal" in r and r.get("step") in (3, 4):
        sig.setdefault(r["signal"], {})[r["step"]] = r["value"]
mean = lambda k: (sig[k][3] + sig[k][4]) / 2
m = re.search(r"step 4/4 loss ([-0-9.]+) acc ([0-9.]+) rewards chosen ([-0-9.]+) rejected ([-0-9.]+)", open(sys.argv[2]).read())
assert m, "no step 4/4 line"
for got, key, digits in zip(m.groups(), ["loss", "accuracy", "rewards/chosen", "rewards/rejected"], [4, 3, 3, 3]):
    assert abs(float(got) - mean(key)) <= 0.6 * 10 ** -digits, f"{key}: the line says {got}, the mean of steps 3-4 is {mean(key)}"
for s in (3, 4):
    assert abs(sig["rewards/margins"][s] - (sig["rewards/chosen"][s] - sig["rewards/rejected"][s])) < 1e-9, "margins"
print("  the step 4 line is the mean of steps 3 and 4; rewards/margins = chosen - rejected")
PY
for want in "step 2 dpo\] train pairs: 830 of 830 examples" \
            "step 2 dpo\] 830 train / 92 held-out pairs; held-out preference accuracy 0.000 ± 0.000, log-prob accuracy" \
            "step 2 dpo\] step 4/4 loss" "step 2 dpo\] held-out preference accuracy .* after" \
            "step 2 dpo\] saved .*dpo.bin as a llama2.c file; reloaded: max |output difference| 0"; do
  grep -q "$want" "$out/log" || { echo "missing in the output: $want"; exit 1; }
done
test -s "$out/dpo.bin" || { echo "no model written at $out/dpo.bin"; exit 1; }
# SIGKILL after the checkpoint of update 4 of 8, then the same command: updates 5-8 and the model as uninterrupted
small=(--no-progress --set node.dpo.model=model/stories260K/stories260K.bin --set node.dpo.steps=8
       --set node.dpo.print_every=1 --set graph.checkpoint_dir="$out/ck" --set node.dpo.save_checkpoint_steps=4)
"$flowrun" "$root/graphs/dpo.graph" "${small[@]}" --set node.dpo.save_checkpoint_steps=0 \
  --set node.dpo.output="$out/ref.bin" > "$out/ref.log" 2> "$out/ref.err" || { tail -5 "$out/ref.err"; exit 1; }
"$flowrun" "$root/graphs/dpo.graph" "${small[@]}" --set node.dpo.output="$out/res.bin" > "$out/a.log" 2> "$out/a.err" &
bg=$!
until grep -q "checkpoint at update 4" "$out/a.log" 2>/dev/null; do
  kill -0 $bg 2>/dev/null || { echo "the run ended before its checkpoint"; tail -5 "$out/a.err"; exit 1; }
  sleep 0.05
done
kill -9 $bg && wait $bg 2>/dev/null || true
bg=
test ! -e "$out/res.bin" || { echo "the killed run had already finished"; exit 1; }
"$flowrun" "$root/graphs/dpo.graph" "${small[@]}" --set node.dpo.output="$out/res.bin" > "$out/b.log" 2> "$out/b.err" ||
  { tail -5 "$out/b.err"; exit 1; }
grep -q "resumed at update 4 of 8" "$out/b.log" || { echo "no resume line"; cat "$out/b.log"; exit 1; }
strip() { grep -E "step [5-8]/8|held-out .* after" "$1" | sed -E 's/; [0-9.]+ s$//'; }
[ "$(strip "$out/b.log" | wc -l)" -eq 5 ] || { echo "the resumed run did not print updates 5-8 and its result"; exit 1; }
diff <(strip "$out/ref.log") <(strip "$out/b.log") || { echo "the resumed lines differ"; exit 1; }
cmp "$out/ref.bin" "$out/res.bin" || { echo "the resumed model differs"; exit 1; }
# bad input: pairs whose chosen equals rejected are skipped; when every pair is, the run stops naming the file
for i in $(seq 1 40); do
  echo "{\"prompt\": \"\\n\\nHuman: question $i\\n\\nAssistant:\", \"chosen\": \" answer $i\", \"rejected\": \" answer $i\"}"
done > "$out/same.jsonl"
if "$flowrun" "$root/graphs/dpo.graph" --no-progress --set node.dpo.model=model/stories260K/stories260K.bin \
     --set node.dpo.data="$out/same.jsonl" --set node.dpo.output="$out/none.bin" > "$out/log2" 2> "$out/err2"; then
  echo "a dataset whose pairs are all identical was accepted"; exit 1
fi
grep -q "identical after tokenization (skipped: chosen = rejected)" "$out/log2" || { echo "no skip count:"; cat "$out/log2"; exit 1; }
grep -q "every one of the .* training pairs of .*same.jsonl has chosen equal to rejected" "$out/err2" ||
  { echo "the error does not name the file:"; tail -5 "$out/err2"; exit 1; }
# the reward model too (it trained at loss log 2 and accuracy 0 to the end, exit 0), before any held-out pass
if "$flowrun" "$root/graphs/rm.graph" --no-progress --set node.rm.data="$out/same.jsonl" --set node.rm.steps=3 \
     --set node.rm.output="$out/none_rm" > "$out/log3" 2> "$out/err3"; then
  echo "rm_trainer accepted a dataset whose pairs are all identical"; exit 1
fi
grep -q "node 'rm': every one of the .* training pairs of .*same.jsonl has chosen equal to rejected" "$out/err3" ||
  { echo "rm_trainer's error does not name the node and the file:"; tail -5 "$out/err3"; exit 1; }
grep -q "held-out" "$out/log3" && { echo "rm_trainer evaluated before refusing"; exit 1; }
# a mix_data file without pairs is named (the error named the data file, whose rows were fine)
for i in $(seq 1 40); do echo "{\"prompt\": \"\\n\\nHuman: q $i\\n\\nAssistant:\", \"chosen\": \" a $i\"}"; done > "$out/pc.jsonl"
if "$flowrun" "$root/graphs/rm.graph" --no-progress --set "node.rm.mix_data=[\"$out/pc.jsonl\"]" --set node.rm.steps=2 \
     --set node.rm.output="$out/none_rm2" > "$out/log4" 2> "$out/err4"; then
  echo "rm_trainer accepted a mix_data file without pairs"; exit 1
fi
grep -qF "node 'rm': mix_data file $out/pc.jsonl holds prompt/chosen rows" "$out/err4" ||
  { echo "the error does not name the mix_data file:"; tail -5 "$out/err4"; exit 1; }
# a second Ctrl-C during a long held-out pass (2,000 pairs) stops the run at once with 130 (it ran the
# whole pass first): the pass gives up at its next batch. Since 2026-12-07 the first one does too, the pass being
# the one before training (a drain has nothing of it to keep): the second may find the run gone
"$flowrun" "$root/graphs/rm.graph" --no-progress --set node.rm.steps=5 --set node.rm.eval_fraction=0.9 \
  --set node.rm.data_split=0,1,0 --set node.rm.max_seq_len=256 --set node.rm.output="$out/rm_int" \
  > "$out/int.log" 2> "$out/int.err" &
pid=$!
for _ in $(seq 1 600); do grep -q "memory plan" "$out/int.err" 2>/dev/null && break; sleep 0.05; done
sleep 0.3
kill -INT $pid; sleep 0.2; kill -INT $pid 2> /dev/null || true
t0=$(date +%s%N)
set +e
wait $pid
rc=$?
set -e
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc -eq 130 ] || { tail -5 "$out/int.err"; echo "two SIGINTs in the held-out pass: exit $rc, not 130"; exit 1; }
grep -q "held-out accuracy" "$out/int.log" && { echo "the held-out pass ran to its end after two SIGINTs"; exit 1; }
[ $ms -lt 6000 ] || { echo "the run took $ms ms to stop after two SIGINTs"; exit 1; }
echo "two SIGINTs in the held-out pass: exit 130 after $ms ms"
# flowrun launch runs the graph in every process: a trainer of one replica is refused there (two copies
# trained every row and wrote one output file)
if "$flowrun" launch --nproc 2 "$root/graphs/rm.graph" --set node.rm.steps=2 --set node.rm.output="$out/rm_launch" \
     > "$out/launch.log" 2>&1; then
  echo "rm_trainer ran under flowrun launch --nproc 2"; exit 1
fi
grep -q "node 'rm' runs as one replica, and flowrun launch --nproc 2 runs the graph in every process" "$out/launch.log" ||
  { tail -5 "$out/launch.log"; echo "the launch refusal does not say why"; exit 1; }
# step 3 likewise (P loops and generators: the ranks waited for each other until comm_timeout_s, 300 s with
# nothing printed): refused when the graph is checked, naming the cluster route
launch_rc=0
timeout 120 "$flowrun" launch --nproc 2 "$root/graphs/rlhf.graph" --set graph.checkpoint_dir="$out/launch_ck" \
  --set node.sft.output="$out/launch_sft.bin" --set node.rm.output="$out/launch_rm" --set node.policy.output="$out/launch_ppo.bin" \
  > "$out/launch_ppo.log" 2>&1 || launch_rc=$?
[ -e "$out/launch_sft.bin" ] && { echo "step 1 trained under launch before the refusal"; exit 1; }
[ $launch_rc -ne 0 ] && [ $launch_rc -ne 124 ] || { tail -5 "$out/launch_ppo.log"; echo "ppo.graph under launch: exit $launch_rc"; exit 1; }
grep -q "node 'ppo_controller': flowrun launch --nproc 2 runs the whole step-3 graph in every process" "$out/launch_ppo.log" &&
  grep -q "run it as a cluster" "$out/launch_ppo.log" ||
  { tail -5 "$out/launch_ppo.log"; echo "the step-3 launch refusal does not say why"; exit 1; }
echo "dpo_small: ok"
