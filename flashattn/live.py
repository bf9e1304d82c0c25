"""The book's live experiments: with a CUDA GPU they run the kernels now; without one they say so in one
line and show what was recorded on the H200 instead (flashattn.records).

Correctness is measured against the float64 reference, timing goes through flashattn.bench and
flashattn.timing (CUDA events, L2 flushed, median), and every call is checked once by flashattn.plan.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from .notebook import LIVE_ONLY, NO_GPU, PRIMARY, gpu, md
from .records import RESULTS, bench_rows, bench_table, recorded
from .table import label
from .versions import INFO


def build(version: str) -> None:
    """Compile (or load from torch's cache) kernels/<version>.cu; one line says how long it took.

    Without a GPU the extension still compiles for sm_90 (flashattn.loader's default), which checks the
    kernel and the binding; nothing is launched."""
    from .loader import arch_list, load, version_archs
    start = time.perf_counter()
    load(version)
    took = time.perf_counter() - start
    archs = ", ".join("sm_" + a.replace(".", "").replace("+PTX", "") for a in version_archs(version) or arch_list())
    how = "compiled" if took > 2 else "loaded from the build cache"
    print(f"{label(version)}: kernels/{version}.cu {how} for {archs} in {took:.1f} s.")


def timing_pitfalls(version: str = "baseline", L: int = 1024):
    """The same call timed four ways, to show what each mistake does to the number."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    from .timing import l2_flush_buffer, time_cuda
    from .validate import plan
    q, k, v = _inputs(PRIMARY["B"], PRIMARY["H"], L, L, PRIMARY["D"], seed=1)
    call = plan(q, k, v, version)
    fn = lambda: call.run(q, k, v)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = (time.perf_counter() - t0) * 1e6
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    host_nosync = (time.perf_counter() - t0) / 20 * 1e6
    torch.cuda.synchronize()
    warm = time_cuda(fn, warmup=5, repetitions=50, flush_l2=False).median_ms * 1e3
    cold = time_cuda(fn, warmup=5, repetitions=50, flush_l2=True).median_ms * 1e3
    l2 = l2_flush_buffer().numel() // 2
    rows = [("first call, host timer, synchronised", first, "includes lazy initialisation (cuBLAS handles, allocator)"),
            ("host timer around 20 launches, no synchronisation", host_nosync,
             "measures how fast the CPU enqueues work"),
            ("CUDA events, warm L2 (inputs stay cached)", warm, "optimistic when the working set fits in L2"),
            ("CUDA events, L2 flushed before each call (the book's method)", cold, "every call starts from DRAM")]
    lines = ["| method | µs per call | what it really measures |", "|---|--:|---|"]
    lines += [f"| {a} | {b:,.1f} | {c} |" for a, b, c in rows]
    return md("\n".join(lines) + f"\n\n{label(version)} at B=4, H=12, M=N={L}, D=64 on "
               f"{torch.cuda.get_device_name()}; Q, K, V and O take {4 * q.numel() * 4 / 1e6:.0f} MB, the L2 "
               f"cache {l2 / 1e6:.0f} MB.")


def _inputs(B, H, M, N, D, dtype=torch.float32, seed=0, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, M, D, device="cuda", generator=gen) * scale
    k = torch.randn(B, H, N, D, device="cuda", generator=gen) * scale
    v = torch.randn(B, H, N, D, device="cuda", generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def default_shapes(version: str) -> list[tuple]:
    """Odd sizes that are not multiples of any tile, M != N where allowed, and one long row."""
    D = (INFO[version].head_dims or (64,))[0]
    if INFO[version].self_attention_only:
        return [(1, 1, 1, 1, D), (2, 3, 113, 113, D), (1, 2, 1000, 1000, D), (4, 12, 512, 512, D)]
    return [(1, 1, 1, 1, D), (2, 3, 113, 203, D), (1, 2, 1000, 17, D), (1, 1, 17, 2048, D), (4, 12, 512, 512, D)]


def correctness(version: str, shapes=None, dtype=torch.float32, causal: bool = False, scale: float = 1.0,
                files=("bench.json", "bench_v6.json")):
    """Relative error ||out - ref|| / ||ref|| against the float64 reference, per shape (live), or the
    error the H200 benchmark recorded at its smallest shape in the benchmark `files` of results/h200
    (no GPU; e.g. files=("bench_v7.json",) for V7)."""
    if not gpu():
        print(NO_GPU.format(what="the errors"))
        rows = [r for f in files for r in bench_rows(RESULTS / f)
                if r["version"] == version and r.get("rel_error") is not None]
        if not rows:
            return md(f"*No recorded benchmark yet (`results/h200/{files[0]}`).*")
        lines = ["| B, H, M, N, D | dtype | causal | relative error |", "|---|---|---|--:|"]
        for r in rows:
            lines.append(f"| {r['batch_size']}, {r['num_heads']}, {r['seq_len_q']}, {r['seq_len_kv']}, "
                         f"{r['head_dim']} | {r['dtype']} | {r['causal']} | {r['rel_error']:.1e} |")
        return md("\n".join(lines))
    from .reference import attention_reference, relative_error
    from .validate import plan
    lines = ["| B, H, M, N, D | ran as | relative error | finite |", "|---|---|--:|---|"]
    for B, H, M, N, D in shapes or default_shapes(version):
        q, k, v = _inputs(B, H, M, N, D, dtype, scale=scale)
        call = plan(q, k, v, version, causal)
        out = call.run(q, k, v)
        err = relative_error(out, attention_reference(q, k, v, causal=causal))
        lines.append(f"| {B}, {H}, {M}, {N}, {D} | {call.runs_as} | {err:.1e} | "
                     f"{bool(torch.isfinite(out).all())} |")
    return md("\n".join(lines))


def timing(versions, seq_lens=(PRIMARY["L"],), B=PRIMARY["B"], H=PRIMARY["H"], D=PRIMARY["D"],
           dtype="float32", causal=False, warmup=5, repetitions=30, rounds=3, max_seconds=2.0, file="bench.json"):
    """Time `versions` side by side on the same inputs (flashattn.bench: CUDA events, L2 flush, median),
    or show the recorded H200 rows without a GPU."""
    versions = list(versions)
    if not gpu():
        print(NO_GPU.format(what="the latencies"))
        return recorded(versions, seq_lens, dtype, causal, D, file)
    from .bench import DTYPES, add_comparisons, bench_shape
    args = SimpleNamespace(warmup=warmup, repetitions=repetitions, rounds=rounds, max_seconds=max_seconds)
    rows = []
    for L in seq_lens:
        q, k, v = _inputs(B, H, L, L, D, DTYPES[dtype], seed=L)
        rows += bench_shape(versions, q, k, v, causal, args)
        del q, k, v
        torch.cuda.empty_cache()
    add_comparisons(rows)
    name = torch.cuda.get_device_name()
    return md(bench_table(rows, f"Measured now on {name}: median of up to {repetitions} calls in {rounds} "
                                  f"interleaved rounds after {warmup} warm-ups, L2 flushed before each "
                                  f"(B={B}, H={H}, D={D}, {dtype})."))


def peak_memory(versions, L: int = PRIMARY["L"]):
    """Peak memory PyTorch's allocator reports during one forward of each version (live only)."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    from .validate import plan
    q, k, v = _inputs(PRIMARY["B"], PRIMARY["H"], L, L, PRIMARY["D"], seed=2)
    base = torch.cuda.memory_allocated()
    lines = ["| version | extra memory during one forward |", "|---|--:|"]
    for version in versions:
        call = plan(q, k, v, version)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = call.run(q, k, v)
        torch.cuda.synchronize()
        lines.append(f"| {label(version)} | {(torch.cuda.max_memory_allocated() - base) / 1e6:,.0f} MB |")
        del out
    return md("\n".join(lines) + f"\n\nB=4, H=12, M=N={L}, D=64, float32; the output itself is "
               f"{q.numel() * 4 / 1e6:.0f} MB.")


def variant_timing(version: str, variants: dict, seq_len: int = PRIMARY["L"], warmup=5, repetitions=30):
    """Build `version` with textual edits of its source and time the variants side by side.

    variants: {label: [(old, new), ...]}; every `old` must occur in kernels/<version>.cu, so a cell that
    names an edit fails loudly when the kernel changes. Without a GPU the variants are only compiled."""
    from .loader import build, source
    base = source(version)
    modules = {f"{version} (as committed)": None}
    for name, edits in variants.items():
        src = base
        for old, new in edits:
            if old not in src:
                raise ValueError(f"{version}: the text {old!r} of variant {name!r} is not in kernels/{version}.cu")
            src = src.replace(old, new)
        tag = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        modules[name] = build(version, src=src, module_name=f"flashattn_{version}_{tag}")
    print(f"built {len(variants)} variant(s) of {version}.")
    if not gpu():
        print(LIVE_ONLY)
        return None
    from .reference import attention_reference, relative_error
    from .timing import time_cuda
    from .validate import plan
    B, H, D = PRIMARY["B"], PRIMARY["H"], PRIMARY["D"]
    q, k, v = _inputs(B, H, seq_len, seq_len, D, seed=7)
    ref = attention_reference(q[:1, :2], k[:1, :2], v[:1, :2])
    lines = ["| variant | median µs | min – max µs | calls | rel. error |", "|---|--:|--:|--:|--:|"]
    committed = plan(q, k, v, version)
    for name, mod in modules.items():
        fn = (lambda: committed.run(q, k, v)) if mod is None else (lambda m=mod: m.forward(q, k, v, False))
        out = fn()
        err = relative_error(out[:1, :2], ref)
        t = time_cuda(fn, warmup=warmup, repetitions=repetitions, max_seconds=2.0)
        lines.append(f"| {name} | {t.median_ms * 1e3:,.1f} | {t.min_ms * 1e3:,.1f} – {t.max_ms * 1e3:,.1f} | "
                     f"{t.calls} | {err:.1e} |")
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, B={B}, H={H}, "
               f"M=N={seq_len}, D={D}, float32; same method as `timing`.")
