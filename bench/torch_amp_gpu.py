#!/usr/bin/env python3
"""The models of bench/bench_gpu.cpp in PyTorch on the same GPU, as the anchor of its report:
fp32 (TF32 off), fp32 with TF32, AMP float16 with GradScaler, AMP bfloat16; fused Adam;
channels-last for the CNNs; the loss read with .item() every step, as bench_gpu reads mpt's.
--gemm times torch.matmul on the GEMMs of a D-4096 step at the batch (forward, data gradient,
weight gradient) in TFLOP/s, as bench_gpu --gemm times mpt's. --launches N brackets N steps of
each model and mode after the warm-up with cudaProfilerStart/Stop, for
`ncu --profile-from-start off` to count the kernels launched (as bench_gpu --launches).

    python3 bench/torch_amp_gpu.py [--steps 50] [--warmup 10] [--batch 1024] [--models ABCDW]
                                   [--modes fp32,fp32_tf32,amp_fp16,amp_bf16] [--gemm] [--launches N]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import input_shape, make_model  # noqa: E402


def measure(which, mode, batch, warmup, steps, launches=0):
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = make_model(which).to(dev)
    x = torch.rand(input_shape(which, batch), device=dev)
    if which in "BC":
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    dtype = {"fp32": None, "fp32_tf32": None, "amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}[mode]
    torch.backends.cuda.matmul.allow_tf32 = mode == "fp32_tf32"
    torch.backends.cudnn.allow_tf32 = mode == "fp32_tf32"
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
    if launches:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(launches):
            step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return 0, 0, 0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0], torch.cuda.max_memory_allocated()


def gemm(batch, reps=20):
    """TFLOP/s of torch.matmul on a D-4096 step's GEMMs (the 4096x4096 layers) at `batch`."""
    n = 4096
    # (a, b, transpose a, transpose b): the shapes and transposes of mpt's dense forward/backward.
    shapes = {"forward x.w": ((batch, n), (n, n), False, False),
              "data grad dy.w^T": ((batch, n), (n, n), False, True),
              "weight grad x^T.dy": ((batch, n), (batch, n), True, False)}
    print(f"torch.matmul, D-4096 GEMMs at batch {batch}: TFLOP/s (median of {reps} after warm-up)")
    for mode, dtype in (("fp32", torch.float32), ("fp32_tf32", torch.float32), ("fp16", torch.float16),
                        ("bf16", torch.bfloat16)):
        torch.backends.cuda.matmul.allow_tf32 = mode == "fp32_tf32"
        row = []
        for name, (sa, sb, ta, tb) in shapes.items():
            a = torch.rand(sa, device="cuda", dtype=dtype)
            b = torch.rand(sb, device="cuda", dtype=dtype)
            oa = a.t() if ta else a
            ob = b.t() if tb else b
            f = lambda: torch.matmul(oa, ob)  # noqa: E731
            for _ in range(5):
                f()
            times = []
            for _ in range(reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                f()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            times.sort()
            flops = 2.0 * oa.shape[0] * oa.shape[1] * ob.shape[1]
            row.append(f"{name} {flops / (times[len(times) // 2] * 1e-3) / 1e12:7.1f}")
        print(f"  {mode:10} " + "   ".join(row), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--models", default="ABCDW")
    p.add_argument("--modes", default="fp32,fp32_tf32,amp_fp16,amp_bf16")
    p.add_argument("--gemm", action="store_true")
    p.add_argument("--launches", type=int, default=0)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if a.gemm:
        return gemm(a.batch)
    if a.launches:
        for which in a.models:
            for mode in a.modes.split(","):
                measure(which, mode, a.batch, a.warmup, 0, a.launches)
        return
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; batch {a.batch}, fused Adam, "
          f"{a.warmup} warm-up + {a.steps} timed steps; median (min) ms per step")
    print(f"{'model':6} {'mode':16} {'ms/step':>10} {'min ms':>10} {'samples/s':>12} {'peak MiB':>10}")
    for which in a.models:
        for mode in a.modes.split(","):
            ms, mn, peak = measure(which, mode, a.batch, a.warmup, a.steps)
            print(f"{which:6} {mode:16} {ms:10.3f} {mn:10.3f} {a.batch / ms * 1e3:12.0f} {peak / 2**20:10.1f}", flush=True)


if __name__ == "__main__":
    main()
