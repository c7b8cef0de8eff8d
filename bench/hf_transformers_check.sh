#!/usr/bin/env bash
# The HF folders flowrun's trainers write, loaded in transformers (issue 16, "HF models end to end"): not in
# CI, since torch and transformers are never runtime or CI dependencies (the C++ tests, test_hf and
# tests/hf_trainers_small.sh, check the same folders without them).
#   1. a Python venv at $FLOWRUN_TFENV (default /tmp/tfenv), made and filled from PyPI if it lacks transformers
#      (torch, transformers, safetensors, and sentencepiece + protobuf for LLaMA's tokenizer.model: a few GB);
#   2. ctest hf_trainers_small, which writes sft / rm / ppo folders of tiny random OPT, GPT-2 and LLaMA models and
#      `flowrun convert --to hf` of stories260K (with an sft run on it) under BUILD/tests/hf_trainers_small;
#   3. tools/hf_transformers_check.py on each folder: one line per folder with max |flowrun - transformers|.
# Usage: bench/hf_transformers_check.sh [BUILD]   (BUILD defaults to build; flowrun and make_tiny_hf built there)
# Exit status: that of the check (1 when a folder fails to load or differs by more than 1e-5).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
venv=${FLOWRUN_TFENV:-/tmp/tfenv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, transformers, safetensors, sentencepiece, google.protobuf" 2>/dev/null; then
  echo "hf_transformers_check: installing torch, transformers, safetensors, sentencepiece, protobuf into $venv"
  python3 -m venv "$venv"
  nice -n 10 "$venv/bin/pip" install --quiet torch transformers safetensors sentencepiece protobuf
fi
ctest --test-dir "$build" -R '^hf_trainers_small$' --output-on-failure > /dev/null ||
  { echo "hf_transformers_check: ctest hf_trainers_small failed (run it alone to see why)"; exit 1; }
h=$build/tests/hf_trainers_small
folders=()
for family in opt gpt2 llama; do
  for step in sft rm ppo; do folders+=("$h/$family/$step"); done
done
folders+=("$h/stories-hf" "$h/stories-hf-sft")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
nice -n 10 "$venv/bin/python" "$root/tools/hf_transformers_check.py" "$build/bin/make_tiny_hf" "${folders[@]}" \
  > "$log" 2>&1 || status=$?
# transformers' load reports (v_head.weight unused in the reward models) and progress bars are left out
grep -E '^(OK|FAIL|torch) ' "$log" | sed "s|$h/||" || { cat "$log"; exit 1; }
(( status == 0 )) || echo "hf_transformers_check: FAILED (a FAIL line above says which folder and why)"
exit $status
