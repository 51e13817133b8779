#!/usr/bin/env bash
# Installs mpt's build and run dependencies from Debian packages. Idempotent; run as root.
set -euo pipefail
pkgs=(build-essential cmake pkg-config
      libxtensor-dev libhdf5-dev doctest-dev nlohmann-json3-dev libcli11-dev
      libdnnl-dev ocl-icd-opencl-dev zlib1g-dev dataset-fashion-mnist
      fortunes     # the text corpus of examples/char_transformer.cpp
      libzip-dev   # libzip: the optional .keras checkpoint format
      libprotobuf-dev protobuf-compiler   # TensorBoard's event protocol buffers
      libopenmpi-dev openmpi-bin   # mpt::distributed across processes and machines
      clang libclang-rt-dev libomp-dev)  # the sanitizer and fuzzing half of scripts/test.sh
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: installed ${missing[*]}"
