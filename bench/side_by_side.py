#!/usr/bin/env python3
"""mpt against PyTorch (and Keras 3) on this CPU, side by side, in one run.

    bash scripts/side_by_side.sh          # sets up its own venv with PyTorch 2.15, then runs this

Models A-D (bench/bench_models.hpp; the same layers and batch sizes in bench/torch_cpu.py) train
with Adam on synthetic data; --models G runs the GPT-mini (AdamW, fused on PyTorch's side when it
wins, scaled_dot_product_attention). Every configuration runs in its own process, interleaved round by
round (mpt float32, mixed_float16, mixed_bfloat16; PyTorch fp32, bf16 autocast, fp16 autocast
with GradScaler, best of fused/foreach Adam, channels-last CNNs, torch.set_num_threads(threads)),
so load from elsewhere hits all alike. Printed: ms/step (median over rounds of each run's median,
and the minimum), samples/s, peak RSS, the ratios the project targets, the CPU and whether AMX
was used, the peak probe (FMA, vdpbf16ps, AMX) with model D's bf16 GEMMs as a fraction of the
bf16 peak, and Keras 3's model C fit time per step against mpt's (bench/keras_fit_anchor.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

MODELS = ["A", "B", "C", "D", "G"]  # G (the GPT-mini of issue 26) only when asked: --models G
MPT_MODES = [("float32", "float32"), ("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")]
TORCH_MODES = [("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16")]
STEPS = {"A": 60, "B": 40, "C": 40, "D": 20, "G": 8}


def run_json(cmd, env, timeout=900):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    return [json.loads(l) for l in lines]


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build", help="mpt build folder (bench_side, peak_probe, examples)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch (and keras)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="A,B,C,D")
    ap.add_argument("--no-keras", action="store_true", help="skip the Keras 3 fit anchor")
    ap.add_argument("--amx-off", action="store_true",
                    help="AMX off on both sides (MPT_ONEDNN_AMX=0, ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16): "
                         "the second table an AMX machine owes")
    ap.add_argument("--isa", choices=["avx2", "baseline", "avx512"],
                    help="cap both sides at this x86 tier: mpt by MPT_CPU_ISA, PyTorch by ATEN_CPU_CAPABILITY and "
                         "MKL_ENABLE_INSTRUCTIONS, oneDNN (both) by ONEDNN_MAX_CPU_ISA; an AVX-512 machine then "
                         "makes the AVX2 table")
    ap.add_argument("--fp16-limit", type=float, default=8.0,
                    help="drop PyTorch fp16 for a model after a probe slower than this many times its fp32")
    ap.add_argument("--bf16-limit", type=float, default=40.0,
                    help="drop PyTorch bf16 for a model after a probe slower than this many times its fp32")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m}; choose from {','.join(MODELS)}")
    here = os.path.dirname(os.path.abspath(__file__))
    side = os.path.join(args.build, "bench", "bench_side")
    probe = os.path.join(args.build, "bench", "peak_probe")
    for exe in (side, probe):
        if not os.path.exists(exe):
            ap.error(f"{exe} not found: build mpt first (scripts/side_by_side.sh does)")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.amx_off:
        env.update(MPT_ONEDNN_AMX="0", ONEDNN_MAX_CPU_ISA="AVX512_CORE_BF16")
    if args.isa:
        env.update(MPT_CPU_ISA=args.isa,
                   ATEN_CPU_CAPABILITY={"avx2": "avx2", "baseline": "default", "avx512": "avx512"}[args.isa],
                   ONEDNN_MAX_CPU_ISA={"avx2": "AVX2", "baseline": "SSE41", "avx512": "AVX512_CORE_BF16"}[args.isa],
                   # PyTorch's float32 GEMMs are MKL's, which ATEN_CPU_CAPABILITY does not cap
                   MKL_ENABLE_INSTRUCTIONS={"avx2": "AVX2", "baseline": "SSE4_2", "avx512": "AVX512"}[args.isa])
    amx_cpu = "amx_bf16" in cpu_flags()
    isa_cap = env.get("ONEDNN_MAX_CPU_ISA", "")
    amx_mpt = amx_cpu and env.get("MPT_ONEDNN_AMX", "1") != "0" and not isa_cap
    amx_torch = amx_cpu and (not isa_cap or "AMX" in isa_cap.upper())

    runs = {}  # (impl, model, dtype) -> list of results
    skip = set()
    skipped16 = {}  # (model, dtype) -> PyTorch's 16-bit probe ms/step (None: it did not finish)
    for r in range(args.rounds):
        for m in models:
            configs = [("mpt", mode, dt) for mode, dt in MPT_MODES] + [("pytorch", mode, dt) for mode, dt in TORCH_MODES]
            if r % 2:
                configs.reverse()
            for impl, mode, dt in configs:
                if (impl, m, dt) in skip:
                    continue
                steps = str(STEPS[m])
                if impl == "mpt":
                    cmd = [side, "--model", m, "--policy", mode, "--steps", steps]
                else:
                    cmd = [args.python, os.path.join(here, "torch_cpu.py"), "--model", m, "--mode", mode, "--steps", steps,
                           "--threads", str(args.threads)]
                if impl == "pytorch" and dt in ("float16", "bfloat16") and (impl, m, dt) not in runs:
                    # PyTorch's fp16 on CPUs without AVX512-FP16/AMX-FP16 can be 100x slower than fp32, and
                    # its bf16 below AVX-512 (model D: tens of seconds a step at AVX2): a 3-step probe first,
                    # kept only when the mode finishes in reasonable time.
                    probe_cmd = cmd[:cmd.index("--steps")] + ["--steps", "3", "--warmup", "1", "--adam", "fused",
                                                              "--threads", str(args.threads)]
                    fp32 = runs.get(("pytorch", m, "float32"))
                    limit = args.fp16_limit if dt == "float16" else args.bf16_limit
                    limit_s = max(60.0, 3 * 5 * limit * (fp32[-1]["median_ms"] / 1e3 if fp32 else 1.0))
                    try:
                        trial = run_json(probe_cmd, env, timeout=limit_s)[-1]
                    except subprocess.TimeoutExpired:
                        trial = None
                    if trial is None or (fp32 and trial["median_ms"] > limit * fp32[-1]["median_ms"]):
                        skipped16[(m, dt)] = trial["median_ms"] if trial else None
                        skip.add((impl, m, dt))
                        print(f"round {r + 1} pytorch {m} {mode:14s} dropped: " +
                              (f"{trial['median_ms']:.0f} ms/step in a 3-step probe" if trial else f"no 3 steps in {limit_s:.0f} s"),
                              flush=True)
                        continue
                res = run_json(cmd, env)[-1]
                runs.setdefault((impl, m, dt), []).append(res)
                print(f"round {r + 1} {impl:7s} {m} {mode:14s} median {res['median_ms']:8.2f} ms  min {res['min_ms']:8.2f}"
                      + (f"  adam {res.get('adam')}" if impl == "pytorch" else ""), flush=True)

    def med(impl, m, dt):
        rs = runs.get((impl, m, dt))
        return statistics.median(x["median_ms"] for x in rs) if rs else None

    def mn(impl, m, dt):
        rs = runs.get((impl, m, dt))
        return min(x["min_ms"] for x in rs) if rs else None

    def fmt(v):
        return "-" if v is None else f"{v:.2f}"

    print()
    print(f"CPU: {cpu_model()}; threads {args.threads}; AMX used: mpt {'yes' if amx_mpt else 'no'}, "
          f"PyTorch {'yes' if amx_torch else 'no'} (CPU has AMX: {'yes' if amx_cpu else 'no'})")
    if args.isa:
        print(f"ISA cap on both sides: {args.isa} (MPT_CPU_ISA={env['MPT_CPU_ISA']}, "
              f"ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']}, ONEDNN_MAX_CPU_ISA={env['ONEDNN_MAX_CPU_ISA']}, "
              f"MKL_ENABLE_INSTRUCTIONS={env['MKL_ENABLE_INSTRUCTIONS']})")
    print()
    print("ms per step, median over rounds (minimum):")
    print("| model | mpt float32 | PyTorch fp32 | mpt mixed_bfloat16 | PyTorch bf16 | mpt mixed_float16 | PyTorch fp16 |")
    print("|---|---|---|---|---|---|---|")
    for m in models:
        cells = []
        for impl, dt in [("mpt", "float32"), ("pytorch", "float32"), ("mpt", "bfloat16"), ("pytorch", "bfloat16"),
                         ("mpt", "float16"), ("pytorch", "float16")]:
            v = med(impl, m, dt)
            if impl == "pytorch" and (m, dt) in skipped16:
                p = skipped16[(m, dt)]
                cells.append(f"dropped ({p:.0f} in a probe)" if p else "dropped (too slow)")
            else:
                cells.append(f"{fmt(v)} ({fmt(mn(impl, m, dt))})" if v is not None else "-")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    print("| model | bf16: mpt / PyTorch (target <= 0.8) | fp32: mpt / PyTorch (<= 0.8) | mpt fp16 / mpt fp32 (<= 1.05) | mpt bf16 / mpt fp32 (<= 1.05) | worst run median/min (<= 1.15): all / mpt's / PyTorch's | samples/s mpt bf16 | peak RSS MB mpt bf16 / PyTorch bf16 |")
    print("|---|---|---|---|---|---|---|---|")
    for m in models:
        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "-"
        def spread(impls):
            return max((x["median_ms"] / x["min_ms"] for (i, mm, d), rs in runs.items() if mm == m and i in impls
                        for x in rs), default=float("nan"))
        rs_mpt = runs.get(("mpt", m, "bfloat16"), [{}])
        rs_pt = runs.get(("pytorch", m, "bfloat16"), [{}])
        sps = rs_mpt[-1].get("samples_per_s", 0)
        print(f"| {m} | {ratio(med('mpt', m, 'bfloat16'), med('pytorch', m, 'bfloat16'))} | "
              f"{ratio(med('mpt', m, 'float32'), med('pytorch', m, 'float32'))} | "
              f"{ratio(med('mpt', m, 'float16'), med('mpt', m, 'float32'))} | "
              f"{ratio(med('mpt', m, 'bfloat16'), med('mpt', m, 'float32'))} | "
              f"{spread(('mpt', 'pytorch')):.2f} / {spread(('mpt',)):.2f} / {spread(('pytorch',)):.2f} | {sps:.0f} | "
              f"{max((x['peak_rss_mb'] for x in rs_mpt if x), default=0):.0f} / "
              f"{max((x['peak_rss_mb'] for x in rs_pt if x), default=0):.0f} |")
    print()
    for p in run_json([probe, "--threads", str(args.threads)], env):
        if p["probe"] == "model_d_bf16_gemms":
            # Below the avx512 tier mpt has no bfloat16 dot-product kernels (their GEMMs widen to
            # float32), so the fraction of the vdpbf16ps peak is no target there.
            target = (f" (capped at {args.isa}: float32 arithmetic, no target)"
                      if args.isa in ("avx2", "baseline") else " (target >= 75 %)")
            print(f"model D's bf16 GEMMs (mpt::ops::matmul): {p['gflops']:.0f} GFLOP/s = "
                  f"{100 * p['fraction_of_peak']:.0f} % of the {p['peak']} peak{target}")
        else:
            print(f"peak {p['probe']}: {p['gflops']:.0f} GFLOP/s on {p['threads']} threads")
    if not args.no_keras:
        print()
        anchor = subprocess.run([args.python, os.path.join(here, "keras_fit_anchor.py"), "--mpt",
                                 os.path.join(args.build, "examples", "fashion_mnist_cnn"), "--threads", str(args.threads)],
                                env=env, capture_output=True, text=True, timeout=1800)
        print(anchor.stdout.strip()[-1500:] if anchor.returncode == 0 else f"Keras anchor failed: {anchor.stderr[-1500:]}")


if __name__ == "__main__":
    main()
