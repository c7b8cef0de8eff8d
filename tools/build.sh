#!/usr/bin/env bash
# Configures and builds flowrun into build/ (binaries in build/bin/).
# Extra arguments go to cmake's configure step, e.g. -DFLOWRUN_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
