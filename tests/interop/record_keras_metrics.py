"""Records Keras 3 metric results (accuracies, top-k, Precision, Recall, AUC, F1Score, the
regression metrics, Mean, the hinge, Poisson, MAPE, MSLE, KLDivergence, LogCoshError, CosineSimilarity
and crossentropy metrics) into test data that tests/metrics/test_metrics.cpp replays in
mpt: each case builds one Keras metric from its arguments, feeds it several batches (some with
sample_weight) and records result() after every batch.

    KERAS_BACKEND=jax python tests/interop/record_keras_metrics.py [tests/data/keras_metrics.json]

A case: {"name", "class", "args" (the constructor's keyword arguments), "exact16" (predictions
exactly representable in bfloat16 and float16, so 16-bit predictions must give the same
results), "batches": [{"y_true", "y_pred", "sample_weight" (or null)}], "results": [[values
after batch 1], ...]}. Tensors are {"shape", "dtype", "values" (flat)}.
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402

M = keras.metrics


def t(a, dtype=None):
    a = np.asarray(a, dtype=dtype)
    return {"shape": list(a.shape), "dtype": str(a.dtype), "values": a.reshape(-1).tolist()}


def probs(rng, shape, quantized):
    """Probabilities in [0, 1]; quantized: multiples of 1/16 (ties, values on thresholds,
    exact in bfloat16)."""
    if quantized:
        return (rng.integers(0, 17, shape) / 16.0).astype("float32")
    return rng.uniform(0, 1, shape).astype("float32")


def softmaxish(rng, shape, quantized):
    if quantized:
        return (rng.integers(0, 9, shape) / 8.0).astype("float32")
    x = rng.normal(0, 1.5, shape)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype("float32")


def weights(rng, kind, n, inner=None):
    """kind: None, "n" [N], "n1" [N, 1], "nd" [N, inner], "scalar", "dyadic" [N] in 1/4 steps."""
    if kind is None:
        return None
    if kind == "n":
        return rng.uniform(0, 2, (n,)).astype("float32")
    if kind == "dyadic":
        return (rng.integers(0, 9, (n,)) / 4.0).astype("float32")
    if kind == "n1":
        return rng.uniform(0, 2, (n, 1)).astype("float32")
    if kind == "nd":
        return rng.uniform(0, 2, (n,) + tuple(np.atleast_1d(inner))).astype("float32")
    if kind == "scalar":
        return np.float32(rng.uniform(0.5, 2))
    raise ValueError(kind)


def record(name, cls, args, batches, exact16=False):
    m = getattr(M, cls)(**args)
    results, out = [], []
    for y_true, y_pred, sw in batches:
        if cls == "Mean":  # Mean.update_state(values, sample_weight): the values are y_pred
            m.update_state(y_pred, sample_weight=sw)
        elif sw is None:
            m.update_state(y_true, y_pred)
        else:
            m.update_state(y_true, y_pred, sample_weight=sw)
        r = np.asarray(m.result(), dtype="float64")
        results.append(r.reshape(-1).tolist())
        out.append({"y_true": t(y_true), "y_pred": t(y_pred), "sample_weight": None if sw is None else t(sw)})
    return {"name": name, "class": cls, "args": args, "exact16": exact16, "batches": out, "results": results}


def categorical_batches(rng, n_list, c, quantized, sw_kinds, sparse=False, label_shape=None, extra=()):
    out = []
    for n, kind in zip(n_list, sw_kinds):
        shape = (n,) + tuple(extra) + (c,)
        y_pred = softmaxish(rng, shape, quantized)
        ids = rng.integers(0, c, (n,) + tuple(extra))
        if sparse:
            y_true = ids.astype("int32") if label_shape is None else ids.reshape((n,) + label_shape).astype("int32")
        else:
            y_true = np.eye(c, dtype="float32")[ids]
        out.append((y_true, y_pred, weights(rng, kind, n, extra if kind == "nd" else None)))
    return out


def binary_batches(rng, n_list, shape, quantized, sw_kinds, logits=False):
    out = []
    for n, kind in zip(n_list, sw_kinds):
        y_true = rng.integers(0, 2, (n,) + tuple(shape)).astype("float32")
        if logits:
            y_pred = (rng.integers(-24, 25, (n,) + tuple(shape)) / 8.0).astype("float32")
        else:
            y_pred = probs(rng, (n,) + tuple(shape), quantized)
        out.append((y_true, y_pred, weights(rng, kind, n, shape if kind == "nd" else None)))
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(os.path.join(here, "..", "data", "keras_metrics.json"))
    rng = np.random.default_rng(27)
    cases = []
    W3 = [None, "n", "n1"]
    # ---- top-k accuracies ----------------------------------------------------------------
    for k in (5, 1, 3):
        for q in (False, True):
            cases.append(record(f"top_k k={k} quantized={q}", "TopKCategoricalAccuracy", {"k": k},
                                categorical_batches(rng, [6, 5, 7], 8, q, W3), exact16=q))
    cases.append(record("top_k rank 3, weights [N] and [N, T]", "TopKCategoricalAccuracy", {"k": 2},
                        categorical_batches(rng, [4, 3, 4], 6, True, [None, "n", "nd"], extra=(3,)), exact16=True))
    cases.append(record("top_k scalar weight", "TopKCategoricalAccuracy", {"k": 2},
                        categorical_batches(rng, [5, 4], 6, True, ["scalar", "scalar"]), exact16=True))
    for k in (5, 2):
        for q in (False, True):
            cases.append(record(f"sparse_top_k k={k} quantized={q}", "SparseTopKCategoricalAccuracy", {"k": k},
                                categorical_batches(rng, [6, 5, 7], 7, q, W3, sparse=True), exact16=q))
    cases.append(record("sparse_top_k labels [N, 1]", "SparseTopKCategoricalAccuracy", {"k": 2},
                        categorical_batches(rng, [5, 6], 5, True, [None, "n"], sparse=True, label_shape=(1,)),
                        exact16=True))
    # Out-of-range labels are never in the top k (k below the class count).
    oob = [(np.array([0, 5, 9, 2], "int32"), softmaxish(rng, (4, 5), True), None)]
    cases.append(record("sparse_top_k out-of-range labels", "SparseTopKCategoricalAccuracy", {"k": 3}, oob,
                        exact16=True))
    sorted_ids = []
    for n, kind in zip([5, 6, 4], W3):
        y_pred = np.stack([rng.permutation(9)[:4] for _ in range(n)]).astype("int32")
        y_true = rng.integers(0, 9, (n,)).astype("int32")
        y_true[: n // 2] = y_pred[: n // 2, rng.integers(0, 4)]  # some hits at each position
        sorted_ids.append((y_true, y_pred, weights(rng, kind, n)))
    for k in (2, 6):
        cases.append(record(f"sparse_top_k from_sorted_ids k={k}", "SparseTopKCategoricalAccuracy",
                            {"k": k, "from_sorted_ids": True}, sorted_ids))
    # ---- precision and recall ------------------------------------------------------------
    pr_args = [
        ("default", {}),
        ("thresholds list", {"thresholds": [0.2, 0.5, 0.8]}),
        ("one threshold", {"thresholds": 0.3}),
        ("even thresholds", {"thresholds": [0.0, 0.25, 0.5, 0.75, 1.0]}),
        ("top_k", {"top_k": 2}),
        ("class_id", {"class_id": 1}),
        ("top_k and class_id", {"top_k": 2, "class_id": 3}),
        ("top_k and thresholds", {"top_k": 3, "thresholds": [0.25, 0.5]}),
    ]
    for cls in ("Precision", "Recall"):
        for label, args in pr_args:
            for q in (False, True):
                kinds = [None, "n", "n1" if "class_id" in args else "nd"]  # class_id: no per-class weights
                cases.append(record(f"{cls} {label} quantized={q}", cls, args,
                                    binary_batches(rng, [6, 5, 7], (4,), q, kinds), exact16=q))
        cases.append(record(f"{cls} rank 1", cls, {"thresholds": [0.3, 0.6]},
                            binary_batches(rng, [8, 6], (), True, [None, "n"]), exact16=True))
        cases.append(record(f"{cls} scalar and [N, 1] weights", cls, {},
                            binary_batches(rng, [6, 5], (3,), True, ["scalar", "n1"]), exact16=True))
    # ---- AUC --------------------------------------------------------------------------------
    auc_args = []
    for curve in ("ROC", "PR", "PRGAIN"):
        for summation in ("interpolation", "minoring", "majoring"):
            auc_args.append((f"{curve} {summation}", {"curve": curve, "summation_method": summation}))
    auc_args += [
        ("7 thresholds", {"num_thresholds": 7}),
        ("uneven thresholds", {"thresholds": [0.1, 0.35, 0.6, 0.9]}),
        ("uneven thresholds PR", {"thresholds": [0.9, 0.1, 0.35, 0.6], "curve": "PR"}),
        ("even thresholds", {"thresholds": [0.25, 0.5, 0.75]}),
        ("label_weights", {"label_weights": [0.5, 1.0, 2.0, 0.0]}),
    ]
    for label, args in auc_args:
        for q in (False, True):
            cases.append(record(f"AUC {label} quantized={q}", "AUC", args,
                                binary_batches(rng, [9, 7, 8], (4,), q, [None, "n", "nd"]), exact16=q))
    for label, args in [
        ("multi_label", {"multi_label": True}),
        ("multi_label num_labels", {"multi_label": True, "num_labels": 4}),
        ("multi_label PR", {"multi_label": True, "curve": "PR"}),
        ("multi_label PR majoring label_weights", {"multi_label": True, "curve": "PR", "summation_method": "majoring",
                                                   "label_weights": [1.0, 0.5, 0.0, 2.0]}),
        ("multi_label uneven thresholds", {"multi_label": True, "thresholds": [0.2, 0.45, 0.7]}),
    ]:
        for q in (False, True):
            cases.append(record(f"AUC {label} quantized={q}", "AUC", args,
                                binary_batches(rng, [9, 7, 8], (4,), q, [None, "n", "nd"]), exact16=q))
    for curve in ("ROC", "PR"):
        cases.append(record(f"AUC from_logits {curve}", "AUC", {"from_logits": True, "curve": curve},
                            binary_batches(rng, [9, 7], (3,), False, [None, "n"], logits=True)))
    cases.append(record("AUC rank 1", "AUC", {}, binary_batches(rng, [10, 8], (), True, [None, "n"]), exact16=True))
    cases.append(record("AUC [N, 1] and scalar weights", "AUC", {"num_thresholds": 11},
                        binary_batches(rng, [6, 5], (2,), True, ["n1", "scalar"]), exact16=True))
    out_of_range = [(np.array([[1, 0], [0, 1], [1, 1]], "float32"), np.array([[1.5, -0.5], [2.0, 0.25], [-1.0, 1.0]],
                                                                             "float32"), None)]
    cases.append(record("AUC predictions outside [0, 1]", "AUC", {"num_thresholds": 5}, out_of_range, exact16=True))
    cases.append(record("AUC predictions outside [0, 1], uneven", "AUC", {"thresholds": [0.3, 0.6]}, out_of_range,
                        exact16=True))
    # ---- F1Score ----------------------------------------------------------------------------
    for average in (None, "micro", "macro", "weighted"):
        for threshold in (None, 0.5, 0.35):
            for q in (False, True):
                batches = binary_batches(rng, [6, 5, 7], (4,), q, [None, "n", "dyadic"])
                if q:  # a row of zeros: no class predicted without a threshold
                    batches[0][1][0, :] = 0.0
                cases.append(record(f"F1Score average={average} threshold={threshold} quantized={q}", "F1Score",
                                    {"average": average, "threshold": threshold}, batches, exact16=q))
    # ---- RootMeanSquaredError ---------------------------------------------------------------
    def regression(n_list, shape_true, shape_pred, kinds):
        out = []
        for n, kind in zip(n_list, kinds):
            out.append((rng.normal(0, 1, (n,) + shape_true).astype("float32"),
                        rng.normal(0, 1, (n,) + shape_pred).astype("float32"),
                        weights(rng, kind, n, shape_pred if kind == "nd" else None)))
        return out

    cases.append(record("RootMeanSquaredError", "RootMeanSquaredError", {},
                        regression([5, 6, 4], (3,), (3,), [None, "n", "nd"])))
    cases.append(record("RootMeanSquaredError [N] vs [N, 1]", "RootMeanSquaredError", {},
                        regression([5, 6], (), (1,), [None, "n"])))
    cases.append(record("RootMeanSquaredError scalar and [N, 1] weights", "RootMeanSquaredError", {},
                        regression([5, 6], (2,), (2,), ["scalar", "n1"])))
    # ---- the existing metrics with sample_weight --------------------------------------------
    for kinds in ([None, "n", "n1"], ["scalar", "n"]):
        cases.append(record(f"SparseCategoricalAccuracy weights {kinds}", "SparseCategoricalAccuracy", {},
                            categorical_batches(rng, [6, 5, 7][: len(kinds)], 5, True, kinds, sparse=True),
                            exact16=True))
        cases.append(record(f"CategoricalAccuracy weights {kinds}", "CategoricalAccuracy", {},
                            categorical_batches(rng, [6, 5, 7][: len(kinds)], 5, True, kinds), exact16=True))
    cases.append(record("SparseCategoricalAccuracy rank 3 weights [N, T]", "SparseCategoricalAccuracy", {},
                        categorical_batches(rng, [4, 3], 5, True, ["nd", "n"], sparse=True, extra=(3,)),
                        exact16=True))
    for args in ({}, {"threshold": 0.7}):
        cases.append(record(f"BinaryAccuracy {args}", "BinaryAccuracy", args,
                            binary_batches(rng, [6, 5, 7, 4], (3,), True, [None, "n", "nd", "scalar"]), exact16=True))
    for cls in ("MeanAbsoluteError", "MeanSquaredError"):
        cases.append(record(f"{cls} weights", cls, {}, regression([5, 6, 4, 3], (3,), (3,), [None, "n", "n1", "scalar"])))
    cases.append(record("Mean values [N, D]", "Mean", {},
                        regression([5, 6, 4, 3, 2], (3,), (3,), [None, "n", "nd", "scalar", "n1"])))
    cases.append(record("Mean values [N, T, D], weights [N, T, D] and [N]", "Mean", {},
                        regression([3, 4], (2, 3), (2, 3), ["nd", "n"])))
    # ---- the metrics of the hinge, Poisson, MAPE and MSLE losses, weighted and not ------------
    def pairs(n_list, kinds, make_true, make_pred):
        out = []
        for n, kind in zip(n_list, kinds):
            y_true = make_true(n)
            y_pred = make_pred(n)
            out.append((y_true, y_pred, weights(rng, kind, n)))
        return out

    def signs(n):
        return np.where(rng.uniform(size=(n, 3)) < 0.5, -1.0, 1.0).astype("float32")

    def bits(n):
        return (rng.uniform(size=(n, 3)) < 0.5).astype("float32")

    def normal(n):
        return rng.normal(0, 1, (n, 3)).astype("float32")

    def positive(n):
        return rng.uniform(0.1, 3, (n, 3)).astype("float32")

    def one_hot(n):
        return np.eye(3, dtype="float32")[rng.integers(0, 3, n)]

    kinds = [None, "n", "n1", "scalar"]
    cases.append(record("Hinge -1/1 labels", "Hinge", {}, pairs([5, 6, 4, 3], kinds, signs, normal)))
    cases.append(record("Hinge 0/1 labels", "Hinge", {}, pairs([5, 6], [None, "n"], bits, normal)))
    cases.append(record("SquaredHinge", "SquaredHinge", {}, pairs([5, 6, 4, 3], kinds, signs, normal)))
    cases.append(record("CategoricalHinge", "CategoricalHinge", {}, pairs([5, 6, 4, 3], kinds, one_hot, normal)))
    cases.append(record("Poisson", "Poisson", {}, pairs([5, 6, 4, 3], kinds, positive, positive)))
    cases.append(record("MeanAbsolutePercentageError", "MeanAbsolutePercentageError", {},
                        pairs([5, 6, 4, 3], kinds, normal, normal)))
    cases.append(record("MeanSquaredLogarithmicError", "MeanSquaredLogarithmicError", {},
                        pairs([5, 6, 4, 3], kinds, positive, normal)))
    # ---- the metrics of KLDivergence, LogCosh, CosineSimilarity and the crossentropies ---------
    def distributions(n):
        return softmaxish(rng, (n, 3), False)

    def unit(n):
        return rng.uniform(0.05, 0.95, (n, 3)).astype("float32")

    def class_ids(n):
        return rng.integers(0, 3, n).astype("int32")

    cases.append(record("KLDivergence", "KLDivergence", {}, pairs([5, 6, 4, 3], kinds, distributions, distributions)))
    cases.append(record("LogCoshError", "LogCoshError", {}, pairs([5, 6, 4, 3], kinds, normal, normal)))
    cases.append(record("CosineSimilarity", "CosineSimilarity", {}, pairs([5, 6, 4, 3], kinds, normal, normal)))
    cases.append(record("CosineSimilarity axis 1", "CosineSimilarity", {"axis": 1},
                        pairs([5, 6], [None, "n"], normal, normal)))
    cases.append(record("BinaryCrossentropy", "BinaryCrossentropy", {}, pairs([5, 6, 4, 3], kinds, bits, unit)))
    cases.append(record("BinaryCrossentropy from_logits label_smoothing", "BinaryCrossentropy",
                        {"from_logits": True, "label_smoothing": 0.1}, pairs([5, 6], [None, "n"], bits, normal)))
    cases.append(record("CategoricalCrossentropy", "CategoricalCrossentropy", {},
                        pairs([5, 6, 4, 3], kinds, one_hot, distributions)))
    cases.append(record("CategoricalCrossentropy from_logits label_smoothing", "CategoricalCrossentropy",
                        {"from_logits": True, "label_smoothing": 0.2}, pairs([5, 6], [None, "n"], one_hot, normal)))
    cases.append(record("SparseCategoricalCrossentropy", "SparseCategoricalCrossentropy", {},
                        pairs([5, 6, 4, 3], kinds, class_ids, distributions)))
    cases.append(record("SparseCategoricalCrossentropy from_logits", "SparseCategoricalCrossentropy",
                        {"from_logits": True}, pairs([5, 6], [None, "n"], class_ids, normal)))
    out = {"keras_version": keras.__version__, "cases": cases}
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"{len(cases)} cases -> {path}")


if __name__ == "__main__":
    main()
