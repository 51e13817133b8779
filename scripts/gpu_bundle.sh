#!/usr/bin/env bash
# Builds, on a CPU machine with the CUDA toolkit, everything the GPU check runs and packs it into
# one file for a GPU machine that has no network and none of mpt's Debian packages:
#   bash scripts/gpu_bundle.sh        -> out/gpu/mpt-gpu.tar.xz (size printed; must be < 60 MiB)
# Then carry that file to the GPU machine with the repository and run scripts/gpu_check.sh there
# (README, "Running on a GPU").
#
# The bundle holds the library and every test, bench and example program of an sm_90 build
# (SASS and PTX, MPI off), CTest's test files, tests/data, the PyTorch anchor, the Fashion-MNIST
# files, and every shared library those programs need except glibc, libstdc++, libgcc, libm,
# libz and CUDA's own (cudart, cuBLAS, cuDNN, NCCL, NVRTC): those come from the GPU machine's
# CUDA toolkit and its Python's NVIDIA wheels. Nothing in it depends on an absolute path of this
# machine: gpu_check.sh rewrites CTest's paths to wherever it unpacks, and the programs find
# their libraries and data through LD_LIBRARY_PATH, MPT_TEST_DATA_DIR and MPT_FASHION_MNIST_DIR.
#   BUILD_DIR=build-gpu (kept between runs: a rebuild is incremental)  OUT_DIR=out/gpu  NO_BUILD=1
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT_DIR=${OUT_DIR:-out/gpu}
LIMIT_MIB=60
start=$SECONDS
log() { echo "== gpu_bundle: $* ($((SECONDS - start)) s)"; }

mkdir -p "$OUT_DIR"
bash scripts/install_deps.sh
command -v nvcc > /dev/null || { echo "gpu_bundle: nvcc not found; the bundle needs the CUDA toolkit" >&2; exit 1; }
generator=()
command -v ninja > /dev/null && [ ! -f "$BUILD_DIR/Makefile" ] && generator=(-G Ninja)

if [ "${NO_BUILD:-0}" != 1 ]; then  # NO_BUILD=1: pack the build folder as it is
  log "configure $BUILD_DIR (CUDA sm_90 SASS + PTX, MPI off)"
  cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMPT_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DMPT_WITH_MPI=OFF -DMPT_BUILD_TESTS=ON -DMPT_BUILD_BENCH=ON \
    -DMPT_BUILD_EXAMPLES=ON > "$OUT_DIR.configure.log" 2>&1 || { cat "$OUT_DIR.configure.log"; exit 1; }
  log "build"
  cmake --build "$BUILD_DIR" -j"$(nproc)"
fi
BUILD=$(cd "$BUILD_DIR" && pwd)

STAGE=$OUT_DIR/stage/mpt-gpu
rm -rf "$OUT_DIR/stage"
mkdir -p "$STAGE/build" "$STAGE/src" "$STAGE/lib" "$STAGE/data"
STAGE=$(cd "$STAGE" && pwd)
log "stage"
is_elf() { [ "$(head -c 4 "$1" 2> /dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }
elfs() { find "$@" -type f | while read -r f; do is_elf "$f" && echo "$f"; done; }  # the ELF files under $@
# The build tree's programs and CTest files, at the same relative paths.
(cd "$BUILD" && find . -path ./CMakeFiles -prune -o -path '*/CMakeFiles' -prune -o -path ./generated -prune -o \
   \( -type f -o -type l \) \( -name CTestTestfile.cmake -o -name 'libmpt.so*' -o -perm -u+x \) -print) |
  while read -r f; do
    case "$f" in *.cmake | *libmpt.so*) ;; *) is_elf "$BUILD/$f" || continue ;; esac
    mkdir -p "$STAGE/build/$(dirname "$f")"
    cp -P "$BUILD/$f" "$STAGE/build/$f"
  done
# What CTest's tests and the device script read from the source tree.
mkdir -p "$STAGE/src/tests" "$STAGE/src/bench" "$STAGE/src/examples"
cp -r tests/data "$STAGE/src/tests/data"
cp bench/*.py "$STAGE/src/bench/"
cp examples/*.cmake "$STAGE/src/examples/" 2> /dev/null || true
FASHION=${MPT_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
cp "$FASHION"/*-ubyte.gz "$STAGE/data/"
# Smaller and no less useful: the programs carry no symbol tables on the GPU machine.
elfs "$STAGE/build" | xargs strip --strip-unneeded

# Every shared library the programs load that the GPU machine may not have. ldd resolves them
# here (CUDA's from the toolkit); those outside the allowed system and CUDA set are copied.
allowed='^(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s|libz|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z-]*|libnvJitLink)\.so'
export LD_LIBRARY_PATH="$BUILD:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elfs "$STAGE/build" | xargs ldd 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $allowed ]] && continue
    [[ "$name" == libmpt.so* ]] && continue
    cp -L "$path" "$STAGE/lib/$name"
  done
strip --strip-unneeded "$STAGE"/lib/*.so* 2> /dev/null || true

# Proof on this machine: with only the bundle's lib folder and CUDA's on the path, every ELF
# file resolves, and nothing outside the bundle but the allowed set.
log "check: ldd of every ELF file in the bundle"
export LD_LIBRARY_PATH="$STAGE/build:$STAGE/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib"
bad=0
while read -r f; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then echo "  $f: $name not found"; bad=1; continue; fi
    case "$path" in "$STAGE"/*) continue ;; esac
    [[ "$name" =~ $allowed ]] || { echo "  $f: $name from $path (outside the bundle)"; bad=1; }
  done < <(ldd "$f" 2> /dev/null)
done < <(elfs "$STAGE/build" "$STAGE/lib")
[ "$bad" = 0 ] || { echo "gpu_bundle: the bundle does not resolve by itself" >&2; exit 1; }

{
  echo "build_root=$BUILD"
  echo "source_root=$SRC"
  echo "commit=$(git rev-parse HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD 2> /dev/null || echo '+changes')"
  echo "built=$(date -u +%Y-%m-%dT%H:%MZ) on $(uname -n), $(nvcc --version | tail -1)"
  echo "cmake_command=$(command -v cmake)"
  echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
} > "$STAGE/MANIFEST"
(cd "$STAGE/lib" && ls) > "$STAGE/lib/LIBRARIES"

log "pack (xz -9)"
BUNDLE=$OUT_DIR/mpt-gpu.tar.xz
tar -C "$OUT_DIR/stage" -cf - mpt-gpu | xz -9 -T"$(nproc)" > "$BUNDLE.tmp"
mv "$BUNDLE.tmp" "$BUNDLE"
bytes=$(stat -c %s "$BUNDLE")
raw=$(du -sb "$STAGE" | cut -f1)
awk -v f="$BUNDLE" -v b="$bytes" -v r="$raw" -v n="$(ls "$STAGE/lib" | grep -c '\.so')" \
  'BEGIN { printf "gpu_bundle: %s: %.1f MiB (%.1f MiB unpacked; %d shared libraries bundled)\n", f, b / 1048576, r / 1048576, n }'
if [ "$bytes" -ge $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu_bundle: over the ${LIMIT_MIB} MiB limit" >&2
  exit 1
fi
log "done"
