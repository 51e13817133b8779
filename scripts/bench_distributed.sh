#!/usr/bin/env bash
# Data-parallel scaling on this machine: bench_distributed on 1 process x 1 thread and on
# 2 processes x 1 thread (mpirun -np 2), for models C and D in float32 and mixed_bfloat16, interleaved
# over ROUNDS rounds. Each round also runs two independent 1-process jobs side by side: their
# summed samples/s is what this machine gives two busy cores with no communication at all (the
# ceiling for 2 ranks). Prints each run and the medians over rounds.
#   bash scripts/bench_distributed.sh        (BUILD_DIR=build, ROUNDS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-3}
cmake --build "$BUILD_DIR" --target bench_distributed -j"$(nproc)" > /dev/null
bench=$BUILD_DIR/bench/bench_distributed
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; $(date -u +%F)"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rate() { sed -n 's/.* \([0-9]*\) samples\/s/\1/p' <<< "$1"; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
for model in C D; do
  steps=$([ "$model" = C ] && echo 100 || echo 15)
  for policy in float32 mixed_bfloat16; do
    one=(); two=(); pair=()
    # One process started without mpirun is a job of its own (no launcher, no MPI).
    run1() { "$bench" --model "$model" --policy "$policy" --steps "$steps" 2>/dev/null; }
    for r in $(seq "$ROUNDS"); do
      l1=$(run1)
      l2=$(mpirun -np 2 --oversubscribe --bind-to none "$bench" --model "$model" --policy "$policy" --steps "$steps" 2>/dev/null)
      run1 > /tmp/bench_pair_a.$$ & la=$(run1); wait; lb=$(cat /tmp/bench_pair_a.$$)
      echo "  1 rank:  $l1"; echo "  2 ranks: $l2"; echo "  2 independent 1-rank jobs: $(rate "$la") + $(rate "$lb") samples/s"
      one+=("$(rate "$l1")"); two+=("$(rate "$l2")"); pair+=("$(( $(rate "$la") + $(rate "$lb") ))")
    done
    m1=$(median "${one[@]}"); m2=$(median "${two[@]}"); mp=$(median "${pair[@]}")
    echo "model $model $policy: 1 rank $m1, 2 ranks $m2, 2 independent jobs $mp samples/s;" \
         "scaling $(awk "BEGIN{printf \"%.2f\", $m2/$m1}")x (the machine's ceiling $(awk "BEGIN{printf \"%.2f\", $mp/$m1}")x)"
  done
done
rm -f /tmp/bench_pair_a.$$
