"""Records Keras 3's training with weight regularizers and constraints into test data that
tests/model/test_regularizers.cpp replays in mpt (expected values from Keras, not from mpt's
own formulas).

    KERAS_BACKEND=jax python tests/interop/record_keras_regularizers.py tests/data/keras_regularizers.json

Three small models with L1 / L2 / L1L2 kernel, bias, embedding, beta/gamma and activity
regularizers and MaxNorm / NonNeg / UnitNorm constraints, given initial weights, trained by
train_on_batch (SGD) on fixed batches in float32. Recorded: Keras's version, the initial
weights by variable path, the batches, sum(model.losses) before training, each step's loss
(regularization included, as Keras reports it), the final weights, and evaluate's loss.

No L1 penalty sits on a variable a constraint pins at 0: there the gradient of |x| is the
backend's choice (sign(0) = 0 under TensorFlow, PyTorch and mpt; 1 under JAX).
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402

L, R, C = keras.layers, keras.regularizers, keras.constraints


def dense_model():
    x = keras.Input((6,), name="x")
    h = L.Dense(5, activation="relu", name="d1", kernel_regularizer=R.L2(0.01), bias_regularizer=R.L2(0.02),
                activity_regularizer=R.L1L2(0.001, 0.002), kernel_constraint=C.MaxNorm(0.8),
                bias_constraint=C.NonNeg())(x)
    y = L.Dense(3, name="d2", kernel_regularizer=R.L1L2(0.01, 0.01), kernel_constraint=C.UnitNorm(axis=0))(h)
    return keras.Model(x, y, name="dense_model"), (6,), "float32"


def token_model():
    ids = keras.Input((5,), dtype="int32", name="ids")
    h = L.Embedding(10, 8, name="emb", embeddings_regularizer=R.L2(0.01),
                    embeddings_constraint=C.MaxNorm(1.0, axis=1), activity_regularizer=R.L1(0.001))(ids)
    a = L.MultiHeadAttention(2, 4, name="mha", kernel_regularizer=R.L2(0.001), bias_regularizer=R.L2(0.001),
                             kernel_constraint=C.MaxNorm(0.9), bias_constraint=C.NonNeg())(h, h)
    h = L.LayerNormalization(name="ln", gamma_regularizer=R.L1(0.01), beta_regularizer=R.L2(0.02),
                             beta_constraint=C.UnitNorm(axis=0))(L.Add(name="add")([h, a]))
    y = L.Dense(3, name="out")(L.Flatten(name="flat")(h))
    return keras.Model(ids, y, name="token_model"), (5,), "int32"


def conv_model():
    x = keras.Input((6, 6, 2), name="x")
    h = L.Conv2D(3, 3, name="conv", kernel_regularizer=R.L2(0.01), bias_regularizer=R.L1L2(0.0, 0.05),
                 activity_regularizer=R.L1(0.001), kernel_constraint=C.MaxNorm(1.0, axis=[0, 1, 2]))(x)
    h = L.BatchNormalization(name="bn", gamma_regularizer=R.L2(0.01), beta_regularizer=R.L1(0.01),
                             gamma_constraint=C.NonNeg(), beta_constraint=C.MaxNorm(0.5))(h)
    y = L.Dense(2, name="out")(L.GlobalAveragePooling2D(name="gap")(h))
    return keras.Model(x, y, name="conv_model"), (6, 6, 2), "float32"


def record(make, seed):
    model, shape, dtype = make()
    rng = np.random.default_rng(seed)
    weights = {}
    for v in model.weights:
        lo = 0.5 if "variance" in v.path else -1.0
        w = rng.uniform(lo, 1.5 if lo > 0 else 1.0, tuple(v.shape)).astype("float32")
        v.assign(w)
        weights[v.path] = w
    if dtype == "int32":
        xs = rng.integers(0, 10, (3, 8) + shape).astype("int32")
    else:
        xs = rng.uniform(-1.5, 1.5, (3, 8) + shape).astype("float32")
    out_dim = model.outputs[0].shape[-1]
    ys = rng.uniform(-1, 1, (3, 8, out_dim)).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model(xs[0])  # a forward, as a step's first half: activity penalties of these outputs
    initial_penalty = float(sum(float(keras.ops.convert_to_numpy(l)) for l in model.losses))
    steps = []
    for step in range(6):
        b = step % 3
        steps.append(float(model.train_on_batch(xs[b], ys[b])))
    final = {v.path: np.asarray(keras.ops.convert_to_numpy(v)).tolist() for v in model.weights}
    evaluate = float(model.evaluate(xs[0], ys[0], batch_size=8, verbose=0))
    return {
        "model": model.name,
        "initial_weights": {k: {"shape": list(w.shape), "values": w.reshape(-1).tolist()} for k, w in weights.items()},
        "x": {"shape": list(xs.shape), "values": xs.reshape(-1).astype("float64").tolist()},
        "y": {"shape": list(ys.shape), "values": ys.reshape(-1).tolist()},
        "initial_penalty": initial_penalty,
        "losses": steps,
        "final_weights": {k: np.asarray(v).reshape(-1).tolist() for k, v in final.items()},
        "evaluate_loss": evaluate,
    }


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = {"keras_version": keras.__version__, "backend": keras.backend.backend(), "optimizer": "SGD(0.1)",
           "loss": "mse", "batches": "step s trains on batch s % 3 (train_on_batch)",
           "cases": [record(dense_model, 1), record(token_model, 2), record(conv_model, 3)]}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    for c in out["cases"]:
        print(f"{c['model']}: penalty {c['initial_penalty']:.6g}, losses {', '.join(f'{l:.6g}' for l in c['losses'])}")


if __name__ == "__main__":
    main()
