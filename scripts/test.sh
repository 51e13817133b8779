#!/usr/bin/env bash
# Installs the dependencies, builds mpt with its tests and runs them all through CTest; then
# scripts/sanitize.sh runs them again under ASan + UBSan and fuzzes every file reader
# (MPT_SKIP_SANITIZE=1 skips that half, e.g. for a quick local run).
#   bash scripts/test.sh            (BUILD_DIR=build-test by default; extra args go to cmake)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build-test}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$BUILD_DIR" -j"$(nproc)"
# Tests run two at a time (-j: each is single-threaded or small); the mpirun jobs alone (RUN_SERIAL).
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j"$(nproc)")
if [ "${MPT_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/sanitize.sh
fi
