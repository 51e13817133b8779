#!/usr/bin/env bash
# TensorBoard end to end: trains model C (examples/fashion_mnist_cnn) for one epoch with the
# TensorBoard callback and a CSVLogger, checks the event files with tensorboard's own reader
# (tests/interop/tensorboard_check.py), then serves them with TensorBoard and takes a headless
# screenshot of the scalars page (docs/images/tensorboard_scalars.png).
#
#   bash scripts/tensorboard_demo.sh            # BUILD_DIR=build, OUT_DIR=/tmp/mpt_tensorboard_demo
#
# Needs, besides scripts/install_deps.sh: `pip install tensorboard` and Debian's chromium
# (SKIP_SCREENSHOT=1 leaves the screenshot out).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT_DIR=${OUT_DIR:-/tmp/mpt_tensorboard_demo}
PORT=${PORT:-6006}
SHOT=${SHOT:-docs/images/tensorboard_scalars.png}

bash scripts/install_deps.sh
python3 -c "import tensorboard" 2>/dev/null || python3 -m pip install -q tensorboard
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j"$(nproc)" --target fashion_mnist_cnn

rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
"$BUILD_DIR"/examples/fashion_mnist_cnn --epochs 1 --validation-split 0.1 --checkpoint "" \
  --tensorboard "$OUT_DIR/logs" --csv-log "$OUT_DIR/history.csv"
python3 tests/interop/tensorboard_check.py --logdir "$OUT_DIR/logs" --csv "$OUT_DIR/history.csv" --update-freq 20

[ "${SKIP_SCREENSHOT:-0}" = 1 ] && exit 0
command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }
python3 -m tensorboard.main --logdir "$OUT_DIR/logs" --port "$PORT" >"$OUT_DIR/tensorboard.log" 2>&1 &
tb_pid=$!
trap 'kill "$tb_pid" 2>/dev/null || true' EXIT
for _ in $(seq 60); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://localhost:$PORT/data/runs')" 2>/dev/null && break
  sleep 1
done
mkdir -p "$(dirname "$SHOT")"
# The scalars page, filtered to loss, accuracy and the loss scale, charts drawn as SVG.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,780 \
  --virtual-time-budget=20000 --screenshot="$SHOT" \
  "http://localhost:$PORT/#scalars&tagFilter=batch_loss%7Cbatch_accuracy%7Closs_scale&_smoothingWeight=0" >/dev/null 2>&1
echo "screenshot: $SHOT ($(stat -c %s "$SHOT") bytes)"
