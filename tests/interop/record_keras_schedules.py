"""Records Keras 3's learning-rate schedules, step by step, into test data that
tests/optimizers/test_schedules_keras.cpp compares mpt's schedules with (expected values from
Keras, not from mpt's formulas).

    KERAS_BACKEND=jax python tests/interop/record_keras_schedules.py tests/data/keras_schedules.json

Each case: the schedule's Keras config (as a .keras file stores it) and its value at steps
0..160, as Keras computes it (float32).
"""
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402

S = keras.optimizers.schedules
SCHEDULES = [
    S.ExponentialDecay(0.1, 10, 0.9),
    S.ExponentialDecay(0.1, 7, 0.5, staircase=True),
    S.PiecewiseConstantDecay([10, 50], [0.1, 0.05, 0.01]),
    S.CosineDecay(0.1, 100, alpha=0.1),
    S.CosineDecay(0.0, 80, warmup_target=0.2, warmup_steps=20),
    S.PolynomialDecay(0.1, 50),
    S.PolynomialDecay(0.1, 40, end_learning_rate=0.01, power=2.0),
    S.PolynomialDecay(0.1, 30, end_learning_rate=0.001, power=0.5, cycle=True),
    S.InverseTimeDecay(0.1, 10, 0.5),
    S.InverseTimeDecay(0.2, 7, 1.5, staircase=True),
    S.CosineDecayRestarts(0.1, 10),
    S.CosineDecayRestarts(0.1, 12, t_mul=1.0, m_mul=0.8, alpha=0.05),
    S.CosineDecayRestarts(0.05, 9, t_mul=1.5, m_mul=0.5, alpha=0.1),
]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    cases = []
    for s in SCHEDULES:
        values = [float(keras.ops.convert_to_numpy(s(step))) for step in range(161)]
        cases.append({"serialized": keras.saving.serialize_keras_object(s), "lr": values})
        print(type(s).__name__, s.get_config(), [round(v, 5) for v in values[::20]])
    with open(sys.argv[1], "w") as f:
        json.dump({"keras_version": keras.__version__, "backend": keras.backend.backend(), "cases": cases}, f)


if __name__ == "__main__":
    main()
