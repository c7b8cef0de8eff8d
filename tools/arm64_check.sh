#!/usr/bin/env bash
# ARM64 (aarch64) build and unit tests on an x86-64 Debian machine: a cross build with
# FLOWRUN_NATIVE=OFF against Debian's arm64 packages, its tests run under qemu-user. It shows that
# the sources build for ARM64 and that the NEON path of the Highway kernels (runtime/kernels/cpu/
# simd_kernels.cpp) and OpenBLAS's ARM64 kernels give the results the tests expect. Not a speed
# measure (qemu emulates); too slow for CI (the build alone takes about 20 minutes on 2 cores).
#
#   bash tools/arm64_check.sh [DIR] [TEST ...]
#
# DIR (default /tmp/flowrun-arm64) holds the downloaded .deb files, the sysroot they are unpacked
# into (nothing is installed for arm64: Debian's libcaf, gloo and sentencepiece packages cannot sit
# beside their amd64 versions), the toolchain file and the build. TESTs default to the doctest
# suites below; each runs with a 300 s limit (FLOWRUN_ARM64_TEST_LIMIT). Needs root for apt-get (the
# cross compiler, qemu-user, and arm64 in dpkg's architectures, which only lets apt-get download).
set -Eeuo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/tmp/flowrun-arm64}
shift || true
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_simd test_tensor test_ops test_llama test_tokenizer test_hf test_hf_tokenizer
  test_lora test_peft test_pg_math test_rlhf_math test_rule_rewards test_generate test_chat_template test_graph
  test_dpo test_critic_free test_ppo test_dschat test_zero test_shard_checkpoint test_tensorboard)
sysroot=$dir/sysroot
sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
mkdir -p "$dir/debs" "$sysroot"

echo "== the cross compiler and qemu-user"
if ! command -v aarch64-linux-gnu-g++ > /dev/null || ! command -v qemu-aarch64 > /dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu qemu-user > /dev/null
fi
dpkg --print-foreign-architectures | grep -qx arm64 || { $sudo dpkg --add-architecture arm64; $sudo apt-get update -qq; }

echo "== Debian's arm64 packages, unpacked into $sysroot"
if [ ! -e "$sysroot/.done" ]; then
  # tools/setup.sh's libraries, and the C/C++ runtime the cross compiler links against
  dev=(libcaf-dev libsentencepiece-dev libmsgpack-cxx-dev libspdlog-dev libopenblas-openmp-dev libicu-dev zlib1g-dev
    libgloo-dev libpcre2-dev libssl-dev libdnnl-dev libblis-openmp-dev libprotobuf-dev libfmt-dev libhwy-dev
    libtomlplusplus-dev libcpp-httplib-dev libbrotli-dev libc6-dev libstdc++-12-dev libgcc-12-dev linux-libc-dev
    libcrypt-dev libgomp1 libatomic1 libasan8 liblsan0 libtsan2 libubsan1 libhwasan0 libitm1
    libc6 libgcc-s1 libstdc++6 libhwy1)  # the last, named: apt lists no dependency already installed for arm64
  arch_all=(nlohmann-json3-dev libcli11-dev doctest-dev)
  names=()
  for p in "${dev[@]}"; do names+=("$p:arm64"); done
  # every package they depend on, as apt resolves them for arm64 (a simulation: nothing is installed)
  mapfile -t deps < <(apt-get install -s --no-install-recommends "${names[@]}" 2>/dev/null | awk '/^Inst/ { print $2 }')
  (
    cd "$dir/debs"
    for p in "${deps[@]}" "${names[@]}" "${arch_all[@]}"; do
      n=${p%%:*}
      ls "${n}"_*_arm64.deb "${n}"_*_all.deb > /dev/null 2>&1 && continue
      apt-get download "$n:arm64" > /dev/null 2>&1 || apt-get download "$n" > /dev/null 2>&1 || echo "  (no arm64 package $n)"
    done
    rm -f ./*_amd64.deb
    for f in ./*.deb; do dpkg -x "$f" "$sysroot"; done
  )
  # absolute symbolic links (libz.so -> /lib/...) point into the sysroot
  find "$sysroot" -type l -lname '/*' | while read -r l; do
    t=$(readlink "$l"); [[ $t == "$sysroot"* ]] || ln -sfn "$sysroot$t" "$l"
  done
  touch "$sysroot/.done"
fi

echo "== configure and build (FLOWRUN_NATIVE=OFF, no CUDA, no benchmarks)"
cat > "$dir/toolchain.cmake" <<EOF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_SYSROOT $sysroot)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} "$sysroot/usr/lib/aarch64-linux-gnu/pkgconfig:$sysroot/usr/share/pkgconfig:$sysroot/usr/lib/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "$sysroot")
# doctest_discover_tests lists each suite's cases after linking it: through qemu
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;$sysroot)
EOF
cmake -S "$root" -B "$dir/build" -DCMAKE_TOOLCHAIN_FILE="$dir/toolchain.cmake" -DCMAKE_BUILD_TYPE=Release \
  -DFLOWRUN_NATIVE=OFF -DFLOWRUN_CUDA=OFF -DFLOWRUN_BENCH=OFF > "$dir/configure.log" 2>&1 ||
  { tail -30 "$dir/configure.log"; exit 1; }
grep "flowrun:" "$dir/configure.log" || true
cmake --build "$dir/build" -j"$(nproc)" > "$dir/build.log" 2>&1 || { grep -E "error" "$dir/build.log" | head -20; exit 1; }
file "$dir/build/bin/flowrun" | cut -d, -f1-2

echo "== the tests under qemu-aarch64"
export QEMU_LD_PREFIX=$sysroot OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export FLOWRUN_ASSETS=${FLOWRUN_ASSETS:-$root/../shared/assets}
failed=0
for t in "${tests[@]}"; do
  s=$(date +%s)
  set +e
  (cd "$dir/build/tests" && timeout "${FLOWRUN_ARM64_TEST_LIMIT:-300}" qemu-aarch64 "$dir/build/bin/$t" > "$dir/$t.log" 2>&1)
  rc=$?
  set -e
  echo "  $t: exit $rc in $(($(date +%s) - s)) s; $(grep -a -E '^\[doctest\] test cases' "$dir/$t.log" | tr -s ' ')"
  [ $rc -eq 0 ] || failed=$((failed + 1))
done
grep -a -m1 "simd paths on this CPU" "$dir/test_simd.log" 2>/dev/null | sed 's/.*MESSAGE: /  /' || true
echo "arm64_check: ${#tests[@]} suites, $failed failed"
[ $failed -eq 0 ]
