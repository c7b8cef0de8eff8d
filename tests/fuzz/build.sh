#!/usr/bin/env bash
# Configures and builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, in their own build
# folder (default build-fuzz; the ordinary build/ stays gcc). Extra arguments go to cmake's configure step.
#   tests/fuzz/build.sh [BUILD_DIR] [cmake args...]
# Where the gcc build build/ exists (tools/build.sh; FLOWRUN_FUZZ_LIBS_FROM=DIR names another), only the
# readers the targets drive are compiled here and the rest links from its static libraries (brought up
# to date first), configured with its FLOWRUN_CUDA, FLOWRUN_NATIVE and FLOWRUN_GEMM so that the headers
# mean the same on both sides (tests/fuzz/CMakeLists.txt). FLOWRUN_FUZZ_LIBS_FROM= (empty) compiles
# everything here instead.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build-fuzz}"
[[ $# -gt 0 ]] && shift
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
from="${FLOWRUN_FUZZ_LIBS_FROM-$root/build}"
opts=(-DFLOWRUN_CUDA=OFF -DFLOWRUN_FUZZ_LIBS_FROM=)
if [[ -n "$from" && -f "$from/CMakeCache.txt" ]]; then
  from="$(cd "$from" && pwd)"
  cache() { sed -n "s/^$1:[A-Z]*=//p" "$from/CMakeCache.txt" | head -1; }
  opts=(-DFLOWRUN_FUZZ_LIBS_FROM="$from" -DFLOWRUN_CUDA="$(cache FLOWRUN_CUDA)" -DFLOWRUN_NATIVE="$(cache FLOWRUN_NATIVE)")
  gemm="$(cache FLOWRUN_GEMM)"
  [[ -n "$gemm" ]] && opts+=(-DFLOWRUN_GEMM="$gemm")
  echo "fuzz build: the readers here, the rest from $from's libraries"
  cmake --build "$from" -j"$(nproc)" --target flowrun_actors flowrun_actor flowrun_graph flowrun_console \
    flowrun_models flowrun_train >/dev/null
elif [[ -n "$from" ]]; then
  echo "fuzz build: no gcc build in $from (tools/build.sh): compiling every library here"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 \
  -DFLOWRUN_FUZZ=ON -DFLOWRUN_TESTS=OFF -DFLOWRUN_BENCH=OFF "${opts[@]}" "${launcher[@]}" "$@" >/dev/null
cmake --build "$build" --target fuzz_all -j"$(nproc)"
