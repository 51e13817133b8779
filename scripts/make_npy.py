#!/usr/bin/env python3
"""Writes Fashion-MNIST as NumPy .npy files with numpy.save, for examples/train_npy.

    python3 scripts/make_npy.py OUT_DIR [--idx-dir /usr/share/datasets/fashion-mnist] [--uint8]
    build/examples/train_npy --x OUT_DIR/train_x.npy --y OUT_DIR/train_y.npy \
        --x-test OUT_DIR/test_x.npy --y-test OUT_DIR/test_y.npy --policy mixed_bfloat16

Reads the IDX files (gzip-compressed or not) that Debian's dataset-fashion-mnist package puts in
/usr/share/datasets/fashion-mnist (or $MPT_FASHION_MNIST_DIR, or --idx-dir) and writes
OUT_DIR/{train,test}_{x,y}.npy: x float32 [N, 28, 28, 1] scaled to [0, 1] (uint8 [N, 28, 28, 1]
with --uint8; train_npy scales uint8 by 1/255 itself), y int64 [N]. Only NumPy is needed.
"""
import argparse
import gzip
import os
import struct
import sys

import numpy as np


def read_idx(path):
    for candidate in (path, path + ".gz"):
        if os.path.exists(candidate):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(candidate, "rb") as f:
                data = f.read()
            break
    else:
        sys.exit(f"make_npy.py: {path}[.gz] not found (apt-get install dataset-fashion-mnist, or --idx-dir DIR)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        sys.exit(f"make_npy.py: {candidate}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        sys.exit(f"make_npy.py: {candidate}: {array.size} bytes of data, the header says {dims}")
    return array.reshape(dims)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument(
        "--idx-dir",
        default=os.environ.get("MPT_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"),
        help="folder of the Fashion-MNIST IDX files (default: %(default)s)",
    )
    parser.add_argument("--uint8", action="store_true", help="write x as uint8 [0, 255] instead of float32 [0, 1]")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(os.path.join(args.idx_dir, f"{prefix}-images-idx3-ubyte"))[..., np.newaxis]
        labels = read_idx(os.path.join(args.idx_dir, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
        x = images if args.uint8 else images.astype(np.float32) / 255.0
        np.save(os.path.join(args.out_dir, f"{split}_x.npy"), x)
        np.save(os.path.join(args.out_dir, f"{split}_y.npy"), labels)
        print(f"{split}: x {x.dtype} {x.shape}, y {labels.dtype} {labels.shape}")
    print(f"wrote {args.out_dir}/{{train,test}}_{{x,y}}.npy")


if __name__ == "__main__":
    main()
