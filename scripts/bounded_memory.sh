#!/bin/bash
# Trains on an .npy dataset larger than the memory the process may use (issue 28): Fashion-MNIST's
# training images repeated K times into one float32 .npy file at least 3x the limit, then
# `train_npy --stream` (the file memory-mapped, batches prepared by 2 workers) for one epoch over
# all of it inside a memory cgroup of LIMIT_MB (v1: memory.limit_in_bytes, v2: memory.max; needs
# root). Prints the file's size, the limit, the process's peak resident memory and the cgroup's
# peak usage (page cache included), and fails if the run did not finish under the limit.
#
#   bash scripts/bounded_memory.sh [build] [LIMIT_MB=320]
set -euo pipefail
BUILD=${1:-build}
LIMIT_MB=${LIMIT_MB:-320}
DIR=${DIR:-/tmp/mpt_bounded}
BIN="$BUILD/examples/train_npy"
[ -x "$BIN" ] || { echo "bounded_memory: $BIN not built" >&2; exit 2; }
mkdir -p "$DIR"

# Fashion-MNIST as .npy (the exporter trains a moment on 256 rows; only its files are wanted).
[ -f "$DIR/train_x.npy" ] || "$BIN" --export-fashion-mnist "$DIR" --epochs 1 --limit 256 --policy float32 >/dev/null

# The .npy header of a C-order array: magic, version 1.0, the dict padded with spaces to a
# multiple of 64 bytes in all, then '\n'.
npy_header() {  # descr shape
  local dict="{'descr': '$1', 'fortran_order': False, 'shape': $2, }"
  local len=$(( ${#dict} + 1 )) pad
  pad=$(( (64 - (10 + len) % 64) % 64 ))
  len=$(( len + pad ))
  printf '\x93NUMPY\x01\x00'
  printf "\\x$(printf %02x $((len & 255)))\\x$(printf %02x $((len >> 8)))"
  printf '%s%*s\n' "$dict" "$pad" ''
}
data_offset() {  # file: where its data starts (version 1.0 header)
  local b8 b9
  b8=$(od -An -tu1 -j8 -N1 "$1" | tr -d ' ')
  b9=$(od -An -tu1 -j9 -N1 "$1" | tr -d ' ')
  echo $(( 10 + b8 + 256 * b9 ))
}

rows=$(( $(stat -c %s "$DIR/train_x.npy") / (28 * 28 * 4) ))  # 60000 (the header is under one row)
row_bytes=$(( 28 * 28 * 4 ))
K=$(( (3 * LIMIT_MB * 1024 * 1024) / (rows * row_bytes) + 1 ))
N=$(( rows * K ))
xo=$(data_offset "$DIR/train_x.npy"); yo=$(data_offset "$DIR/train_y.npy")
if [ ! -f "$DIR/big_x.npy" ] || [ "$(cat "$DIR/big_rows" 2>/dev/null)" != "$N" ]; then
  { npy_header '<f4' "($N, 28, 28, 1)"; for _ in $(seq "$K"); do tail -c +$((xo + 1)) "$DIR/train_x.npy"; done; } > "$DIR/big_x.npy"
  { npy_header '<i8' "($N,)"; for _ in $(seq "$K"); do tail -c +$((yo + 1)) "$DIR/train_y.npy"; done; } > "$DIR/big_y.npy"
  echo "$N" > "$DIR/big_rows"
fi
size=$(stat -c %s "$DIR/big_x.npy")
limit=$(( LIMIT_MB * 1024 * 1024 ))
echo "dataset: $DIR/big_x.npy, $N rows, $((size / 1048576)) MiB = $(awk "BEGIN{printf \"%.2f\", $size / $limit}")x the limit of $LIMIT_MB MiB"
# The file is read from disk, not from a page cache filled outside the cgroup.
sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true

name="mpt_bounded_$$"
if [ -d /sys/fs/cgroup/memory ]; then  # cgroup v1
  CG=/sys/fs/cgroup/memory/$name
  mkdir "$CG"
  echo "$limit" > "$CG/memory.limit_in_bytes"
  echo "$limit" > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
  PEAK_FILE=$CG/memory.max_usage_in_bytes
else  # cgroup v2
  CG=/sys/fs/cgroup/$name
  mkdir "$CG"
  echo "$limit" > "$CG/memory.max"
  echo 0 > "$CG/memory.swap.max" 2>/dev/null || true
  PEAK_FILE=$CG/memory.peak
fi
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
set +e
( echo "$BASHPID" > "$CG/cgroup.procs"
  exec "$BIN" --x "$DIR/big_x.npy" --y "$DIR/big_y.npy" --stream --workers 2 --epochs 1 --policy mixed_bfloat16 ) \
  | tee "$DIR/run.log"
rc=${PIPESTATUS[0]}
set -e
peak=$(cat "$PEAK_FILE" 2>/dev/null || echo 0)
rss=$(sed -n 's/^peak_rss_mb=//p' "$DIR/run.log")
echo "limit $LIMIT_MB MiB; process peak RSS ${rss:-?} MiB; cgroup peak usage $((peak / 1048576)) MiB (page cache included); exit code $rc"
[ "$rc" = 0 ] || { echo "bounded_memory: the run failed (killed at the limit?)" >&2; exit 1; }
awk "BEGIN{exit !(${rss:-1e9} < $LIMIT_MB)}" || { echo "bounded_memory: peak RSS over the limit" >&2; exit 1; }
echo "bounded_memory: OK, a dataset $(awk "BEGIN{printf \"%.2f\", $size / $limit}")x the memory limit trained with peak RSS under it"
