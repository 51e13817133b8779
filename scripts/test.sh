#!/usr/bin/env bash
# Installs the dependencies, builds mpt with its tests and runs them all through CTest; then
# scripts/sanitize.sh runs them again under ASan + UBSan and fuzzes every file reader
# (MPT_SKIP_SANITIZE=1 skips that half, e.g. for a quick local run).
#   bash scripts/test.sh            (BUILD_DIR=build-test by default; extra args go to cmake)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build-test}
# The benchmarks (bench/) are no test: left out here (they build by default elsewhere).
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DMPT_BUILD_BENCH=OFF "$@"
cmake --build "$BUILD_DIR" -j"$(nproc)"
# One test at a time: most use every core (OpenMP), and two at once ran slower in all.
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600)
if [ "${MPT_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/sanitize.sh
fi
