#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the GPU at bench_attention's sizes: causal, B*T fixed,
T = 1024, 2048, 4096; the fastest of --repeat timed runs after one untimed, forward alone and
forward + backward (torch.cuda.synchronize around each), in the layout torch wants ([B, H, T, D]).

    python3 bench/torch_attention_gpu.py [--tokens 16384] [--heads 8] [--dim 64] [--dtype bfloat16] [--repeat 5]
"""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    dt = getattr(torch, a.dtype)
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}: B*T = {a.tokens} tokens, {a.heads} heads of {a.dim}, {a.dtype}, causal, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'T':>8} {'B':>6} {'fwd ms':>12} {'fwd+bwd ms':>12}")
    t = 1024
    while t <= a.tokens // 2 and t <= 4096:
        b = a.tokens // t
        q, k, v = (torch.empty(b, a.heads, t, a.dim, device=dev, dtype=dt).uniform_(-1, 1).requires_grad_()
                   for _ in range(3))

        def run(backward):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if backward:
                y.float().sum().backward()
            torch.cuda.synchronize()

        run(True)
        best = [1e30, 1e30]
        for _ in range(a.repeat):
            for backward in (0, 1):
                t0 = time.perf_counter()
                run(backward == 1)
                best[backward] = min(best[backward], time.perf_counter() - t0)
        print(f"{t:>8} {b:>6} {best[0] * 1e3:>12.3f} {best[1] * 1e3:>12.3f}", flush=True)
        t *= 2


if __name__ == "__main__":
    main()
