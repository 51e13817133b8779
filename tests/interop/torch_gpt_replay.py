#!/usr/bin/env python3
"""The PyTorch replay of mpt's GPT-mini (issue 26), run by hand (not by CTest).

    python3 -m pip install "torch==2.15.*" h5py numpy     # CPU wheels are enough
    cmake --build build --target gpt_replay_helper
    python3 tests/interop/torch_gpt_replay.py build/tests/gpt_replay_helper [--steps 50] [--d 64] ...

The helper builds the GPT-mini (token Embedding + PositionEmbedding; pre-norm blocks of causal
MultiHeadAttention and a GELU MLP with residual Adds; final LayerNormalization; Dense head), saves
its initial weights, and trains it in float32 with AdamW on fixed batches, one train_on_batch per
step. This script builds the same model in PyTorch from those weights (mpt's .weights.h5 read
with h5py: Keras's EinsumDense kernels [d, heads, key_dim] become [d, heads * key_dim]), runs the
same batches with Keras's AdamW update (decoupled decay var -= lr * wd * var, then Adam with
alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) and epsilon 1e-7 outside the square root), with
torch.nn.functional.scaled_dot_product_attention, and compares the losses step by step: every one
within 1e-4 relative.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as F

TOL = 1e-4


def load_weights(path):
    """{layer: [arrays]} and {layer: {group: [arrays]}} from mpt's Keras 3 .weights.h5."""
    out = {}
    with h5py.File(path, "r") as f:
        for name, g in f["layers"].items():
            own = [np.asarray(g["vars"][str(i)]) for i in range(len(g["vars"]))] if "vars" in g else []
            subs = {k: [np.asarray(v["vars"][str(i)]) for i in range(len(v["vars"]))]
                    for k, v in g.items() if k != "vars" and "vars" in v}
            out[name] = (own, subs)
    return out


class GPT(torch.nn.Module):
    def __init__(self, c, w):
        super().__init__()
        self.c = c
        t = lambda a: torch.nn.Parameter(torch.tensor(a, dtype=torch.float64 if c.get("f64") else torch.float32))
        p = {}
        p["tok"] = t(w["tok"][0][0])
        p["pos"] = t(w["pos"][0][0])
        for b in range(c["blocks"]):
            for ln in ("ln1", "ln2"):
                g, be = w[f"b{b}_{ln}"][0]
                p[f"b{b}_{ln}_g"], p[f"b{b}_{ln}_b"] = t(g), t(be)
            subs = w[f"b{b}_mha"][1]
            for part in ("query", "key", "value"):
                k, bias = subs[f"{part}_dense"]
                p[f"b{b}_{part}_k"] = t(k.reshape(k.shape[0], -1))
                p[f"b{b}_{part}_b"] = t(bias.reshape(-1))
            k, bias = subs["output_dense"]
            p[f"b{b}_out_k"] = t(k.reshape(-1, k.shape[-1]))
            p[f"b{b}_out_b"] = t(bias)
            for fc in ("fc1", "fc2"):
                k, bias = w[f"b{b}_{fc}"][0]
                p[f"b{b}_{fc}_k"], p[f"b{b}_{fc}_b"] = t(k), t(bias)
        g, be = w["ln_f"][0]
        p["ln_f_g"], p["ln_f_b"] = t(g), t(be)
        k, bias = w["head"][0]
        p["head_k"], p["head_b"] = t(k), t(bias)
        self.p = torch.nn.ParameterDict(p)

    def forward(self, ids):
        c, p = self.c, self.p
        B, T = ids.shape
        H, K = c["heads"], c["d"] // c["heads"]
        ln = lambda x, n: F.layer_norm(x, (c["d"],), p[n + "_g"], p[n + "_b"], eps=1e-3)
        x = p["tok"][ids] + p["pos"][:T]
        for b in range(c["blocks"]):
            h = ln(x, f"b{b}_ln1")
            q, k, v = ((h @ p[f"b{b}_{n}_k"] + p[f"b{b}_{n}_b"]).view(B, T, H, K).transpose(1, 2)
                       for n in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(K))
            x = x + (a.transpose(1, 2).reshape(B, T, H * K) @ p[f"b{b}_out_k"] + p[f"b{b}_out_b"])
            h = ln(x, f"b{b}_ln2")
            h = F.gelu(h @ p[f"b{b}_fc1_k"] + p[f"b{b}_fc1_b"])
            x = x + (h @ p[f"b{b}_fc2_k"] + p[f"b{b}_fc2_b"])
        return ln(x, "ln_f") @ p["head_k"] + p["head_b"]


def keras_adamw_step(params, state, step, lr, wd, b1=0.9, b2=0.999, eps=1e-7):
    with torch.no_grad():
        alpha = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        for i, prm in enumerate(params):
            g = prm.grad
            m, v = state.setdefault(i, (torch.zeros_like(prm), torch.zeros_like(prm)))
            prm -= prm * (wd * lr)
            m += (g - m) * (1 - b1)
            v += (g * g - v) * (1 - b2)
            prm -= alpha * m / (v.sqrt() + eps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("helper")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="mpt-gpt-replay-") as d:
        subprocess.run([a.helper, d] + a.rest, check=True)
        c = json.load(open(os.path.join(d, "config.json")))
        mpt_losses = [float(l) for l in open(os.path.join(d, "losses.txt"))]
        data = np.fromfile(os.path.join(d, "batches.i32"), dtype="<i4").reshape(c["steps"], 2, c["batch"], c["seq"])
        model = GPT(c, load_weights(os.path.join(d, "initial.weights.h5")))
        params = list(model.parameters())
        state = {}
        worst = 0.0
        print(f"torch {torch.__version__}; GPT-mini {c}")
        print(f"{'step':>5} {'mpt loss':>12} {'torch loss':>12} {'rel diff':>10}")
        for step in range(c["steps"]):
            x, y = (torch.from_numpy(data[step, i].astype(np.int64)) for i in range(2))
            for prm in params:
                prm.grad = None
            loss = F.cross_entropy(model(x).reshape(-1, c["vocab"]), y.reshape(-1))
            loss.backward()
            keras_adamw_step(params, state, step + 1, c["lr"], c["weight_decay"])
            rel = abs(mpt_losses[step] - loss.item()) / abs(loss.item())
            worst = max(worst, rel)
            if step < 5 or step % 10 == 9 or step == c["steps"] - 1:
                print(f"{step + 1:>5} {mpt_losses[step]:>12.6f} {loss.item():>12.6f} {rel:>10.2e}")
        print(f"largest relative difference over {c['steps']} steps: {worst:.2e} (bound {TOL:g})")
        if not worst < TOL:
            raise SystemExit("FAILED: the losses differ by more than the bound")
    print("replay OK")


if __name__ == "__main__":
    main()
