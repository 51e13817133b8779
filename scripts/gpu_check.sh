#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: builds mpt for sm_90, runs the whole test suite
# (every for_each_device test then also runs on cuda:0, and the GPU-only test runs instead of
# being skipped), runs compute-sanitizer's memcheck over the op tests, runs bench/bench_gpu
# (models A, B, C, D and D widened to 4096, batch 1024, float32 / mixed_float16 /
# mixed_bfloat16) and the same models in PyTorch AMP, and writes one report.
#   bash scripts/gpu_check.sh            (REPORT=gpu_report.md, BUILD_DIR=build-gpu)
# Budget: under 10 minutes on an H100 (the build takes most of it on 16 cores).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
REPORT=${REPORT:-gpu_report.md}
STEPS=${STEPS:-50}
start=$SECONDS
log() { echo "== $* ($((SECONDS - start)) s)"; }

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi); this script is for a machine with one"
  exit 2
fi
# The build dependencies come from Debian packages; on a machine that cannot reach them, they
# must be there already.
bash scripts/install_deps.sh || echo "gpu_check: install_deps failed; building with what is installed"

{
  echo "# mpt GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -1
  lscpu | grep -E "^Model name" || true
  echo '```'
} > "$REPORT"

log "configure and build ($BUILD_DIR, sm_90)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DMPT_WITH_CUDA=ON \
  > "$BUILD_DIR.configure.log" 2>&1 || { cat "$BUILD_DIR.configure.log"; exit 1; }
if ! cmake --build "$BUILD_DIR" -j"$(nproc)" > "$BUILD_DIR.build.log" 2>&1; then
  tail -50 "$BUILD_DIR.build.log"
  echo "gpu_check: build failed" | tee -a "$REPORT"
  exit 1
fi

log "test suite on the GPU"
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 300 -j4 -E package_consumer) > "$BUILD_DIR.ctest.log" 2>&1 || status=1
{
  echo
  echo "## Test suite (ctest, cuda:0 in every for_each_device test)"
  echo '```'
  grep -E "tests passed|tests failed|Not Run|Skipped|\*\*\*Failed|Timeout" "$BUILD_DIR.ctest.log"
  grep -h "cuda:0" "$BUILD_DIR.ctest.log" | head -20
  echo '```'
} >> "$REPORT"

log "compute-sanitizer memcheck over the op tests"
{
  echo
  echo "## compute-sanitizer memcheck (op tests on cuda:0)"
  echo '```'
} >> "$REPORT"
for t in test_ops_forward test_ops_grad test_conv_ops test_cuda_gpu; do
  exe=$(find "$BUILD_DIR/tests" -maxdepth 1 -name "$t" -type f | head -1)
  [ -n "$exe" ] || continue
  if MPT_DEVICE=cuda:0 timeout 240 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 \
       "$exe" --subcase-exclude=cpu,test > "$BUILD_DIR.$t.memcheck.log" 2>&1; then
    echo "$t: clean ($(grep -E 'ERROR SUMMARY' "$BUILD_DIR.$t.memcheck.log" | tail -1))" >> "$REPORT"
  else
    status=1
    echo "$t: FAILED" >> "$REPORT"
    grep -E "ERROR SUMMARY|Invalid|out of bounds|ERROR:" "$BUILD_DIR.$t.memcheck.log" | head -20 >> "$REPORT"
  fi
done
echo '```' >> "$REPORT"

log "benchmarks: mpt, then PyTorch AMP"
{
  echo
  echo "## mpt (bench/bench_gpu)"
  echo '```'
  "$BUILD_DIR/bench/bench_gpu" --steps "$STEPS" 2>&1 || status=1
  echo '```'
  echo
  echo "## PyTorch on the same GPU (bench/torch_amp_gpu.py)"
  echo '```'
  if python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
    python3 bench/torch_amp_gpu.py --steps "$STEPS" 2>&1 || status=1
  else
    echo "PyTorch with CUDA is not installed here: no anchor"
  fi
  echo '```'
} >> "$REPORT" 2>&1

log "done: $REPORT"
cat "$REPORT"
echo "gpu_check: $((SECONDS - start)) s, status $status"
exit $status
