#!/usr/bin/env python3
"""Reads the TensorBoard event files of a model C run (examples/fashion_mnist_cnn --tensorboard DIR
--csv-log FILE) with tensorboard's own readers and checks the tags, steps and values against the
CSVLogger file of the same run. Not part of CTest (needs `pip install tensorboard`).

    python3 tests/interop/tensorboard_check.py --logdir DIR --csv FILE [--steps-per-epoch 422]
"""
import argparse
import csv
import glob
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader

# Model C's weights: conv2d 3x3x1x32, conv2d_1 3x3x32x64, dense 1600x128, dense_1 128x10, and biases.
WEIGHT_SIZES = {
    "conv2d/kernel": 288, "conv2d/bias": 32,
    "conv2d_1/kernel": 18432, "conv2d_1/bias": 64,
    "dense/kernel": 204800, "dense/bias": 128,
    "dense_1/kernel": 1280, "dense_1/bias": 10,
}


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        check.failures += 1


check.failures = 0


def close(a, b):  # event scalars are float32
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)


def load(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    check(len(files) == 1, f"{run_dir}: one event file ({[os.path.basename(f) for f in files]})")
    # The raw loader: the first record must be the file_version event.
    first = next(iter(event_file_loader.EventFileLoader(files[0]).Load()))
    check(first.file_version == "brain.Event:2", f"{os.path.basename(run_dir)}: first event file_version "
          f"{first.file_version!r}")
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0,
                                                                    event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--logdir", required=True)
    p.add_argument("--csv", required=True, help="the CSVLogger file of the same run")
    p.add_argument("--update-freq", type=int, default=20)
    args = p.parse_args()

    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    epochs = [int(r["epoch"]) for r in rows]
    history = {k: [float(r[k]) for r in rows] for k in rows[0] if k != "epoch"}
    print(f"CSV: {len(rows)} epoch(s), keys {sorted(history)}")

    train = load(os.path.join(args.logdir, "train"))
    tags = train.Tags()
    print("train scalars:", sorted(tags["scalars"]))
    for key, values in history.items():
        if key.startswith("val_"):
            continue
        tag = "epoch_" + key
        ok = tag in tags["scalars"]
        check(ok, f"train/{tag} present")
        if ok:
            ev = train.Scalars(tag)
            check([e.step for e in ev] == epochs and all(close(e.value, v) for e, v in zip(ev, values)),
                  f"train/{tag} = CSV {key}: {[(e.step, e.value) for e in ev]} vs {values}")
    for tag in ("epoch_loss", "epoch_accuracy", "epoch_learning_rate", "epoch_loss_scale", "epoch_skipped_steps",
                "batch_loss", "batch_accuracy"):
        check(tag in tags["scalars"], f"train/{tag} present")
    if "batch_loss" in tags["scalars"]:
        steps = [e.step for e in train.Scalars("batch_loss")]
        check(steps and all(s % args.update_freq == 0 for s in steps) and steps == sorted(steps),
              f"train/batch_loss every {args.update_freq} batches: {len(steps)} points, steps {steps[0]}..{steps[-1]}")
    print("train histograms:", sorted(tags["histograms"]))
    for name, size in WEIGHT_SIZES.items():
        for tag in (f"{name}/histogram", f"{name}/gradient/histogram"):
            ok = tag in tags["histograms"]
            check(ok, f"train/{tag} present")
            if ok:
                h = train.Histograms(tag)[-1].histogram_value
                check(h.num == size and sum(h.bucket) == size and len(h.bucket) == 30 and h.min <= h.max,
                      f"train/{tag}: num {h.num:.0f} = {size}, 30 buckets, min {h.min:.4g}, max {h.max:.4g}")

    val_keys = [k for k in history if k.startswith("val_")]
    if val_keys:
        val = load(os.path.join(args.logdir, "validation"))
        vtags = val.Tags()["scalars"]
        print("validation scalars:", sorted(vtags))
        for key in val_keys:
            tag = "epoch_" + key[4:]
            ok = tag in vtags
            check(ok, f"validation/{tag} present")
            if ok:
                ev = val.Scalars(tag)
                check([e.step for e in ev] == epochs and all(close(e.value, v) for e, v in zip(ev, history[key])),
                      f"validation/{tag} = CSV {key}: {[(e.step, e.value) for e in ev]}")
    print("tensorboard_check:", "FAILED" if check.failures else "all checks passed",
          f"({check.failures} failure(s))" if check.failures else "")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
