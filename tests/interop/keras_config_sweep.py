"""Zero silent loads: every config field of every Keras class mpt registers, set to a
non-default value by Keras 3 and saved as .keras, either loads in mpt and predicts as Keras
does, or is refused by an mpt::Error naming the field.

    KERAS_BACKEND=jax python tests/interop/keras_config_sweep.py build/tests/keras_interop_helper

Layers: a small model around the layer, weights drawn at random, predictions compared (1e-5
relative to the outputs' scale, float32). Optimizers, schedules and losses: the model compiled
with them; a load must keep the field (mpt's own save of the loaded model carries the value).
Initializers: each with non-default arguments on a Dense kernel; a load must keep it (in mpt's
re-saved config, read back by Keras) and mpt's fresh kernel must follow it as Keras's draws do.
Metrics: each compiled in, with a non-default argument; a load must keep it (Keras reads mpt's
saved entry back into the same metric). A loss field Keras's own get_config leaves out (Huber's delta, CosineSimilarity's axis) is put
into the saved config.json, where Keras's from_config honours it.
Prints one line per case and a summary; exits non-zero on any silent load or wrong prediction.
"""
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402

L = keras.layers
N = 64  # the helper's sample count


def dense_in(layer, shape=(6,)):
    x = keras.Input(shape)
    return keras.Model(x, layer(x)), shape


def image_in(layer, shape=(6, 6, 4)):
    return dense_in(layer, shape)


def seq_in(layer, shape=(5, 8)):
    return dense_in(layer, shape)


def mha_in(layer, shape=(5, 8)):
    x = keras.Input(shape)
    return keras.Model(x, layer(x, x)), shape


def ids_in(layer):
    x = keras.Input((5,), dtype="int32")
    return keras.Model(x, layer(x)), "int"


def add_in(layer, shape=(4,)):
    x = keras.Input(shape)
    return keras.Model(x, layer([x, L.Dense(4)(x)])), shape


def concat_in(layer, shape=(3, 4)):
    x = keras.Input(shape)
    return keras.Model(x, layer([x, L.Dense(4)(x)])), shape


RNG = keras.regularizers.L2(0.01)
CONSTRAINT = keras.constraints.MaxNorm(1.5)
INIT = keras.initializers.RandomNormal(stddev=0.5)

# class -> (make(**fields), builder, {field: non-default value})
CASES = {
    "Dense": (lambda **f: L.Dense(**{"units": 4, **f}), dense_in, {
        "units": 7, "activation": "tanh", "use_bias": False, "kernel_initializer": INIT,
        "bias_initializer": "ones", "kernel_regularizer": RNG, "bias_regularizer": RNG,
        "activity_regularizer": RNG, "kernel_constraint": CONSTRAINT, "bias_constraint": CONSTRAINT,
        "lora_rank": 2}),
    "Activation": (lambda **f: L.Activation(**{"activation": "relu", **f}), dense_in,
                   {"activation": "gelu"}),
    "Softmax": (lambda **f: L.Softmax(**f), seq_in, {"axis": 1}),
    "Flatten": (lambda **f: L.Flatten(**f), image_in, {"data_format": "channels_first"}),
    "Reshape": (lambda **f: L.Reshape(**{"target_shape": (4, 36), **f}), image_in, {"target_shape": (12, 12)}),
    "Dropout": (lambda **f: L.Dropout(**{"rate": 0.1, **f}), dense_in, {"rate": 0.5, "noise_shape": (None, 1), "seed": 3}),
    "ReLU": (lambda **f: L.ReLU(**f), dense_in, {"max_value": 0.5, "negative_slope": 0.1, "threshold": 0.2}),
    "LeakyReLU": (lambda **f: L.LeakyReLU(**f), dense_in, {"negative_slope": 0.05}),
    "ELU": (lambda **f: L.ELU(**f), dense_in, {"alpha": 0.5}),
    "BatchNormalization": (lambda **f: L.BatchNormalization(**f), image_in, {
        "axis": 1, "momentum": 0.5, "epsilon": 0.1, "center": False, "scale": False,
        "beta_initializer": "ones", "gamma_initializer": "zeros", "moving_mean_initializer": "ones",
        "moving_variance_initializer": "zeros", "beta_regularizer": RNG, "gamma_regularizer": RNG,
        "beta_constraint": CONSTRAINT, "gamma_constraint": CONSTRAINT, "synchronized": True, "renorm": True,
        "renorm_momentum": 0.5}),
    "Conv2D": (lambda **f: L.Conv2D(**{"filters": 4, "kernel_size": 3, **f}), image_in, {
        "filters": 6, "kernel_size": 2, "strides": 2, "padding": "same", "data_format": "channels_first",
        "dilation_rate": 2, "groups": 2, "activation": "relu", "use_bias": False, "kernel_initializer": INIT,
        "bias_initializer": "ones", "kernel_regularizer": RNG, "bias_regularizer": RNG,
        "activity_regularizer": RNG, "kernel_constraint": CONSTRAINT, "bias_constraint": CONSTRAINT}),
    "DepthwiseConv2D": (lambda **f: L.DepthwiseConv2D(**{"kernel_size": 3, **f}), image_in, {
        "kernel_size": 2, "strides": 2, "padding": "same", "depth_multiplier": 3, "data_format": "channels_first",
        "dilation_rate": 2, "activation": "relu", "use_bias": False, "depthwise_initializer": INIT,
        "bias_initializer": "ones", "depthwise_regularizer": RNG, "bias_regularizer": RNG,
        "activity_regularizer": RNG, "depthwise_constraint": CONSTRAINT, "bias_constraint": CONSTRAINT}),
    "Embedding": (lambda **f: L.Embedding(**{"input_dim": 10, "output_dim": 4, **f}), ids_in, {
        "input_dim": 12, "output_dim": 6, "embeddings_initializer": INIT, "embeddings_regularizer": RNG,
        "activity_regularizer": RNG, "embeddings_constraint": CONSTRAINT, "mask_zero": True}),
    "LayerNormalization": (lambda **f: L.LayerNormalization(**f), seq_in, {
        "axis": [1, 2], "epsilon": 0.1, "center": False, "scale": False, "rms_scaling": True,
        "beta_initializer": "ones", "gamma_initializer": "zeros", "beta_regularizer": RNG,
        "gamma_regularizer": RNG, "beta_constraint": CONSTRAINT, "gamma_constraint": CONSTRAINT}),
    "Add": (lambda **f: L.Add(**f), add_in, {}),
    "Concatenate": (lambda **f: L.Concatenate(**f), concat_in, {"axis": 1}),
    "MultiHeadAttention": (lambda **f: L.MultiHeadAttention(**{"num_heads": 2, "key_dim": 4, **f}), mha_in, {
        "num_heads": 4, "key_dim": 3, "value_dim": 5, "dropout": 0.1, "use_bias": False, "output_shape": 6,
        "attention_axes": (1,), "kernel_initializer": INIT, "bias_initializer": "ones",
        "kernel_regularizer": RNG, "bias_regularizer": RNG, "activity_regularizer": RNG,
        "kernel_constraint": CONSTRAINT, "bias_constraint": CONSTRAINT, "seed": 5, "use_gate": True}),
    "MaxPooling2D": (lambda **f: L.MaxPooling2D(**f), image_in, {
        "pool_size": 3, "strides": 1, "padding": "same", "data_format": "channels_first"}),
    "AveragePooling2D": (lambda **f: L.AveragePooling2D(**{"pool_size": 2, **f}), image_in, {
        "pool_size": 3, "strides": 1, "padding": "same", "data_format": "channels_first"}),
    "GlobalAveragePooling2D": (lambda **f: L.GlobalAveragePooling2D(**f), image_in, {
        "data_format": "channels_first", "keepdims": True}),
    "RMSNormalization": (lambda **f: L.RMSNormalization(**f), seq_in, {"axis": 1, "epsilon": 0.1}),
    "ZeroPadding2D": (lambda **f: L.ZeroPadding2D(**f), image_in, {
        "padding": ((1, 2), (0, 3)), "data_format": "channels_first"}),
}

OPTIMIZERS = {
    "SGD": (keras.optimizers.SGD, {"learning_rate": 0.05, "momentum": 0.5, "nesterov": True}),
    "Adam": (keras.optimizers.Adam, {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-5, "amsgrad": True}),
    "AdamW": (keras.optimizers.AdamW, {"weight_decay": 0.01, "beta_1": 0.8}),
    "RMSprop": (keras.optimizers.RMSprop, {"rho": 0.8, "momentum": 0.3, "epsilon": 1e-5, "centered": True}),
    "Nadam": (keras.optimizers.Nadam, {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-5}),
    "Adamax": (keras.optimizers.Adamax, {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-5}),
    "Adagrad": (keras.optimizers.Adagrad, {"initial_accumulator_value": 0.3, "epsilon": 1e-5}),
    "Lion": (keras.optimizers.Lion, {"beta_1": 0.8, "beta_2": 0.95}),
    "Adafactor": (keras.optimizers.Adafactor, {"beta_2_decay": -0.5, "epsilon_1": 1e-20, "epsilon_2": 1e-2,
                                               "clip_threshold": 0.5, "relative_step": False}),
}
# Fields that change nothing on their own: a load may drop them.
INERT = {"renorm_momentum": "used only with renorm=True"}
BASE_FIELDS = {"clipnorm": 1.0, "global_clipnorm": 2.0, "clipvalue": 0.5, "use_ema": True, "ema_momentum": 0.9,
               "ema_overwrite_frequency": 10, "loss_scale_factor": 4.0, "gradient_accumulation_steps": 3,
               "weight_decay": 0.02}
SCHEDULES = {
    "ExponentialDecay": (keras.optimizers.schedules.ExponentialDecay,
                         {"initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.9},
                         {"staircase": True}),
    "PiecewiseConstantDecay": (keras.optimizers.schedules.PiecewiseConstantDecay,
                               {"boundaries": [10], "values": [0.1, 0.01]}, {}),
    "CosineDecay": (keras.optimizers.schedules.CosineDecay, {"initial_learning_rate": 0.1, "decay_steps": 10},
                    {"alpha": 0.1, "warmup_target": 0.2, "warmup_steps": 5}),
    "PolynomialDecay": (keras.optimizers.schedules.PolynomialDecay, {"initial_learning_rate": 0.1, "decay_steps": 10},
                        {"end_learning_rate": 0.01, "power": 2.0, "cycle": True}),
    "InverseTimeDecay": (keras.optimizers.schedules.InverseTimeDecay,
                         {"initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5}, {"staircase": True}),
    "CosineDecayRestarts": (keras.optimizers.schedules.CosineDecayRestarts,
                            {"initial_learning_rate": 0.1, "first_decay_steps": 10},
                            {"t_mul": 1.5, "m_mul": 0.5, "alpha": 0.1}),
}
LOSSES = {
    "SparseCategoricalCrossentropy": (keras.losses.SparseCategoricalCrossentropy,
                                      {"from_logits": True, "ignore_class": 0, "reduction": "sum"}),
    "CategoricalCrossentropy": (keras.losses.CategoricalCrossentropy,
                                {"from_logits": True, "label_smoothing": 0.1, "axis": 0, "reduction": "sum"}),
    "BinaryCrossentropy": (keras.losses.BinaryCrossentropy,
                           {"from_logits": True, "label_smoothing": 0.1, "axis": 0, "reduction": "sum"}),
    "MeanSquaredError": (keras.losses.MeanSquaredError, {"reduction": "sum"}),
    "MeanAbsoluteError": (keras.losses.MeanAbsoluteError, {"reduction": "sum"}),
    "Huber": (keras.losses.Huber, {"delta": 2.5, "reduction": "sum"}),
    "KLDivergence": (keras.losses.KLDivergence, {"reduction": "sum"}),
    "LogCosh": (keras.losses.LogCosh, {"reduction": "sum"}),
    "CosineSimilarity": (keras.losses.CosineSimilarity, {"axis": 0, "reduction": "sum"}),
}

# Metrics in compile: class -> (class, {case: constructor kwargs}). A case loads (and mpt's own
# save keeps every kwarg, which Keras reads back into the same metric) or is refused naming it.
KM = keras.metrics
METRICS = {
    "TopKCategoricalAccuracy": (KM.TopKCategoricalAccuracy, {"k": {"k": 3}, "name": {"name": "top3"}}),
    "SparseTopKCategoricalAccuracy": (KM.SparseTopKCategoricalAccuracy,
                                      {"k": {"k": 2}, "from_sorted_ids": {"from_sorted_ids": True}}),
    "Precision": (KM.Precision, {"thresholds": {"thresholds": [0.3, 0.7]}, "top_k": {"top_k": 2},
                                 "class_id": {"class_id": 1}, "thresholds (one)": {"thresholds": 0.4}}),
    "Recall": (KM.Recall, {"thresholds": {"thresholds": [0.25, 0.5, 0.75]}, "top_k": {"top_k": 2},
                           "class_id": {"class_id": 2}}),
    "AUC": (KM.AUC, {"num_thresholds": {"num_thresholds": 50}, "curve": {"curve": "PR"},
                     "summation_method": {"summation_method": "minoring"}, "thresholds": {"thresholds": [0.6, 0.2]},
                     "multi_label": {"multi_label": True}, "num_labels": {"multi_label": True, "num_labels": 3},
                     "label_weights": {"label_weights": [1.0, 0.5, 2.0]}, "from_logits": {"from_logits": True},
                     "dtype": {"dtype": "float16"}}),
    "F1Score": (KM.F1Score, {"average": {"average": "macro"}, "threshold": {"threshold": 0.4}}),
    "RootMeanSquaredError": (KM.RootMeanSquaredError, {"name": {"name": "rms"}}),
    "BinaryAccuracy": (KM.BinaryAccuracy, {"threshold": {"threshold": 0.7}}),
    "function": (None, {"top_k_categorical_accuracy": KM.top_k_categorical_accuracy,
                        "mean_squared_error": KM.mean_squared_error, "hinge": KM.hinge}),
}


def randomize(model, seed):
    rng = np.random.default_rng(seed)
    ws = []
    for v in model.weights:
        shape = tuple(v.shape)
        if "variance" in v.path:
            ws.append(rng.uniform(0.5, 1.5, shape).astype("float32"))
        else:
            ws.append(rng.uniform(-1, 1, shape).astype("float32"))
    model.set_weights(ws)


class Sweep:
    def __init__(self, helper, d):
        self.helper, self.d = helper, d
        self.rows, self.bad = [], []

    def run(self, model, shape, what, field, check_resaved=None, layer_class=None, patch=None):
        path = os.path.join(self.d, "case.keras")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save(path)
        if patch:  # edit the archive's config.json (a field Keras's get_config leaves out)
            with zipfile.ZipFile(path) as z:
                entries = {n: z.read(n) for n in z.namelist()}
            cfg = json.loads(entries["config.json"])
            patch(cfg)
            entries["config.json"] = json.dumps(cfg).encode()
            with zipfile.ZipFile(path, "w") as z:
                for n, data in entries.items():
                    z.writestr(n, data)
        if shape == "int":
            x = np.random.default_rng(1).integers(0, 10, (N, 5)).astype("float32")
            dims = ["5", "int"]
            xin = x.astype("int32")
        else:
            x = np.random.default_rng(1).uniform(-2, 2, (N,) + tuple(shape)).astype("float32")
            dims = [str(s) for s in shape]
            xin = x
        try:
            want = model.predict(xin, verbose=0)
        except Exception as e:  # Keras's own predict fails on it (nothing to compare with)
            self.rows.append((what, field, "Keras cannot predict it", str(e).strip().splitlines()[0][:100]))
            return
        xf, out, resaved = (os.path.join(self.d, n) for n in ("x.f32", "out.f32", "resaved.keras"))
        x.tofile(xf)
        r = subprocess.run([self.helper, "try_load", path, xf, out, resaved] + dims, capture_output=True, text=True)
        if r.returncode == 3:
            msg = r.stdout.strip().removeprefix("REFUSED: ")
            named = field in msg
            self.rows.append((what, field, "refused" if named else "refused WITHOUT naming the field", msg))
            if not named:
                self.bad.append((what, field, msg))
            return
        if r.returncode != 0:
            self.rows.append((what, field, "helper failed", r.stdout + r.stderr))
            self.bad.append((what, field, r.stdout + r.stderr))
            return
        got = np.fromfile(out, dtype="float32")
        ok = got.size == want.size
        diff = float(np.abs(got - want.reshape(-1)).max()) if ok else float("inf")
        scale = max(1.0, float(np.abs(want).max()))
        ok = ok and diff <= 1e-5 * scale
        note = f"max abs diff {diff:.3g}"
        if ok and layer_class and field != "(defaults)":
            # Predictions alone miss fields that act only in training (regularizers,
            # constraints, dropout): the model mpt saves again must carry the field's value.
            with zipfile.ZipFile(resaved) as z:
                layers = json.loads(z.read("config.json"))["config"]["layers"]
            mine = next(l for l in layers if l["class_name"] == layer_class)
            theirs = next(l for l in model.get_config()["layers"] if l["class_name"] == layer_class)
            got, want = mine["config"].get(field), theirs["config"].get(field)
            if field in INERT:
                note = f"inert ({INERT[field]}); {note}"
            elif not same_value(got, want):
                ok, note = False, f"mpt keeps {field} = {json.dumps(got)}, Keras has {json.dumps(want)}"
        if ok and check_resaved:
            with zipfile.ZipFile(resaved) as z:
                ok, note = check_resaved(json.loads(z.read("config.json")))
        self.rows.append((what, field, "loaded: predicts and keeps it" if ok else "SILENT: loaded and differs", note))
        if not ok:
            self.bad.append((what, field, note))


KI = keras.initializers
# Initializers with their arguments, as Dense(48)'s kernel_initializer over 80 features (kernel
# [80, 48]: fan_in 80, fan_out 48). A load must keep the initializer: mpt's re-saved config carries
# its class and arguments, Keras reads that file back into the same initializer, and the kernel mpt
# draws afresh from the loaded config follows the initializer as Keras's draws do (values for the
# constant ones; orthonormal columns for Orthogonal; else mean, stddev and, where the distribution
# is bounded, its ends, against Keras's own draws: a seed gives other values in mpt than in JAX).
INITIALIZERS = {
    "RandomNormal": KI.RandomNormal(mean=0.1, stddev=0.5, seed=3),
    "RandomUniform": KI.RandomUniform(minval=-0.3, maxval=0.7, seed=4),
    "TruncatedNormal": KI.TruncatedNormal(mean=0.2, stddev=0.3),
    "Zeros": KI.Zeros(),
    "Ones": KI.Ones(),
    "Constant": KI.Constant(0.7),
    "VarianceScaling": KI.VarianceScaling(scale=2.5, mode="fan_out", distribution="untruncated_normal", seed=5),
    "VarianceScaling truncated": KI.VarianceScaling(scale=0.5, mode="fan_avg"),
    "VarianceScaling axes": KI.VarianceScaling(scale=3.0, distribution="uniform", input_axes=[1], output_axes=[0]),
    "GlorotNormal": KI.GlorotNormal(seed=6),
    "GlorotUniform": KI.GlorotUniform(seed=7),
    "HeNormal": KI.HeNormal(seed=8),
    "HeUniform": KI.HeUniform(),
    "LecunNormal": KI.LecunNormal(),
    "LecunUniform": KI.LecunUniform(seed=9),
    "Orthogonal": KI.Orthogonal(gain=1.5, seed=10),
    "Identity": KI.Identity(gain=2.0),
}
INIT_IN, INIT_UNITS = 80, 48


def bounded(obj):
    """Whether the initializer's distribution has ends (uniform or truncated at 2 stddev)."""
    if isinstance(obj, KI.VarianceScaling):
        return obj.distribution != "untruncated_normal"
    return isinstance(obj, (KI.RandomUniform, KI.TruncatedNormal))


def compare_draws(mine, theirs, obj):
    """(ok, note): mpt's fresh kernel against Keras's draws of the same initializer and shape."""
    if isinstance(obj, (KI.Zeros, KI.Ones, KI.Constant, KI.Identity)):
        diff = float(np.abs(mine - theirs).max())
        return diff <= 1e-7, f"values as Keras's (max abs diff {diff:.3g})"
    if isinstance(obj, KI.Orthogonal):
        err = float(np.abs(mine.T @ mine - obj.gain ** 2 * np.eye(mine.shape[1])).max())
        return err <= 1e-5 * obj.gain ** 2, f"orthogonal: max |K^T K - gain^2 I| {err:.3g}"
    n = mine.size
    mm, ms, tm, ts = float(mine.mean()), float(mine.std()), float(theirs.mean()), float(theirs.std())
    ok = abs(mm - tm) <= 6 * ts * np.sqrt(2.0 / n) and abs(ms / ts - 1) <= 6 / np.sqrt(n)
    note = f"mean/std mpt {mm:.4f}/{ms:.4f}, Keras {tm:.4f}/{ts:.4f}"
    if bounded(obj):
        span = float(theirs.max() - theirs.min())
        ends = abs(float(mine.min() - theirs.min())), abs(float(mine.max() - theirs.max()))
        ok = ok and max(ends) <= 0.05 * span
        note += f"; ends mpt [{mine.min():.4f}, {mine.max():.4f}], Keras [{theirs.min():.4f}, {theirs.max():.4f}]"
    return ok, note


def run_initializer(s, name, obj):
    want = KI.serialize(obj)
    patch = None
    if isinstance(obj, KI.Identity):
        # Keras 3.15's Identity get_config drops gain (its from_config takes it): the case puts it
        # into config.json, as mpt writes it.
        want["config"]["gain"] = obj.gain

        def patch(cfg):
            for layer in cfg["config"]["layers"]:
                if layer["class_name"] == "Dense":
                    layer["config"]["kernel_initializer"]["config"]["gain"] = obj.gain

    x = keras.Input((INIT_IN,))
    m = keras.Model(x, L.Dense(INIT_UNITS, kernel_initializer=obj)(x))
    randomize(m, 2)

    def check(cfg):
        mine = next(l for l in cfg["config"]["layers"] if l["class_name"] == "Dense")["config"]["kernel_initializer"]
        if not same_value(mine, want):
            return False, f"mpt keeps kernel_initializer = {json.dumps(mine)}, Keras has {json.dumps(want)}"
        resaved = os.path.join(s.d, "resaved.keras")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            back = keras.models.load_model(resaved, compile=False)
        got = next(l for l in back.layers if isinstance(l, L.Dense)).kernel_initializer
        if (type(got) is not type(obj) or KI.serialize(got)["config"] != KI.serialize(obj)["config"]
                or getattr(got, "gain", None) != getattr(obj, "gain", None)):
            return False, f"Keras reads mpt's file as {KI.serialize(got)}"
        out = os.path.join(s.d, "kernel.f32")
        r = subprocess.run([s.helper, "fresh_kernel", resaved, out], capture_output=True, text=True)
        if r.returncode != 0:
            return False, f"fresh_kernel failed: {r.stdout}{r.stderr}"
        fresh = np.fromfile(out, dtype="float32").reshape(INIT_IN, INIT_UNITS).astype("float64")
        theirs = np.asarray(obj((INIT_IN, INIT_UNITS)), dtype="float64")
        return compare_draws(fresh, theirs, obj)

    s.run(m, (INIT_IN,), f"initializer {name}", "kernel_initializer", check, patch=patch)


def compiled_model(seed=0):
    x = keras.Input((6,))
    m = keras.Model(x, L.Dense(3)(x))
    randomize(m, seed)
    return m


def find_field(cfg, path):
    for k in path:
        cfg = cfg[k] if isinstance(cfg, dict) and k in cfg else None
        if cfg is None:
            return None
    return cfg


def same_value(mine, keras_value):
    """Whether mpt's saved value of a field is Keras's: numbers to 1e-6, tuples as lists,
    serialized objects (initializers included) by class and config."""
    if isinstance(keras_value, dict) and "class_name" in keras_value:
        return (isinstance(mine, dict) and mine.get("class_name") == keras_value["class_name"]
                and same_value(mine.get("config", {}), keras_value.get("config", {})))
    if isinstance(keras_value, dict):
        return isinstance(mine, dict) and set(mine) == set(keras_value) and all(
            same_value(mine[k], keras_value[k]) for k in keras_value)
    if isinstance(keras_value, (list, tuple)):
        if not isinstance(mine, (list, tuple)):
            return len(keras_value) == 1 and same_value(mine, keras_value[0])
        return len(mine) == len(keras_value) and all(same_value(a, b) for a, b in zip(mine, keras_value))
    return close(mine, keras_value)


def close(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    return a == b


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    helper = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="mpt-sweep-") as d:
        s = Sweep(helper, d)
        for cls, (make, build, fields) in CASES.items():
            m, shape = build(make())
            randomize(m, 0)
            s.run(m, shape, cls, "(defaults)")
            for field, value in fields.items():
                try:
                    m, shape = build(make(**{field: value}))
                except Exception as e:  # Keras itself refuses the combination
                    s.rows.append((cls, field, "Keras cannot build it", str(e).splitlines()[0][:80]))
                    continue
                randomize(m, 1)
                s.run(m, shape, cls, field, layer_class=cls)
        for name, obj in INITIALIZERS.items():
            run_initializer(s, name, obj)
        for cls, (make, fields) in OPTIMIZERS.items():
            for field, value in list(fields.items()) + list(BASE_FIELDS.items()):
                if cls == "AdamW" and field == "weight_decay" and value == 0.02:
                    continue
                m = compiled_model()
                m.compile(optimizer=make(**{field: value}), loss="mse")
                want = value

                def check(cfg, field=field, want=want):
                    got = find_field(cfg, ["compile_config", "optimizer", "config", field])
                    if field in INERT:
                        return True, f"inert ({INERT[field]}): mpt keeps {field} = {got!r}"
                    return close(got, want), f"mpt keeps {field} = {got!r}"

                s.run(m, (6,), f"optimizer {cls}", field, check)
        for field, value in {"initial_scale": 128.0, "dynamic_growth_steps": 100}.items():
            m = compiled_model()
            m.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), **{field: value}),
                      loss="mse")

            def check(cfg, field=field, want=value):
                got = find_field(cfg, ["compile_config", "optimizer", "config", field])
                return close(got, want), f"mpt keeps {field} = {got!r}"

            s.run(m, (6,), "optimizer LossScaleOptimizer", field, check)
        for cls, (make, base, fields) in SCHEDULES.items():
            for field, value in fields.items():
                m = compiled_model()
                m.compile(optimizer=keras.optimizers.SGD(make(**base, **{field: value})), loss="mse")

                def check(cfg, field=field, want=value):
                    got = find_field(cfg, ["compile_config", "optimizer", "config", "learning_rate", "config", field])
                    return close(got, want), f"mpt keeps {field} = {got!r}"

                s.run(m, (6,), f"schedule {cls}", field, check)
        for cls, (make, fields) in LOSSES.items():
            for field, value in fields.items():
                m = compiled_model()
                loss_obj = make(**{field: value})
                m.compile(optimizer="adam", loss=loss_obj)
                patch, note = None, ""
                if field not in keras.losses.serialize(loss_obj)["config"]:
                    # Keras 3's Huber and CosineSimilarity get_config drop delta and axis, so
                    # Keras's own file reloads them at the defaults. Their from_config takes them
                    # (mpt writes them): the case puts the field into config.json, and checks
                    # that Keras honours it there too.
                    def patch(cfg, field=field, value=value):
                        cfg["compile_config"]["loss"]["config"][field] = value

                    cc = keras.losses.serialize(loss_obj)
                    cc["config"][field] = value
                    kwargs = getattr(keras.losses.deserialize(cc), "_fn_kwargs", {})
                    assert close(kwargs.get(field), value), f"Keras does not honour {cls} {field} in config.json"
                    note = "injected into config.json (Keras's get_config drops it); "

                def check(cfg, field=field, want=value, note=note):
                    loss = find_field(cfg, ["compile_config", "loss"])
                    got = find_field(loss, ["config", field]) if isinstance(loss, dict) else None
                    return close(got, want), f"{note}mpt keeps {field} = {got!r}"

                s.run(m, (6,), f"loss {cls}", field, check, patch=patch)
        for cls, (make, cases) in METRICS.items():
            for field, kwargs in cases.items():
                metric = kwargs if make is None else make(**kwargs)
                m = compiled_model()
                m.compile(optimizer="adam", loss="mse", metrics=[metric])
                want = keras.metrics.serialize(metric)

                def check(cfg, want=want, kwargs=kwargs):
                    got = find_field(cfg, ["compile_config", "metrics"])
                    if not isinstance(got, list) or len(got) != 1:
                        return False, f"mpt keeps metrics = {json.dumps(got)}"
                    mine = got[0]
                    if isinstance(want, dict) and want.get("class_name") == "function":
                        return mine == want["config"], f"mpt keeps {json.dumps(mine)}"
                    # Keras reads mpt's entry back into the metric it saved.
                    theirs = keras.metrics.serialize(keras.metrics.get(mine))["config"]
                    ok = theirs == want["config"] and all(k in json.dumps(mine) for k in kwargs)
                    return ok, f"mpt keeps {json.dumps(mine)[:120]}"

                s.run(m, (6,), f"metric {cls}", field, check)
        for what, field, verdict, note in s.rows:
            print(f"{what:34s} {field:28s} {verdict:28s} {note[:150]}")
        kinds = {}
        for _, _, verdict, _ in s.rows:
            kinds[verdict] = kinds.get(verdict, 0) + 1
        print("summary: " + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())))
        if s.bad:
            print(f"{len(s.bad)} SILENT OR UNNAMED:")
            for b in s.bad:
                print("  ", b)
            raise SystemExit(1)
        print("sweep OK: zero silent loads")


if __name__ == "__main__":
    main()
