#!/usr/bin/env bash
# The second half of the test command: the whole test suite again in a clang build with
# AddressSanitizer and UBSan (errors abort), then every file reader's libFuzzer target for a
# fixed time from its committed corpus (tests/fuzz/corpus/<target>) and a fixed seed. A finding
# fails the run. The *_avx2 and *_baseline reruns (the same binaries at a lower ISA tier) run in the
# normal build only. Open MPI stays out of this build (its own allocations would read as leaks): the
# mpirun tests run in the normal build, the fake-communicator test here.
#   bash scripts/sanitize.sh          (BUILD_DIR=build-sanitize, FUZZ_SECONDS=10 per target)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sanitize}
FUZZ_SECONDS=${FUZZ_SECONDS:-10}
# -gline-tables-only: reports still get file:line stacks, and the build compiles and links
# faster than with full debug info (-g). -O1 for the library (AddressSanitizer's advice, and a
# third faster to compile than -O2), -O0 for the test programs (their time is in the library):
# this build was half of the CI's time. MPT_ISA_TIERS=OFF: the kernels' baseline bodies only (the
# AVX2 and AVX-512 wrappers inline the same bodies; the normal build tests them at each tier).
# -Wno-pass-failed: clang does not vectorize at -O1, and says so for every `omp simd` loop.
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPT_WITH_CUDA=OFF -DMPT_WITH_MPI=OFF \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG -Wno-pass-failed" -DMPT_TEST_OPT_FLAG=-O0 \
  -DMPT_ASAN=ON -DMPT_FUZZ=ON -DMPT_BUILD_EXAMPLES=OFF -DMPT_BUILD_BENCH=OFF -DMPT_ISA_TIERS=OFF > /dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# allocator_may_return_null: the tests ask for terabytes on purpose and expect an mpt::Error;
# handle_segv=0: the test device's own test needs a plain SIGSEGV in its child.
export ASAN_OPTIONS=allocator_may_return_null=1:handle_segv=0:detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 900 -E "package_consumer|_avx2$|_baseline$")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in "$BUILD_DIR"/tests/fuzz/fuzz_*; do
  name=$(basename "$target")
  corpus=tests/fuzz/corpus/${name#fuzz_}
  mkdir -p "$work/$name"
  echo "== $name: ${FUZZ_SECONDS} s from $(ls "$corpus" | wc -l) seeds"
  start=$SECONDS
  # New inputs go to a scratch folder; the committed corpus is only read. -seed fixes the
  # mutation sequence; a crash, leak, sanitizer report, timeout or other exception fails CI.
  # -timeout=30: above the 10 s limit mpt gives libhdf5 on a file it did not write (parse_guarded).
  if ! TMPDIR="$work" "$target" -seed=1 -max_total_time="$FUZZ_SECONDS" -timeout=30 -rss_limit_mb=4096 \
       -print_final_stats=1 -artifact_prefix="$work/$name-" "$work/$name" "$corpus" > "$work/$name.log" 2>&1; then
    tail -60 "$work/$name.log"
    echo "sanitize: $name found a failure (the input: $(ls "$work/$name"-* 2>/dev/null | head -1))"
    exit 1
  fi
  grep -E "^#[0-9]+[[:space:]]+DONE|^stat::new_units_added" "$work/$name.log" | tr '\n' ' '
  echo "($((SECONDS - start)) s)"
done
echo "sanitize: all tests and fuzz targets clean"
