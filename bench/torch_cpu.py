#!/usr/bin/env python3
"""PyTorch's side of the CPU comparison with mpt, model by model: the wall time of one training
step (zero_grad, forward under the precision mode, loss, backward, Adam step) of the same four
models and batch sizes that mpt's CPU benchmark trains, on the same machine and thread count.

    python3 bench/torch_cpu.py --model A|B|C|D --mode fp32|bf16|fp16
                               [--steps 30] [--warmup 5] [--threads 2] [--adam auto|fused|foreach]

Models (the Keras models of mpt's examples and benches; data in Keras's NHWC layout, read by the
CNNs as channels-last tensors; Keras initializers: Glorot-uniform kernels, zero biases; softmax +
sparse categorical cross-entropy as cross_entropy on float32 logits; Adam lr 1e-3):
  A  MLP, 28x28x1 flattened: Dense 512 relu, Dense 512 relu, Dense 10.                batch 256
  B  CIFAR CNN, 32x32x3: Conv 32 3x3 relu, MaxPool 2, Conv 64 3x3 relu, MaxPool 2,
     Flatten, Dense 128 relu, Dense 10 ('valid' padding).                             batch 128
  C  Fashion-MNIST CNN, 28x28x1: as B with 1 input channel (Flatten gives 1600).      batch 128
  D  MLP, 1024 inputs: Dense 2048 relu x3, Dense 10.                                  batch 512
  G  GPT-mini (torch_models.GPTMini): 4 pre-norm blocks, d 256, 4 heads, causal
     scaled_dot_product_attention, GELU MLP 1024, vocab 128; ids [16, 256]; AdamW (weight
     decay 0.01 on the Linear weights only), cross-entropy over every position.        batch 16
The CNNs flatten in Keras's NHWC order (a free view of the channels-last activations), so the
Dense weights have Keras's layout.

Modes, PyTorch's CPU recipes: fp32 = plain float32; bf16 = torch.autocast("cpu", bfloat16) around
forward and loss; fp16 = torch.autocast("cpu", float16) with torch.amp.GradScaler("cpu")
(scale, backward, step, update).

Adam: --adam auto (the default) trains a fresh copy of the model with fused=True and one with
foreach=True (warm-up, then max(3, steps // 4) timed steps each) and keeps the faster for the
measured run; --adam fused|foreach forces one. Where this torch has no fused Adam on CPU, foreach
is used and the report says "foreach (fused unsupported)".

Data: a few batches of synthetic inputs (uniform [0, 1)) and integer labels in [0, 10), drawn once
with seed 0 and cycled, so no data generation is timed. torch.set_num_threads(--threads).

Output: exactly one JSON line on stdout: median and min per-step wall time (ms, time.perf_counter
around each timed step), samples/s = batch / median, the process's peak RSS (MB, getrusage),
threads, batch, torch version, torch's CPU capability and $ONEDNN_MAX_CPU_ISA. Diagnostics (the
Adam trial) go to stderr.
"""
import argparse
import gc
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import NUM_CLASSES, make_model  # noqa: E402

BATCH = {"A": 256, "B": 128, "C": 128, "D": 512, "G": 16}
NUM_BATCHES = 4  # pre-generated batches, cycled


def make_data(which, batch):
    """NUM_BATCHES (x, y) pairs. CNN inputs are drawn as NHWC and viewed as N,C,H,W, which is
    exactly PyTorch's channels-last layout."""
    if which == "G":
        from torch_models import GPT
        return [(torch.randint(0, GPT["vocab"], (batch, GPT["seq"])), torch.randint(0, GPT["vocab"], (batch, GPT["seq"])))
                for _ in range(NUM_BATCHES)]
    shape = {"A": (batch, 784), "B": (batch, 32, 32, 3), "C": (batch, 28, 28, 1), "D": (batch, 1024)}[which]
    data = []
    for _ in range(NUM_BATCHES):
        x = torch.rand(shape)
        if which in "BC":
            x = x.permute(0, 3, 1, 2)
            assert x.is_contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, NUM_CLASSES, (batch,))
        data.append((x, y))
    return data


def fused_adam_supported():
    try:
        p = torch.zeros(8, requires_grad=True)
        p.grad = torch.ones(8)
        torch.optim.Adam([p], lr=1e-3, fused=True).step()
        return True
    except Exception:  # torch < 2.4: "`fused=True` requires ... supported devices: ['cuda']"
        return False


def make_scaler():
    try:
        return torch.amp.GradScaler("cpu")
    except (AttributeError, TypeError, RuntimeError, AssertionError) as e:
        sys.exit(f"torch_cpu.py: --mode fp16 needs torch.amp.GradScaler('cpu') (torch >= 2.3); "
                 f"torch {torch.__version__}: {e}")


class Trainer:
    """A fresh model (seed 0) with Adam of the given kind, and one training step."""

    def __init__(self, which, mode, adam_kind, data):
        torch.manual_seed(0)
        self.model = make_model(which)
        self.model.train()
        kw = {"fused": True} if adam_kind == "fused" else {"foreach": True}
        if which == "G":  # AdamW, decay on the Linear weights only (the C++ side's exclusions)
            decay = [p for n, p in self.model.named_parameters() if n.endswith("weight") and "ln" not in n
                     and not n.startswith("tok")]
            rest = [p for n, p in self.model.named_parameters() if not any(p is q for q in decay)]
            self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                         lr=1e-3, **kw)
        else:
            self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, **kw)
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]
        self.scaler = make_scaler() if mode == "fp16" else None
        self.data = data
        self.i = 0
        self.loss = None

    def step(self):
        x, y = self.data[self.i % len(self.data)]
        self.i += 1
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None):
            out = self.model(x).float()
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.loss = loss

    def run(self, warmup, steps):
        """Per-step wall times (ms) of `steps` steps after `warmup` untimed ones."""
        for _ in range(warmup):
            self.step()
        gc.collect()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step()
            times.append((time.perf_counter() - t0) * 1e3)
        return times


def median(xs):
    return float(np.median(np.asarray(xs)))


def peak_rss_mb():
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0  # bytes vs KiB


def cpu_capability():
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:
        return ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=["A", "B", "C", "D", "G"])
    p.add_argument("--mode", required=True, choices=["fp32", "bf16", "fp16"])
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--adam", default="auto", choices=["auto", "fused", "foreach"])
    a = p.parse_args()
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.threads < 1:
        p.error("--threads must be >= 1")

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    batch = BATCH[a.model]
    data = make_data(a.model, batch)
    if a.mode == "fp16":
        make_scaler()  # fail early, with the reason, where this torch has no CPU GradScaler

    fused_ok = fused_adam_supported()
    if not fused_ok:
        kind, label = "foreach", "foreach (fused unsupported)"
        print(f"torch_cpu.py: fused Adam unsupported on CPU in torch {torch.__version__}; using foreach",
              file=sys.stderr)
    elif a.adam != "auto":
        kind = label = a.adam
    else:
        trial_steps = max(3, a.steps // 4)
        trial = {}
        for k in ("fused", "foreach"):
            t = Trainer(a.model, a.mode, k, data)
            trial[k] = median(t.run(a.warmup, trial_steps))
            del t
            gc.collect()
        kind = label = min(trial, key=trial.get)
        print(f"torch_cpu.py: Adam trial ({trial_steps} steps after {a.warmup} warm-up): "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in trial.items()) + f" -> {kind}", file=sys.stderr)

    t = Trainer(a.model, a.mode, kind, data)
    times = t.run(a.warmup, a.steps)
    loss = float(t.loss.detach())
    if not math.isfinite(loss):
        print(f"torch_cpu.py: warning: last loss is {loss}", file=sys.stderr)

    med = median(times)
    print(json.dumps({
        "impl": "pytorch",
        "model": a.model,
        "mode": a.mode,
        "adam": label,
        "median_ms": round(med, 3),
        "min_ms": round(min(times), 3),
        "samples_per_s": round(batch / (med / 1e3), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "threads": a.threads,
        "batch": batch,
        "torch": torch.__version__,
        "cpu_capability": cpu_capability(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")),
    }), flush=True)


if __name__ == "__main__":
    main()
