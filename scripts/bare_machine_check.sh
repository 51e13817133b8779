#!/usr/bin/env bash
# Proves, on a CPU machine, that the GPU bundle runs where none of mpt's Debian packages are:
# a minimal Debian 12 made with debootstrap, holding only Python, xz and, from PyPI, CMake and
# NVIDIA's CUDA wheels (cuDNN, cuBLAS, the CUDA runtime, NVRTC, NCCL), as the GPU machine's
# Python holds them. It copies the repository and out/gpu/mpt-gpu.tar.xz in, chroots and runs
# scripts/gpu_check.sh there exactly as on the GPU machine. Every library must resolve, every
# CPU test pass, and the GPU parts say "no GPU".
#   bash scripts/gpu_bundle.sh && sudo bash scripts/bare_machine_check.sh
#   sudo bash scripts/bare_machine_check.sh --prepare    (the bare root alone, while a build runs)
#   BARE_ROOT=/var/tmp/mpt-bare-root (made once, ~1.5 GB with the wheels, reused)
#   CUDNN_WHEEL=nvidia-cudnn-cu13==9.13.0.50 (older than the build's headers on purpose)
# The report lands in out/bare/ (gpu_report.md, ctest.log).
set -euo pipefail
cd "$(dirname "$0")/.."
BARE_ROOT=${BARE_ROOT:-/var/tmp/mpt-bare-root}
CUDNN_WHEEL=${CUDNN_WHEEL:-nvidia-cudnn-cu13==9.13.0.50}
# The CUDA 13.0 generation of the wheels, as PyTorch's cu130 builds pin them.
WHEELS=(cmake "$CUDNN_WHEEL" "nvidia-cuda-runtime==13.0.*" "nvidia-cublas==13.1.*" "nvidia-cuda-nvrtc==13.0.*"
        "nvidia-nccl-cu13==2.28.*")
BUNDLE=out/gpu/mpt-gpu.tar.xz
PREPARE_ONLY=0
[ "${1:-}" = --prepare ] && PREPARE_ONLY=1   # make the bare root only (no bundle needed yet)
[ -f "$BUNDLE" ] || [ "$PREPARE_ONLY" = 1 ] || { echo "bare_machine_check: no $BUNDLE; run bash scripts/gpu_bundle.sh first"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bare_machine_check: needs root (debootstrap, chroot)"; exit 2; }

mounted=()
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" 2> /dev/null || true; done; }
trap cleanup EXIT
mount_all() {
  for m in proc dev; do
    mountpoint -q "$BARE_ROOT/$m" || { mount --rbind "/$m" "$BARE_ROOT/$m" && mounted+=("$BARE_ROOT/$m"); }
  done
}

if [ ! -f "$BARE_ROOT/.mpt-debootstrap-done" ]; then
  command -v debootstrap > /dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  echo "== debootstrap: minimal Debian 12 in $BARE_ROOT"
  rm -rf "$BARE_ROOT"
  debootstrap --variant=minbase --include=python3,python3-venv,xz-utils bookworm "$BARE_ROOT" \
    http://deb.debian.org/debian > /tmp/mpt-debootstrap.log 2>&1 || { tail -20 /tmp/mpt-debootstrap.log; exit 1; }
  touch "$BARE_ROOT/.mpt-debootstrap-done"
fi
if [ ! -f "$BARE_ROOT/.mpt-wheels-done" ]; then
  echo "== PyPI into $BARE_ROOT/opt/venv: ${WHEELS[*]}"
  # Fetched here (this machine's pip knows the way out), installed in the root with no index.
  mkdir -p "$BARE_ROOT/wheels"
  python3 -m pip download -q --only-binary=:all: -d "$BARE_ROOT/wheels" "${WHEELS[@]}"
  mount_all
  rm -rf "$BARE_ROOT/opt/venv"
  chroot "$BARE_ROOT" /usr/bin/python3 -m venv /opt/venv
  chroot "$BARE_ROOT" /usr/bin/env -i PATH=/usr/bin:/bin /opt/venv/bin/pip install -q --no-index \
    --find-links /wheels "${WHEELS[@]}"
  rm -rf "$BARE_ROOT/wheels"
  touch "$BARE_ROOT/.mpt-wheels-done"
fi

[ "$PREPARE_ONLY" = 0 ] || { echo "bare_machine_check: $BARE_ROOT is ready"; exit 0; }
mount_all
echo "== what the bare root has"
chroot "$BARE_ROOT" dpkg-query -W -f='${Package}\n' > /tmp/mpt-bare-packages.txt
ours='^(libdnnl|libhdf5|libxtensor|libprotobuf|libzip|libopenmpi|openmpi|nlohmann|libcli11|doctest|libgomp|libcurl|ocl-icd|cmake$)'
if grep -E "$ours" /tmp/mpt-bare-packages.txt; then
  echo "bare_machine_check: the bare root holds one of mpt's dependencies (above); not a proof"; exit 1
fi
echo "$(wc -l < /tmp/mpt-bare-packages.txt) Debian packages, none of mpt's; /usr/local/cuda: $([ -e "$BARE_ROOT/usr/local/cuda" ] && echo present || echo absent)"
chroot "$BARE_ROOT" /opt/venv/bin/pip list 2> /dev/null | grep -iE "nvidia|cmake"

echo "== the repository (as the device tool copies it: tracked and untracked, not ignored) and the bundle"
rm -rf "$BARE_ROOT/work" && mkdir -p "$BARE_ROOT/work/mpt/out/gpu"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$BARE_ROOT/work/mpt"
cp "$BUNDLE" "$BARE_ROOT/work/mpt/out/gpu/"

echo "== scripts/gpu_check.sh in the bare root"
rc=0
chroot "$BARE_ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  OUT=/work/out bash -c 'cd /work/mpt && bash scripts/gpu_check.sh' || rc=$?
rm -rf out/bare && mkdir -p out/bare && cp -r "$BARE_ROOT/work/out/." out/bare/
echo "bare_machine_check: gpu_check exited $rc; report in out/bare/gpu_report.md"
exit $rc
