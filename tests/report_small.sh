#!/usr/bin/env bash
# `flowrun report` on a real run: graphs/rlhf.graph with small settings writes --metrics (snapshot
# lines and a signal record per point); the report's SVGs are well-formed XML with a polyline per
# signal holding a point per record with a step, and REPORT.md's last reward and held-out
# before/after are the printed "[step 3 ppo]" lines' (tests/report_check.py). Then bad input:
# a non-JSON line is an error naming file:line, an empty file is refused, a non-finite value is
# skipped and counted, --signals with an unknown name is refused, and -o / --signals are obeyed.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
"$flowrun" "$root/graphs/rlhf.graph" --no-progress --set graph.checkpoint_dir="$out/checkpoints" \
  --set node.sft.steps=6 --set node.rm.steps=6 --set node.prompts.iterations=3 --set node.prompts.eval_prompts=8 \
  --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm" --set node.policy.output="$out/ppo.bin" \
  --metrics "$out/run/metrics.jsonl" --metrics-interval 1 \
  > "$out/log" 2> "$out/err" || { echo "flowrun failed:"; tail -20 "$out/err"; exit 1; }
grep "step 3 ppo\]" "$out/log"
grep -q "step 3 ppo\] iter 2 reward" "$out/log" || { echo "step 3 did not finish"; exit 1; }

# the report, beside the metrics file by default
"$flowrun" report "$out/run/metrics.jsonl" > "$out/report.out" 2> "$out/report.err" ||
  { echo "flowrun report failed:"; cat "$out/report.err"; exit 1; }
cat "$out/report.out"
for f in REPORT.md sft.svg rm.svg ppo_controller.svg; do
  [ -s "$out/run/$f" ] || { echo "flowrun report did not write $f"; exit 1; }
done
if command -v xmllint > /dev/null; then xmllint --noout "$out/run/"*.svg; fi
python3 "$root/tests/report_check.py" "$out/run/metrics.jsonl" "$out/run" "$out/log"

# -o DIR and --signals: only ppo_controller reports reward and kl, so one SVG with those two
"$flowrun" report "$out/run/metrics.jsonl" -o "$out/only" --signals reward,kl > /dev/null
ls "$out/only" | LC_ALL=C sort | tr '\n' ' ' | grep -qx "REPORT.md ppo_controller.svg " ||
  { echo "-o with --signals reward,kl wrote: $(ls "$out/only")"; exit 1; }
[ "$(grep -c "<polyline" "$out/only/ppo_controller.svg")" = 2 ] || { echo "--signals reward,kl: not 2 polylines"; exit 1; }
if "$flowrun" report "$out/run/metrics.jsonl" -o "$out/none" --signals rewrd 2> "$out/unknown.err"; then
  echo "--signals with an unknown name was accepted"; exit 1
fi
grep -q "has no signal 'rewrd'; it has: .*reward" "$out/unknown.err" || { cat "$out/unknown.err"; exit 1; }

# a line that is not JSON: the error names the file and the line, and the exit code is not 0
mkdir -p "$out/bad"
head -2 "$out/run/metrics.jsonl" > "$out/bad/m.jsonl"
echo "loss 1.5" >> "$out/bad/m.jsonl"
if "$flowrun" report "$out/bad/m.jsonl" 2> "$out/bad/err"; then echo "a non-JSON line was accepted"; exit 1; fi
grep -q "$out/bad/m.jsonl:3: not a JSON line" "$out/bad/err" || { echo "no file:line in:"; cat "$out/bad/err"; exit 1; }
[ ! -e "$out/bad/REPORT.md" ] || { echo "REPORT.md written despite the bad line"; exit 1; }
# an empty file
: > "$out/bad/empty.jsonl"
if "$flowrun" report "$out/bad/empty.jsonl" 2> "$out/bad/empty.err"; then echo "an empty file was accepted"; exit 1; fi
grep -q "empty.jsonl is empty" "$out/bad/empty.err" || { cat "$out/bad/empty.err"; exit 1; }
# non-finite values (written as null) are skipped and counted; a single point still plots
mkdir -p "$out/nan"
cat > "$out/nan/m.jsonl" << 'EOF'
{"signal":"loss","node":"sft","replica":0,"step":0,"value":2.5,"t":0.1}
{"signal":"loss","node":"sft","replica":0,"step":1,"value":null,"nonfinite":"nan","t":0.2}
{"signal":"loss","node":"sft","replica":0,"step":2,"value":null,"nonfinite":"inf","t":0.3}
EOF
"$flowrun" report "$out/nan/m.jsonl" > /dev/null 2> "$out/nan/err"
grep -q "2 non-finite signal values" "$out/nan/err" || { echo "no warning about non-finite values:"; cat "$out/nan/err"; exit 1; }
grep -q "| loss | 1 | 2.5 | 2.5 | 2.5 | 2.5 | 2.5 |  | 2 |" "$out/nan/REPORT.md" || { cat "$out/nan/REPORT.md"; exit 1; }
grep -q 'points="[0-9.]*,[0-9.]*"' "$out/nan/sft.svg" || { echo "the single point is not plotted"; exit 1; }
echo "report_small: ok"
