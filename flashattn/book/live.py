"""The book's live experiments: with a CUDA GPU they run the kernels now; without one they say so in one
line and show what was recorded on the H200 instead (flashattn.book.records).

Correctness is measured against the float64 reference, timing goes through flashattn.measure.bench and
flashattn.measure.timing (CUDA events, L2 flushed, median), and every call is checked once by flashattn.plan.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from flashattn import loader
from flashattn.book.notebook import LIVE_ONLY, NO_GPU, PRIMARY, gpu, md
from flashattn.book.records import RESULTS, bench_rows, bench_table, recorded
from flashattn.measure.bench import DTYPES, add_comparisons, bench_shape
from flashattn.measure.table import label
from flashattn.measure.timing import l2_flush_buffer, time_cuda
from flashattn.reference import attention_reference, relative_error
from flashattn.validate import plan
from flashattn.versions import INFO


def build(version: str) -> None:
    """Compile (or load from torch's cache) kernels/<version>.cu; one line says how long it took.

    Without a GPU the extension still compiles for sm_90 (flashattn.loader's default), which checks the
    kernel and the binding; nothing is launched."""
    start = time.perf_counter()
    loader.load(version)
    took = time.perf_counter() - start
    archs = ", ".join("sm_" + a.replace(".", "").replace("+PTX", "")
                      for a in loader.version_archs(version) or loader.arch_list())
    how = "compiled" if took > 2 else "loaded from the build cache"
    print(f"{label(version)}: kernels/{version}.cu {how} for {archs} in {took:.1f} s.")


def timing_pitfalls(version: str = "baseline", L: int = 1024):
    """The same call timed with a host timer (two mistakes) and with the book's method."""
    if not gpu():
        print(LIVE_ONLY)
        return None
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
    book = time_cuda(fn, warmup=5, repetitions=50).median_ms * 1e3
    rows = [("first call, host timer, synchronised", first, "includes lazy initialisation (cuBLAS handles, allocator)"),
            ("host timer around 20 launches, no synchronisation", host_nosync,
             "measures how fast the CPU enqueues work"),
            ("CUDA events, L2 flushed before each call (the book's method)", book, "the kernels' device time")]
    lines = ["| method | µs per call | what it really measures |", "|---|--:|---|"]
    lines += [f"| {a} | {b:,.1f} | {c} |" for a, b, c in rows]
    return md("\n".join(lines) + f"\n\n{label(version)} at B={PRIMARY['B']}, H={PRIMARY['H']}, M=N={L}, "
               f"D={PRIMARY['D']} on {torch.cuda.get_device_name()}.")


def _cache_and_start(fn, warmup: int = 5, repetitions: int = 50) -> dict:
    """Median µs of `fn` for each (L2, GPU at the start event) pair; the flush always runs first, then:
    nothing (cold, queued: the book's method), an untimed call (warm, queued), a synchronisation (cold,
    idle) or both (warm, idle). While the flush or the untimed call runs, the host enqueues the timed one."""
    sync = torch.cuda.synchronize

    def warm_idle():
        fn()
        sync()
    ways = {("cold", "queued"): None, ("warm", "queued"): fn, ("cold", "idle"): sync, ("warm", "idle"): warm_idle}
    return {w: time_cuda(fn, warmup=warmup, repetitions=repetitions, before=b).median_ms * 1e3
            for w, b in ways.items()}


def _span(values, fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"


def cache_and_launch(softmax_mb=(0.03, 8, 32, 256), L: int = 1024):
    """L2 residency and launch latency, each where it shows: `torch.softmax` over rows of 1024 float32
    scores (the baseline's middle kernel) at working sets (input + output, MB) below and above the L2,
    and the baseline at M=N=`L`, each timed with the L2 flushed or warm and with the GPU busy or idle
    when the call is enqueued. Returns the table and sentences computed from it."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    l2_mb = l2_flush_buffer().numel() / 2 / 1e6
    cases = []
    for mb in softmax_mb:
        rows = max(1, round(mb * 1e6 / 2 / 4 / 1024))
        x = torch.randn(rows, 1024, device="cuda")
        cases.append((f"softmax, {rows:,} rows of 1024", 2 * x.numel() * 4 / 1e6,
                      _cache_and_start(lambda x=x: torch.softmax(x, dim=-1))))
        del x
    q, k, v = _inputs(PRIMARY["B"], PRIMARY["H"], L, L, PRIMARY["D"], seed=1)
    call = plan(q, k, v, "baseline")
    s_mb = PRIMARY["B"] * PRIMARY["H"] * L * L * 4 / 1e6          # S and P, float32
    cases.append((f"{label('baseline')}, M=N={L}", 4 * q.numel() * 4 / 1e6 + 2 * s_mb,
                  _cache_and_start(lambda: call.run(q, k, v))))
    return md(cache_and_launch_table(cases, l2_mb, torch.cuda.get_device_name()))


def cache_and_launch_table(cases, l2_mb: float, device: str, calls: int = 50) -> str:
    """The markdown of `cache_and_launch`: one row per (name, working set MB, {(L2, start): µs}), then
    sentences computed from the rows (the smallest case first, the baseline last)."""
    lines = ["| call | working set (MB) | cold, queued (the book) | warm, queued | cold, idle | warm, idle "
             "| cold ÷ warm (queued) | idle − queued (cold, µs) |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, ws, t in cases:
        lines.append(f"| {name} | {ws:,.2f} | {t['cold', 'queued']:,.1f} | {t['warm', 'queued']:,.1f} "
                     f"| {t['cold', 'idle']:,.1f} | {t['warm', 'idle']:,.1f} "
                     f"| {t['cold', 'queued'] / t['warm', 'queued']:.2f}× "
                     f"| {t['cold', 'idle'] - t['cold', 'queued']:,.1f} |")
    gain = lambda c: c[2]["cold", "queued"] / c[2]["warm", "queued"]
    fits = [c for c in cases[1:] if c[1] <= l2_mb]              # cases[0] is the launch-latency probe
    spills = [c for c in cases[1:] if c[1] > l2_mb]
    text = [f"Times in µs (medians of {calls} calls) on {device}, whose L2 holds {l2_mb:.0f} MB."]
    for group, where in ((fits, "that fit in L2"), (spills, "larger than L2")):
        if group:
            gains = [gain(c) for c in group]
            verdict = ("warm calls are faster" if min(gains) > 1.05 else
                       "warm calls are no faster" if max(gains) < 1.05 else "warm calls are faster only in part")
            text.append(f"Working sets {where} ({', '.join(f'{c[1]:,.0f} MB' for c in group)}): cold ÷ warm = "
                        f"{_span(gains, '.2f')}, {verdict}.")
    launch = [c[2]["cold", "idle"] - c[2]["cold", "queued"] for c in cases]
    text.append(f"Starting on an idle GPU adds {_span(launch, '.1f')} µs per call (idle − queued, cold); for "
                f"{cases[0][0]} that is {launch[0] / cases[0][2]['cold', 'queued']:.1f}× its own device time.")
    base = cases[-1][2]
    text.append(f"{cases[-1][0]}: 'warm, idle' ({base['warm', 'idle']:,.1f} µs) minus the book's figure "
                f"({base['cold', 'queued']:,.1f} µs) is {base['warm', 'idle'] - base['cold', 'queued']:+,.1f} µs, "
                f"of which the idle start accounts for {base['warm', 'idle'] - base['warm', 'queued']:+,.1f} µs "
                f"and the warm cache for {base['warm', 'queued'] - base['cold', 'queued']:+,.1f} µs.")
    return "\n".join(lines) + "\n\n" + " ".join(text)


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
    """Time `versions` side by side on the same inputs (flashattn.measure.bench: CUDA events, L2 flush, median),
    or show the recorded H200 rows without a GPU."""
    versions = list(versions)
    if not gpu():
        print(NO_GPU.format(what="the latencies"))
        return recorded(versions, seq_lens, dtype, causal, D, file)
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
    base = loader.source(version)
    modules = {f"{version} (as committed)": None}
    for name, edits in variants.items():
        src = base
        for old, new in edits:
            if old not in src:
                raise ValueError(f"{version}: the text {old!r} of variant {name!r} is not in kernels/{version}.cu")
            src = src.replace(old, new)
        tag = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        modules[name] = loader.build(version, src=src, module_name=f"flashattn_{version}_{tag}")
    print(f"built {len(variants)} variant(s) of {version}.")
    if not gpu():
        print(LIVE_ONLY)
        return None
    B, H, D = PRIMARY["B"], PRIMARY["H"], PRIMARY["D"]
    q, k, v = _inputs(B, H, seq_len, seq_len, D, seed=7)
    ref = attention_reference(q[:1, :2], k[:1, :2], v[:1, :2])
    lines = ["| variant | median µs | min – max µs | calls | rel. error |", "|---|--:|--:|--:|--:|"]
    committed = plan(q, k, v, version)
    for name, mod in modules.items():
        fn = (lambda: committed.run(q, k, v)) if mod is None else (lambda m=mod: m.forward(q, k, v))
        out = fn()
        err = relative_error(out[:1, :2], ref)
        t = time_cuda(fn, warmup=warmup, repetitions=repetitions, max_seconds=2.0)
        lines.append(f"| {name} | {t.median_ms * 1e3:,.1f} | {t.min_ms * 1e3:,.1f} – {t.max_ms * 1e3:,.1f} | "
                     f"{t.calls} | {err:.1e} |")
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, B={B}, H={H}, "
               f"M=N={seq_len}, D={D}, float32; same method as `timing`.")
