"""Tile-shape sweep for kernels/v5.cu (register-tiled fp32 FlashAttention) on one GPU.

    python scripts/v5_sweep.py --out DIR

For every candidate tile shape (B_r, B_c, TM, TN and a few code switches) this script

1. builds kernels/v5.cu with torch's load_inline under a unique module name, the shape passed as -D
   macros (builds run in parallel threads: each is an nvcc and a host-compiler process);
2. runs nvcc -Xptxas -v with the same flags and reads registers, stack frame and spill bytes;
3. works out the theoretical blocks per SM from registers, shared memory and threads (sm_90 limits:
   65,536 registers allocated per warp in units of 256, 228 KB shared memory with 1 KB reserved per
   block, 2,048 threads, 32 blocks) and also asks the CUDA runtime (cudaOccupancy... through the
   module's kernel_info());
4. checks the output against a float64 reference on odd shapes (M, N not multiples of any tile, N
   below B_c, M != N, large logits) and on the primary shape;
5. times the primary shape B=4, H=12, M=N=2048 (D=64, and D=128 for the D=128 candidates) with
   flashattn.timing.time_cuda: 10 warm-ups, 50 timed calls, L2 flushed before each, median; PyTorch
   SDPA (float32) is timed the same way in the same run;
6. for the fastest correct shape of each head dim, times M=N in 512 ... 8192 against SDPA.

Writes DIR/v5_sweep.json and prints a table. Meant to finish in well under 4 minutes on an H200.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from flashattn import loader, resources  # noqa: E402
from flashattn.bench import attention_flops  # noqa: E402
from flashattn.reference import attention_reference, relative_error  # noqa: E402
from flashattn.timing import time_cuda  # noqa: E402

# Candidate tile shapes. The arithmetic behind each (see scripts/v5_notes.md): per 4-deep step a
# thread issues 4*TM*TN FFMA from TM+TN float4 loads; WC = B_c/TN lanes share a row; shared memory
# is Q_i + K_j + V_j + P_ij with padded rows; registers ~ S tile + O tile + per-tile PV tile + operands.
#   name          D   B_r B_c TM TN  extra -D flags
CANDIDATES = [
    ("d64_64x64_4x8",      64,  64, 64, 4, 8, {}),                      # the arithmetic's pick: 3 blocks/SM
    ("d64_64x64_8x4",      64,  64, 64, 8, 4, {}),                      # same tile, transposed thread grid
    ("d64_64x64_4x8_u2",   64,  64, 64, 4, 8, {"V5_UNROLL": 2}),        # shorter loop bodies
    ("d64_64x64_4x8_u8",   64,  64, 64, 4, 8, {"V5_UNROLL": 8}),        # longer loop bodies
    ("d64_64x64_4x8_flat", 64,  64, 64, 4, 8, {"V5_BLOCKED_PV": 0}),    # P V summed straight into O_i
    ("d64_128x64_8x8",     64, 128, 64, 8, 8, {}),                      # SGEMM's 8x8 tile, 2 blocks/SM (default)
    ("d64_96x64_6x8",      64,  96, 64, 6, 8, {}),                      # 6x8 tile, 2 blocks/SM
    ("d64_64x32_4x4",      64,  64, 32, 4, 4, {}),                      # small tiles, 4 blocks/SM
    ("d64_128x32_4x4",     64, 128, 32, 4, 4, {"V5_MIN_BLOCKS": 2}),   # 256 threads, 16 warps/SM
    ("d128_64x32_4x4",    128,  64, 32, 4, 4, {}),                      # 2 blocks/SM
    ("d128_96x32_6x4_flat", 128, 96, 32, 6, 4, {"V5_BLOCKED_PV": 0}),   # taller tile, 2 blocks/SM
    ("d128_128x64_8x4",   128, 128, 64, 8, 4, {}),                      # one 256-thread block per SM (default)
]

ODD_SHAPES = [  # (B, H, M, N, logit scale)
    (2, 3, 203, 113, 1.0),
    (2, 3, 113, 203, 1.0),
    (1, 2, 7, 5, 1.0),      # M < B_r, N < B_c
    (1, 1, 1, 1, 1.0),
    (2, 3, 203, 113, 20.0),  # large logits: the running max must keep exp2 finite
]
PRIMARY = (4, 12, 2048, 2048)
SCALING_SEQ = (512, 1024, 2048, 4096, 8192)


def macro_flags(c) -> list[str]:
    name, D, br, bc, tm, tn, extra = c
    flags = [f"-DV5_ONLY_D={D}", f"-DV5_D{D}_BR={br}", f"-DV5_D{D}_BC={bc}", f"-DV5_D{D}_TM={tm}",
             f"-DV5_D{D}_TN={tn}"]
    flags += [f"-D{k}={v}" for k, v in extra.items()]
    return flags


def smem_bytes(D, br, bc, tm, tn) -> int:
    """Mirror of Tiles<>::SMEM_BYTES in kernels/v5.cu (the module's kernel_info() reports the truth)."""
    wc = bc // tn
    ps = bc + ((wc - bc % 32) % 32 + 32) % 32
    return 4 * (br * (D + 4) + bc * (D + 4) + bc * D + br * ps)


def theoretical_blocks(regs: int, smem: int, threads: int) -> dict:
    """flashattn.resources.occupancy, in the field names v5_sweep.json has always used."""
    occ = resources.occupancy(regs, smem, threads)
    by = occ["by"]
    names = {"registers": "registers", "shared memory": "shared memory", "warps": "threads"}
    return {"blocks_per_sm": occ["blocks"], "by_regs": by["registers"], "by_smem": by["shared memory"],
            "by_threads": by["warps"], "warps_per_sm": occ["warps"], "occupancy": occ["occupancy_pct"] / 100,
            "limited_by": " and ".join(names[k] for k in occ["limited_by"] if k in names)}


def ptxas_report(c) -> dict:
    """Registers / stack / spills from ptxas for the same macros the extension is built with, for this
    GPU's architecture."""
    arch = loader.arch_list()[0].removesuffix("+PTX").replace(".", "")
    t0 = time.perf_counter()
    try:
        kernels, log = resources.compile_report("v5", arch, macro_flags(c)), None   # -DV5_ONLY_D: one kernel
    except RuntimeError as err:
        kernels, log = [], str(err)[-2000:]
    info = {"ptxas_seconds": round(time.perf_counter() - t0, 1), "ptxas_ok": log is None}
    info["regs_ptxas"] = max((k.get("registers", 0) for k in kernels), default=None)
    if kernels:
        info.update(stack_bytes=sum(k.get("stack_bytes", 0) for k in kernels),
                    spill_stores=sum(k.get("spill_store_bytes", 0) for k in kernels),
                    spill_loads=sum(k.get("spill_load_bytes", 0) for k in kernels))
    if log:
        info["ptxas_log"] = log
    return info


def build(c) -> tuple[object, float]:
    t0 = time.perf_counter()
    mod = loader.build("v5", macro_flags(c), module_name=f"flashattn_v5_sweep_{c[0]}",
                       functions=("forward", "kernel_info"))
    return mod, time.perf_counter() - t0


def inputs(B, H, M, N, D, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, M, D, device="cuda", generator=g) * scale
    k = torch.randn(B, H, N, D, device="cuda", generator=g)
    v = torch.randn(B, H, N, D, device="cuda", generator=g)
    return q, k, v


def time_call(fn, warmup=10, reps=50) -> dict:
    """flashattn.timing.time_cuda without the time cap, in the field names v5_sweep.json uses."""
    t = time_cuda(fn, warmup=warmup, repetitions=reps, max_seconds=None)
    return {"median_us": t.median_ms * 1e3, "min_us": t.min_ms * 1e3, "max_us": t.max_ms * 1e3,
            "calls": t.calls, "warmups": t.warmups}


def tflops(B, H, M, N, D, us) -> float:
    return attention_flops(B, H, M, N, D) / (us * 1e-6) / 1e12


def sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def check_odd_shapes(mod, D) -> list[dict]:
    rows = []
    for seed, (B, H, M, N, scale) in enumerate(ODD_SHAPES):
        q, k, v = inputs(B, H, M, N, D, scale, seed=100 + seed)
        out = mod.forward(q, k, v)
        torch.cuda.synchronize()
        err = relative_error(out, attention_reference(q, k, v))
        rows.append({"B": B, "H": H, "M": M, "N": N, "logit_scale": scale, "rel_err": err,
                     "finite": bool(torch.isfinite(out).all())})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for v5_sweep.json")
    ap.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 4), help="parallel builds")
    ap.add_argument("--no-scaling", action="store_true", help="skip the M=N 512..8192 runs")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    torch.backends.cuda.matmul.allow_tf32 = False
    assert torch.cuda.is_available(), "the sweep needs a CUDA GPU"
    props = torch.cuda.get_device_properties(0)

    cands = [c for c in CANDIDATES if not args.only or c[0] in args.only.split(",")]
    results = {c[0]: {"name": c[0], "D": c[1], "B_r": c[2], "B_c": c[3], "TM": c[4], "TN": c[5],
                      "threads": (c[3] // c[5]) * (c[2] // c[4]), "flags": macro_flags(c),
                      "smem_bytes_formula": smem_bytes(*c[1:6])} for c in cands}
    modules = {}

    # ---- build everything in parallel (nvcc/ptxas and the host compiler run as subprocesses) ----
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        ptx_f = {pool.submit(ptxas_report, c): c for c in cands}
        bld_f = {pool.submit(build, c): c for c in cands}
        for f in cf.as_completed(list(ptx_f) + list(bld_f)):
            c = ptx_f.get(f) or bld_f.get(f)
            r = results[c[0]]
            try:
                if f in ptx_f:
                    r.update(f.result())
                else:
                    mod, secs = f.result()
                    modules[c[0]] = mod
                    r["build_seconds"] = round(secs, 1)
            except Exception as e:  # a failed build is a result too; keep going
                r.setdefault("errors", []).append(f"{type(e).__name__}: {str(e)[-1500:]}")
    build_wall = time.perf_counter() - t_start
    print(f"built {len(modules)}/{len(cands)} variants in {build_wall:.0f} s", flush=True)

    # ---- float64 references for the primary shape (one per head dim), SDPA timings ----
    primary = {}
    for D in sorted({c[1] for c in cands}):
        B, H, M, N = PRIMARY
        q, k, v = inputs(B, H, M, N, D, seed=7)
        ref = attention_reference(q, k, v)
        o_sdpa = sdpa(q, k, v)
        t = time_call(lambda: sdpa(q, k, v))
        primary[D] = {"q": q, "k": k, "v": v, "ref": ref,
                      "sdpa": {**t, "rel_err": relative_error(o_sdpa, ref),
                               "tflops": tflops(B, H, M, N, D, t["median_us"])}}
        print(f"SDPA D={D}: {t['median_us']:.1f} us, rel err {primary[D]['sdpa']['rel_err']:.2e}", flush=True)

    # ---- per variant: resources, correctness, timing ----
    for c in cands:
        r = results[c[0]]
        mod = modules.get(c[0])
        if mod is None:
            continue
        D = c[1]
        try:
            info = mod.kernel_info(D)
            keys = ["B_r", "B_c", "TM", "TN", "threads", "smem_bytes", "regs", "local_bytes", "blocks_per_sm"]
            r["runtime"] = dict(zip(keys, info))
            regs = r.get("regs_ptxas") or r["runtime"]["regs"]
            r["theory"] = theoretical_blocks(regs, r["runtime"]["smem_bytes"], r["runtime"]["threads"])
            r["odd_shapes"] = check_odd_shapes(mod, D)
            P = primary[D]
            out = mod.forward(P["q"], P["k"], P["v"])
            r["primary_rel_err"] = relative_error(out, P["ref"])
            t = time_call(lambda: mod.forward(P["q"], P["k"], P["v"]))
            B, H, M, N = PRIMARY
            r["primary"] = {**t, "tflops": tflops(B, H, M, N, D, t["median_us"]),
                            "vs_sdpa": P["sdpa"]["median_us"] / t["median_us"]}
            normal = [x["rel_err"] for x in r["odd_shapes"] if x["logit_scale"] == 1.0]
            big = [x["rel_err"] for x in r["odd_shapes"] if x["logit_scale"] != 1.0]
            r["correct"] = (all(x["finite"] for x in r["odd_shapes"]) and max(normal) <= 2e-6
                            and max(big) <= 2e-5 and r["primary_rel_err"] <= 2e-6)
            r["no_spill"] = r.get("spill_stores", 0) == 0 and r["runtime"]["local_bytes"] == 0
        except Exception as e:
            r.setdefault("errors", []).append(f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
        print(f"  {c[0]}: done", flush=True)

    # ---- the fastest correct variant of each head dim across sequence lengths ----
    scaling = []
    best = {}
    for D in sorted({c[1] for c in cands}):
        ok = [r for r in results.values() if r["D"] == D and r.get("correct") and r.get("no_spill")
              and "primary" in r]
        if ok:
            best[D] = min(ok, key=lambda r: r["primary"]["median_us"])["name"]
    if not args.no_scaling:
        for D, name in best.items():
            if D != 64:
                continue   # the D=128 primary point is already in the table
            mod = modules[name]
            for S in SCALING_SEQ:
                B, H = PRIMARY[:2]
                q, k, v = inputs(B, H, S, S, D, seed=11)
                ref = attention_reference(q, k, v)
                row = {"name": name, "D": D, "B": B, "H": H, "M": S, "N": S}
                tv = time_call(lambda: mod.forward(q, k, v))
                ts = time_call(lambda: sdpa(q, k, v))
                row.update(v5_us=tv["median_us"], sdpa_us=ts["median_us"],
                           v5_tflops=tflops(B, H, S, S, D, tv["median_us"]),
                           sdpa_tflops=tflops(B, H, S, S, D, ts["median_us"]),
                           v5_rel_err=relative_error(mod.forward(q, k, v), ref),
                           sdpa_rel_err=relative_error(sdpa(q, k, v), ref))
                scaling.append(row)
                del q, k, v, ref
                torch.cuda.empty_cache()

    doc = {"device": props.name, "sm_count": props.multi_processor_count,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "primary_shape": dict(zip("BHMN", PRIMARY)),
           "timing": "flashattn.timing.time_cuda: 10 warm-ups, 50 timed calls, L2 flushed before each, median",
           "sdpa": {D: P["sdpa"] for D, P in primary.items()},
           "configs": list(results.values()), "best": best, "scaling": scaling,
           "build_wall_seconds": round(build_wall, 1),
           "total_seconds": round(time.perf_counter() - t_start, 1)}
    (out_dir / "v5_sweep.json").write_text(json.dumps(doc, indent=2, default=str))

    # ---- table ----
    hdr = (f"{'variant':22} {'D':>3} {'Br':>3} {'Bc':>3} {'TMxTN':>5} {'thr':>4} {'regs':>4} {'spill':>5} "
           f"{'smemKB':>6} {'blk/SM':>6} {'rt':>3} {'warps':>5} {'err odd':>8} {'err big':>8} "
           f"{'err prim':>8} {'us':>8} {'TFLOP/s':>7} {'xSDPA':>6}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in results.values():
        rt, th = r.get("runtime", {}), r.get("theory", {})
        odd = r.get("odd_shapes", [])
        e_odd = max((x["rel_err"] for x in odd if x["logit_scale"] == 1.0), default=float("nan"))
        e_big = max((x["rel_err"] for x in odd if x["logit_scale"] != 1.0), default=float("nan"))
        p = r.get("primary", {})
        print(f"{r['name']:22} {r['D']:>3} {r['B_r']:>3} {r['B_c']:>3} {r['TM']}x{r['TN']:<3} "
              f"{r['threads']:>4} {str(r.get('regs_ptxas', '?')):>4} {str(r.get('spill_stores', '?')):>5} "
              f"{rt.get('smem_bytes', r['smem_bytes_formula']) / 1024:>6.1f} "
              f"{str(th.get('blocks_per_sm', '?')):>6} {str(rt.get('blocks_per_sm', '?')):>3} "
              f"{str(th.get('warps_per_sm', '?')):>5} {e_odd:>8.1e} {e_big:>8.1e} "
              f"{r.get('primary_rel_err', float('nan')):>8.1e} {p.get('median_us', float('nan')):>8.1f} "
              f"{p.get('tflops', float('nan')):>7.2f} {p.get('vs_sdpa', float('nan')):>6.2f}"
              + ("" if r.get("correct", True) else "  WRONG") + ("  ERROR" if r.get("errors") else ""))
    for D, P in primary.items():
        s = P["sdpa"]
        print(f"{'sdpa (fp32)':22} {D:>3} {'':>69} {s['rel_err']:>8.1e} {s['median_us']:>8.1f} "
              f"{s['tflops']:>7.2f} {1.0:>6.2f}")
    if scaling:
        print(f"\nbest D=64 variant {best.get(64)} across M=N (B={PRIMARY[0]}, H={PRIMARY[1]}):")
        for row in scaling:
            print(f"  M=N={row['M']:>5}: v5 {row['v5_us']:>9.1f} us ({row['v5_tflops']:.1f} TFLOP/s, err "
                  f"{row['v5_rel_err']:.1e})  sdpa {row['sdpa_us']:>9.1f} us ({row['sdpa_tflops']:.1f} TFLOP/s, "
                  f"err {row['sdpa_rel_err']:.1e})  speedup {row['sdpa_us'] / row['v5_us']:.2f}x")
    print(f"\nbest per head dim: {best}; wrote {out_dir / 'v5_sweep.json'}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    for r in results.values():
        for e in r.get("errors", []):
            print(f"[{r['name']}] {e[:800]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
