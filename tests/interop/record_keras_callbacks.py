"""Records Keras 3 fits with ReduceLROnPlateau and LearningRateScheduler into test data that
tests/callbacks/test_lr_callbacks.cpp replays in mpt (the decisions and rates from Keras).

    KERAS_BACKEND=jax python tests/interop/record_keras_callbacks.py tests/data/keras_callbacks.json

One small regression model (Dense(3, tanh) -> Dense(1), named d1 and d2), given initial
weights, fitted full-batch (shuffle off) with SGD(0.2) on mse; per epoch, Keras's loss and the
"learning_rate" the callback logged.
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402


def model():
    x = keras.Input((4,), name="x")
    h = keras.layers.Dense(3, activation="tanh", name="d1")(x)
    return keras.Model(x, keras.layers.Dense(1, name="d2")(h))


def run(callback, seed):
    m = model()
    rng = np.random.default_rng(seed)
    weights = {}
    for v in m.weights:
        w = rng.uniform(-1, 1, tuple(v.shape)).astype("float32")
        v.assign(w)
        weights[v.path] = {"shape": list(w.shape), "values": w.reshape(-1).tolist()}
    x = rng.uniform(-1, 1, (32, 4)).astype("float32")
    y = (np.sin(x.sum(axis=1, keepdims=True)) * 0.5).astype("float32")
    m.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse")
    h = m.fit(x, y, batch_size=32, epochs=14, shuffle=False, verbose=0, callbacks=[callback])
    return {"initial_weights": weights, "x": x.reshape(-1).tolist(), "y": y.reshape(-1).tolist(),
            "loss": h.history["loss"], "learning_rate": h.history["learning_rate"]}


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    plateau = {"monitor": "loss", "factor": 0.5, "patience": 1, "min_delta": 0.008, "cooldown": 1, "min_lr": 0.03}
    out = {
        "keras_version": keras.__version__,
        "reduce_lr_on_plateau": {"options": plateau, **run(keras.callbacks.ReduceLROnPlateau(**plateau), 1)},
        "learning_rate_scheduler": {"rule": "lr if epoch < 3 else lr * 0.8",
                                    **run(keras.callbacks.LearningRateScheduler(
                                        lambda epoch, lr: lr if epoch < 3 else lr * 0.8), 2)},
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    for k in ("reduce_lr_on_plateau", "learning_rate_scheduler"):
        print(k, [round(v, 5) for v in out[k]["loss"]], [round(v, 5) for v in out[k]["learning_rate"]])


if __name__ == "__main__":
    main()
