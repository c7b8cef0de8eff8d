#!/usr/bin/env bash
# The CUDA device check (issue #7): one script for a GPU machine, under 8 minutes.
#
#   tools/device_check.sh                      build (FLOWRUN_CUDA=ON) in build/device, then run
#   tools/device_check.sh --prebuilt DIR       use DIR/bundle.tar.xz made by tools/device_bundle.sh
#                                              (binaries, their non-system libraries and the assets)
#   options: --out DIR (default $OUT, else build/device_check), --build DIR, --quick (bench_cuda --quick),
#            --allow-no-gpu (run the steps anyway where no GPU is seen; they skip, and the exit code stays 3)
#
# Runs, each with its own time limit inside the 8-minute budget, logging to the output dir:
#   1. test_cuda        every op on CUDA against the CPU backend (all cases must pass; prints the largest error per check)
#   2. test_cuda_model  stories260K on the GPU against the float64 reference, greedy generation vs CPU,
#                       AdamW on device parameters, GPT-2/OPT shapes vs CPU
#   2b. test_cuda_zero the ZeRO engine on the GPU (stages 0-3, 1 and 2 in-process ranks, bf16, fp16) vs the CPU engine
#   3. test_nccl        two ranks on two GPUs vs the inproc backend, the unique id over the CAF store
#                       (those cases skip, with a line, on < 2 GPUs)
#   4. bench_cuda       the benchmark table -> bench.md
#   5. bench_cuda --profile under CUDA_LAUNCH_BLOCKING=1: per-op time of one GPT-2 SFT step -> profile.md
# then prints a dated summary (also summary.txt) and exits 1 when a step failed, 3 when no GPU is present.
# The build mode needs tools/setup.sh's Debian packages; the GPU machines we borrow lack them,
# hence --prebuilt.
set -uo pipefail

start=$(date +%s)
budget=${DEVICE_CHECK_BUDGET_S:-465}  # 7:45, leaving time for the summary
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prebuilt=""
out="${OUT:-}"
build=""
quick=0
allow_no_gpu=0
need_value() { (($# >= 2)) || { echo "device_check: $1 needs a value" >&2; exit 2; }; }
while (($#)); do
  case "$1" in
    --prebuilt) need_value "$@"; prebuilt="$2"; shift 2 ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --build) need_value "$@"; build="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --allow-no-gpu) allow_no_gpu=1; shift ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "device_check: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [[ -n "$prebuilt" ]]; then
  root="$(pwd)"
else
  root="$(cd "$script_dir/.." && pwd)"
fi
[[ -z "$out" ]] && out="$root/build/device_check"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }

say "flowrun device check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host $(hostname)"

gpus=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  nvidia-smi -L 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
elif python3 -c 'import torch' 2>/dev/null; then
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
fi
say "GPUs: $gpus"
if ((gpus == 0)) && ((!allow_no_gpu)); then
  # Without a GPU every CUDA test only prints its "skipped" line: a PASS here would verify nothing.
  say "NO GPU: neither nvidia-smi nor torch sees a CUDA device, so nothing can be checked here;"
  say "run this on a GPU machine (or pass --allow-no-gpu to test the script itself: every step then skips)"
  exit 3
fi

# ------------------------------------------------------------------ binaries
if [[ -n "$prebuilt" ]]; then
  tarball="$prebuilt/bundle.tar.xz"
  [[ -f "$tarball" ]] || { say "FAIL: no $tarball (make it with tools/device_bundle.sh)"; exit 1; }
  unpack="$(mktemp -d /tmp/flowrun-bundle.XXXXXX)"
  trap 'rm -rf "$unpack"' EXIT
  if ! tar -xJf "$tarball" -C "$unpack" 2>/dev/null; then  # no xz: python's tarfile reads it too
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$tarball" "$unpack" ||
      { say "FAIL: cannot unpack $tarball"; exit 1; }
  fi
  bin="$unpack/bin"
  export FLOWRUN_ASSETS="$unpack/assets"
  [[ -f "$unpack/MANIFEST" ]] && say "bundle: $(head -1 "$unpack/MANIFEST")"
  libpath="$unpack/lib"
else
  build="${build:-$root/build/device}"
  say "building in $build (FLOWRUN_CUDA=ON)"
  if ! { cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLOWRUN_CUDA=ON \
           -DFLOWRUN_NATIVE=ON >"$out/build.log" 2>&1 &&
         targets=$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\(test_cuda\|test_cuda_model\|test_cuda_zero\|test_nccl\|bench_cuda\): .*/\1/p' | sort -u) &&
         timeout "$(left)" ninja -C "$build" $targets >>"$out/build.log" 2>&1; }; then
    say "FAIL: build (see build.log)"; tail -20 "$out/build.log"; exit 1
  fi
  bin="$build/bin"
  libpath=""
fi

# CUDA libraries of the machine: the toolkit's, and pip's nvidia-* wheels (torch installs them).
cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && cuda_dirs+=("$d")
done
sites=$(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13 libcudart.so.13; do
  found=""
  for d in "${cuda_dirs[@]}"; do [[ -e "$d/$lib" ]] && found="$d" && break; done
  if [[ -z "$found" ]]; then
    for s in $sites /usr/lib/x86_64-linux-gnu /usr/local/lib /opt; do
      [[ -d "$s" ]] || continue
      f=$(find "$s" -maxdepth 5 -name "$lib" 2>/dev/null | head -1)
      [[ -n "$f" ]] && { found="$(dirname "$f")"; cuda_dirs+=("$found"); break; }
    done
  fi
  say "library $lib: ${found:-NOT FOUND}"
done
extra=$(IFS=:; echo "${cuda_dirs[*]}")
export LD_LIBRARY_PATH="${libpath:+$libpath:}${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$out/env.txt"
echo "FLOWRUN_ASSETS=${FLOWRUN_ASSETS:-}" >>"$out/env.txt"


for b in test_cuda test_cuda_model test_cuda_zero test_nccl bench_cuda; do
  [[ -x "$bin/$b" ]] || continue
  missing=$(ldd "$bin/$b" 2>/dev/null | grep 'not found' | awk '{print $1}' | sort -u | tr '\n' ' ')
  [[ -n "$missing" ]] && say "WARNING: $b is missing libraries: $missing"
done

# ------------------------------------------------------------------ steps
declare -a results
failed=0
# step NAME LIMIT_S COMMAND...: runs with the smaller of LIMIT_S and the budget left
step() {
  local name="$1" limit="$2"; shift 2
  local l; l=$(left)
  ((l < limit)) && limit=$l
  if ((limit < 10)); then
    results+=("$name: NOT RUN (time budget spent)"); failed=1; return
  fi
  local t0=$(date +%s) rc
  echo "== $name (limit ${limit}s): $*" | tee -a "$summary"
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t0))
  # the lines that say a case was skipped, and doctest's totals
  grep -E 'skipped|parity:|^\[doctest\] (test cases|assertions|Status)' "$out/$name.log" | sort | uniq -c | sed 's/^/   /' | tee -a "$summary"
  if ((rc == 0)); then
    results+=("$name: PASS (${dt}s)")
  elif ((rc == 124 || rc == 137)); then
    results+=("$name: FAIL (timed out after ${limit}s)"); failed=1
  else
    results+=("$name: FAIL (exit $rc, ${dt}s; see $name.log)"); failed=1
    tail -25 "$out/$name.log" | sed 's/^/   | /'
  fi
}

if [[ -x "$bin/test_cuda" ]]; then
  step test_cuda 200 "$bin/test_cuda"
else
  results+=("test_cuda: MISSING (not in this build)"); failed=1
fi
if [[ -x "$bin/test_cuda_model" ]]; then
  step test_cuda_model 120 "$bin/test_cuda_model"
else
  results+=("test_cuda_model: MISSING"); failed=1
fi
if [[ -x "$bin/test_cuda_zero" ]]; then
  step test_cuda_zero 120 "$bin/test_cuda_zero"
else
  results+=("test_cuda_zero: MISSING"); failed=1
fi
if [[ -x "$bin/test_nccl" ]]; then
  # its two-rank cases need 2 GPUs and print a "skipped" line on fewer; the argument checks run on any
  ((gpus >= 2)) || say "test_nccl: $gpus GPU(s): the two-rank NCCL cases need 2 and skip themselves"
  step test_nccl 90 "$bin/test_nccl"
else
  results+=("test_nccl: MISSING"); failed=1
fi
if [[ -x "$bin/bench_cuda" ]]; then
  bargs=(--out "$out/bench.md")
  ((quick)) && bargs+=(--quick)
  step bench_cuda 200 "$bin/bench_cuda" "${bargs[@]}"
else
  results+=("bench_cuda: MISSING"); failed=1
fi
if [[ -x "$bin/bench_cuda" ]]; then
  pargs=(--profile --out "$out/profile.md")
  ((quick)) && pargs+=(--quick)
  step bench_profile 90 env CUDA_LAUNCH_BLOCKING=1 "$bin/bench_cuda" "${pargs[@]}"
fi

say ""
say "== summary $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($(($(date +%s) - start)) s)"
for r in "${results[@]}"; do say "  $r"; done
[[ -f "$out/bench.md" ]] && { say ""; tee -a "$summary" <"$out/bench.md"; }
[[ -f "$out/profile.md" ]] && { say ""; grep -v '^#\|^- \|^$' "$out/profile.md" | tee -a "$summary"; }
say "output: $out"
if ((gpus == 0)); then
  say "NO GPU (--allow-no-gpu): the steps above only skipped; nothing was verified"
  exit 3
fi
exit $failed
