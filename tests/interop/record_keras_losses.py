"""Records Keras 3's Huber, KLDivergence, LogCosh, CosineSimilarity, Hinge, SquaredHinge,
CategoricalHinge, Poisson, MeanAbsolutePercentageError and MeanSquaredLogarithmicError losses, and
their reductions with sample weights, into test data that tests/losses/test_losses.cpp compares
mpt's losses with (expected values from Keras, not from mpt's own formulas).

    KERAS_BACKEND=jax python tests/interop/record_keras_losses.py [tests/data/keras_losses.json]

Each case: the loss class and its options, y_true and y_pred (float32, rank 1 to 3, some with
Keras's rank alignment [N] vs [N, 1]), the per-example values (the same loss with
reduction=None) and the scalar with the default reduction "sum_over_batch_size". Huber runs
around its delta (errors of exactly delta, just under and over), KLDivergence through its clip
(zeros, negatives, values over 1), LogCosh from tiny to large errors (where exp(-2|x|) rounds
1 + e to 1), CosineSimilarity along axes -1, 0 and 1, with a zero vector; the hinges with -1/1
labels and with 0/1 labels (which Keras converts), Poisson, MAPE (with zero labels) and MSLE
(with negative values, clipped). "reductions": the scalar under each of Keras's reductions, with
and without sample weights, and SparseCategoricalCrossentropy's ignore_class mask under each.
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402

K = keras.losses
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "keras_losses.json")


def f32(a):
    return np.asarray(a, dtype="float32")


def tensor_json(a):
    a = np.asarray(a)
    return {"shape": list(a.shape), "values": [float(v) for v in a.reshape(-1)]}


def case(what, cls, options, y_true, y_pred):
    y_true, y_pred = f32(y_true), f32(y_pred)
    make = getattr(K, cls)
    per = make(**options, reduction=None)(y_true, y_pred)
    value = make(**options)(y_true, y_pred)
    return {
        "what": what,
        "class": cls,
        "options": options,
        "y_true": tensor_json(y_true),
        "y_pred": tensor_json(y_pred),
        "per_example": tensor_json(keras.ops.convert_to_numpy(per).astype("float64")),
        "value": float(keras.ops.convert_to_numpy(value)),
    }


def main():
    rng = np.random.default_rng(27)
    cases = []

    # Huber: errors on both sides of delta, exactly at it, and far beyond.
    t = rng.uniform(-1, 1, (4, 6))
    err = np.array([[0.5, -0.999, 1.0, -1.0, 1.001, -3.0],
                    [0.0, 0.25, -0.75, 2.0, -1.5, 10.0],
                    [0.999, 1.0001, -0.3, 0.3, 4.0, -0.01],
                    [1.0, 1.0, -1.0, 0.9, -0.9, 0.1]])
    t32 = f32(t)
    # y_pred = y_true + err, with err exact in float32 where the rounding allows.
    cases.append(case("huber delta 1 rank 2 around the boundary", "Huber", {}, t32, t32 + f32(err)))
    cases.append(case("huber delta 1 exact boundary", "Huber", {}, np.zeros((2, 3)),
                      [[1.0, -1.0, 0.5], [1.0000001, -0.9999999, 2.0]]))
    cases.append(case("huber delta 2.5 rank 3", "Huber", {"delta": 2.5}, rng.uniform(-2, 2, (2, 3, 4)),
                      rng.uniform(-4, 4, (2, 3, 4))))
    cases.append(case("huber delta 0.3 (inexact in float32) rank 2", "Huber", {"delta": 0.3},
                      rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, (3, 5))))
    cases.append(case("huber delta 0.3 at the float32 delta", "Huber", {"delta": 0.3}, np.zeros((1, 3)),
                      [[0.3, -0.3, 0.31]]))
    cases.append(case("huber rank 1 labels vs [N, 1] predictions", "Huber", {"delta": 1.5},
                      rng.uniform(-2, 2, (5,)), rng.uniform(-2, 2, (5, 1))))

    # KLDivergence: distributions, zeros (clipped to 1e-7), negatives and values over 1.
    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    cases.append(case("kld rank 2 distributions", "KLDivergence", {}, softmax(rng.normal(size=(4, 5))),
                      softmax(rng.normal(size=(4, 5)))))
    cases.append(case("kld rank 2 clipped", "KLDivergence", {}, [[1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [1.5, -0.5, 0.0]],
                      [[0.0, 0.5, 0.5], [0.2, 0.0, 0.8], [0.7, 0.2, 1.3]]))
    cases.append(case("kld rank 3", "KLDivergence", {}, softmax(rng.normal(size=(2, 3, 4))),
                      softmax(rng.normal(size=(2, 3, 4)))))
    cases.append(case("kld rank 1 labels vs [N, 1]", "KLDivergence", {}, rng.uniform(0, 1, (4,)),
                      rng.uniform(0, 1, (4, 1))))

    # LogCosh: small, moderate and large errors (exp(-2|x|) below float32's epsilon at |x| = 20).
    cases.append(case("log_cosh rank 2", "LogCosh", {}, rng.uniform(-2, 2, (4, 5)), rng.uniform(-2, 2, (4, 5))))
    cases.append(case("log_cosh wide range", "LogCosh", {}, np.zeros((2, 5)),
                      [[0.3, -0.7, 1.5, -3.0, 6.0], [-9.0, 20.0, -45.0, 0.05, 2.5]]))
    cases.append(case("log_cosh rank 3", "LogCosh", {}, rng.uniform(-3, 3, (2, 3, 4)), rng.uniform(-3, 3, (2, 3, 4))))

    # CosineSimilarity: the last axis, axis 1 of a rank-3 tensor, the batch axis, a zero vector.
    cases.append(case("cosine rank 2 axis -1", "CosineSimilarity", {}, rng.normal(size=(4, 5)),
                      rng.normal(size=(4, 5))))
    cases.append(case("cosine with a zero vector and (anti)parallel rows", "CosineSimilarity", {},
                      [[0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]],
                      [[1.0, 0.0], [1.0, 1.0], [-1.0, -1.0], [2.0, 3.0]]))
    cases.append(case("cosine rank 3 axis 1", "CosineSimilarity", {"axis": 1}, rng.normal(size=(2, 3, 4)),
                      rng.normal(size=(2, 3, 4))))
    cases.append(case("cosine rank 3 axis -1", "CosineSimilarity", {"axis": -1}, rng.normal(size=(2, 3, 4)),
                      rng.normal(size=(2, 3, 4))))
    cases.append(case("cosine rank 2 axis 0", "CosineSimilarity", {"axis": 0}, rng.normal(size=(3, 4)),
                      rng.normal(size=(3, 4))))

    # The hinges: -1/1 labels, 0/1 labels (converted to -1/1), and labels neither (kept).
    signs = np.where(rng.uniform(size=(4, 5)) < 0.5, -1.0, 1.0)
    bits = (rng.uniform(size=(4, 5)) < 0.5).astype("float64")
    for cls in ("Hinge", "SquaredHinge"):
        cases.append(case(f"{cls} -1/1 labels", cls, {}, signs, rng.normal(size=(4, 5))))
        cases.append(case(f"{cls} 0/1 labels", cls, {}, bits, rng.normal(size=(4, 5))))
        cases.append(case(f"{cls} labels neither", cls, {}, [[0.0, 1.0, 0.5], [1.0, 0.0, -1.0]],
                          [[0.3, -0.2, 1.5], [0.9, -1.4, 0.1]]))
        cases.append(case(f"{cls} rank 3", cls, {}, np.where(rng.uniform(size=(2, 3, 4)) < 0.5, -1.0, 1.0),
                          rng.normal(size=(2, 3, 4))))
    one_hot = np.eye(5)[rng.integers(0, 5, 4)]
    cases.append(case("CategoricalHinge one-hot", "CategoricalHinge", {}, one_hot, rng.normal(size=(4, 5))))
    cases.append(case("CategoricalHinge rank 3", "CategoricalHinge", {}, np.eye(4)[rng.integers(0, 4, (2, 3))],
                      rng.normal(size=(2, 3, 4))))
    cases.append(case("Poisson", "Poisson", {}, rng.poisson(2.0, (4, 5)), rng.uniform(0.1, 4, (4, 5))))
    cases.append(case("Poisson with zero predictions", "Poisson", {}, [[0.0, 1.0, 3.0]], [[0.0, 0.5, 0.0]]))
    cases.append(case("MeanAbsolutePercentageError", "MeanAbsolutePercentageError", {},
                      rng.uniform(-3, 3, (4, 5)), rng.uniform(-3, 3, (4, 5))))
    cases.append(case("MeanAbsolutePercentageError zero labels", "MeanAbsolutePercentageError", {},
                      [[0.0, 1e-8, -2.0], [0.5, 0.0, 1.0]], [[0.1, 0.0, -1.0], [0.5, -3e-7, 2.0]]))
    cases.append(case("MeanAbsolutePercentageError rank 1 vs [N, 1]", "MeanAbsolutePercentageError", {},
                      rng.uniform(1, 2, (5,)), rng.uniform(1, 2, (5, 1))))
    cases.append(case("MeanSquaredLogarithmicError", "MeanSquaredLogarithmicError", {},
                      rng.uniform(0, 5, (4, 5)), rng.uniform(0, 5, (4, 5))))
    cases.append(case("MeanSquaredLogarithmicError negatives clipped", "MeanSquaredLogarithmicError", {},
                      [[-1.0, 0.0, 2.0], [3.0, -0.5, 1e-9]], [[0.5, -2.0, 2.0], [0.0, 1.0, -1e-9]]))

    # Reductions: MeanSquaredError over [4, 3] (one value per example) with [4] weights, and
    # SparseCategoricalCrossentropy with ignore_class over [2, 3] positions with [2, 3] weights.
    reductions = []
    t, p = f32(rng.normal(size=(4, 3))), f32(rng.normal(size=(4, 3)))
    w = f32([0.5, 0.0, 2.0, 1.25])
    labels = np.array([[2, -1, 0], [3, 1, -1]])
    logits = f32(rng.normal(size=(2, 3, 4)))
    wp = f32([[1.0, 3.0, 0.5], [2.0, 0.25, 1.0]])
    for red in ("sum_over_batch_size", "mean", "sum", "mean_with_sample_weight", None):
        for weights in (None, w):
            value = K.MeanSquaredError(reduction=red)(t, p, sample_weight=weights)
            reductions.append({"class": "MeanSquaredError", "options": {}, "reduction": red or "none",
                               "y_true": tensor_json(t), "y_pred": tensor_json(p),
                               "sample_weight": None if weights is None else tensor_json(weights),
                               "value": tensor_json(keras.ops.convert_to_numpy(value).astype("float64"))})
        for weights in (None, wp):
            loss = K.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1, reduction=red)
            value = loss(labels, logits, sample_weight=weights)
            reductions.append({"class": "SparseCategoricalCrossentropy", "options": {"ignore_class": -1},
                               "reduction": red or "none", "y_true": tensor_json(labels),
                               "y_pred": tensor_json(logits),
                               "sample_weight": None if weights is None else tensor_json(weights),
                               "value": tensor_json(keras.ops.convert_to_numpy(value).astype("float64"))})

    out = {"keras_version": keras.__version__, "backend": keras.backend.backend(), "cases": cases,
           "reductions": reductions}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases and {len(reductions)} reductions to {OUT}")


if __name__ == "__main__":
    main()
