#!/usr/bin/env bash
# Configures and builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, in their own build
# folder (default build-fuzz; the ordinary build/ stays gcc). Extra arguments go to cmake's configure step.
#   tests/fuzz/build.sh [BUILD_DIR] [cmake args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build-fuzz}"
[[ $# -gt 0 ]] && shift
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 \
  -DFLOWRUN_FUZZ=ON -DFLOWRUN_TESTS=OFF -DFLOWRUN_BENCH=OFF -DFLOWRUN_CUDA=OFF "${launcher[@]}" "$@" >/dev/null
cmake --build "$build" --target fuzz_all -j"$(nproc)"
