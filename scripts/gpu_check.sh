#!/usr/bin/env bash
# The GPU check, run on the GPU machine (no network, none of mpt's Debian packages needed) from
# the repository root, with the bundle scripts/gpu_bundle.sh made on a CPU machine:
#   bash scripts/gpu_check.sh [--bundle out/gpu/mpt-gpu.tar.xz] [--out DIR] [--steps 20]
#                             [--sanitize] [--no-bench] [--attention] [--char-transformer CORPUS_DIR]
# It unpacks the bundle (under /tmp), finds CUDA's libraries where that machine has them (its
# Python's NVIDIA wheels, /usr/local/cuda), prints the versions it loaded, checks with ldd that
# every program resolves, runs the whole CTest suite (every for_each_device test also on cuda:0,
# and the GPU-only test), trains the Fashion-MNIST CNN for one epoch in mixed_float16, runs
# bench_gpu and the same models in PyTorch AMP, and writes
# gpu_report.md, the CTest log and the failing tests' output into DIR ($OUT when set, else
# out/gpu/report). Every step has its own time limit and all of them end by DEADLINE (520 s):
# give the command a 540 s limit. The first run should take about 5 minutes on an H100.
# --char-transformer DIR trains examples/char_transformer on cuda:0 for one minute under
# mixed_bfloat16 on the fortunes files in DIR (the GPU machine has no fortunes package: carry them).
# --attention times ops::dot_product_attention on cuda:0 (bench_attention: bfloat16 through
# cuDNN's fused forward, float32 through mpt's kernels) beside PyTorch's scaled_dot_product_attention.
# --sanitize adds compute-sanitizer's memcheck over the op tests on cuda:0: a separate step that
# reports "not supported here" where the machine refuses it.
# Exit status: 0 when every test passed (with or without a GPU: the report says which),
# 1 when something failed, 2 when the bundle is missing or does not resolve.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=out/gpu/mpt-gpu.tar.xz
OUT_DIR=${OUT:-out/gpu/report}
STEPS=50
EPOCHS=3
SANITIZE=0
PROFILE=
BENCH=1
ATTENTION=0
CHAR_CORPUS=
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --sanitize) SANITIZE=1; shift ;;
    --profile) PROFILE=$2; shift 2 ;;
    --no-bench) BENCH=0; shift ;;
    --attention) ATTENTION=1; shift ;;
    --char-transformer) CHAR_CORPUS=$(cd "$2" && pwd); shift 2 ;;
    *) echo "gpu_check: unknown argument '$1' (see the head of $0)"; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
REPORT=$OUT_DIR/gpu_report.md
ROOT=${MPT_GPU_ROOT:-/tmp/mpt-gpu}
DEADLINE=${DEADLINE:-520}   # seconds: every step is cut to what is left of it (a 540 s command limit)
start=$SECONDS
# The time limit of a step: its own cap, or what is left before the deadline, if less.
budget() { local left=$((DEADLINE - (SECONDS - start))); [ "$left" -gt 5 ] || left=5; echo $(($1 < left ? $1 : left)); }
log() { echo "== gpu_check: $* ($((SECONDS - start)) s)"; }
section() { printf '\n## %s\n\n```\n' "$1" >> "$REPORT"; }
endsection() { echo '```' >> "$REPORT"; }

[ -f "$BUNDLE" ] || { echo "gpu_check: no bundle at $BUNDLE: make it on a CPU machine with bash scripts/gpu_bundle.sh"; exit 2; }
log "unpack $BUNDLE into $ROOT"
rm -rf "$ROOT" && mkdir -p "$ROOT"
tar -xJf "$BUNDLE" -C "$ROOT" --strip-components=1 || { echo "gpu_check: cannot unpack $BUNDLE"; exit 2; }
manifest() { sed -n "s/^$1=//p" "$ROOT/MANIFEST"; }

# CTest's files name the build machine's folders and cmake: point them here.
CMAKE=$(command -v cmake || true)
while read -r f; do
  sed -i -e "s|$(manifest build_root)|$ROOT/build|g" -e "s|$(manifest source_root)|$ROOT/src|g" \
    ${CMAKE:+-e "s|\"$(manifest cmake_command)\"|\"$CMAKE\"|g"} "$f"
done < <(find "$ROOT/build" -name CTestTestfile.cmake)

# CUDA's libraries: the NVIDIA wheels of every Python here first (cuDNN and NCCL live only
# there), then the toolkit's.
cuda_dirs=()
for python in python3 /opt/torch/.venv/bin/python3; do
  command -v "$python" > /dev/null || continue
  for sp in $("$python" -c 'import site, sysconfig; print(" ".join(set(site.getsitepackages() + [sysconfig.get_paths()["purelib"]])))' 2> /dev/null); do
    [ -d "$sp/nvidia" ] || continue
    while read -r d; do cuda_dirs+=("$d"); done < <(find "$sp/nvidia" -name 'lib*.so*' -printf '%h\n' 2> /dev/null | sort -u)
  done
done
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cuda_dirs+=("$d")
done
lib_path="$ROOT/build:$ROOT/lib"
declare -A seen=()
for d in "${cuda_dirs[@]}"; do
  [ -n "${seen[$d]:-}" ] && continue
  seen[$d]=1
  lib_path="$lib_path:$d"
done
# The bundle's libraries are Debian 12's (OpenSSL, libffi, ...): only mpt's programs get them;
# Python keeps the machine's own (py runs it so).
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
py() { LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH python3 "$@"; }
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MPT_TEST_DATA_DIR=$ROOT/src/tests/data
export MPT_FASHION_MNIST_DIR=$ROOT/data
unset MPT_DEVICE

{
  echo "# mpt GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Bundle: $(manifest commit), built $(manifest built)."
  echo "Here: $(uname -n), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores."
} > "$REPORT"

section "GPU and CUDA stack"
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >> "$REPORT" 2>&1
else
  echo "nvidia-smi: no GPU visible" >> "$REPORT"
fi
command -v nvcc > /dev/null && nvcc --version | tail -1 >> "$REPORT"
json_arg=()
nvidia-smi -L > /dev/null 2>&1 && json_arg=(--device-json "$OUT_DIR/cudnn_device.json")
"$ROOT/build/tests/cuda_versions" "${json_arg[@]}" >> "$REPORT" 2>&1 || echo "cuda_versions failed ($?)" >> "$REPORT"
echo "library folders, in search order:" >> "$REPORT"
echo "$LD_LIBRARY_PATH" | tr ':' '\n' | sed 's/^/  /' >> "$REPORT"
endsection
GPU=0
grep -q '^GPU 0 ' "$REPORT" && GPU=1

log "ldd of every program and library in the bundle"
section "ldd: every ELF file of the bundle resolves"
unresolved=0
while read -r f; do
  missing=$(ldd "$f" 2>&1 | grep "not found" || true)
  if [ -n "$missing" ]; then
    unresolved=1
    echo "${f#"$ROOT"/}:" >> "$REPORT"
    echo "$missing" >> "$REPORT"
  fi
done < <(find "$ROOT/build" "$ROOT/lib" -type f | while read -r f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$f"; done)
[ "$unresolved" = 0 ] && echo "all resolve ($(find "$ROOT/build" "$ROOT/lib" -type f | wc -l) files)" >> "$REPORT"
endsection
if [ "$unresolved" = 1 ]; then
  cat "$REPORT"
  echo "gpu_check: libraries missing (see $REPORT)"
  exit 2
fi

status=0
log "test suite (ctest; cuda:0 in every for_each_device test)"
jobs=$(( $(nproc) / 2 )); [ "$jobs" -ge 1 ] || jobs=1; [ "$jobs" -le 8 ] || jobs=8
# package_consumer compiles a project against the installed headers: a CPU-machine test.
(cd "$ROOT/build" && timeout "$(budget 300)" ctest --output-on-failure --timeout 240 -j"$jobs" -E '^package_consumer$' \
   --output-junit "$OUT_DIR/ctest.xml") > "$OUT_DIR/ctest.log" 2>&1 || status=1
section "Test suite (ctest -j$jobs, per-test limit 240 s)"
grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run|Skipped|Total Test time" \
  "$OUT_DIR/ctest.log" >> "$REPORT"
endsection
# Each failing test's own output (CTest printed it once, as a block after its result line): one
# file each, and the lines that say what failed in the report.
mkdir -p "$OUT_DIR/failed"
while read -r t; do
  [ -n "$t" ] || continue
  awk -v t="$t" '$0 ~ "Test +#[0-9]+: " t " [.]" && /\*\*\*|Failed/ {on = 1; print; next}
                 on && /^ *[0-9]+\/[0-9]+ Test +#/ {on = 0} on' "$OUT_DIR/ctest.log" > "$OUT_DIR/failed/$t.log"
  section "Failed: $t (what failed, 60 lines at most; all of it in failed/$t.log)"
  grep -E "ERROR|FAILED|CHECK|REQUIRE|rror|what\(\)|Segmentation|Abort|SUBCASE|TEST CASE|Timeout|Exception" \
    "$OUT_DIR/failed/$t.log" | head -60 >> "$REPORT"
  endsection
done < <(grep -vE '\((Skipped|Disabled)\)$' "$OUT_DIR/ctest.log" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (.*/\1/p' | sort -u)

# The main job, model C on Fashion-MNIST (batch 128, seed 1), in every policy on cuda:0: its test
# accuracy (to compare with the CPU's for the same seed) and the allocator's cudaMalloc count
# after the first step. Without a GPU, one epoch of mixed_float16 on the CPU.
if [ "$GPU" = 1 ]; then fit_device=cuda:0; fit_policies="float32 mixed_float16 mixed_bfloat16"; fit_epochs=$EPOCHS
else fit_device=cpu; fit_policies=mixed_float16; fit_epochs=1; fi
log "the main job: examples/fashion_mnist_cnn on $fit_device, $fit_epochs epochs, $fit_policies"
section "The main job: fashion_mnist_cnn --epochs $fit_epochs --batch-size 128 --seed 1 on $fit_device"
for policy in $fit_policies; do
  t0=$SECONDS
  (cd "$ROOT" && MPT_DEVICE=$fit_device timeout "$(budget $((30 * fit_epochs + 30)))" "$ROOT/build/examples/fashion_mnist_cnn" \
     --policy "$policy" --epochs "$fit_epochs" --checkpoint "$ROOT/fashion_cnn_$policy.weights.h5") \
    > "$OUT_DIR/fit_$policy.log" 2>&1 || { echo "$policy: exit $?" >> "$REPORT"; status=1; }
  echo "-- $policy ($((SECONDS - t0)) s in all)" >> "$REPORT"
  tr '\r' '\n' < "$OUT_DIR/fit_$policy.log" | grep -aE "^Epoch|/step|trained on|device memory|test accuracy|error|: reservation" \
    | sed -E 's/━+ //' | tail -30 >> "$REPORT"
  grep -q "test_accuracy=0\.[7-9]" "$OUT_DIR/fit_$policy.log" || { echo "(no test_accuracy >= 0.7)" >> "$REPORT"; status=1; }
done
endsection

if [ "$SANITIZE" = 1 ]; then
  log "compute-sanitizer memcheck"
  section "compute-sanitizer memcheck (op tests, cuda:0 subcases)"
  if [ "$GPU" = 0 ]; then
    echo "no GPU: not run" >> "$REPORT"
  elif ! command -v compute-sanitizer > /dev/null; then
    echo "compute-sanitizer: not installed here" >> "$REPORT"
  elif ! timeout "$(budget 60)" compute-sanitizer --tool memcheck --error-exitcode 99 "$ROOT/build/tests/cuda_versions" \
         > "$OUT_DIR/memcheck.probe.log" 2>&1; then
    echo "compute-sanitizer: not supported here ($(grep -m1 -iE 'not supported|error' "$OUT_DIR/memcheck.probe.log"))" >> "$REPORT"
  else
    # API errors are not reported: test_cuda_gpu asks for 2^50 bytes on purpose (an mpt::Error
    # naming "out of memory" is what it checks). Exit 99: memcheck found an error; other codes: the
    # tests' own failures (doctest) or the time limit (124).
    for t in test_op_table test_ops_forward test_ops_grad test_conv_ops test_cuda_elementwise test_cuda_gpu; do
      timeout "$(budget 75)" compute-sanitizer --tool memcheck --leak-check no --report-api-errors no --error-exitcode 99 \
        "$ROOT/build/tests/$t" --subcase-exclude=cpu,test > "$OUT_DIR/memcheck.$t.log" 2>&1
      rc=$?
      summary=$(grep -E 'ERROR SUMMARY' "$OUT_DIR/memcheck.$t.log" | tail -1 | sed 's/=* *//')
      if [ "$rc" = 0 ]; then
        echo "$t: clean, tests passed ($summary)" >> "$REPORT"
      else
        status=1
        echo "$t: exit $rc ($summary; memcheck.$t.log)" >> "$REPORT"
        grep -E "Invalid|out of bounds|ERROR:|doctest. test cases" "$OUT_DIR/memcheck.$t.log" | head -12 >> "$REPORT"
      fi
    done
  fi
  endsection
fi

if [ -n "$CHAR_CORPUS" ]; then
  log "examples/char_transformer on cuda:0, 1 minute, mixed_bfloat16"
  section "examples/char_transformer --minutes 1 --corpus (fortunes) on $([ "$GPU" = 1 ] && echo cuda:0 || echo cpu)"
  (cd "$OUT_DIR" && timeout "$(budget 150)" "$ROOT/build/examples/char_transformer" --minutes 1 --corpus "$CHAR_CORPUS" \
     --checkpoint "" --sample-chars 300) >> "$REPORT" 2>&1 || { echo "char_transformer: exit $?" >> "$REPORT"; status=1; }
  endsection
fi

if [ "$ATTENTION" = 1 ]; then
  log "attention: bench_attention and PyTorch's scaled_dot_product_attention"
  for dt in bfloat16 float32; do
    section "mpt: bench/bench_attention --device cuda:0 --dtype $dt --tokens 16384 --heads 8 --dim 64 --repeat 5"
    if [ "$GPU" = 1 ]; then
      timeout "$(budget 60)" "$ROOT/build/bench/bench_attention" --device cuda:0 --dtype $dt --tokens 16384 --heads 8 \
        --dim 64 --repeat 5 >> "$REPORT" 2>&1 || { echo "bench_attention: exit $?" >> "$REPORT"; status=1; }
    else
      echo "no GPU: nothing to measure" >> "$REPORT"
    fi
    endsection
    section "PyTorch: bench/torch_attention_gpu.py --dtype $dt --tokens 16384 --heads 8 --dim 64 --repeat 5"
    if py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
      (cd "$ROOT/src/bench" && timeout "$(budget 60)" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" python3 \
        torch_attention_gpu.py --dtype $dt --tokens 16384 --heads 8 --dim 64 --repeat 5) >> "$REPORT" 2>&1 ||
        echo "torch_attention_gpu: exit $?" >> "$REPORT"
    else
      echo "no PyTorch with a usable GPU here: no anchor" >> "$REPORT"
    fi
    endsection
  done
fi

if [ "$BENCH" = 1 ]; then
  log "bench_gpu and PyTorch AMP"
  # Batch 1024 for every model, then W (D widened to 4096) at batch 8192.
  for args in "--batch 1024" "--batch 8192 --models W"; do
    section "mpt: bench/bench_gpu --steps $STEPS $args"
    if [ "$GPU" = 1 ]; then
      timeout "$(budget 90)" "$ROOT/build/bench/bench_gpu" --steps "$STEPS" $args >> "$REPORT" 2>&1 || { echo "bench_gpu: exit $?" >> "$REPORT"; status=1; }
    else
      echo "no GPU: nothing to measure" >> "$REPORT"
    fi
    endsection
    section "PyTorch AMP on the same GPU: bench/torch_amp_gpu.py --steps $STEPS $args"
    if py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
      (cd "$ROOT/src/bench" && timeout "$(budget 90)" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" python3 torch_amp_gpu.py --steps "$STEPS" $args) >> "$REPORT" 2>&1 || { echo "torch_amp_gpu: exit $?" >> "$REPORT"; status=1; }
    else
      echo "no PyTorch with a usable GPU here: no anchor" >> "$REPORT"
    fi
    endsection
  done
  section "GEMMs of a D-4096 step at batch 8192: mpt's ops::matmul and torch.matmul, TFLOP/s"
  if [ "$GPU" = 1 ]; then
    timeout "$(budget 40)" "$ROOT/build/bench/bench_gpu" --gemm --batch 8192 >> "$REPORT" 2>&1 || echo "bench_gpu --gemm: exit $?" >> "$REPORT"
    (cd "$ROOT/src/bench" && timeout "$(budget 40)" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" python3 torch_amp_gpu.py --gemm --batch 8192) \
      >> "$REPORT" 2>&1 || echo "torch_amp_gpu --gemm: exit $?" >> "$REPORT"
  else
    echo "no GPU: nothing to measure" >> "$REPORT"
  fi
  endsection
fi

# Kernel launches per training step (models A and C, batch 1024): Nsight Compute counts the
# kernels between cudaProfilerStart and Stop around 5 steps after the warm-up, one process per
# model and mode, on both sides.
if [ "$BENCH" = 1 ] && [ "$GPU" = 1 ] && command -v ncu > /dev/null; then
  log "kernel launches per step"
  section "Kernel launches per training step (ncu, 5 steps after 3 warm-up, batch 1024)"
  count() {  # ncu's per-kernel summary: the sum of the Invocations column
    py -c '
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 5]
if not rows: print("no kernels"); sys.exit()
i = [h.strip("\"") for h in rows[0]].index("Invocations")
m = [h.strip("\"") for h in rows[0]].index("Metric Name")
print(sum(int(r[i]) for r in rows[1:] if r[m] == "gpu__time_duration.sum") / 5)' "$1"
  }
  for model in A C; do
    for policy in float32 mixed_float16; do
      timeout "$(budget 30)" ncu --profile-from-start off --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
        "$ROOT/build/bench/bench_gpu" --models $model --policies $policy --launches 5 --warmup 3 > "$OUT_DIR/launches_mpt_$model$policy.csv" 2>&1
      echo "mpt     $model $policy: $(count "$OUT_DIR/launches_mpt_$model$policy.csv") kernels per step" >> "$REPORT"
    done
    for mode in fp32 amp_fp16; do
      (cd "$ROOT/src/bench" && timeout "$(budget 40)" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" ncu --profile-from-start off \
         --metrics gpu__time_duration.sum --print-summary per-kernel --csv python3 torch_amp_gpu.py --models $model \
         --modes $mode --launches 5 --warmup 3) > "$OUT_DIR/launches_torch_$model$mode.csv" 2>&1
      echo "PyTorch $model $mode: $(count "$OUT_DIR/launches_torch_$model$mode.csv") kernels per step" >> "$REPORT"
    done
  done
  endsection
fi

# --profile MODELS: Nsight Compute's per-kernel times for bench_gpu's steps of those models
# (2 warm-up and 2 timed steps in each policy): where a step's time goes.
if [ -n "$PROFILE" ] && [ "$GPU" = 1 ] && command -v ncu > /dev/null; then
  log "ncu per-kernel times, models $PROFILE"
  section "Nsight Compute: kernels of bench_gpu --models $PROFILE (sum of gpu__time_duration over 4 steps x 3 policies, top 25)"
  timeout "$(budget 150)" ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
    "$ROOT/build/bench/bench_gpu" --models "$PROFILE" --steps 2 --warmup 2 > "$OUT_DIR/ncu.csv" 2> "$OUT_DIR/ncu.err"
  echo "ncu exit $?, $(grep -c . "$OUT_DIR/ncu.csv") lines" >> "$REPORT"
  py - "$OUT_DIR/ncu.csv" >> "$REPORT" 2>&1 <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 5]
if not rows: sys.exit("no ncu rows")
head = rows[0]
def col(name):
    return next(i for i, h in enumerate(head) if h.strip('"') == name)
try:
    k, inv, met, avg = col("Kernel Name"), col("Invocations"), col("Metric Name"), col("Average")
except StopIteration:
    sys.exit("ncu columns: " + ",".join(head))
tot = collections.Counter(); cnt = collections.Counter()
for r in rows[1:]:
    if r[met] != "gpu__time_duration.sum": continue
    try: n, a = int(r[inv]), float(r[avg].replace(",", ""))
    except ValueError: continue
    tot[r[k][:110]] += n * a; cnt[r[k][:110]] += n
all_ns = sum(tot.values())
print(f"{len(tot)} kernels, {sum(cnt.values())} launches, {all_ns / 1e6:.2f} ms in all (units as ncu printed)")
for name, t in tot.most_common(25):
    print(f"{100 * t / all_ns:5.1f}%  {t / 1e6:9.3f}  x{cnt[name]:<5d} {name}")
PY
  endsection
fi

{
  echo
  if [ "$GPU" = 1 ]; then echo "GPU: yes."; else echo "GPU: none here; the CUDA halves were skipped and said so."; fi
  echo "Result: $([ "$status" = 0 ] && echo "every test passed" || echo "FAILURES (see above)"), $((SECONDS - start)) s."
} >> "$REPORT"
# The device tool brings back at most 8 files: the report and the device description as they
# are, everything else in one archive.
if [ "$(find "$OUT_DIR" -type f | wc -l)" -gt 7 ]; then
  (cd "$OUT_DIR" && tar -czf /tmp/mpt-gpu-details.tar.gz --exclude=gpu_report.md --exclude=cudnn_device.json . \
     && find . -mindepth 1 ! -name gpu_report.md ! -name cudnn_device.json -delete \
     && mv /tmp/mpt-gpu-details.tar.gz details.tar.gz)
  echo "Logs: details.tar.gz (ctest.log, ctest.xml, failed/, fit and memcheck logs)." >> "$REPORT"
fi
cat "$REPORT"
log "done: $REPORT, status $status"
exit $status
