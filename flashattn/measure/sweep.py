"""Variant sweep of one kernel: `python -m flashattn.measure.sweep VERSION [--only NAME ...] [--out DIR] [--metrics]`.

A variant is the kernel file built with a few -D macros (tile shape, pipeline depth, code switches). For
every variant of VERSION listed in VARIANTS this

1. builds it with flashattn.loader.build under its own module name (builds run in parallel threads: each
   is an nvcc and a host-compiler process) and asks ptxas for its registers, stack and spills
   (flashattn.measure.resources.compile_report, same macros);
2. works out threads, shared memory and blocks per SM (flashattn.measure.geometry,
   flashattn.measure.resources.occupancy);
   v5 also reports what the CUDA runtime says (its binding's kernel_info);
3. checks the output against the float64 reference on odd shapes (M, N not multiples of any tile, M != N
   both ways, N below B_c, large logits; both masks where the version has causal) and calls it correct
   when its largest relative error is at most twice SDPA's on the same inputs (floor: FLOOR per dtype);
4. times every variant of one head dim beside SDPA (and SDPA's flash backend for 16-bit dtypes) with
   flashattn.measure.timing.time_interleaved: CUDA events, L2 flushed before each call, interleaved rounds, median.

Writes DIR/<version>_sweep.json in the one format flashattn.book.records.sweep_table reads, and prints a table.
A new version needs only its entry in VARIANTS (and, for its geometry columns, a case in `geometry_of`).

Step sets. A key "<version>-steps" (e.g. "v6-steps") is a chapter's chain of steps: the variants in
order, each one compile-time change (Variant.change says which) away from the step before, the last
one the file as committed. It builds kernels/<version>.cu like any other set and writes
DIR/<version>_steps.json (same schema, plus "steps": the order, and each variant's "change").
`--metrics` then runs every correct variant once more under Nsight Compute at METRICS_SHAPE and stores
the counters of flashattn.measure.ncu.STEP_METRICS per variant (bank conflicts, shared wavefronts, instructions,
the warp-stall breakdown, occupancy, duration), and `flashattn.measure.sass` counts the instructions of each
variant's hot loop (no GPU needed for that part). flashattn.book.records.step_table reads the result.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flashattn import loader
from flashattn.measure import geometry, resources, steps
from flashattn.versions import INFO

SCHEMA = "flashattn.sweep/1"


@dataclass(frozen=True)
class Variant:
    D: int                                            # the head dim the macros affect (and that is timed)
    macros: dict = field(default_factory=dict)        # -D NAME=VALUE; {} builds the file as committed
    change: str = ""                                  # step sets: the one change from the step before


def kernel_version(key: str) -> str:
    """The kernel file a VARIANTS key builds: "v6-steps" -> "v6"."""
    return key.removesuffix("-steps")


def is_steps(key: str) -> bool:
    return key.endswith("-steps")


def output_name(key: str) -> str:
    """v6 -> v6_sweep.json; v6-steps -> v6_steps.json."""
    return f"{kernel_version(key)}_steps.json" if is_steps(key) else f"{key}_sweep.json"


def _v5(D, B_r, B_c, TM, TN, **extra) -> Variant:
    tile = {f"V5_D{D}_BR": B_r, f"V5_D{D}_BC": B_c, f"V5_D{D}_TM": TM, f"V5_D{D}_TN": TN}
    # the candidate tile alone: with V5_D64_SMALL the launcher would run its own 64-row tile on the small
    # grids of the correctness check, and the candidate would go unchecked there
    alone = {"V5_D64_SMALL": 0} if D == 64 else {}
    return Variant(D, {"V5_ONLY_D": D, **tile, **alone, **extra})


# kernels/v5.cu's steps: (name, macros set by the step, the one change from the step before). Interleaving
# comes second: in the order (last) the bank conflicts of compact ownership hid the three steps
# before it (results/h200/v5_steps_issue_order.json).
V5_STEPS = (
    ("register tiles", {"V5_CP_ASYNC": 0, "V5_EXP2": 0, "V5_BLOCKED_PV": 0, "V5_INTERLEAVE": 0},
     "T_M x T_N register tiles for both products, plain loads, expf, one running sum, compact ownership"),
    ("interleaved", {"V5_INTERLEAVE": 1}, "rows and columns owned with stride B_r/T_M and B_c/T_N"),
    ("cp.async", {"V5_CP_ASYNC": 1}, "K/V copies with cp.async behind half a tile of arithmetic"),
    ("exp2", {"V5_EXP2": 1}, "p = 2^((s - m) log2(e)/sqrt(D)) with ex2.approx instead of expf"),
    ("blocked PV sum (default)", {"V5_BLOCKED_PV": 1}, "P_ij V_j summed per tile, then added to O_i"),
)

# The variants of each version, by name. Why each one is there: docs/v5_notes.md and docs/v6_notes.md.
VARIANTS: dict[str, dict[str, Variant]] = {
    "v5": {
        "d64_64x64_4x8": _v5(64, 64, 64, 4, 8),                       # 3 blocks/SM by the arithmetic
        "d64_64x64_8x4": _v5(64, 64, 64, 8, 4),                       # same tile, transposed thread grid
        "d64_64x64_4x8_u2": _v5(64, 64, 64, 4, 8, V5_UNROLL=2),       # shorter loop bodies
        "d64_64x64_4x8_u8": _v5(64, 64, 64, 4, 8, V5_UNROLL=8),       # longer loop bodies
        "d64_64x64_4x8_flat": _v5(64, 64, 64, 4, 8, V5_BLOCKED_PV=0),  # P V summed straight into O_i
        "d64_128x64_8x8": _v5(64, 128, 64, 8, 8),                     # SGEMM's 8x8 tile, 2 blocks/SM
        "d64_96x64_6x8": _v5(64, 96, 64, 6, 8),
        "d64_64x32_4x4": _v5(64, 64, 32, 4, 4),                       # small tiles, 4 blocks/SM
        "d64_128x32_4x4": _v5(64, 128, 32, 4, 4, V5_MIN_BLOCKS=2),    # 256 threads, 16 warps/SM
        "d128_64x32_4x4": _v5(128, 64, 32, 4, 4),
        "d128_96x32_6x4_flat": _v5(128, 96, 32, 6, 4, V5_BLOCKED_PV=0),
        "d128_128x64_8x4": _v5(128, 128, 64, 8, 4),                   # one 256-thread block per SM
    },
    "v6": {
        "d64 (default)": Variant(64),
        "d64-stages3": Variant(64, {"V6_D64_STAGES": 3}),
        "d128 (default)": Variant(128),
        "d128-bc32": Variant(128, {"V6_D128_BC": 32}),
        "d128-bc48": Variant(128, {"V6_D128_BC": 48}),
    },
    # The steps of kernels/v7.cu's header table, one interleaved run per head dim. At D=128 the plain-load
    # and extra-stage steps need 2 warpgroups (their registers or shared memory leave no room for 3).
    "v7": {
        "d64 plain loads, 1 stage": Variant(64, {"V7_TMA": 0, "V7_STAGES": 1}),
        "d64 plain loads, 2 stages": Variant(64, {"V7_TMA": 0}),
        "d64 TMA, 1 stage": Variant(64, {"V7_STAGES": 1}),
        "d64 TMA, 2 stages (default)": Variant(64),
        "d64 TMA, 3 stages": Variant(64, {"V7_STAGES": 3}),
        "d64 3 WG": Variant(64, {"V7_D64_WG": 3}),
        "d64 B_c=64": Variant(64, {"V7_D64_BC": 64, "V7_D64_MINB": 2}),
        "d128 plain loads, 1 stage": Variant(128, {"V7_TMA": 0, "V7_STAGES": 1, "V7_D128_WG": 2}),
        "d128 plain loads, 2 stages": Variant(128, {"V7_TMA": 0, "V7_D128_WG": 2}),
        "d128 TMA, 1 stage": Variant(128, {"V7_STAGES": 1}),
        "d128 TMA, 2 stages, 2 WG": Variant(128, {"V7_D128_WG": 2}),
        "d128 TMA, 2 stages, 3 WG (default)": Variant(128),
        "d128 TMA, 3 stages, 2 WG": Variant(128, {"V7_STAGES": 3, "V7_D128_WG": 2}),
        "d128 B_c=64": Variant(128, {"V7_D128_BC": 64, "V7_D128_WG": 2, "V7_D128_MINB": 2}),
    },
    # The steps of the V8 chapter, one change each (tests/test_v8.py VARIANTS), at both head dims, then the
    # extras: a third stage, FlashAttention-3's B_c = 176 (D=128), 2 consumers at D=64, overlap without
    # ping-pong. "spec0" is v7's loop on v8's barriers (no producer); the last step adds persistent blocks.
    "v8": {f"d{D} {name}": Variant(D, macros) for D in (64, 128) for name, macros in (
        ("spec0", {"V8_SPECIALIZE": 0}),
        ("spec", {"V8_SETMAXNREG": 0, "V8_PINGPONG": 0, "V8_OVERLAP": 0, "V8_PERSISTENT": 0}),
        ("setmaxnreg", {"V8_PINGPONG": 0, "V8_OVERLAP": 0, "V8_PERSISTENT": 0}),
        ("pingpong", {"V8_OVERLAP": 0, "V8_PERSISTENT": 0}),
        ("overlap", {"V8_PERSISTENT": 0}),
        ("persistent (default)", {}),
        ("stages3", {"V8_STAGES": 3}),
        ("bc176" if D == 128 else "d64wg2", {"V8_D128_BC": 176} if D == 128 else {"V8_D64_WG": 2}),
        ("overlap_nopp", {"V8_PINGPONG": 0, "V8_PERSISTENT": 0}),
    )},
    # The V6 chapter's steps (issue 12), one interleaved run per head dim; docs/v6_notes.md says why each.
    "v6-steps": steps.v6_chain(Variant),
    # The V5 chapter's steps (issue 12), one interleaved run per head dim at DEFAULT_SHAPE: every step macro of
    # kernels/v5.cu off, then on one at a time in the chapter's order; the last step is the committed build.
    "v5-steps": {f"d{D} {name}": Variant(D, {m: on for _, flips, _ in V5_STEPS[:k + 1] for m, on in flips.items()},
                                        change)
                 for D in (64, 128) for k, (name, _, change) in enumerate(V5_STEPS)},
}
SHAPES = {v: {64: (4, 12, 2048, 2048), 128: (2, 16, 8192, 8192)} for v in ("v6", "v7", "v8")}   # (B, H, M, N)
METRICS_SHAPE = (4, 12, 2048, 2048)   # --metrics: the chapters' primary shape, as flashattn.measure.profile
# Timed beside the variants in the same interleaved run (16-bit dtypes; float32 runs time SDPA only).
REFERENCES = {"v7": ("sdpa", "sdpa_flash", "sdpa_cudnn", "v6"), "v8": ("sdpa", "sdpa_flash", "sdpa_cudnn", "v7")}
DEFAULT_REFERENCES = ("sdpa", "sdpa_flash")
DEFAULT_SHAPE = (4, 12, 2048, 2048)
ODD_SHAPES = [(2, 3, 203, 113, 1.0), (2, 3, 113, 203, 1.0), (1, 2, 7, 5, 1.0), (1, 1, 1, 1, 1.0),
              (2, 3, 203, 113, 20.0)]              # (B, H, M, N, logit scale); 20: exp overflows without the max
FLOOR = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-3}


def flags(variant: Variant) -> list[str]:
    return [f"-D{k}={v}" for k, v in variant.macros.items()]


def geometry_of(version: str, variant: Variant) -> dict | None:
    """Threads and shared memory of the variant's kernel at its head dim, from flashattn.measure.geometry."""
    version = kernel_version(version)
    if version == "v5":
        return geometry.v5_default_tiles(variant.macros)[variant.D]
    if version == "v6":
        get = lambda k: variant.macros.get(f"V6_D{variant.D}_{k}") or geometry.constant("v6", f"V6_D{variant.D}_{k}")
        B_r, smem = geometry.v6_smem(2, variant.D, get("WM"), get("BC"), get("STAGES"))
        # the step macros, as kernels/v6.cu's launcher counts them: 16 bytes more per row when padded,
        # and a [B_r][B_c] tile for P when it goes through shared memory
        if variant.macros.get("V6_SMEM_LAYOUT") == 1:
            smem += 16 * (B_r + 2 * get("STAGES") * get("BC"))
        if variant.macros.get("V6_P_SMEM") == 1:
            smem += 2 * B_r * get("BC") + (16 * B_r if variant.macros.get("V6_SMEM_LAYOUT") == 1 else 0)
        return dict(D=variant.D, B_r=B_r, B_c=get("BC"), threads=32 * geometry.constant("v6", "kWarps"), smem=smem)
    if version == "v7":
        return geometry.v7_tiles(variant.D, variant.macros)
    if version == "v8":
        return geometry.v8_tiles(variant.D, variant.macros)
    return None


def own_head_dim(kernel: str, D: int) -> bool:
    """Whether a templated kernel (v6::flash_fwd_mma<T, D, ...>) is the head-dim-D instance."""
    args = geometry.template_args(kernel) if "<" in kernel else []
    return len(args) > 1 and args[1] == str(D)


def _ptxas(version: str, variant: Variant, dtype: str) -> dict:
    """The largest register count, stack and spills over the variant's kernels of the timed dtype."""
    kernels = _compile_report_cached(version, tuple(flags(variant)))
    tag = {"bfloat16": "bfloat16", "float16": "half"}.get(dtype)
    kernels = [k for k in kernels if tag is None or tag in k["name"]] or kernels
    kernels = [k for k in kernels if own_head_dim(k["name"], variant.D)] or kernels
    return {"registers": max(k.get("registers", 0) for k in kernels),
            "stack_bytes": max(k.get("stack_bytes", 0) for k in kernels),
            "spill_store_bytes": max(k.get("spill_store_bytes", 0) for k in kernels),
            "kernels": kernels}


_CACHE_LOCK = threading.Lock()
_IN_FLIGHT: dict = {}


def _compile_report_cached(version: str, variant_flags: tuple[str, ...]) -> list[dict]:
    """ptxas's report of the whole file under these flags (flashattn.measure.resources.compile_report), remembered
    in TORCH_EXTENSIONS_DIR (next to the builds) under a hash of the kernel text, the flags and the
    architecture, so that `--build-only` on a machine's CPUs leaves the timed run only the GPU work, and
    variants that differ only in the head dim they time compile once."""
    arch = (loader.version_archs(version) or loader.arch_list())[0].removesuffix("+PTX").replace(".", "")
    key = hashlib.sha256(f"{version}|{arch}|{list(variant_flags)}|{loader.source(version)}".encode()).hexdigest()
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or tempfile.gettempdir()) / "flashattn_sweep_ptxas.json"
    with _CACHE_LOCK:
        cache = json.loads(path.read_text()) if path.exists() else {}
        if key in cache:
            return cache[key]
        lock = _IN_FLIGHT.setdefault(key, threading.Lock())   # one compile per key, the others wait for it
    with lock:
        with _CACHE_LOCK:
            cache = json.loads(path.read_text()) if path.exists() else {}
        if key in cache:
            return cache[key]
        report = resources.compile_report(version, arch, list(variant_flags))
        with _CACHE_LOCK:
            cache = json.loads(path.read_text()) if path.exists() else {}
            cache[key] = report
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache))
    return report


def _build(version: str, variant: Variant):
    """One module per set of macros (named after them): variants that differ only in the head dim they
    time share their build, since every build holds both head dims."""
    tag = "_".join(f"{k}_{v}" for k, v in sorted(variant.macros.items())) or "default"
    tag = "".join(ch if ch.isalnum() else "_" for ch in tag)
    functions = ("forward", "kernel_info") if version == "v5" else ("forward",)
    return loader.build(version, flags(variant), module_name=f"flashattn_{version}_sweep_{tag}",
                        functions=functions)


def _errors(module, version: str, D: int, dtype):
    """Largest relative error over the odd shapes (both masks where the version has causal), and SDPA's
    largest on the same non-causal inputs (the yardstick of the correctness bound)."""
    import torch

    from flashattn.reference import attention_reference, relative_error, sdpa
    worst, worst_sdpa, rows = 0.0, 0.0, []
    for seed, (B, H, M, N, scale) in enumerate(ODD_SHAPES):
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g) for L in (M, N, N))
        q, k, v = (q * scale).to(dtype), k.to(dtype), v.to(dtype)
        for causal in (False, True) if INFO[version].causal else (False,):
            ref = attention_reference(q, k, v, causal)
            out = module.forward(q, k, v, causal)
            err = relative_error(out, ref) if torch.isfinite(out).all() else float("inf")
            rows.append(dict(B=B, H=H, M=M, N=N, logit_scale=scale, causal=causal, rel_error=err))
            worst = max(worst, err)
        worst_sdpa = max(worst_sdpa, relative_error(sdpa(q, k, v), attention_reference(q, k, v)))
    return worst, worst_sdpa, rows


def _time_head_dim(version, names, modules, D, shape, dtype, args) -> tuple[dict, list[dict]]:
    """Interleaved timing of every variant of head dim D and the SDPA references on one set of inputs."""
    import torch

    from flashattn.measure.bench import attention_flops, make_call
    from flashattn.measure.timing import time_interleaved
    B, H, M, N = shape
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype) for L in (M, N, N))
    refs = list(REFERENCES.get(version, DEFAULT_REFERENCES)) if dtype != torch.float32 else ["sdpa"]
    calls = {r: make_call(r, q, k, v, False)[:2] for r in refs}
    for n in names:
        calls[n] = ((lambda m: lambda: m.forward(q, k, v, False))(modules[n]), _nullcontext)
    timings = time_interleaved(calls, warmup=args.warmup, repetitions=args.repetitions, rounds=args.rounds,
                               max_seconds=None)
    flops = attention_flops(B, H, M, N, D)
    summary = {}
    for n, t in timings.items():
        summary[n] = {"error": str(t)} if isinstance(t, Exception) else \
            dict(t.summary(), tflops=flops / (t.median_ms * 1e-3) / 1e12)
    references = [dict(name=r, D=D, shape=[B, H, M, N, D], timing=summary[r]) for r in refs]
    return summary, references


def _nullcontext():
    import contextlib
    return contextlib.nullcontext()


def build_all(key: str, only=(), jobs: int = 4) -> tuple[dict, dict]:
    """Build every variant of VARIANTS[key] and ask ptxas about it, `jobs` compilers at a time:
    ({name: module}, {name: ptxas report or the errors})."""
    variants = {n: v for n, v in VARIANTS[key].items() if not only or n in only}
    version = kernel_version(key)
    dtype_name = str(INFO[version].dtypes[0]).replace("torch.", "")
    modules, reports = {}, {n: {} for n in variants}
    same_macros: dict = {}                            # one build per set of macros, for all its variants
    for n, v in variants.items():
        same_macros.setdefault(tuple(sorted(v.macros.items())), []).append(n)
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        builds = {pool.submit(_build, version, variants[names[0]]): names for names in same_macros.values()}
        ptxas = {pool.submit(_ptxas, version, v, dtype_name): [n] for n, v in variants.items()}
        counts = {pool.submit(steps.sass_counts, version, v): [n] for n, v in variants.items()} if is_steps(key) else {}
        for f in cf.as_completed(list(builds) + list(ptxas) + list(counts)):
            names = builds.get(f) or ptxas.get(f) or counts[f]
            for n in names:
                try:
                    if f in builds:
                        modules[n] = f.result()
                    elif f in counts:
                        reports[n]["sass_hot_loop"] = f.result()
                    else:
                        reports[n]["ptxas"] = f.result()
                except Exception as err:              # a failed build is a result too; keep going
                    reports[n].setdefault("errors", []).append(f"{type(err).__name__}: {str(err)[-1500:]}")
    return modules, reports


def run(key: str, only=(), jobs: int = 4, args=None) -> dict:
    import torch

    from flashattn.measure.bench import DTYPES, environment
    variants = {n: v for n, v in VARIANTS[key].items() if not only or n in only}
    version = kernel_version(key)
    dtype_name = str(INFO[version].dtypes[0]).replace("torch.", "")
    dtype = DTYPES[dtype_name]
    start = time.perf_counter()
    rows = {n: dict(name=n, D=v.D, macros=v.macros, flags=flags(v), geometry=geometry_of(version, v))
            for n, v in variants.items()}
    modules, reports = build_all(key, only, jobs)
    for n, report in reports.items():
        rows[n].update(report)
    for n, r in rows.items():
        geo, px = r["geometry"], r.get("ptxas")
        if geo and px:
            occ = resources.occupancy(px["registers"], geo["smem"], geo["threads"])
            r["occupancy"] = dict(blocks_per_sm=occ["blocks"], warps_per_sm=occ["warps"],
                                  limited_by=occ["limited_by"])
        if n in modules and version == "v5":
            keys = ["B_r", "B_c", "TM", "TN", "threads", "smem_bytes", "registers", "local_bytes", "blocks_per_sm"]
            r["runtime"] = dict(zip(keys, modules[n].kernel_info(r["D"])))
    references = []
    for D in sorted({v.D for v in variants.values()}):
        names = [n for n in variants if variants[n].D == D and n in modules]
        for n in names:
            worst, worst_sdpa, shapes = _errors(modules[n], version, D, dtype)
            bound = max(FLOOR[dtype_name], 2 * worst_sdpa)
            rows[n].update(max_rel_error=worst, error_bound=bound, correct=worst <= bound, odd_shapes=shapes)
        shape = SHAPES.get(version, {}).get(D, DEFAULT_SHAPE)
        summary, refs = _time_head_dim(version, names, modules, D, shape, dtype, args)
        references += refs
        for n in names:
            t = summary[n]
            rows[n].update(shape=[*shape, D], timing=t)
            if "median_us" in t:
                rows[n]["vs"] = {r["name"]: r["timing"]["median_us"] / t["median_us"] for r in refs
                                 if "median_us" in r["timing"]}
        torch.cuda.empty_cache()
    step_set = {"set": key, "steps": list(variants)} if is_steps(key) else {}
    for n in rows if step_set else ():
        rows[n]["change"] = variants[n].change
    meta = environment(getattr(args, "argv", None), prog="python -m flashattn.measure.sweep")
    return {"schema": SCHEMA, "version": version, **step_set, "dtype": dtype_name, "meta": meta,
            "settings": dict(warmup=args.warmup, repetitions=args.repetitions, rounds=args.rounds,
                             timing="flashattn.measure.timing.time_interleaved: CUDA events, L2 flushed before each "
                                    "call, interleaved rounds, median",
                             correct_if="max relative error over the odd shapes <= max(floor, 2 x SDPA's)"),
            "variants": list(rows.values()), "references": references,
            "total_seconds": round(time.perf_counter() - start, 1)}


def format_table(doc: dict) -> str:
    lines = [f"{'variant':24} {'D':>3} {'thr':>4} {'regs':>4} {'spill':>5} {'smem KB':>7} {'blk/SM':>6} "
             f"{'max err':>8} {'ok':>3} {'median us':>10} {'TFLOP/s':>8}  vs"]
    for r in doc["variants"]:
        geo, px, t = r.get("geometry") or {}, r.get("ptxas") or {}, r.get("timing") or {}
        vs = " ".join(f"{k} {x:.2f}x" for k, x in (r.get("vs") or {}).items())
        lines.append(f"{r['name']:24} {r['D']:>3} {geo.get('threads', '?'):>4} {px.get('registers', '?'):>4} "
                     f"{px.get('spill_store_bytes', '?'):>5} {geo.get('smem', 0) / 1024:>7.1f} "
                     f"{(r.get('occupancy') or {}).get('blocks_per_sm', '?'):>6} "
                     f"{r.get('max_rel_error', float('nan')):>8.1e} {'yes' if r.get('correct') else 'NO':>3} "
                     f"{t.get('median_us', float('nan')):>10.1f} {t.get('tflops', float('nan')):>8.1f}  {vs}")
        lines += [f"    {e[:300]}" for e in r.get("errors", [])]
    for ref in doc["references"]:
        t = ref["timing"]
        lines.append(f"{ref['name']:24} {ref['D']:>3} {'':>48} {t.get('median_us', float('nan')):>10.1f} "
                     f"{t.get('tflops', float('nan')):>8.1f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.sweep", description=__doc__.split("\n\n")[0],
                                epilog="versions with variants: " + ", ".join(VARIANTS))
    p.add_argument("version", metavar="VERSION", choices=tuple(VARIANTS), help="one of " + ", ".join(VARIANTS))
    p.add_argument("--only", nargs="+", default=(), metavar="NAME", help="these variants only (default: all)")
    p.add_argument("--out", type=Path, default=Path("."),
                   help="folder for VERSION_sweep.json or VERSION_steps.json (default: .)")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 2),
                   help="parallel builds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up calls per variant (default: %(default)s)")
    p.add_argument("--repetitions", type=int, default=60, help="timed calls per variant (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    p.add_argument("--metrics", action="store_true",
                   help="also run every correct variant once under Nsight Compute at "
                        f"B, H, M, N = {METRICS_SHAPE} and store flashattn.measure.ncu.STEP_METRICS and the warp-stall "
                        "ratios per variant (default: off)")
    p.add_argument("--target", nargs="+", metavar="NAME", help=argparse.SUPPRESS)   # internal: what ncu runs
    p.add_argument("--build-only", action="store_true",
                   help="build the variants and record ptxas's reports (no GPU needed), so that a later "
                        "run only times them (default: off)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv                                  # for the record's command line (sys.argv when None)
    if args.target:
        return steps.target(args.version, args.target, args.warmup)
    unknown = set(args.only) - set(VARIANTS[args.version])
    if unknown:
        raise SystemExit(f"unknown variant(s) of {args.version}: {', '.join(sorted(unknown))}")
    if args.build_only:
        start = time.perf_counter()
        modules, reports = build_all(args.version, args.only, args.jobs)
        for n, r in reports.items():
            errors = "".join(f"\n    {e[:300]}" for e in r.get("errors", []))
            print(f"{n:36} {'built' if n in modules else 'BUILD FAILED'}  registers "
                  f"{(r.get('ptxas') or {}).get('registers', '?')}{errors}")
        print(f"{len(modules)} of {len(reports)} variants of {args.version} built in "
              f"{time.perf_counter() - start:.0f} s")
        return 0 if len(modules) == len(reports) else 1
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("flashattn.measure.sweep needs a CUDA GPU: torch.cuda.is_available() is False")
    doc = run(args.version, args.only, args.jobs, args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / output_name(args.version)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if args.metrics:
        steps.attach_metrics(doc, args.version, args.out)
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(format_table(doc) + f"\n\nwrote {path} ({doc['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
