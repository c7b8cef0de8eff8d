#!/usr/bin/env bash
# The progress lines of the commands that run one long loop outside a graph (tools/flowrun/progress_line.h;
# docs/console.md, "Progress and ETA"), on a pseudo-terminal made by script(1):
#  - `flowrun convert` llama2.c -> HF (4 shards) draws "[flowrun convert] save tensors k/N, X of Y ETA m:ss" for
#    every k from 1 to N - 1, N the tensors the written folder holds; HF -> llama2.c draws "load tensors k/N ..."
#    the same way; without a terminal nothing of it reaches standard error;
#  - `flowrun eval reward` draws "[flowrun eval] eval reward k/N ETA m:ss" for every batch k < N of 16 held-out
#    pairs (N from the pairs it prints), `flowrun eval prompts` "eval prompts k/3 ETA m:ss" for k = 1, 2.
# Each line is checked by its counts, never by how long anything took (the ETA is known from the first unit on).
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "progress_cli: $*"; exit 1; }
command -v script > /dev/null || fail "needs script(1) (util-linux) to run a command on a terminal"

on_tty() {  # NAME CMD...: CMD with standard output and error on a pseudo-terminal; what it drew in $out/NAME.tty
  local name=$1
  shift
  script -qefc "$(printf '%q ' "$@")" "$out/$name.tty" > /dev/null ||
    { tail -c 2000 "$out/$name.tty"; fail "$name failed on a terminal"; }
}

# LOG PREFIX LOW HIGH N [SUFFIX-REGEX]: the drawn lines "PREFIX k/N...ETA m:ss" hold every k in LOW..HIGH
drawn() {
  python3 - "$@" <<'PY' || fail "$1: not every progress line was drawn"
import re, sys
log, prefix, low, high, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
text = open(log, encoding="utf-8", errors="replace").read().replace("\x1b[K", "")
pat = re.compile(re.escape(prefix) + r" (\d+)/(\d+)\b.* ETA \d+:\d{2}$")
seen = set()
for piece in re.split(r"[\r\n]", text):
    m = pat.search(piece)
    if m:
        assert int(m.group(2)) == n, (piece, n)
        seen.add(int(m.group(1)))
want = set(range(low, high + 1))
if not want <= seen:
    print(f"{log}: '{prefix} k/{n} ... ETA m:ss' drawn for k in {sorted(seen)}, wanted {low}..{high}")
    sys.exit(1)
print(f"{log}: '{prefix} k/{n} ... ETA' drawn for k = {low}..{high}")
PY
}

# convert: llama2.c -> HF in shards of at most 300 kB, then back
on_tty convert-save "$flowrun" convert --from llama2c model/stories260K/stories260K.bin --to hf "$out/hf" \
  --max_shard_bytes 300000
n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["weight_map"]))' \
  "$out/hf/model.safetensors.index.json")
(( n > 2 )) || fail "the HF folder holds $n tensors"
drawn "$out/convert-save.tty" "[flowrun convert] save tensors" 1 $((n - 1)) "$n"
grep -q "wrote HF folder .* in [0-9.]* s" "$out/convert-save.tty" || fail "convert logged no time taken"
on_tty convert-load "$flowrun" convert --from hf "$out/hf" --to llama2c "$out/back.bin"
drawn "$out/convert-load.tty" "[flowrun convert] load tensors" 1 $((n - 1)) "$n"
# not a terminal: no progress line on standard error
"$flowrun" convert --from hf "$out/hf" --to llama2c "$out/back2.bin" > /dev/null 2> "$out/convert-plain.err"
if grep -q "tensors [0-9]" "$out/convert-plain.err"; then fail "a progress line went to a non-terminal"; fi
cmp -s "$out/back.bin" "$out/back2.bin" || fail "the two conversions differ"

# eval reward on a reward model of one update (its figures are not the point; its batches are)
"$flowrun" "$root/graphs/rm.graph" --no-progress --set node.rm.steps=1 --set node.rm.output="$out/rm" \
  > "$out/rm.log" 2> "$out/rm.err" || { tail "$out/rm.err"; fail "rm.graph failed"; }
on_tty eval-reward "$flowrun" eval reward --model "$out/rm"
pairs=$(sed -n 's/.*held-out pairs \([0-9]*\): accuracy.*/\1/p' "$out/eval-reward.tty" | head -1)
[[ -n "$pairs" ]] || fail "eval reward printed no held-out pairs"
batches=$(( (pairs + 15) / 16 ))
(( batches > 2 )) || fail "only $batches batches of held-out pairs"
drawn "$out/eval-reward.tty" "[flowrun eval] eval reward" 1 $((batches - 1)) "$batches"

on_tty eval-prompts "$flowrun" eval prompts --baseline model/stories260K/stories260K.bin \
  --finetuned model/stories260K/stories260K.bin --n 3 --max_new_tokens 4
drawn "$out/eval-prompts.tty" "[flowrun eval] eval prompts" 1 2 3
echo "progress_cli: ok"
