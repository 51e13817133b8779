#!/usr/bin/env bash
# The main job: installs the dependencies, builds mpt and runs the end-to-end demo in mixed
# precision.   bash scripts/run_main.sh [--policy mixed_bfloat16] [--steps 300]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DMPT_BUILD_TESTS=OFF -DMPT_BUILD_BENCH=OFF
cmake --build "$BUILD_DIR" -j"$(nproc)" --target quickstart
if [ $# -eq 0 ]; then set -- --policy mixed_float16; fi
"$BUILD_DIR"/examples/quickstart "$@"
