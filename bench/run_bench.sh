#!/usr/bin/env bash
# The CPU performance figures of docs/performance.md, flowrun and PyTorch side by
# side in one run, then the regression check against the last recorded ratios.
#
#   bench/run_bench.sh [--quick] [--record] [--no-torch] [--no-ppo] [--trl] [--only ITEMS] [--repeat N]
#
#   BUILD=build             where bench_core and flowrun are (tools/build.sh builds them)
#   TORCH_VENV=/tmp/refenv  a venv with torch. Left unset, /tmp/refenv is made and filled from PyPI
#                           when torch is missing there; a TORCH_VENV that is set must hold a python
#                           (a misspelt path stops the run instead of installing PyTorch into it)
#   THREADS=N               threads for both, the TRL comparison's too (default: all hardware threads)
#   OUT=$BUILD/bench        where results.jsonl and report.md go
#
# Each item runs flowrun and PyTorch as interleaved pairs (bench_core --only ITEM
# and torch_ref.py --only ITEM back to back, flowrun first in odd pairs and PyTorch
# first in even ones), so a ratio compares figures taken seconds apart. --repeat N
# (default 5) is the number of pairs: the whole list runs N times, and report.py
# gives each item's median ratio with its min-max and each side's spread (shared
# machines move whole runs 2-3x; a best-of-2 could land on a slow period).
# The "host" line records the CPU model and ISA, the machine line the GEMM library;
# baselines are per machine type (report.py).
# Items: machine train_260k train_gpt2 train_gpt2_large decode (and the PPO split).
# --trl adds a PPO iteration side by side with TRL's PPOTrainer and a GRPO iteration with its
# GRPOTrainer (bench/trl_ppo.sh, N pairs per model and algorithm; it installs trl 1.12 into the venv;
# about 1 minute per pair, model and algorithm on 2 cores, from a 39 s stories260K PPO pair to the
# 6.1 M model's longer ones); where the CPU has AVX512_BF16 or AMX, also the 6.1 M
# model's PPO iteration with both sides in bf16 (about 5 minutes more).
# With --trl or the PPO split, bench/runtime_share.py measures the actor runtime's share of a PPO
# iteration's CPU samples under Linux perf (skipped where perf cannot record).
# --record makes the median ratios of this run the new baseline of this machine type
# (bench/baseline.json); otherwise the run fails when a median ratio dropped more than
# 10% below it.
# Nothing here changes the environment of the programs it runs (no
# OPENBLAS_CORETYPE, no OMP_* variables): the thread count is passed as an argument.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build}"
[[ "$build" = /* ]] || build="$root/$build"
venv="${TORCH_VENV:-/tmp/refenv}"
threads="${THREADS:-$(nproc)}"
out="${OUT:-$build/bench}"
quick="" record="" torch=1 ppo=1 trl=0 repeat=5
known_items="machine train_260k train_gpt2 train_gpt2_large decode"
items="$known_items"
usage="usage: bench/run_bench.sh [--quick] [--record] [--no-torch] [--no-ppo] [--trl] [--only ITEMS] [--repeat N]
  ITEMS: a comma-separated list of $known_items"
while (($#)); do
  case "$1" in
    --quick) quick="--quick" ;;
    --record) record="--record" ;;
    --no-torch) torch=0 ;;
    --no-ppo) ppo=0 ;;
    --trl) trl=1 ;;
    --only|--repeat)
      if (($# < 2)) || [[ "$2" == --* ]]; then echo "run_bench: $1 needs a value" >&2; echo "$usage" >&2; exit 2; fi
      if [[ "$1" == --only ]]; then items="${2//,/ }"; else repeat="$2"; fi
      shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "run_bench: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
  shift
done
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "run_bench: --repeat takes a positive number of pairs, not '$repeat'" >&2; exit 2; }
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "run_bench: THREADS takes a positive number, not '$threads'" >&2; exit 2; }
for item in $items; do
  [[ " $known_items " == *" $item "* ]] ||
    { echo "run_bench: --only: no item '$item' (items: $known_items)" >&2; exit 2; }
done
[[ -z "$items" ]] && { echo "run_bench: --only names no item (items: $known_items)" >&2; exit 2; }

if [[ ! -x "$build/bin/bench_core" ]]; then
  echo "run_bench: $build/bin/bench_core is missing: build it first (tools/build.sh, or ninja -C $build bench_core flowrun)" >&2
  exit 1
fi
if [[ -n "${TORCH_VENV:-}" ]] && ((torch || trl)) && [[ ! -x "$venv/bin/python" ]]; then
  echo "run_bench: TORCH_VENV=$venv holds no bin/python: give a venv with torch, or leave TORCH_VENV unset to have" \
    "/tmp/refenv made (or --no-torch without --trl to compare with nothing)" >&2
  exit 2
fi
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"

if ((torch)); then
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "run_bench: installing PyTorch from PyPI into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch numpy
  fi
fi

# The machine type (report.py keeps a baseline per type): CPU model (with its family and model
# numbers on x86) and the widest SIMD ISA, from bench/host.py.
python3 "$root/bench/host.py" >> "$results"

flowrun_item() { "$build/bin/bench_core" --threads "$threads" --only "$1" --json "$results" $quick; }
torch_item() { "$venv/bin/python" "$root/bench/torch_ref.py" --threads "$threads" --only "$1" $quick | tee -a "$results"; }
for ((rep = 1; rep <= repeat; rep++)); do
  for item in $items; do
    echo "== $item (pair $rep of $repeat)" >&2
    if ((torch)) && [[ "$item" != machine ]]; then
      if ((rep % 2)); then flowrun_item "$item"; torch_item "$item"; else torch_item "$item"; flowrun_item "$item"; fi
    elif [[ "$item" != machine || $rep -eq 1 ]]; then
      flowrun_item "$item"
    fi
  done
done

if ((trl)); then
  echo "== PPO and GRPO side by side with TRL" >&2
  TORCH_VENV="$venv" THREADS="$threads" bash "$root/bench/trl_ppo.sh" "$( ((${#quick})) && echo 1 || echo "$repeat")" "$build" \
    stories260K,llama6m ppo,grpo | grep -E '"kind": "trl_(ppo|grpo)"' >> "$results"
  # where the CPU multiplies bf16 (AVX512_BF16, AMX: runtime/kernels/cpu/gemm_bf16.h), the 6.1 M PPO
  # iteration with both sides in bf16 too (flowrun's dtype = bf16, TRL's bf16=True), beside the fp32 goal
  if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
    echo "== PPO side by side with TRL, both in bf16" >&2
    DTYPE=bf16 TORCH_VENV="$venv" THREADS="$threads" bash "$root/bench/trl_ppo.sh" "$( ((${#quick})) && echo 1 || echo "$repeat")" \
      "$build" llama6m ppo | grep -E '"kind": "trl_ppo"' >> "$results"
  fi
fi

if ((ppo)); then
  echo "== ppo" >&2
  python3 "$root/bench/ppo_split.py" --flowrun "$build/bin/flowrun" --out "$out/ppo" $quick | tee -a "$results"
fi

# The actor runtime's share of a PPO iteration's CPU samples (bench/runtime_share.py, Linux perf):
# with --trl on the TRL bench's two models at its shapes (8 prompts x 48 + 32 tokens), else on the
# PPO split's stories260K at graphs/ppo.graph's own. Skipped, with a line, where perf cannot record.
share_item() {  # LABEL ACTOR REWARD ITERATIONS [--set ...]
  local label="$1" actor="$2" reward="$3" iters="$4"
  shift 4
  rm -rf "$out/share_policy"
  python3 "$root/bench/runtime_share.py" --label "$label" -- "$build/bin/flowrun" "$root/graphs/ppo.graph" \
    --no-progress --set graph.checkpoint_dir= --set "node.actor_model.model=$actor" \
    --set "node.reward_model.model=$reward" --set "node.prompts.iterations=$iters" \
    --set node.prompts.eval_prompts=8 --set "node.policy.output=$out/share_policy" "$@" |
    grep '"kind": "runtime_share"' | tee -a "$results"
}
if ((ppo || trl)); then
  echo "== the actor runtime's share (perf)" >&2
  if ! command -v perf >/dev/null || ! perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
    echo "run_bench: perf cannot record here (not installed, or kernel.perf_event_paranoid > 2): the runtime's share is not measured" >&2
  elif ((trl)); then
    shapes=(--set node.prompts.max_prompt_seq_len=48 --set node.prompts.per_device_generation_batch_size=8
            --set node.generator.max_answer_seq_len=32 --set node.policy.per_device_training_batch_size=8
            --set node.critic.per_device_training_batch_size=8)
    for m in stories260K llama6m; do
      d="$build/trl_ppo/$m"
      [[ -d "$d/hf" && -d "$d/rm" ]] || continue
      iters=$([[ $m == stories260K ]] && echo 30 || echo 10)
      ((${#quick})) && iters=3
      share_item "$m, 8 prompts x 48 + 32 tokens" "$d/hf" "$d/rm" "$iters" "${shapes[@]}" ||
        echo "run_bench: the runtime share of $m failed" >&2
    done
  elif [[ -f "$out/ppo/sft.bin" && -d "$out/ppo/rm" ]]; then
    share_item "stories260K, graphs/ppo.graph" "$out/ppo/sft.bin" "$out/ppo/rm" "$( ((${#quick})) && echo 3 || echo 30)" ||
      echo "run_bench: the runtime share failed" >&2
  fi
fi

python3 "$root/bench/report.py" "$results" --baseline "$root/bench/baseline.json" $record | tee "$out/report.md"
