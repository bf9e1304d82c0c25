"""Variant sweep of one kernel: `python -m flashattn.measure.sweep VERSION [--only NAME ...] [--out DIR] [--metrics]`.

A variant is the kernel file built with a few -D macros (tile shape, pipeline depth, code switches). For
every variant of the set VERSION (flashattn.measure.variants.SETS, one of SWEEPS) this

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

Writes DIR/<version>_sweep.json, a flashattn.measure.results record of kind sweep (a row per variant; the SDPA
rows timed beside them in meta["references"]) that flashattn.book.records.sweep_table reads, and prints a table.
A new version needs only its set in flashattn.measure.variants (and, for its geometry columns, a case in
flashattn.measure.geometry.variant_geometry).

Step sets. A key "<version>-steps" (e.g. "v6-steps") is a chapter's chain of steps: the variants in
order, each one compile-time change (Variant.change says which) away from the step before, the last
one the file as committed. It builds kernels/<version>.cu like any other set and writes
DIR/<version>_steps.json (same kind, plus meta["steps"]: the order, and each row's "change").
`--metrics` then runs every correct variant once more under Nsight Compute at METRICS_SHAPE and stores
the counters of flashattn.measure.ncu.STEP_METRICS per variant (bank conflicts, shared wavefronts, instructions,
the warp-stall breakdown, occupancy, duration; flashattn.measure.profile.attach_metrics), and
flashattn.measure.step_sass counts the instructions of each variant's hot loop (no GPU needed for that part).
flashattn.book.records.step_table reads the result.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import sys
import time
from pathlib import Path

import torch

from flashattn import loader
from flashattn.measure import build_cache, geometry, profile, resources, results, step_sass
from flashattn.measure.bench import DTYPES, attention_flops, make_call
from flashattn.measure.results import environment
from flashattn.measure.timing import time_interleaved
from flashattn.measure.variants import SETS, SWEEPS, Variant, is_chain, kernel_of
from flashattn.reference import attention_reference, relative_error, sdpa
from flashattn.versions import INFO

SHAPES = {v: {64: (4, 12, 2048, 2048), 128: (2, 16, 8192, 8192)} for v in ("v6", "v7", "v8")}   # (B, H, M, N)
METRICS_SHAPE = (4, 12, 2048, 2048)   # --metrics: the chapters' primary shape, as flashattn.measure.profile
# Timed beside the variants in the same interleaved run (16-bit dtypes; float32 runs time SDPA only).
REFERENCES = {"v7": ("sdpa", "sdpa_flash", "sdpa_cudnn", "v6"), "v8": ("sdpa", "sdpa_flash", "sdpa_cudnn", "v7")}
DEFAULT_REFERENCES = ("sdpa", "sdpa_flash")
DEFAULT_SHAPE = (4, 12, 2048, 2048)
ODD_SHAPES = [(2, 3, 203, 113, 1.0), (2, 3, 113, 203, 1.0), (1, 2, 7, 5, 1.0), (1, 1, 1, 1, 1.0),
              (2, 3, 203, 113, 20.0)]              # (B, H, M, N, logit scale); 20: exp overflows without the max
FLOOR = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-3}


def output_name(key: str) -> str:
    """v6 -> v6_sweep.json; v6-steps -> v6_steps.json."""
    return f"{kernel_of(key)}_steps.json" if is_chain(key) else f"{key}_sweep.json"


def own_head_dim(kernel: str, D: int) -> bool:
    """Whether a templated kernel (v6::flash_fwd_mma<T, D, ...>) is the head-dim-D instance."""
    args = geometry.template_args(kernel) if "<" in kernel else []
    return len(args) > 1 and args[1] == str(D)


def _ptxas(version: str, variant: Variant, dtype: str) -> dict:
    """The largest register count, stack and spills over the variant's kernels of the timed dtype."""
    kernels = compile_report_cached(version, tuple(variant.flags))
    tag = {"bfloat16": "bfloat16", "float16": "half"}.get(dtype)
    kernels = [k for k in kernels if tag is None or tag in k["name"]] or kernels
    kernels = [k for k in kernels if own_head_dim(k["name"], variant.D)] or kernels
    return {"registers": max(k.get("registers", 0) for k in kernels),
            "stack_bytes": max(k.get("stack_bytes", 0) for k in kernels),
            "spill_store_bytes": max(k.get("spill_store_bytes", 0) for k in kernels),
            "kernels": kernels}


def compile_report_cached(version: str, variant_flags: tuple[str, ...]) -> list[dict]:
    """ptxas's report of the whole file under these flags (flashattn.measure.resources.compile_report),
    remembered next to the builds (flashattn.measure.build_cache), so that `--build-only` on a machine's CPUs
    leaves the timed run only the GPU work, and variants that differ only in the head dim they time compile
    once."""
    arch = (loader.version_archs(version) or loader.arch_list())[0].removesuffix("+PTX").replace(".", "")
    key = build_cache.key_of(version, arch, list(variant_flags), loader.source(version))
    return build_cache.remembered("flashattn_sweep_ptxas.json", key,
                                  lambda: resources.compile_report(version, arch, list(variant_flags)),
                                  keep=lambda report: True)


def build(variant: Variant):
    """The variant's extension, one module per set of macros (named after them): variants that differ only
    in the head dim they time share their build, since every build holds both head dims."""
    version = variant.kernel
    tag = "_".join(f"{k}_{v}" for k, v in sorted(variant.macros.items())) or "default"
    tag = "".join(ch if ch.isalnum() else "_" for ch in tag)
    functions = ("forward", "kernel_info") if version == "v5" else ("forward",)
    return loader.build(version, variant.flags, module_name=f"flashattn_{version}_sweep_{tag}",
                        functions=functions)


def _errors(module, version: str, D: int, dtype):
    """Largest relative error over the odd shapes (both masks where the version has causal), and SDPA's
    largest on the same non-causal inputs (the yardstick of the correctness bound)."""
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
    B, H, M, N = shape
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype) for L in (M, N, N))
    refs = list(REFERENCES.get(version, DEFAULT_REFERENCES)) if dtype != torch.float32 else ["sdpa"]
    calls = {r: make_call(r, q, k, v, False)[:2] for r in refs}
    for n in names:
        calls[n] = ((lambda m: lambda: m.forward(q, k, v, False))(modules[n]), contextlib.nullcontext)
    timings = time_interleaved(calls, warmup=args.warmup, repetitions=args.repetitions, rounds=args.rounds,
                               max_seconds=None)
    flops = attention_flops(B, H, M, N, D)
    summary = {}
    for n, t in timings.items():
        summary[n] = {"error": str(t)} if isinstance(t, Exception) else \
            dict(t.summary(), tflops=flops / (t.median_ms * 1e-3) / 1e12)
    references = [dict(name=r, D=D, shape=[B, H, M, N, D], timing=summary[r]) for r in refs]
    return summary, references


def build_all(key: str, only=(), jobs: int = 4) -> tuple[dict, dict]:
    """Build every variant of the set `key` and ask ptxas about it (and, for a chain of steps, count its hot
    loop's SASS), `jobs` compilers at a time: ({name: module}, {name: ptxas report or the errors})."""
    variants = {n: v for n, v in SETS[key].items() if not only or n in only}
    version = kernel_of(key)
    dtype_name = str(INFO[version].dtypes[0]).replace("torch.", "")
    modules, reports = {}, {n: {} for n in variants}
    same_macros: dict = {}                            # one build per set of macros, for all its variants
    for n, v in variants.items():
        same_macros.setdefault(tuple(sorted(v.macros.items())), []).append(n)
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        builds = {pool.submit(build, variants[names[0]]): names for names in same_macros.values()}
        ptxas = {pool.submit(_ptxas, version, v, dtype_name): [n] for n, v in variants.items()}
        counts = {pool.submit(step_sass.hot_loop_counts, v): [n] for n, v in variants.items()} if is_chain(key) else {}
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
    variants = {n: v for n, v in SETS[key].items() if not only or n in only}
    version = kernel_of(key)
    dtype_name = str(INFO[version].dtypes[0]).replace("torch.", "")
    dtype = DTYPES[dtype_name]
    start = time.perf_counter()
    rows = {n: dict(name=n, D=v.D, macros=v.macros, flags=v.flags, geometry=geometry.variant_geometry(v))
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
    step_set = {"set": key, "steps": list(variants)} if is_chain(key) else {}
    for n in rows if step_set else ():
        rows[n]["change"] = variants[n].change
    meta = {**environment(getattr(args, "argv", None), prog="python -m flashattn.measure.sweep"),
            "version": version, **step_set, "dtype": dtype_name, "references": references,
            "total_seconds": round(time.perf_counter() - start, 1)}
    settings = dict(warmup=args.warmup, repetitions=args.repetitions, rounds=args.rounds,
                    timing="flashattn.measure.timing.time_interleaved: CUDA events, L2 flushed before each call, "
                           "interleaved rounds, median",
                    correct_if="max relative error over the odd shapes <= max(floor, 2 x SDPA's)")
    return results.document("sweep", rows.values(), meta, settings)


def format_table(doc: dict) -> str:
    lines = [f"{'variant':24} {'D':>3} {'thr':>4} {'regs':>4} {'spill':>5} {'smem KB':>7} {'blk/SM':>6} "
             f"{'max err':>8} {'ok':>3} {'median us':>10} {'TFLOP/s':>8}  vs"]
    for r in doc["rows"]:
        geo, px, t = r.get("geometry") or {}, r.get("ptxas") or {}, r.get("timing") or {}
        vs = " ".join(f"{k} {x:.2f}x" for k, x in (r.get("vs") or {}).items())
        lines.append(f"{r['name']:24} {r['D']:>3} {geo.get('threads', '?'):>4} {px.get('registers', '?'):>4} "
                     f"{px.get('spill_store_bytes', '?'):>5} {geo.get('smem', 0) / 1024:>7.1f} "
                     f"{(r.get('occupancy') or {}).get('blocks_per_sm', '?'):>6} "
                     f"{r.get('max_rel_error', float('nan')):>8.1e} {'yes' if r.get('correct') else 'NO':>3} "
                     f"{t.get('median_us', float('nan')):>10.1f} {t.get('tflops', float('nan')):>8.1f}  {vs}")
        lines += [f"    {e[:300]}" for e in r.get("errors", [])]
    for ref in doc["meta"]["references"]:
        t = ref["timing"]
        lines.append(f"{ref['name']:24} {ref['D']:>3} {'':>48} {t.get('median_us', float('nan')):>10.1f} "
                     f"{t.get('tflops', float('nan')):>8.1f}")
    return "\n".join(lines)


def target(key: str, names: list[str], warmup: int = 1) -> int:
    """What ncu runs for --metrics (`--target NAME ...`): for each variant in `names`, its build (from the
    extension cache), `warmup` calls and one more at METRICS_SHAPE, in the version's timed dtype (its first),
    non-causal. ncu profiles every launch; flashattn.measure.profile.attach_metrics keeps each variant's last."""
    B, H, M, N = METRICS_SHAPE
    dtype = INFO[kernel_of(key)].dtypes[0]
    finite = True
    for name in names:
        variant = SETS[key][name]
        module = build(variant)
        g = torch.Generator(device="cuda").manual_seed(11)
        q, k, v = (torch.randn(B, H, L, variant.D, device="cuda", generator=g).to(dtype) for L in (M, N, N))
        for _ in range(warmup + 1):
            out = module.forward(q, k, v, False)
        torch.cuda.synchronize()
        finite &= bool(torch.isfinite(out).all().item())
    return 0 if finite else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.sweep", description=__doc__.split("\n\n")[0],
                                epilog="sets of variants (flashattn.measure.variants): " + ", ".join(SWEEPS))
    p.add_argument("version", metavar="VERSION", choices=SWEEPS, help="one of " + ", ".join(SWEEPS))
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
        return target(args.version, args.target, args.warmup)
    unknown = set(args.only) - set(SETS[args.version])
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
    if not torch.cuda.is_available():
        raise SystemExit("flashattn.measure.sweep needs a CUDA GPU: torch.cuda.is_available() is False")
    doc = run(args.version, args.only, args.jobs, args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / output_name(args.version)
    results.save(path, doc)
    if args.metrics:
        profile.attach_metrics(doc, args.version, args.out, METRICS_SHAPE)
        results.save(path, doc)
    print(format_table(doc) + f"\n\nwrote {path} ({doc['meta']['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
