"""Tile sweep for v6 on the GPU: build variants of kernels/v6.cu with -D macros, check each, time each
beside SDPA's flash and default backends at the two target shapes (bf16, non-causal).

    python scripts/v6_sweep.py --out DIR      -> DIR/v6_sweep.json and a printed table
"""
import argparse
import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn.loader import build, gencode_flags, arch_list, NVCC_FLAGS, KERNELS_DIR
from flashattn.resources import nvcc, parse_ptxas
from flashattn.timing import time_cuda

CONFIGS = {  # name: (head dim the macros affect, macros). Earlier runs: results/h200/v6_sweep*.json
    "d64-wm2-bc64-q1 (default, eager)": (64, []),
    "d64-wm2-bc64-q1-lazy": (64, ["-DV6_D64_LAZY=1"]),
    "d128-wm2-bc32-q0 (default, lazy)": (128, []),
    "d128-wm2-bc32-q0-eager": (128, ["-DV6_D128_LAZY=0"]),
    "d128-wm2-bc64-q0": (128, ["-DV6_D128_BC=64"]),
}
SHAPES = {64: (4, 12, 2048, 64), 128: (2, 16, 8192, 128)}


def ptxas(flags):
    res = subprocess.run([nvcc(), *NVCC_FLAGS, *gencode_flags(arch_list()), *flags, "-Xptxas", "-v", "-c",
                          str(KERNELS_DIR / "v6.cu"), "-o", "/dev/null"], capture_output=True, text=True)
    return [k for k in parse_ptxas(res.stderr) if "bf16" in k["name"] or "bfloat" in k["name"]
            or "nv_bfloat16" in k["function"]]


def ref32(q, k, v, causal=False):
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:   # bottom-right aligned, rows with no key give 0 (the kernel's contract)
        M, N = s.shape[-2:]
        i = torch.arange(M, device=s.device)[:, None]
        s = s.masked_fill(torch.arange(N, device=s.device)[None, :] > i + (N - M), float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v.float()


def small_error(mod, D):
    """Max abs error over odd shapes, both masks: key tails that end inside a sub-tile (203, 100) or skip
    whole sub-tiles (70), M < N and M > N."""
    err = 0.0
    for M, N in ((113, 203), (203, 113), (130, 70), (64, 100)):
        qs, ks, vs = (torch.randn(2, 3, n, D, device="cuda", dtype=torch.bfloat16) for n in (M, N, N))
        for causal in (False, True):
            out = mod.forward(qs, ks, vs, causal).float()
            err = max(err, (out - ref32(qs, ks, vs, causal)).abs().max().item())
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = list(CONFIGS)
    with ThreadPoolExecutor(8) as pool:
        mods = list(pool.map(lambda n: build("v6", CONFIGS[n][1], module_name="v6sweep_" + str(names.index(n))),
                             names))
        resources = list(pool.map(lambda n: ptxas(CONFIGS[n][1]), names))
    rows = []
    for D, (B, H, L, _) in SHAPES.items():
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * L * L * D
        base = {}
        for label, ctx in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_default", None)):
            if ctx is None:
                t = time_cuda(lambda: F.scaled_dot_product_attention(q, k, v), 10, args.reps)
            else:
                with sdpa_kernel(ctx):
                    t = time_cuda(lambda: F.scaled_dot_product_attention(q, k, v), 10, args.reps)
            base[label] = t.median_ms * 1e3
            rows.append(dict(config=label, D=D, shape=[B, H, L, L, D], us=base[label],
                             tflops=flops / t.median_ms / 1e9))
        for name, mod, res in zip(names, mods, resources):
            if CONFIGS[name][0] != D:
                continue
            err = small_error(mod, D)
            t = time_cuda(lambda: mod.forward(q, k, v, False), 10, args.reps)
            us = t.median_ms * 1e3
            rows.append(dict(config=name, D=D, shape=[B, H, L, L, D], us=us, tflops=flops / t.median_ms / 1e9,
                             max_abs_err_small=err, vs_flash=base["sdpa_flash"] / us,
                             vs_default=base["sdpa_default"] / us, ptxas=res))
    (args.out / "v6_sweep.json").write_text(json.dumps(rows, indent=1))
    # earlier sweeps of this script (other CONFIGS) are kept as results/h200/v6_sweep_{tiles,sub}.json
    for r in rows:
        regs = ",".join(str(k.get("registers")) for k in r.get("ptxas", []))
        spill = sum(k.get("spill_store_bytes", 0) for k in r.get("ptxas", []))
        print(f"{r['config']:28} D={r['D']:3} {r['us']:9.1f} us {r['tflops']:7.1f} TFLOP/s "
              f"flash x{r.get('vs_flash', float('nan')):.2f} default x{r.get('vs_default', float('nan')):.2f} "
              f"err {r.get('max_abs_err_small', float('nan')):.1e} regs {regs} spill {spill}")


if __name__ == "__main__":
    main()
