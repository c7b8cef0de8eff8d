#!/usr/bin/env bash
# graphs/dpo.graph with small settings, from stories260K itself (the graph's own start is
# sft.graph's output): the data summary, the held-out lines before and after print, and the
# trained policy is written and reloads.
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
"$flowrun" "$root/graphs/dpo.graph" --no-progress --set node.dpo.model=model/stories260K/stories260K.bin \
  --set node.dpo.steps=4 --set node.dpo.print_every=2 --set node.dpo.output="$out/dpo.bin" \
  --set node.dpo.verify_output=true > "$out/log" 2> "$out/err" || { echo "flowrun failed:"; tail -20 "$out/err"; exit 1; }
cat "$out/log"
for want in "step 2 dpo\] train pairs: 738 of 738 examples" \
            "step 2 dpo\] 738 train / 184 held-out pairs; held-out preference accuracy 0.000 ± 0.000, log-prob accuracy" \
            "step 2 dpo\] step 4/4 loss" "step 2 dpo\] held-out preference accuracy .* after" \
            "step 2 dpo\] saved .*dpo.bin as a llama2.c file; reloaded: max |output difference| 0"; do
  grep -q "$want" "$out/log" || { echo "missing in the output: $want"; exit 1; }
done
test -s "$out/dpo.bin" || { echo "no model written at $out/dpo.bin"; exit 1; }
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
echo "dpo_small: ok"
