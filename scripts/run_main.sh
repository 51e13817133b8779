#!/usr/bin/env bash
# The main job: installs the dependencies, builds mpt and trains model C (the CNN) on Fashion-MNIST in
# mixed precision.   bash scripts/run_main.sh [--policy mixed_bfloat16] [--epochs 3] [--batch-size 128] [--checkpoint PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j"$(nproc)" --target fashion_mnist_cnn
if [ $# -eq 0 ]; then set -- --policy mixed_float16 --epochs 3 --checkpoint fashion_cnn.weights.h5; fi
"$BUILD_DIR"/examples/fashion_mnist_cnn "$@"
