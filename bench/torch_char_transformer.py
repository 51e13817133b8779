#!/usr/bin/env python3
"""PyTorch's side of examples/char_transformer (issue 26): the same GPT-style character model on
the same corpus, split, windows, hyperparameters, batch and wall-clock budget, so that the two
validation losses can be compared after the same minutes on the same machine.

    python3 bench/torch_char_transformer.py [--minutes 10] [--mode fp32|bf16] [--threads 2]
                                            [--corpus /usr/share/games/fortunes] [--seed 1]

Mirrors examples/char_transformer.cpp's defaults and rules:
- corpus: every plain file of the fortunes directory (not .dat, .u8, links or dot files), in name
  order, each ending in a newline; vocabulary the sorted distinct bytes; the first 90 % trains,
  the last 10 % validates (512 windows of T = 128 spread evenly over it);
- model: token Embedding(V, 128) (uniform ±0.05, Keras's default) + a learned position table
  (glorot-uniform, Keras-Hub's PositionEmbedding); 4 pre-norm blocks of causal multi-head
  attention (4 heads of 32, separate q/k/v/out projections, scaled_dot_product_attention) and a
  GELU (erf) MLP of 512, LayerNorm eps 1e-5, residual adds; final LayerNorm; Dense(V) logits;
  glorot-uniform kernels, zero biases (Keras's defaults);
- AdamW lr 2e-3, beta 0.9 / 0.99, epsilon 1e-7, weight decay 0.1 on the Linear weights only
  (not biases, norms, embeddings); batch 32; epochs of 100 steps over non-overlapping windows
  from a random phase, shuffled; validation after each epoch; the last epoch shortened to what
  the budget still holds (the previous epoch's step time), training and validation counted.
Prints one line per epoch and then `val_bits_per_char=<v>` and a sample.
"""
import argparse
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPTMini  # noqa: E402


def read_fortunes(d):
    names = sorted(n for n in os.listdir(d)
                   if not n.startswith(".") and not n.endswith((".dat", ".u8"))
                   and os.path.isfile(os.path.join(d, n)) and not os.path.islink(os.path.join(d, n)))
    text = bytearray()
    for n in names:
        s = open(os.path.join(d, n), "rb").read()
        if not s:
            continue
        if not s.endswith(b"\n"):
            s += b"\n"
        text += s
    return bytes(text), len(names)


def glorot_(t, fan_in, fan_out):
    lim = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        t.uniform_(-lim, lim)


def char_gpt(vocab, seq, d, heads, blocks):
    """torch_models.GPTMini (the bench's GPT-mini module) with Keras's initializers, as the C++
    example's layers have them: Keras's fans of the EinsumDense kernels for q/k/v/out, Embedding uniform ±0.05, the
    position table glorot-uniform, zero biases."""
    model = GPTMini(vocab, seq, d, heads, blocks)
    nn.init.uniform_(model.tok.weight, -0.05, 0.05)
    glorot_(model.pos, seq, d)
    kd = d // heads
    for blk in model.blocks:
        # Keras's fans of a kernel of rank 3: the leading dim is a receptive field, so the
        # [d, heads, key_dim] q/k/v kernels have fan_in heads*d and fan_out key_dim*d, and the
        # [heads, key_dim, d] output kernel fan_in key_dim*heads and fan_out d*heads.
        for lin in (blk.q, blk.k, blk.v):
            glorot_(lin.weight, heads * d, kd * d)
        glorot_(blk.o.weight, kd * heads, d * heads)
        glorot_(blk.fc1.weight, d, 4 * d)
        glorot_(blk.fc2.weight, 4 * d, d)
        for lin in (blk.q, blk.k, blk.v, blk.o, blk.fc1, blk.fc2):
            nn.init.zeros_(lin.bias)
    glorot_(model.head.weight, d, vocab)
    nn.init.zeros_(model.head.bias)
    return model


def window_starts(n, T, phase):
    return list(range(phase, n - T, T)) if n > T else []


def windows(ids, starts, T):
    x = np.stack([ids[s:s + T] for s in starts])
    y = np.stack([ids[s + 1:s + T + 1] for s in starts])
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--mode", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps-per-epoch", type=int, default=100)
    ap.add_argument("--val-windows", type=int, default=512)
    ap.add_argument("--learning-rate", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    a = ap.parse_args()
    t_start = time.perf_counter()
    budget = a.minutes * 60
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    text, files = read_fortunes(a.corpus)
    chars = sorted(set(text))
    lut = np.full(256, -1, dtype=np.int32)
    for i, c in enumerate(chars):
        lut[c] = i
    ids = lut[np.frombuffer(text, dtype=np.uint8)]
    n_train = len(ids) * 9 // 10
    train, val = ids[:n_train], ids[n_train:]
    T, B = a.seq_len, a.batch_size
    vs = window_starts(len(val), T, 0)
    if a.val_windows and len(vs) > a.val_windows:
        vs = [vs[i * len(vs) // a.val_windows] for i in range(a.val_windows)]
    vx, vy = windows(val, vs, T)
    print(f"torch {torch.__version__}, {a.threads} threads, {a.mode}; corpus {files} files, {len(text)} characters, "
          f"vocabulary {len(chars)}; train {n_train}, validation {len(val)} ({len(vs)} windows of {T})", flush=True)

    model = char_gpt(len(chars), T, a.d_model, a.heads, a.blocks)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "ln" not in n and not n.startswith("tok")]
    rest = [p for p in model.parameters() if not any(p is q for q in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.learning_rate, betas=(0.9, 0.99), eps=1e-7, fused=True)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.mode == "bf16")

    def evaluate():
        model.eval()
        total, n = 0.0, 0
        with torch.no_grad(), amp:
            for i in range(0, len(vx), 64):
                out = model(vx[i:i + 64]).float()
                total += F.cross_entropy(out.reshape(-1, out.shape[-1]), vy[i:i + 64].reshape(-1), reduction="sum").item()
                n += vy[i:i + 64].numel()
        model.train()
        return total / n

    step_s = eval_s = 0.0
    val_bits = float("nan")
    total_steps = 0
    epoch = 0
    while True:
        starts = window_starts(n_train, T, rng.randrange(T))
        rng.shuffle(starts)
        steps = min(len(starts) // B, a.steps_per_epoch)
        if epoch > 0:
            left = budget - (time.perf_counter() - t_start) - eval_s
            steps = min(steps, int(left / step_s))
            if steps < max(1, min(10, a.steps_per_epoch // 4)):
                break
        x, y = windows(train, starts[:steps * B], T)
        t0 = time.perf_counter()
        loss_sum = 0.0
        for s in range(steps):
            xb, yb = x[s * B:(s + 1) * B], y[s * B:(s + 1) * B]
            opt.zero_grad(set_to_none=True)
            with amp:
                out = model(xb).float()
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        train_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        val_bits = evaluate() / math.log(2)
        eval_s = time.perf_counter() - t1
        step_s = train_s / steps
        total_steps += steps
        epoch += 1
        print(f"epoch {epoch}: {steps} steps, train {loss_sum / steps / math.log(2):.3f} bits/char, val {val_bits:.3f} "
              f"bits/char, {1e3 * step_s:.0f} ms/step, {steps * B * T / train_s:.0f} tokens/s, "
              f"{(time.perf_counter() - t_start) / 60:.1f} min", flush=True)
        if time.perf_counter() - t_start >= budget:
            break
    print(f"trained {total_steps} steps ({total_steps * B * T} tokens) in {(time.perf_counter() - t_start) / 60:.1f} min")
    # A sample, as the C++ example prints: temperature 0.8 after "The ".
    model.eval()
    g = torch.Generator().manual_seed(a.seed)
    seq = [int(lut[c]) for c in b"The "]
    with torch.no_grad():
        for _ in range(400):
            w = seq[-T:]
            logits = model(torch.tensor([w]))[0, -1].float() / 0.8
            seq.append(int(torch.multinomial(F.softmax(logits, -1), 1, generator=g)))
    print("--- sample ---\n" + bytes(chars[i] for i in seq).decode("utf-8", "replace") + "\n---")
    print(f"val_bits_per_char={val_bits:.4f}")


if __name__ == "__main__":
    sys.exit(main())
