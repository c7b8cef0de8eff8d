#!/usr/bin/env bash
# The CPU performance figures of docs/performance.md, flowrun and PyTorch side by
# side in one run, then the regression check against the last recorded ratios.
#
#   bench/run_bench.sh [--quick] [--record] [--no-torch] [--no-ppo] [--only ITEMS] [--repeat N]
#
#   BUILD=build             where bench_core and flowrun are (tools/build.sh builds them)
#   TORCH_VENV=/tmp/refenv  a venv with torch; made and filled from PyPI if torch is missing
#   THREADS=N               threads for both (default: all hardware threads)
#   OUT=$BUILD/bench        where results.jsonl and report.md go
#
# Each item runs flowrun and PyTorch back to back (bench_core --only ITEM, then
# torch_ref.py --only ITEM), so a ratio compares figures taken seconds apart.
# --repeat N (default 2) runs the whole list N times and keeps the best of each
# figure and ratio: on shared machines one run can be 30% off.
# Items: machine train_260k train_gpt2 train_gpt2_large decode (and the PPO split).
# --record makes the ratios of this run the new baseline (bench/baseline.json);
# otherwise the run fails when a ratio dropped more than 10% below it.
# Nothing here changes the environment of the programs it runs (no
# OPENBLAS_CORETYPE, no OMP_* variables): the thread count is passed as an argument.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build}"
[[ "$build" = /* ]] || build="$root/$build"
venv="${TORCH_VENV:-/tmp/refenv}"
threads="${THREADS:-$(nproc)}"
out="${OUT:-$build/bench}"
quick="" record="" torch=1 ppo=1 repeat=2
items="machine train_260k train_gpt2 train_gpt2_large decode"
while (($#)); do
  case "$1" in
    --quick) quick="--quick" ;;
    --record) record="--record" ;;
    --no-torch) torch=0 ;;
    --no-ppo) ppo=0 ;;
    --only) items="${2//,/ }"; shift ;;
    --repeat) repeat="$2"; shift ;;
    *) echo "usage: bench/run_bench.sh [--quick] [--record] [--no-torch] [--no-ppo] [--only ITEMS] [--repeat N]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"

if [[ ! -x "$build/bin/bench_core" ]]; then
  echo "run_bench: $build/bin/bench_core is missing: build it first (tools/build.sh, or ninja -C $build bench_core flowrun)" >&2
  exit 1
fi

if ((torch)); then
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "run_bench: installing PyTorch from PyPI into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch numpy
  fi
fi

for ((rep = 1; rep <= repeat; rep++)); do
  for item in $items; do
    echo "== $item (run $rep of $repeat)" >&2
    "$build/bin/bench_core" --threads "$threads" --only "$item" --json "$results" $quick
    if ((torch)) && [[ "$item" != machine ]]; then
      "$venv/bin/python" "$root/bench/torch_ref.py" --threads "$threads" --only "$item" $quick | tee -a "$results"
    fi
  done
done

if ((ppo)); then
  echo "== ppo" >&2
  python3 "$root/bench/ppo_split.py" --flowrun "$build/bin/flowrun" --out "$out/ppo" $quick | tee -a "$results"
fi

python3 "$root/bench/report.py" "$results" --baseline "$root/bench/baseline.json" $record | tee "$out/report.md"
