#!/usr/bin/env python3
"""The Keras 3 anchor: Keras's own model.fit of model C against mpt's, same run, same machine.

    python3 -m venv /tmp/kvenv2 && /tmp/kvenv2/bin/pip install keras torch numpy
    /tmp/kvenv2/bin/python bench/keras_fit_anchor.py [--mpt build/examples/fashion_mnist_cnn]
                                                     [--threads 2] [--train-size 60000]

Model C (Conv2D 32 3x3 relu, MaxPool 2, Conv2D 64 3x3 relu, MaxPool 2, Flatten, Dense 128 relu,
Dense 10 softmax) on Fashion-MNIST, batch 128, Adam 1e-3, mixed_bfloat16 policy, with the
TensorBoard and CSVLogger callbacks on. Keras runs on the torch backend (KERAS_BACKEND=torch,
torch.set_num_threads(threads)); a warm-up fit of a few batches comes first, then one timed epoch
(ms/step = the fit's wall time / steps). mpt's fashion_mnist_cnn then trains one epoch the same
way (--policy mixed_bfloat16 --epochs 1 --tensorboard DIR --csv-log FILE --checkpoint ""); its
ms/step is read from its Keras-style progress bar. Prints both and the ratio Keras/mpt.
"""
import argparse
import gzip
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402


def read_idx(path):
    for candidate in (path, path + ".gz"):
        if os.path.exists(candidate):
            with (gzip.open if candidate.endswith(".gz") else open)(candidate, "rb") as f:
                data = f.read()
            ndim = data[3]
            dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
            return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    sys.exit(f"keras_fit_anchor.py: {path}[.gz] not found (apt-get install dataset-fashion-mnist)")


def parse_ms_per_step(text):
    """The last 'N ms/step' (or s/step, us/step) of a Keras-style progress bar, in ms."""
    hits = re.findall(r"([0-9.]+)(us|ms|s)/step", text)
    if not hits:
        return None
    value, unit = hits[-1]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpt", default=os.path.join(here, "..", "build-tb", "examples", "fashion_mnist_cnn"),
                        help="mpt's fashion_mnist_cnn binary (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=60000, help="first N training images (default all)")
    parser.add_argument("--idx-dir", default=os.environ.get("MPT_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--skip-keras", action="store_true")
    args = parser.parse_args()

    x = read_idx(os.path.join(args.idx_dir, "train-images-idx3-ubyte"))[: args.train_size]
    y = read_idx(os.path.join(args.idx_dir, "train-labels-idx1-ubyte"))[: args.train_size].astype(np.int64)
    x = (x.astype(np.float32) / 255.0)[..., np.newaxis]
    steps = -(-len(x) // 128)
    work = tempfile.mkdtemp(prefix="keras_anchor_")

    keras_ms = None
    if not args.skip_keras:
        import torch
        import keras
        from keras import layers

        torch.set_num_threads(args.threads)
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
            layers.Activation("softmax", dtype="float32"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        callbacks = [keras.callbacks.CSVLogger(os.path.join(work, "keras.csv"))]
        try:  # Keras's TensorBoard callback writes through tensorflow.summary, whatever the backend
            import tensorflow  # noqa: F401

            callbacks.append(keras.callbacks.TensorBoard(os.path.join(work, "keras_tb"), update_freq=20,
                                                         histogram_freq=1))
        except ImportError:
            print("note: tensorflow is not installed, so Keras runs without its TensorBoard callback "
                  "(it needs tensorflow.summary); only CSVLogger is on", flush=True)
        model.fit(x[: 128 * 10], y[: 128 * 10], batch_size=128, epochs=1, verbose=0)  # warm-up
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=128, epochs=1, callbacks=callbacks, verbose=2)
        keras_ms = (time.perf_counter() - t0) * 1e3 / steps
        print(f"keras {keras.__version__} (torch {torch.__version__}, {torch.get_num_threads()} threads): "
              f"{keras_ms:.1f} ms/step over {steps} steps", flush=True)

    env = dict(os.environ, MPT_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    cmd = [args.mpt, "--policy", "mixed_bfloat16", "--epochs", "1", "--tensorboard", os.path.join(work, "mpt_tb"),
           "--csv-log", os.path.join(work, "mpt.csv"), "--checkpoint", ""]
    if args.train_size < 60000:
        print("note: mpt's fashion_mnist_cnn always trains on all 60000 images; ms/step is per step either way")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = run.stdout + run.stderr
    mpt_ms = parse_ms_per_step(out)
    if run.returncode != 0 or mpt_ms is None:
        sys.exit(f"keras_fit_anchor.py: {' '.join(cmd)} failed (rc {run.returncode}):\n{out[-3000:]}")
    acc = re.findall(r"test_accuracy=([0-9.]+)", out)
    print(f"mpt fashion_mnist_cnn: {mpt_ms:.1f} ms/step (test_accuracy={acc[-1] if acc else '?'})", flush=True)
    if keras_ms is not None:
        print(f"ratio keras/mpt: {keras_ms / mpt_ms:.2f}")
    print(f"logs under {work}")


if __name__ == "__main__":
    main()
