"""Records Keras 3's image resampling (keras.ops.image.affine_transform and resize) into test
data that tests/ops/test_image_ops.cpp compares mpt's ops with (expected values from Keras, not
from mpt's own formulas).

    KERAS_BACKEND=torch python tests/interop/record_keras_image.py [tests/data/keras_image.json]

affine_transform: a batch of 3 images 5 x 7 x 2 under per-image transforms (rotation with
scale, shear with translation, a translation by whole pixels, a zoom about the centre, a
translation beyond the image) in both interpolations and every fill mode, fill_value 0.5 for
"constant". The projective entries c0, c1 stay 0: Keras's backends disagree on them (the torch
backend adds c·channel to the coordinates), so mpt's projective division is checked against
its own float64 reference instead. resize: up and down, with and without crop_to_aspect_ratio.
"""
import json
import math
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")
import keras  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "keras_image.json")


def f32(a):
    return np.asarray(a, dtype="float32")


def values(a):
    """float32 values as short decimals (8 significant digits: the tests compare to 1e-5)."""
    return [float(f"{v:.8g}") for v in f32(a).ravel()]


def main():
    rng = np.random.default_rng(5)
    images = f32(rng.uniform(-1, 1, (3, 5, 7, 2)))
    c, s = math.cos(0.4) * 1.1, math.sin(0.4) * 1.1
    transforms = f32(
        [
            [c, -s, 1.3, s, c, -0.7, 0, 0],  # rotation + scale about the origin
            [1.0, 0.35, -2.25, -0.2, 0.9, 1.6, 0, 0],  # shear + translation
            [1.0, 0.0, -3.0, 0.0, 1.0, 2.0, 0, 0],  # whole pixels
        ]
    )
    zoom = 1.6
    zoom_row = f32([[zoom, 0, (7 - 1) / 2 * (1 - zoom), 0, zoom, (5 - 1) / 2 * (1 - zoom), 0, 0]])
    far = f32([[1.0, 0.0, 9.5, 0.0, 1.0, -11.25, 0, 0]])  # every sample outside: the fill modes alone
    cases = []
    for interpolation in ("bilinear", "nearest"):
        for fill_mode in ("constant", "nearest", "wrap", "mirror", "reflect"):
            for name, t in (("mixed", transforms), ("zoom", np.repeat(zoom_row, 3, 0)), ("far", np.repeat(far, 3, 0))):
                out = keras.ops.image.affine_transform(
                    images, t, interpolation=interpolation, fill_mode=fill_mode, fill_value=0.5
                )
                cases.append(
                    {
                        "name": name,
                        "interpolation": interpolation,
                        "fill_mode": fill_mode,
                        "fill_value": 0.5,
                        "transform": values(t),
                        "output": values(keras.ops.convert_to_numpy(out)),
                    }
                )
    resizes = []
    for size, crop in (((9, 4), False), ((3, 3), False), ((2, 5), False), ((4, 4), True), ((6, 3), True)):
        out = keras.ops.image.resize(images, size, interpolation="bilinear", crop_to_aspect_ratio=crop)
        resizes.append(
            {"size": list(size), "crop_to_aspect_ratio": crop, "output": values(keras.ops.convert_to_numpy(out))}
        )
    data = {
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "images_shape": list(images.shape),
        "images": values(images),
        "affine": cases,
        "resize": resizes,
    }
    with open(OUT, "w") as f:
        json.dump(data, f)
    print(f"wrote {OUT}: {len(cases)} affine cases, {len(resizes)} resizes (Keras {keras.__version__}, {keras.backend.backend()})")


if __name__ == "__main__":
    main()
