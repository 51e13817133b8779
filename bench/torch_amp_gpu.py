#!/usr/bin/env python3
"""The models of bench/bench_gpu.cpp in PyTorch on the same GPU, as the anchor of its report:
fp32 (TF32 off), AMP float16 with GradScaler, AMP bfloat16; fused Adam; channels-last for the
CNNs; the loss read with .item() every step, as bench_gpu reads mpt's.

    python3 bench/torch_amp_gpu.py [--steps 50] [--warmup 10] [--batch 1024] [--models ABCDW]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import input_shape, make_model  # noqa: E402


def measure(which, mode, batch, warmup, steps):
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = make_model(which).to(dev)
    x = torch.rand(input_shape(which, batch), device=dev)
    if which in "BC":
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    dtype = {"fp32": None, "amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}[mode]
    scaler = torch.amp.GradScaler("cuda", enabled=mode == "amp_fp16")
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    for _ in range(warmup):
        step()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0], torch.cuda.max_memory_allocated()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--models", default="ABCDW")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; batch {a.batch}, fused Adam, "
          f"{a.warmup} warm-up + {a.steps} timed steps; median (min) ms per step")
    print(f"{'model':6} {'mode':16} {'ms/step':>10} {'min ms':>10} {'samples/s':>12} {'peak MiB':>10}")
    for which in a.models:
        for mode in ("fp32", "amp_fp16", "amp_bf16"):
            ms, mn, peak = measure(which, mode, a.batch, a.warmup, a.steps)
            print(f"{which:6} {mode:16} {ms:10.3f} {mn:10.3f} {a.batch / ms * 1e3:12.0f} {peak / 2**20:10.1f}", flush=True)


if __name__ == "__main__":
    main()
