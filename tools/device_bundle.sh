#!/usr/bin/env bash
# Packs the CUDA binaries for a GPU machine that has CUDA, cuBLAS and NCCL but none of our
# Debian packages (CAF, spdlog, fmt, sentencepiece, OpenBLAS, ICU, gloo, ...), and no network.
#
#   tools/device_bundle.sh [--dest DIR] [--build DIR] [--no-build]
#
# Here (Debian 12, glibc 2.36; the GPU machine's newer glibc runs these binaries):
#  1. configures and builds test_cuda (when the tree has it), test_cuda_model, test_cuda_zero, test_nccl and
#     bench_cuda in --build DIR (default build/devbundle) with FLOWRUN_CUDA=ON,
#     FLOWRUN_GEMM=openblas (smaller libraries than oneDNN) and FLOWRUN_NATIVE=OFF (the GPU
#     host's CPU is not this one), CUDA archs 80;90;
#  2. copies them (stripped) with every shared library they load (ldd) except the system's
#     (libc, libm, libpthread, libdl, librt, ld-linux, libstdc++, libgcc_s), the driver's
#     (libcuda) and the big CUDA libraries the GPU machine has (libcublas, libcublasLt,
#     libnccl); libcudart (0.7 MB) is included;
#  3. adds the assets the tests read (stories260K, tok512, the reference files) from
#     $FLOWRUN_ASSETS (default ../shared/assets);
#  4. packs bin/ lib/ assets/ MANIFEST into DIR/bundle.tar.xz (must stay under 60 MB) and copies
#     tools/device_check.sh beside it.
# DIR defaults to .devbundle at the root of this checkout; the folder is added to the
# repository's info/exclude so git never tracks it. Then, on the GPU machine, from the folder
# that holds DIR:   bash DIR/device_check.sh --prebuilt DIR
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.devbundle"
build="$root/build/devbundle"
do_build=1
while (($#)); do
  case "$1" in
    --dest) dest="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "device_bundle: unknown argument $1" >&2; exit 2 ;;
  esac
done
limit_mb=60

if ((do_build)); then
  echo "device_bundle: configuring $build"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLOWRUN_CUDA=ON -DFLOWRUN_GEMM=openblas \
    -DFLOWRUN_NATIVE=OFF "-DCMAKE_CUDA_ARCHITECTURES=80;90" >"$build/configure.log" 2>&1 ||
    { tail -30 "$build/configure.log"; exit 1; }
fi
wanted=(test_cuda test_cuda_model test_cuda_zero test_nccl bench_cuda)
have=$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\([a-z_]*\): .*/\1/p' | sort -u)
targets=()
for t in "${wanted[@]}"; do
  if grep -qx "$t" <<<"$have"; then targets+=("$t"); else echo "device_bundle: WARNING: no target $t in this tree"; fi
done
if ((do_build)); then
  echo "device_bundle: building ${targets[*]} (ninja -j${JOBS:-2})"
  ninja -C "$build" -j"${JOBS:-2}" "${targets[@]}"
fi

stage="$(mktemp -d /tmp/flowrun-devbundle.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/assets"
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$t" 2>/dev/null || true
done

# shared libraries: everything ldd resolves, minus the system's, the driver's and the big CUDA ones
skip='^(linux-vdso|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
for t in "${targets[@]}"; do
  ldd "$build/bin/$t" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  if grep -Eq "$skip" <<<"$name"; then continue; fi
  cp -L "$path" "$stage/lib/$name"
done
missing=$(for t in "${targets[@]}"; do ldd "$build/bin/$t" | grep 'not found' || true; done)
[[ -z "$missing" ]] || { echo "device_bundle: unresolved libraries here: $missing"; exit 1; }

# assets the CUDA tests read
assets="${FLOWRUN_ASSETS:-$root/../shared/assets}"
[[ -d "$assets" ]] || assets="/work/shared/assets"
for f in model/stories260K/stories260K.bin model/stories260K/stories260K_v1.bin model/stories260K/tok512.model \
         model/stories260K/tok512.bin ref/stories260K_forward_reference.json \
         ref/stories260K_forward_reference_logits.npy ref/tokenizer_cases.json \
         data/tinystories/tinystories_train_head.txt README.md; do
  [[ -f "$assets/$f" ]] || { echo "device_bundle: missing asset $assets/$f"; exit 1; }
  mkdir -p "$stage/assets/$(dirname "$f")"
  cp "$assets/$f" "$stage/assets/$f"
done

rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain 2>/dev/null | grep -c . || true)
{
  echo "flowrun device bundle: commit $rev ($dirty uncommitted paths), built $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname), CUDA archs 80;90"
  echo "binaries: ${targets[*]}"
  echo "libraries:"
  (cd "$stage/lib" && ls -1)
  echo "expected on the GPU machine: libcuda (driver), libcublas.so.13, libcublasLt.so.13, libnccl.so.2"
} >"$stage/MANIFEST"

mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
rm -f "$dest/bundle.tar.xz"
echo "device_bundle: packing ($(du -sh "$stage" | cut -f1) unpacked)"
tar -C "$stage" -cf - bin lib assets MANIFEST | xz -6 -T"${JOBS:-2}" >"$dest/bundle.tar.xz"
cp "$root/tools/device_check.sh" "$dest/device_check.sh"
chmod +x "$dest/device_check.sh"
cp "$stage/MANIFEST" "$dest/MANIFEST"
size_mb=$(( $(stat -c %s "$dest/bundle.tar.xz") / 1048576 ))
echo "device_bundle: $dest/bundle.tar.xz is ${size_mb} MB"
((size_mb < limit_mb)) || { echo "device_bundle: over the ${limit_mb} MB limit"; exit 1; }

# keep the bundle out of git in the repository that holds DEST
repo="$(cd "$dest/.." && git rev-parse --show-toplevel 2>/dev/null || true)"
if [[ -n "$repo" ]]; then
  exclude="$(cd "$repo" && git rev-parse --path-format=absolute --git-path info/exclude 2>/dev/null ||
             echo "$repo/.git/info/exclude")"
  rel="/${dest#"$repo"/}/"
  mkdir -p "$(dirname "$exclude")"
  touch "$exclude"
  grep -qxF "$rel" "$exclude" || echo "$rel" >>"$exclude"
  echo "device_bundle: $rel is in $exclude"
fi
echo "device_bundle: on the GPU machine, from $(dirname "$dest"): bash $(basename "$dest")/device_check.sh --prebuilt $(basename "$dest")"
