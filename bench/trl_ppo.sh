#!/usr/bin/env bash
# flowrun's PPO iteration side by side with Hugging Face TRL's PPOTrainer, and its GRPO iteration with TRL's
# GRPOTrainer (bench/trl_ppo.py and bench/trl_grpo.py say what is compared and how). Not for CI: about 1
# minute per pair, model and algorithm on 2 cores.
#
#   bench/trl_ppo.sh [PAIRS=5] [BUILD_DIR=build] [MODELS=stories260K,llama6m] [ALGOS=ppo]   (ALGOS: ppo,grpo)
#
#   TORCH_VENV=/tmp/refenv   the venv (as bench/run_bench.sh's); torch, transformers, protobuf (transformers 5 reads
#                            tok512.model through it), trl 1.12 (the last
#                            release with PPOTrainer, under trl.experimental.ppo) installed from PyPI if missing
#   BASELINE=OTHER/bin/flowrun  a second flowrun (e.g. main's build) measured in the same rounds (before/after)
#   DTYPE=bf16                  both sides in bf16 (flowrun's dtype = bf16 on its models, TRL's bf16=True)
#   THREADS=N                   threads for both sides (default 2, the figures of docs/performance.md)
# Prints the host line and one JSON line per model; the per-pair figures go to stderr.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pairs=${1:-5}
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "trl_ppo: PAIRS takes a positive number, not '$pairs'" >&2; exit 2; }
build=$(cd "${2:-$root/build}" 2>/dev/null && pwd) ||
  { echo "trl_ppo: no build folder ${2:-$root/build} (tools/build.sh makes build/)" >&2; exit 2; }
[[ -x "$build/bin/flowrun" ]] || { echo "trl_ppo: $build/bin/flowrun is missing: build it first (tools/build.sh)" >&2; exit 2; }
models=${3:-stories260K,llama6m}
algos=${4:-ppo}
venv="${TORCH_VENV:-/tmp/refenv}"
if ! "$venv/bin/python" -c "import trl.experimental.ppo, trl.trainer.grpo_trainer, sentencepiece, google.protobuf" 2>/dev/null; then
  echo "trl_ppo: installing torch, transformers and trl 1.12 from PyPI into $venv" >&2
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch numpy transformers datasets accelerate sentencepiece protobuf requests "trl==1.12.0"
fi
out="$build/trl_ppo"
mkdir -p "$out"
: > "$out/results.jsonl"
for algo in ${algos//,/ }; do
  case "$algo" in ppo|grpo) ;; *) echo "trl_ppo: ALGOS takes ppo and grpo, not '$algo'" >&2; exit 2 ;; esac
  "$venv/bin/python" "$root/bench/trl_$algo.py" --flowrun "$build/bin/flowrun" --out "$out" --pairs "$pairs" \
    --models "$models" --threads "${THREADS:-2}" ${BASELINE:+--baseline "$BASELINE"} ${DTYPE:+--dtype "$DTYPE"} | tee -a "$out/results.jsonl"
done
