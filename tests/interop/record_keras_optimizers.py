"""Records Keras 3 optimizer trajectories for tests/optimizers/test_keras_optimizers.cpp.

Each case applies 20 gradients to two float32 variables (kernel [4, 3], bias [3]) with
`optimizer.apply`; the gradient of call t is 0.5 * (w - target) + noise[t] in float32 (the C++
test computes the same), so weight decay, EMA and accumulation see a real trajectory. Recorded:
the variables after every call, `iterations`, and, for use_ema, the variables after
finalize_variable_values.

    KERAS_BACKEND=jax python tests/interop/record_keras_optimizers.py   # writes tests/data/keras_optimizers.json
"""
import json
import os

import numpy as np
import keras

STEPS = 20
rng = np.random.default_rng(7)
init = {"kernel": rng.normal(size=(4, 3)).astype(np.float32), "bias": rng.normal(size=(3,)).astype(np.float32)}
target = {"kernel": rng.normal(size=(4, 3)).astype(np.float32), "bias": rng.normal(size=(3,)).astype(np.float32)}
noise = [{k: (0.3 * rng.normal(size=v.shape)).astype(np.float32) for k, v in init.items()} for _ in range(STEPS)]

O = keras.optimizers
CASES = [
    ("sgd_momentum_wd", lambda: O.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01), {}),
    ("rmsprop_centered_wd", lambda: O.RMSprop(0.01, momentum=0.5, centered=True, weight_decay=0.05), {}),
    ("adam_wd", lambda: O.Adam(0.05, weight_decay=0.01), {}),
    ("adamw_amsgrad_exclude", lambda: O.AdamW(0.05, weight_decay=0.1, amsgrad=True), {"exclude": ["bias"]}),
    ("nadam", lambda: O.Nadam(0.05), {}),
    ("nadam_beta_wd", lambda: O.Nadam(0.05, beta_1=0.8, beta_2=0.99, weight_decay=0.02), {}),
    ("adamax", lambda: O.Adamax(0.05), {}),
    ("adamax_beta_wd", lambda: O.Adamax(0.05, beta_1=0.7, beta_2=0.9, epsilon=1e-5, weight_decay=0.01), {}),
    ("adagrad", lambda: O.Adagrad(0.05), {}),
    ("adagrad_init_eps", lambda: O.Adagrad(0.1, initial_accumulator_value=0.5, epsilon=1e-4, weight_decay=0.03), {}),
    ("lion", lambda: O.Lion(0.01), {}),
    ("lion_beta_wd", lambda: O.Lion(0.02, beta_1=0.8, beta_2=0.95, weight_decay=0.1), {}),
    ("adafactor", lambda: O.Adafactor(), {}),
    ("adafactor_fixed_lr", lambda: O.Adafactor(0.01, relative_step=False, clip_threshold=0.5, beta_2_decay=-0.5,
                                               epsilon_2=1e-2, weight_decay=0.01), {}),
    ("adam_ema_overwrite", lambda: O.Adam(0.05, use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=5), {}),
    ("sgd_ema", lambda: O.SGD(0.05, use_ema=True, ema_momentum=0.8), {}),
    ("adam_accumulate3", lambda: O.Adam(0.05, gradient_accumulation_steps=3), {}),
    ("nadam_accumulate2_wd", lambda: O.Nadam(0.05, gradient_accumulation_steps=2, weight_decay=0.01), {}),
    ("adam_accumulate2_ema", lambda: O.Adam(0.05, gradient_accumulation_steps=2, use_ema=True, ema_momentum=0.7), {}),
    ("sgd_accumulate2_clipnorm", lambda: O.SGD(0.1, gradient_accumulation_steps=2, clipnorm=0.5), {}),
    ("lion_clipvalue", lambda: O.Lion(0.01, clipvalue=0.2), {}),
    # Gradients of a loss scaled by loss_scale_factor (times 128): apply divides them back.
    ("adam_loss_scale_factor", lambda: O.Adam(0.05, loss_scale_factor=128.0), {"grad_multiplier": 128.0}),
    ("sgd_loss_scale_factor_accumulate2", lambda: O.SGD(0.1, loss_scale_factor=64.0, gradient_accumulation_steps=2),
     {"grad_multiplier": 64.0}),
]


def run(make, extra):
    opt = make()
    kernel = keras.Variable(init["kernel"], name="kernel")
    bias = keras.Variable(init["bias"], name="bias")
    variables = [kernel, bias]
    mult = np.float32(extra.get("grad_multiplier", 1.0))
    if "exclude" in extra:
        opt.exclude_from_weight_decay(var_names=extra["exclude"])
    opt.build(variables)
    steps = []
    for t in range(STEPS):
        grads = []
        for v, name in zip(variables, ["kernel", "bias"]):
            w = np.asarray(v.value, dtype=np.float32)
            grads.append(((np.float32(0.5) * (w - target[name]) + noise[t][name]) * mult).astype(np.float32))
        opt.apply(grads, variables)
        steps.append({"kernel": np.asarray(kernel.value).ravel().tolist(), "bias": np.asarray(bias.value).tolist(),
                      "iterations": int(opt.iterations)})
    out = {"config": {k: v for k, v in opt.get_config().items() if k != "learning_rate" or not callable(v)},
           "class_name": type(opt).__name__, "steps": steps}
    if extra:
        out["extra"] = extra
    if opt.use_ema:
        opt.finalize_variable_values(variables)
        out["finalized"] = {"kernel": np.asarray(kernel.value).ravel().tolist(), "bias": np.asarray(bias.value).tolist()}
    return out


def main():
    data = {"keras_version": keras.__version__, "backend": keras.backend.backend(), "steps": STEPS,
            "init": {k: v.ravel().tolist() for k, v in init.items()},
            "target": {k: v.ravel().tolist() for k, v in target.items()},
            "noise": [{k: v.ravel().tolist() for k, v in n.items()} for n in noise],
            "cases": {name: run(make, extra) for name, make, extra in CASES}}
    path = os.path.join(os.path.dirname(__file__), "..", "data", "keras_optimizers.json")
    with open(path, "w") as f:
        json.dump(data, f)
    print("wrote", os.path.normpath(path), "with", len(CASES), "cases")


if __name__ == "__main__":
    main()
