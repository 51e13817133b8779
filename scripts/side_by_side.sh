#!/usr/bin/env bash
# mpt against PyTorch 2.15 and Keras 3 on this CPU (issue 11), in one command: builds mpt's
# benchmarks, installs PyTorch 2.15, Keras 3 and NumPy from PyPI into a virtual environment of
# its own (MPT_BENCH_VENV, default ~/.cache/mpt/bench-venv; never at test time or in CI), and runs
# bench/side_by_side.py, whose flags it passes on (--rounds, --models, --threads, --no-keras,
# --amx-off, --isa). On an AMX machine, run it again with AMX off on both sides:
#   bash scripts/side_by_side.sh --amx-off
# and on an AVX-512 machine, with both sides capped at AVX2 (the table of AVX2-only CPUs):
#   bash scripts/side_by_side.sh --isa avx2
# (the same as MPT_ONEDNN_AMX=0 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 in the environment).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
VENV=${MPT_BENCH_VENV:-$HOME/.cache/mpt/bench-venv}
if [ ! -x "$VENV/bin/python" ] || ! KERAS_BACKEND=torch "$VENV/bin/python" -c "import torch, keras, numpy" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==2.15.*" "keras>=3" numpy
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target bench_side peak_probe fashion_mnist_cnn > /dev/null
exec "$VENV/bin/python" bench/side_by_side.py --build "$BUILD_DIR" --python "$VENV/bin/python" "$@"
