"""Tile sweep for v6 on the GPU: build variants of kernels/v6.cu with -D macros, check each, time each
beside SDPA's flash and default backends at the two target shapes (bf16, non-causal).

    python scripts/v6_sweep.py --out DIR      -> DIR/v6_sweep.json and a printed table
"""
import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn.loader import arch_list, build
from flashattn.reference import attention_reference
from flashattn.resources import compile_report
from flashattn.timing import time_cuda

CONFIGS = {  # name: (head dim the macros affect, macros). Earlier runs: results/h200/v6_sweep*.json;
    # the committed v6_sweep.json ran when the D=128 default was B_c = 32 (its "d128 (default)" row)
    "d64 (default)": (64, []),
    "d64-stages3": (64, ["-DV6_D64_STAGES=3"]),
    "d128 (default, bc64)": (128, []),
    "d128-bc32": (128, ["-DV6_D128_BC=32"]),
    "d128-bc48": (128, ["-DV6_D128_BC=48"]),
}
SHAPES = {64: (4, 12, 2048, 64), 128: (2, 16, 8192, 128)}


def ptxas(flags, path=None):
    """ptxas's report of the bf16 instances (fp16 compiles to the same resources)."""
    arch = arch_list()[0].removesuffix("+PTX").replace(".", "")
    return [k for k in compile_report("v6", arch, flags, src=path) if "bfloat16" in k["name"]]

def small_error(mod, D):
    """Max abs error over odd shapes, both masks: key tails that end inside a sub-tile (203, 100) or skip
    whole sub-tiles (70), M < N and M > N."""
    err = 0.0
    for M, N in ((113, 203), (203, 113), (130, 70), (64, 100)):
        qs, ks, vs = (torch.randn(2, 3, n, D, device="cuda", dtype=torch.bfloat16) for n in (M, N, N))
        for causal in (False, True):
            out = mod.forward(qs, ks, vs, causal).float()
            err = max(err, (out - attention_reference(qs, ks, vs, causal, dtype=torch.float32)).abs().max().item())
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3,
                    help="time every config this many times, interleaved, and keep the median round "
                         "(slow drifts of clock or temperature then hit all configs alike)")
    ap.add_argument("--prev", type=Path, help="an earlier v6.cu to time beside the configs, as 'previous'")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    configs = {n: (D, flags, None) for n, (D, flags) in CONFIGS.items()}
    if args.prev:
        for D in SHAPES:
            configs[f"d{D} previous ({args.prev.name})"] = (D, [], args.prev)
    names = list(configs)

    def build_one(n):
        D, flags, path = configs[n]
        return build("v6", flags, module_name="v6sweep_" + str(names.index(n)),
                     src=path.read_text() if path else None)

    def ptxas_one(n):
        D, flags, path = configs[n]
        return ptxas(flags, path) if path else ptxas(flags)

    with ThreadPoolExecutor(8) as pool:
        mods = dict(zip(names, pool.map(build_one, names)))
        resources = dict(zip(names, pool.map(ptxas_one, names)))
    rows = []
    for D, (B, H, L, _) in SHAPES.items():
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * L * L * D
        calls = {"sdpa_flash": lambda: F.scaled_dot_product_attention(q, k, v),
                 "sdpa_default": lambda: F.scaled_dot_product_attention(q, k, v)}
        here = [n for n in names if configs[n][0] == D]
        for n in here:
            calls[n] = (lambda m: lambda: m.forward(q, k, v, False))(mods[n])
        times = {n: [] for n in calls}
        for _ in range(args.rounds):
            for n, fn in calls.items():
                if n == "sdpa_flash":   # the backend is chosen outside the timed region
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        t = time_cuda(fn, 10, args.reps)
                else:
                    t = time_cuda(fn, 10, args.reps)
                times[n].append(t.median_ms * 1e3)
        us = {n: sorted(ts)[len(ts) // 2] for n, ts in times.items()}
        for n in calls:
            row = dict(config=n, D=D, shape=[B, H, L, L, D], us=us[n], rounds_us=times[n],
                       tflops=flops / us[n] / 1e6)
            if n in mods:
                row.update(max_abs_err_small=small_error(mods[n], D), vs_flash=us["sdpa_flash"] / us[n],
                           vs_default=us["sdpa_default"] / us[n], ptxas=resources[n])
            rows.append(row)
    (args.out / "v6_sweep.json").write_text(json.dumps(rows, indent=1))
    # earlier sweeps of this script (other CONFIGS) are kept as results/h200/v6_sweep_{tiles,sub}.json
    for r in rows:
        regs = ",".join(str(k.get("registers")) for k in r.get("ptxas", []))
        spill = sum(k.get("spill_store_bytes", 0) for k in r.get("ptxas", []))
        print(f"{r['config']:34} D={r['D']:3} {r['us']:9.1f} us {r['tflops']:7.1f} TFLOP/s "
              f"flash x{r.get('vs_flash', float('nan')):.3f} default x{r.get('vs_default', float('nan')):.2f} "
              f"err {r.get('max_abs_err_small', float('nan')):.1e} regs {regs} spill {spill} "
              f"rounds {' '.join(f'{t:.1f}' for t in r['rounds_us'])}")

if __name__ == "__main__":
    main()
