#!/usr/bin/env bash
# Installs what flowrun needs (Debian packages) and checks the real input files.
#
#   tools/setup.sh            install packages, then check/fetch assets
#   FLOWRUN_SKIP_APT=1 ...    only check the assets
#
# The asset root is $FLOWRUN_ASSETS, default ../shared/assets beside the project.
# configs/assets.tsv lists every file with its sha256 and public source; a
# missing file is named with its source and, where the network allows,
# downloaded and checked against its sha256.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libcaf-dev libsentencepiece-dev libmsgpack-cxx-dev libspdlog-dev doctest-dev
  libopenblas-openmp-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libicu-dev zlib1g-dev libgloo-dev
  # Google Highway: the CPU backend's vector kernels (AVX2, AVX-512, NEON, ... chosen at run time)
  libhwy-dev
  # Hugging Face tokenizer.json: the Split pre-tokenizer's regexes (Llama 3, Qwen2)
  libpcre2-dev
  # cluster authentication (HMAC-SHA256, libcrypto) and TLS between nodes (caf_openssl links libssl)
  libssl-dev
  # the CPU backend's GEMM (oneDNN's dnnl_sgemm: AVX-512 kernels on CPUs OpenBLAS 0.3.21 does not know;
  # docs/performance.md) and BLIS, measured beside it by bench/bench_gemm
  libdnnl-dev libblis-openmp-dev
  # the console's browser test (tests/console_browser.py): headless Chromium driven by Selenium
  chromium chromium-driver python3-selenium
  # the libFuzzer targets (tests/fuzz): clang 16 (Debian 12's clang 14 lacks C++20 lambda captures of structured
  # bindings), its sanitizer and libFuzzer runtimes, and its OpenMP
  clang-16 libclang-rt-16-dev libomp-16-dev
  # TensorBoard event files (runtime/tensorboard): protoc and the protobuf library for TensorBoard's Event
  # messages, Boost.CRC (header-only) for TFRecord's CRC32C; python3-venv for the read-back test's venv (below)
  libprotobuf-dev protobuf-compiler libboost-dev python3-venv
)

if [[ "${FLOWRUN_SKIP_APT:-0}" != 1 ]]; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: all ${#packages[@]} Debian packages present"
  fi
fi

# Python packages that tests read flowrun's output back with (never a dependency of flowrun itself): a venv
# with tensorboard (tests/tensorboard_small.sh), from PyPI where the network allows. FLOWRUN_PYENV moves it;
# FLOWRUN_SKIP_PYENV=1 skips it (the tests that need it then say so and are skipped).
pyenv="${FLOWRUN_PYENV:-$root/build/pyenv}"
if [[ "${FLOWRUN_SKIP_PYENV:-0}" != 1 ]]; then
  if "$pyenv/bin/python" -c "import tensorboard" 2>/dev/null; then
    echo "setup: $pyenv has tensorboard"
  elif /usr/bin/python3 -m venv "$pyenv" && "$pyenv/bin/pip" install -q tensorboard; then
    echo "setup: made $pyenv with tensorboard (PyPI)"
  else
    echo "setup: WARNING: could not install tensorboard into $pyenv (no network?): tests/tensorboard_small.sh" \
         "will be skipped" >&2
  fi
fi

assets="${FLOWRUN_ASSETS:-$root/../shared/assets}"
echo "setup: assets in $assets"
fail=0
while IFS=$'\t' read -r path sha url note; do
  [[ -z "$path" || "$path" == \#* || "$path" == path ]] && continue
  f="$assets/$path"
  if [[ ! -f "$f" ]]; then
    if [[ -n "$url" ]]; then
      echo "setup: missing $path; downloading from $url"
      mkdir -p "$(dirname "$f")" 2>/dev/null || true
      if ! curl -fsSL --retry 2 -o "$f.part" "$url" 2>/dev/null; then
        echo "setup: ERROR: could not download $path from $url (no network?). Fetch it by hand into $assets/$path" >&2
        rm -f "$f.part"; fail=1; continue
      fi
      mv "$f.part" "$f"
    else
      echo "setup: ERROR: missing $path ($note); it has no public URL of its own: copy the asset bundle into $assets" >&2
      fail=1; continue
    fi
  fi
  got=$(sha256sum "$f" | cut -d' ' -f1)
  if [[ "$got" != "$sha" ]]; then
    echo "setup: ERROR: $f has sha256 $got, expected $sha (source: ${url:-$note})" >&2
    fail=1
  fi
done < "$root/configs/assets.tsv"
if ((fail)); then
  echo "setup: some assets are missing or differ (above). Set FLOWRUN_ASSETS to a folder holding them." >&2
  exit 1
fi
echo "setup: all assets present and verified"
