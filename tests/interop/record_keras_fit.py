"""Records Keras 3 fits with fit's weighting and epoch options into test data that
tests/model/test_fit_options.cpp replays in mpt (losses, validation logs and weights from Keras).

    KERAS_BACKEND=jax python tests/interop/record_keras_fit.py tests/data/keras_fit.json

One small classifier (Dense(3, tanh) -> Dense(3, softmax), named d1 and d2) on 10 examples of 4
features, given initial weights, fitted in batches of 4 (4, 4, 2: the last one partial) with
shuffle off and SGD(0.5). Each run records per epoch Keras's loss and its val_loss (null where
the epoch did not validate), evaluate's loss after training (with the same weights), and the
final weights.
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402

N, FEATURES, CLASSES = 10, 4, 3


def model():
    x = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(3, activation="tanh", name="d1")(x)
    return keras.Model(x, keras.layers.Dense(CLASSES, activation="softmax", name="d2")(h))


class EpochLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.val_loss = []

    def on_epoch_end(self, epoch, logs=None):
        self.val_loss.append(logs.get("val_loss"))


def weights_of(m):
    return {v.path: {"shape": list(v.shape), "values": np.asarray(v.numpy()).reshape(-1).tolist()} for v in m.weights}


def run(seed, loss="sparse_categorical_crossentropy", one_hot=False, fit_args=None, validation=False, metrics=None,
        weighted_metrics=None):
    """A fit of the model from weights drawn with `seed`; fit_args go to fit as they are, except
    that "sample_weight": True draws the weights, and validation adds (x, y, sample_weight)
    validation data of 5 examples."""
    fit_args = dict(fit_args or {})
    rng = np.random.default_rng(seed)
    m = model()
    for v in m.weights:
        v.assign(rng.uniform(-1, 1, tuple(v.shape)).astype("float32"))
    initial = weights_of(m)
    x = rng.uniform(-1, 1, (N, FEATURES)).astype("float32")
    labels = rng.integers(0, CLASSES, N).astype("int32")
    y = np.eye(CLASSES, dtype="float32")[labels] if one_hot else labels
    sw = rng.uniform(0, 2, N).astype("float32")
    out = {"loss_name": loss, "initial_weights": initial, "x": x.reshape(-1).tolist(), "y": y.reshape(-1).tolist(),
           "y_shape": list(y.shape), "sample_weight": sw.tolist()}
    if fit_args.get("sample_weight") is True:
        fit_args["sample_weight"] = sw
    if validation:
        vx = rng.uniform(-1, 1, (5, FEATURES)).astype("float32")
        vlabels = rng.integers(0, CLASSES, 5).astype("int32")
        vy = np.eye(CLASSES, dtype="float32")[vlabels] if one_hot else vlabels
        vsw = rng.uniform(0, 2, 5).astype("float32")
        fit_args["validation_data"] = (vx, vy, vsw)
        out.update({"val_x": vx.reshape(-1).tolist(), "val_y": vy.reshape(-1).tolist(), "val_sample_weight": vsw.tolist()})
    m.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, metrics=metrics, weighted_metrics=weighted_metrics)
    out.update({"metrics": metrics or [], "weighted_metrics": weighted_metrics or []})
    logs = EpochLogs()
    h = m.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[logs], **fit_args)
    out.update({"loss": h.history["loss"], "val_loss": logs.val_loss, "history": h.history,
                "final_weights": weights_of(m),
                "evaluate": m.evaluate(x, y, batch_size=3, verbose=0, return_dict=True),
                "evaluate_weighted": m.evaluate(x, y, batch_size=3, sample_weight=sw, verbose=0, return_dict=True)})
    out["evaluate_loss"], out["evaluate_weighted_loss"] = out["evaluate"]["loss"], out["evaluate_weighted"]["loss"]
    return out


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    runs = {
        "plain": run(1, fit_args={"epochs": 3}),
        "sample_weight": run(2, fit_args={"epochs": 3, "sample_weight": True}),
        "class_weight_sparse": run(3, fit_args={"epochs": 3, "class_weight": {0: 0.5, 2: 3.0}}),
        "class_weight_one_hot": run(4, loss="categorical_crossentropy", one_hot=True,
                                    fit_args={"epochs": 3, "class_weight": {1: 2.5, 2: 0.25}}),
        # 3 batches a pass: 2 per epoch runs 0 1 | 2 (out of data) | 0 1 | 2 ...
        "steps_per_epoch_2": run(5, fit_args={"epochs": 5, "steps_per_epoch": 2}),
        # more steps than batches: every epoch ends at the end of the data
        "steps_per_epoch_5": run(6, fit_args={"epochs": 3, "steps_per_epoch": 5, "sample_weight": True}),
        "validation_freq": run(7, validation=True,
                               fit_args={"epochs": 5, "sample_weight": True, "validation_freq": 2,
                                         "validation_batch_size": 2}),
        "validation_split": run(8, fit_args={"epochs": 3, "sample_weight": True, "validation_split": 0.3}),
        # weighted_metrics: "accuracy" in both lists (the weighted one is "weighted_accuracy"), and
        # alone with class weights
        "weighted_metrics": run(9, validation=True, metrics=["accuracy"], weighted_metrics=["accuracy"],
                                fit_args={"epochs": 3, "sample_weight": True}),
        "weighted_metrics_class_weight": run(10, loss="categorical_crossentropy", one_hot=True,
                                             weighted_metrics=["accuracy"],
                                             fit_args={"epochs": 3, "class_weight": {0: 3.0, 1: 0.5}}),
    }
    for name, fit_args in (("class_weight_sparse", {0: 0.5, 2: 3.0}), ("class_weight_one_hot", {1: 2.5, 2: 0.25}),
                           ("weighted_metrics_class_weight", {0: 3.0, 1: 0.5})):
        runs[name]["class_weight"] = {str(k): v for k, v in fit_args.items()}
    out = {"keras_version": keras.__version__, "runs": runs}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    for k, r in runs.items():
        print(k, [round(v, 5) for v in r["loss"]], [None if v is None else round(v, 5) for v in r["val_loss"]],
              round(r["evaluate_loss"], 5), round(r["evaluate_weighted_loss"], 5), sorted(r["history"]),
              r["evaluate_weighted"])


if __name__ == "__main__":
    main()
