#!/usr/bin/env python3
"""mpt <-> Keras 3 checkpoint interop, run by hand (not by CTest).

    pip install keras "jax[cpu]" h5py        # or tensorflow-cpu instead of jax
    cmake --build build --target keras_interop_helper
    KERAS_BACKEND=jax python tests/interop/keras_interop.py build/tests/keras_interop_helper

1. mpt writes model.weights.h5 (Keras 3 layout, with Adam's state), a legacy Keras 2 .h5 and
   a bfloat16 export; Keras loads each into the same MLP and predicts on the same inputs, and
   takes one more Adam step from mpt's optimizer state, which must match mpt's own step.
   Keras also rebuilds whole models from mpt's .keras archives (load_model): the MLP, every core
   layer under mixed_bfloat16, a functional residual CNN (Keras 3's functional config), a
   two-output model compiled with per-output losses, loss_weights and metrics (Keras evaluates
   it to mpt's logs), and the augmentation layers with their arguments.
2. Keras writes .weights.h5 (float32 and bfloat16), a legacy .h5 and .keras archives (the MLP
   and a functional residual CNN); mpt loads each (load_weights, load_model) and predicts. Both
   ways also a CNN with DepthwiseConv2D and a grouped Conv2D. Every comparison prints its max abs
   difference and must stay under 1e-5.
It also checks that h5py reads mpt's files through their 512-byte userblock.
"""
import os
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("KERAS_BACKEND", "jax")

import h5py  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

N, IN, OUT = 64, 20, 10
TOL = 1e-5


def mlp(dtype=None):
    return keras.Sequential(
        [
            keras.Input((IN,)),
            keras.layers.Dense(64, activation="relu", name="dense", dtype=dtype),
            keras.layers.Dense(32, activation="tanh", name="dense_1", dtype=dtype),
            keras.layers.Dense(OUT, name="dense_2", dtype=dtype),
            keras.layers.Activation("softmax", name="activation", dtype=dtype),
        ]
    )


def residual_cnn():
    """The functional residual CNN of keras_interop_helper's residual_cnn(), with the names
    Keras gives (conv2d_3, ... when built after other layers): weights go by object path."""
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    y = keras.layers.Conv2D(4, 3, padding="same")(x)
    z = keras.layers.Add()([x, y])
    z = keras.layers.GlobalAveragePooling2D()(z)
    out = keras.layers.Dense(5, activation="softmax")(z)
    return keras.Model(inp, out, name="residual")


def depthwise_cnn():
    """keras_interop_helper's depthwise_cnn(): DepthwiseConv2D and a grouped Conv2D."""
    inp = keras.Input((8, 8, 4))
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="relu")(inp)
    x = keras.layers.Conv2D(6, 3, groups=2, activation="tanh")(x)
    out = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inp, out, name="depthwise")


T, VOCAB = 12, 20


def gpt():
    """The helper's token model: Embedding, causal MultiHeadAttention with a mask input, Add,
    LayerNormalization, Dense (Keras's core has no PositionEmbedding)."""
    ids = keras.Input((T,), dtype="int32", name="ids")
    mask = keras.Input((T, T), dtype="bool", name="mask")
    h = keras.layers.Embedding(VOCAB, 16)(ids)
    a = keras.layers.MultiHeadAttention(2, 8)(h, h, attention_mask=mask, use_causal_mask=True)
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, a]))
    return keras.Model([ids, mask], keras.layers.Dense(VOCAB)(h), name="gpt")


def crossed(names):
    """out = Add([c(x), b(a(x))]) named a, b, c = names; Keras lists its layers a, c, b."""
    x = keras.Input((4,), name="features")
    ya = keras.layers.Dense(3, name=names[0])(x)
    yb = keras.layers.Dense(4, name=names[1])(ya)
    yc = keras.layers.Dense(4, activation="relu", name=names[2])(x)
    return keras.Model(x, keras.layers.Add()([yc, yb]))


def nested():
    """A model used as a layer: Input -> base -> Dense head, base = Dense, BatchNormalization, Dense."""
    bi = keras.Input((IN,))
    h = keras.layers.BatchNormalization()(keras.layers.Dense(16, activation="relu")(bi))
    base = keras.Model(bi, keras.layers.Dense(8, activation="tanh")(h))
    x = keras.Input((IN,))
    return keras.Model(x, keras.layers.Dense(OUT)(base(x)))


def read_f32(path, shape):
    return np.fromfile(path, dtype="<f4").reshape(shape)


def report(what, a, b, tol=TOL):
    diff = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    print(f"  {what:58s} max abs diff {diff:.3e}")
    if not diff < tol:
        raise SystemExit(f"FAILED: {what}: {diff} >= {tol}")
    return diff


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    helper = sys.argv[1]
    print(f"keras {keras.__version__} ({keras.backend.backend()}), h5py {h5py.__version__}")
    with tempfile.TemporaryDirectory(prefix="mpt-interop-") as d:
        # ---- mpt writes, Keras reads -------------------------------------------------------
        subprocess.run([helper, "export", d], check=True)
        x = read_f32(os.path.join(d, "inputs.f32"), (N, IN))
        mpt_preds = read_f32(os.path.join(d, "preds.f32"), (N, OUT))
        mpt_preds_bf16 = read_f32(os.path.join(d, "preds_bf16.f32"), (N, OUT))
        print("mpt -> Keras")
        for name in ["mpt.weights.h5", "mpt_legacy.h5", "mpt_bf16.weights.h5"]:
            path = os.path.join(d, name)
            with h5py.File(path, "r") as f:
                assert f.userblock_size == 512, f.userblock_size
                with open(path, "rb") as raw:
                    assert raw.read(16) == b"\x89MPT checkpoint\n"
            m = mlp()
            if name == "mpt.weights.h5":
                # Compiled and built, Keras also restores the optimizer's variables.
                m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
                m.optimizer.build(m.trainable_variables)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a skipped optimizer state would warn
                m.load_weights(path)
            want = mpt_preds_bf16 if "bf16" in name else mpt_preds
            report(f"Keras predict after load_weights({name})", m.predict(x, verbose=0), want)
            if name == "mpt.weights.h5":
                its = int(keras.ops.convert_to_numpy(m.optimizer.iterations))
                print(f"  Keras optimizer iterations after loading: {its}")
                assert its == 32, its
                # One more Adam step from mpt's slots (momentum/velocity order) matches mpt's step.
                xb = x[:32]
                yb = ((xb[:, 0] > 0).astype("int32") + 2 * (xb[:, 1] > 0)).astype("int32")
                m.train_on_batch(xb, yb)
                step = read_f32(os.path.join(d, "preds_step.f32"), (N, OUT))
                report("Keras predict after one more Adam step (vs mpt's)", m.predict(x, verbose=0), step)

        # Every optimizer's variables (slots, Nadam's u_product, EMA averages, gradient
        # accumulators) and config: Keras rebuilds the compiled model from mpt's .keras and one
        # more train_on_batch lands where mpt's did.
        subprocess.run([helper, "optimizers_export", d], check=True)
        opt_inputs = read_f32(os.path.join(d, "opt_inputs.f32"), (N, IN))
        xb = read_f32(os.path.join(d, "opt_batch_x.f32"), (32, IN))
        yb = read_f32(os.path.join(d, "opt_batch_y.f32"), (32,)).astype("int32")
        for name in ["nadam", "adamax", "adagrad", "lion", "adafactor", "adam_ema_acc", "sgd_wd"]:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a skipped optimizer state would warn
                km = keras.saving.load_model(os.path.join(d, f"mpt_opt_{name}.keras"))
            km.train_on_batch(xb, yb)
            want = read_f32(os.path.join(d, f"preds_opt_{name}.f32"), (N, OUT))
            report(f"{type(km.optimizer).__name__} ({name}): Keras step from mpt's .keras vs mpt's step",
                   km.predict(opt_inputs, verbose=0), want, tol=2e-5)

        # A whole model: Keras rebuilds mpt's .keras from its config.json and weights.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            km = keras.saving.load_model(os.path.join(d, "mpt.keras"))
        print(f"  Keras load_model(mpt.keras): {type(km).__name__} of {len(km.layers)} layers, "
              f"optimizer {type(km.optimizer).__name__}, iterations "
              f"{int(keras.ops.convert_to_numpy(km.optimizer.iterations))}")
        report("Keras predict after load_model(mpt.keras)", km.predict(x, verbose=0), mpt_preds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kc = keras.saving.load_model(os.path.join(d, "mpt_core.keras"))
        print("  Keras load_model(mpt_core.keras): " + ", ".join(
            f"{type(l).__name__}[{l.dtype_policy.name}]" for l in kc.layers))
        x8 = read_f32(os.path.join(d, "inputs8.f32"), (N, 8))
        report("Keras predict after load_model(mpt_core.keras) (bfloat16)", kc.predict(x8, verbose=0),
               read_f32(os.path.join(d, "preds_core.f32"), (N, 4)), tol=2e-2)

        # A functional residual CNN: Keras rebuilds the graph from Keras 3's functional config.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kr = keras.saving.load_model(os.path.join(d, "mpt_residual.keras"))
        print(f"  Keras load_model(mpt_residual.keras): {type(kr).__name__} of "
              + ", ".join(type(l).__name__ for l in kr.layers))
        ximg = read_f32(os.path.join(d, "inputs_img.f32"), (N, 8, 8, 3))
        report("Keras predict after load_model(mpt_residual.keras)", kr.predict(ximg, verbose=0),
               read_f32(os.path.join(d, "preds_residual.f32"), (N, 5)))

        # User-chosen layer names, in a graph whose Keras order (a, c, b) is not its call order.
        x4 = read_f32(os.path.join(d, "inputs4.f32"), (N, 4))
        want4 = read_f32(os.path.join(d, "preds_crossed.f32"), (N, 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kx = keras.saving.load_model(os.path.join(d, "mpt_crossed.keras"))
        print("  Keras load_model(mpt_crossed.keras): " + ", ".join(l.name for l in kx.layers))
        report("Keras predict after load_model(mpt_crossed.keras)", kx.predict(x4, verbose=0), want4)
        kx2 = crossed(["p", "q", "r"])  # other names: weights go by object path
        kx2.load_weights(os.path.join(d, "mpt_crossed.weights.h5"))
        report("Keras predict after load_weights(mpt_crossed.weights.h5), other names", kx2.predict(x4, verbose=0),
               want4)

        # A token model with causal MultiHeadAttention and a mask input (the call's kwargs).
        subprocess.run([helper, "gpt_export", d], check=True)
        ids = read_f32(os.path.join(d, "gpt_ids.f32"), (N, T)).astype("int32")
        gmask = read_f32(os.path.join(d, "gpt_mask.f32"), (N, T, T)).astype(bool)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kg = keras.saving.load_model(os.path.join(d, "mpt_gpt.keras"))
        print(f"  Keras load_model(mpt_gpt.keras): {type(kg).__name__} of "
              + ", ".join(type(l).__name__ for l in kg.layers))
        report("Keras predict after load_model(mpt_gpt.keras)", kg.predict([ids, gmask], verbose=0),
               read_f32(os.path.join(d, "gpt_preds.f32"), (N, T, VOCAB)))
        # The causal rule travelled: without it Keras predicts something else.
        mha = next(l for l in kg.layers if isinstance(l, keras.layers.MultiHeadAttention))
        assert kg.get_config()["layers"][[l.name for l in kg.layers].index(mha.name)]["inbound_nodes"][0]["kwargs"][
            "use_causal_mask"] is True

        # DepthwiseConv2D and a grouped Conv2D (Keras's groups), trained in mpt.
        subprocess.run([helper, "depthwise_export", d], check=True)
        xdw = read_f32(os.path.join(d, "inputs_dw.f32"), (N, 8, 8, 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kd = keras.saving.load_model(os.path.join(d, "mpt_depthwise.keras"))
        print(f"  Keras load_model(mpt_depthwise.keras): " + ", ".join(
            f"{type(l).__name__}{'(groups=%d)' % l.groups if getattr(l, 'groups', 1) != 1 else ''}" for l in kd.layers))
        report("Keras predict after load_model(mpt_depthwise.keras)", kd.predict(xdw, verbose=0),
               read_f32(os.path.join(d, "preds_dw.f32"), (N, 5)))

        # Two outputs compiled with a loss, a loss weight and metrics each (Keras's loss=[...],
        # loss_weights=[...], metrics=[[...], [...]]): Keras evaluates mpt's .keras under the
        # compile settings it stored, to mpt's logs, names included.
        subprocess.run([helper, "multi_output_export", d], check=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kt = keras.saving.load_model(os.path.join(d, "mpt_two_heads.keras"))
        xt2 = read_f32(os.path.join(d, "two_heads_x.f32"), (N, IN))
        y1 = read_f32(os.path.join(d, "two_heads_y1.f32"), (N,)).astype("int32")
        y2 = read_f32(os.path.join(d, "two_heads_y2.f32"), (N, 1))
        got = kt.evaluate(xt2, [y1, y2], batch_size=N, verbose=0, return_dict=True)
        with open(os.path.join(d, "two_heads_logs.txt")) as f:
            want_logs = {k: float(v) for k, v in (line.split() for line in f)}
        print(f"  Keras load_model(mpt_two_heads.keras): loss {kt.loss}, loss_weights {kt.get_compile_config()['loss_weights']}")
        assert set(got) == set(want_logs), (sorted(got), sorted(want_logs))
        for k in sorted(want_logs):
            report(f"Keras evaluate '{k}' vs mpt's", np.float32(got[k]), np.float32(want_logs[k]), tol=1e-4)

        # The augmentation layers with their arguments: Keras rebuilds them from mpt's config, and
        # in inference (the random layers the identity) predicts what mpt predicts.
        subprocess.run([helper, "augment_export", d], check=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ka = keras.saving.load_model(os.path.join(d, "mpt_augment.keras"))
        by_type = {type(l).__name__: l.get_config() for l in ka.layers}
        print("  Keras load_model(mpt_augment.keras): " + ", ".join(type(l).__name__ for l in ka.layers))
        tr, zo = by_type["RandomTranslation"], by_type["RandomZoom"]
        assert list(tr["height_factor"]) == [-0.2, 0.1] and tr["width_factor"] == 0.15, tr
        assert (tr["fill_mode"], tr["interpolation"], tr["fill_value"], tr["seed"]) == ("constant", "nearest", 0.5, 4), tr
        assert zo["height_factor"] == 0.2 and list(zo["width_factor"]) == [-0.1, 0.3] and zo["fill_mode"] == "wrap", zo
        assert by_type["RandomFlip"]["mode"] == "horizontal" and by_type["Rescaling"]["offset"] == -1.0, by_type
        assert (by_type["RandomCrop"]["height"], by_type["RandomCrop"]["width"]) == (8, 8), by_type["RandomCrop"]
        xaug = read_f32(os.path.join(d, "inputs_aug.f32"), (N, 8, 8, 3))
        report("Keras predict after load_model(mpt_augment.keras)", ka.predict(xaug, verbose=0),
               read_f32(os.path.join(d, "preds_aug.f32"), (N, 5)))

        # ---- Keras writes, mpt reads -------------------------------------------------------
        print("Keras -> mpt")
        # Keras's optimizers with their state: mpt's load_model rebuilds each and one more
        # train_on_batch lands where Keras's did. (use_ema is checked the other way round above:
        # Keras 3.15's fit on JAX fails with use_ema, "Attempt to donate the same buffer twice".)
        O = keras.optimizers
        keras_optimizers = {
            "nadam": lambda: O.Nadam(1e-2, weight_decay=0.01),
            "adamax": lambda: O.Adamax(1e-2, beta_2=0.99),
            "adagrad": lambda: O.Adagrad(5e-2, initial_accumulator_value=0.2),
            "lion": lambda: O.Lion(1e-3, weight_decay=0.1),
            "adafactor": lambda: O.Adafactor(1e-2),
            "adam_acc": lambda: O.Adam(1e-2, gradient_accumulation_steps=4),
            "rmsprop_wd": lambda: O.RMSprop(1e-2, weight_decay=0.02, centered=True),
        }
        xo = np.random.default_rng(1).normal(size=(480, IN)).astype("float32")
        yo = (xo[:, 0] > 0).astype("int32") + 2 * (xo[:, 1] > 0)
        for name, make in keras_optimizers.items():
            keras.utils.set_random_seed(5)
            k = mlp()
            k.compile(optimizer=make(), loss="sparse_categorical_crossentropy")
            k.fit(xo, yo, batch_size=32, epochs=1, shuffle=False, verbose=0)
            path = os.path.join(d, f"keras_opt_{name}.keras")
            k.save(path)
            k.train_on_batch(xb, yb)
            want_step = k.predict(opt_inputs, verbose=0)
            out = os.path.join(d, "out.f32")
            subprocess.run([helper, "import_step", path, os.path.join(d, "opt_batch_x.f32"),
                            os.path.join(d, "opt_batch_y.f32"), os.path.join(d, "opt_inputs.f32"), out], check=True)
            report(f"{type(k.optimizer).__name__} ({name}): mpt step from Keras's .keras vs Keras's step",
                   read_f32(out, (N, OUT)), want_step, tol=2e-5)
        keras.utils.set_random_seed(5)
        k = mlp()
        k.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        xt = np.random.default_rng(0).normal(size=(256, IN)).astype("float32")
        k.fit(xt, (xt[:, 0] > 0).astype("int32") + 2 * (xt[:, 1] > 0), epochs=1, verbose=0)
        want = k.predict(x, verbose=0)
        k.save_weights(os.path.join(d, "keras.weights.h5"))
        k.save(os.path.join(d, "keras.keras"))
        from keras.src.legacy.saving import legacy_h5_format

        with h5py.File(os.path.join(d, "keras_legacy.h5"), "w") as f:
            legacy_h5_format.save_weights_to_hdf5_group(f, k)
        # A pure bfloat16 model stores opaque 2-byte bfloat16 datasets tagged dtype=bfloat16.
        kb = mlp("bfloat16")
        kb.set_weights([w.astype("float32") for w in k.get_weights()])
        kb.save_weights(os.path.join(d, "keras_bf16.weights.h5"))
        k32 = mlp()
        k32.set_weights([np.asarray(w, dtype="float32") for w in kb.get_weights()])
        want_bf16 = k32.predict(x, verbose=0)
        for name, expected in [
            ("keras.weights.h5", want),
            ("keras_legacy.h5", want),
            ("keras_bf16.weights.h5", want_bf16),
        ]:
            out = os.path.join(d, "out.f32")
            subprocess.run([helper, "import", os.path.join(d, name), os.path.join(d, "inputs.f32"), out], check=True)
            report(f"mpt predict after load_weights({name})", read_f32(out, (N, OUT)), expected)
        out = os.path.join(d, "out.f32")
        subprocess.run([helper, "import_model", os.path.join(d, "keras.keras"), os.path.join(d, "inputs.f32"), out],
                       check=True)
        report("mpt predict after load_model(keras.keras)", read_f32(out, (N, OUT)), want)
        # A model built second in the session: its config names (dense_3, ...) are not its weight
        # paths (dense, ...); mpt follows the paths, as Keras does.
        keras.layers.Dense(1)  # takes the name "dense", as a model built before would
        k2 = keras.Sequential([keras.Input((IN,)), keras.layers.Dense(64, activation="relu"),
                               keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(OUT),
                               keras.layers.Activation("softmax")])
        k2.set_weights([w * 0.5 for w in k.get_weights()])
        assert k2.layers[0].name != "dense", k2.layers[0].name
        k2.save(os.path.join(d, "keras_second.keras"))
        subprocess.run([helper, "import_model", os.path.join(d, "keras_second.keras"), os.path.join(d, "inputs.f32"),
                        out], check=True)
        report(f"mpt predict after load_model(keras_second.keras), layers named {k2.layers[0].name}, ...",
               read_f32(out, (N, OUT)), k2.predict(x, verbose=0))
        # User-chosen names in Keras's crossed graph: .keras and .weights.h5 into mpt's own names.
        kx3 = crossed(["alpha", "beta", "gamma"])
        rng = np.random.default_rng(4)
        kx3.set_weights([rng.uniform(-1, 1, w.shape).astype("float32") for w in kx3.get_weights()])
        kx3.save(os.path.join(d, "keras_crossed.keras"))
        kx3.save_weights(os.path.join(d, "keras_crossed.weights.h5"))
        want4 = kx3.predict(x4, verbose=0)
        subprocess.run([helper, "import_model", os.path.join(d, "keras_crossed.keras"), os.path.join(d, "inputs4.f32"),
                        out, "4"], check=True)
        report("mpt predict after load_model(keras_crossed.keras)", read_f32(out, (N, 4)), want4)
        subprocess.run([helper, "crossed_import", os.path.join(d, "keras_crossed.weights.h5"),
                        os.path.join(d, "inputs4.f32"), out], check=True)
        report("mpt predict after load_weights(keras_crossed.weights.h5), mpt's names", read_f32(out, (N, 4)), want4)
        # Keras's augmentation layers with their arguments: mpt rebuilds them and predicts as
        # Keras in inference.
        L = keras.layers
        kaug = keras.Sequential([keras.Input((8, 8, 3)), L.Rescaling(2.0, offset=0.5), L.RandomFlip("vertical", seed=1),
                                 L.RandomTranslation(0.1, (-0.3, 0.2), fill_mode="nearest", seed=2),
                                 L.RandomZoom((-0.2, 0.1), fill_mode="reflect", interpolation="nearest", seed=3),
                                 L.RandomCrop(8, 8, seed=4), L.Conv2D(4, 3, activation="relu"), L.Flatten(),
                                 L.Dense(5)])
        kaug.save(os.path.join(d, "keras_augment.keras"))
        subprocess.run([helper, "import_model", os.path.join(d, "keras_augment.keras"), os.path.join(d, "inputs_aug.f32"),
                        out, "8", "8", "3"], check=True)
        report("mpt predict after load_model(keras_augment.keras)", read_f32(out, (N, 5)),
               kaug.predict(xaug, verbose=0))
        # ReLU's options (MobileNet's ReLU6 and the rest): loaded as what they are, not as a plain
        # ReLU (issue 27: a plain ReLU predicted up to 74 apart). Weights large enough to cap.
        for relu_options in ({"max_value": 6.0}, {"max_value": 2.5, "negative_slope": 0.1, "threshold": 0.5}):
            relu = keras.layers.ReLU(**relu_options)
            kq = keras.Sequential([keras.Input((IN,)), keras.layers.Dense(16), relu, keras.layers.Dense(OUT)])
            kq.set_weights([w * 8 for w in kq.get_weights()])
            kq.save(os.path.join(d, "keras_relu.keras"))
            subprocess.run([helper, "import_model", os.path.join(d, "keras_relu.keras"), os.path.join(d, "inputs.f32"), out],
                           check=True)
            kwant = kq.predict(x, verbose=0)  # outputs in the hundreds: float32's tolerance relative to them
            report(f"mpt predict after load_model(keras_relu.keras), ReLU({relu_options})", read_f32(out, (N, OUT)),
                   kwant, tol=1e-6 * float(np.abs(kwant).max()))
        kr = residual_cnn()
        kr.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        xi = np.random.default_rng(1).normal(size=(128, 8, 8, 3)).astype("float32")
        kr.fit(xi, np.arange(128) % 5, epochs=1, verbose=0)
        kr.save(os.path.join(d, "keras_residual.keras"))
        ximg.tofile(os.path.join(d, "inputs_img_k.f32"))
        subprocess.run([helper, "import_model", os.path.join(d, "keras_residual.keras"),
                        os.path.join(d, "inputs_img_k.f32"), out, "8", "8", "3"], check=True)
        report("mpt predict after load_model(keras_residual.keras)", read_f32(out, (N, 5)),
               kr.predict(ximg, verbose=0))
        kg = gpt()
        rng = np.random.default_rng(3)
        kg.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in kg.get_weights()])
        kg.save(os.path.join(d, "keras_gpt.keras"))
        ids.astype("float32").tofile(os.path.join(d, "gpt_ids_k.f32"))
        gmask.astype("float32").tofile(os.path.join(d, "gpt_mask_k.f32"))
        subprocess.run([helper, "gpt_import", os.path.join(d, "keras_gpt.keras"), os.path.join(d, "gpt_ids_k.f32"),
                        os.path.join(d, "gpt_mask_k.f32"), out], check=True)
        report("mpt predict after load_model(keras_gpt.keras)", read_f32(out, (N, T, VOCAB)),
               kg.predict([ids, gmask], verbose=0))
        # DepthwiseConv2D (kernel [3, 3, 4, 2]) and Conv2D(groups=2), trained a little in Keras.
        kdw = depthwise_cnn()
        rng = np.random.default_rng(6)
        kdw.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in kdw.get_weights()])
        kdw.compile(optimizer="adam", loss="mse")
        kdw.fit(rng.normal(size=(128, 8, 8, 4)).astype("float32"), rng.normal(size=(128, 5)).astype("float32"),
                epochs=1, verbose=0)
        kdw.save(os.path.join(d, "keras_depthwise.keras"))
        subprocess.run([helper, "import_model", os.path.join(d, "keras_depthwise.keras"),
                        os.path.join(d, "inputs_dw.f32"), out, "8", "8", "4"], check=True)
        report("mpt predict after load_model(keras_depthwise.keras)", read_f32(out, (N, 5)),
               kdw.predict(xdw, verbose=0))
        # ---- a model used as a layer (fine-tuning a frozen base), both ways ------------------
        print("nested models")
        subprocess.run([helper, "nested_export", d], check=True)
        xn = read_f32(os.path.join(d, "inputs_nested.f32"), (N, IN))
        mpt_nested = read_f32(os.path.join(d, "preds_nested.f32"), (N, OUT))
        mn = keras.saving.load_model(os.path.join(d, "mpt_nested.keras"))
        inner = mn.layers[1]
        assert isinstance(inner, keras.Model) and not inner.trainable, inner
        assert len(mn.trainable_weights) == 2 and len(mn.weights) == 2 + 8, (mn.trainable_weights, mn.weights)
        report("Keras predict after load_model(mpt_nested.keras)", mn.predict(xn, verbose=0), mpt_nested)
        with h5py.File(os.path.join(d, "mpt_nested.weights.h5"), "r") as f:
            for key in ["layers/functional/layers/dense/vars/0", "layers/functional/layers/batch_normalization/vars/3",
                        "layers/functional/layers/dense_1/vars/1", "layers/dense/vars/0"]:
                assert key in f, key
        kn = nested()
        kn.load_weights(os.path.join(d, "mpt_nested.weights.h5"))
        report("Keras predict after load_weights(mpt_nested.weights.h5)", kn.predict(xn, verbose=0), mpt_nested)
        kn2 = nested()
        rng = np.random.default_rng(8)
        for v in kn2.weights:
            lo, hi = (0.5, 1.5) if "variance" in v.name else (-0.5, 0.5)
            v.assign(rng.uniform(lo, hi, v.shape).astype("float32"))
        kn2.layers[1].trainable = False
        kn2.compile(optimizer="adam", loss="mse")
        kn2.fit(rng.normal(size=(128, IN)).astype("float32"), rng.normal(size=(128, OUT)).astype("float32"),
                epochs=1, verbose=0)
        kn2.save(os.path.join(d, "keras_nested.keras"))
        kn2.save_weights(os.path.join(d, "keras_nested.weights.h5"))
        want_n = kn2.predict(xn, verbose=0)
        subprocess.run([helper, "import_model", os.path.join(d, "keras_nested.keras"),
                        os.path.join(d, "inputs_nested.f32"), out], check=True)
        report(f"mpt predict after load_model(keras_nested.keras), base '{kn2.layers[1].name}'",
               read_f32(out, (N, OUT)), want_n)
        subprocess.run([helper, "nested_import", os.path.join(d, "keras_nested.weights.h5"),
                        os.path.join(d, "inputs_nested.f32"), out], check=True)
        report("mpt predict after load_weights(keras_nested.weights.h5)", read_f32(out, (N, OUT)), want_n)
    print("interop OK")


if __name__ == "__main__":
    main()
