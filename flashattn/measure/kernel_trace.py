"""Kernel by kernel, from CUPTI: what each launch of a call takes on the GPU, and the span of the call.

`profile_call(fn)` runs `fn()` under `torch.profiler` (CUPTI records every kernel's start and end on the GPU),
each call after the L2 flush of flashattn.measure.timing (and, with `slack_us`, after the same spin kernel
the benchmarks queue). The flush's and the spin's own kernels, found by profiling them alone first,
separate one call's kernels from the next. Per kernel position it returns the median, minimum and maximum
duration; `profile_spans` also returns the median span of a call, from the start of its first kernel to
the end of its last: what a call costs on the GPU with the gaps between its kernels, but without the
event-to-kernel latency that CUDA-event timing includes.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from flashattn.measure.timing import l2_flush_buffer, spin, warm_up

Kernel = tuple[str, float, float]          # name, start (us), duration (us)


def kernels(prof) -> list[Kernel]:
    """(name, start us, duration us) of every GPU kernel in a finished profile, in start order, read from
    its Chrome trace (a stable format across PyTorch versions)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return trace_kernels(json.loads(path.read_text()))


def trace_kernels(doc: dict) -> list[Kernel]:
    """(name, start us, duration us) of every GPU kernel of a Chrome trace's document, in start order."""
    ks = [(e["name"], float(e["ts"]), float(e["dur"])) for e in doc.get("traceEvents", [])
          if isinstance(e, dict) and e.get("cat") == "kernel" and "dur" in e]
    return sorted(ks, key=lambda k: k[1])


def calls_between(trace: list[Kernel], separators: set[str]) -> list[list[Kernel]]:
    """The kernels between separator kernels (the L2 flush), one list per call; kernels before the first
    separator are dropped."""
    calls, current = [], None
    for k in trace:
        if k[0] in separators:
            if current:
                calls.append(current)
            current = []
        elif current is not None:
            current.append(k)
    if current:
        calls.append(current)
    return calls


def split_calls(trace: list[Kernel], separators: set[str]) -> list[list[tuple[str, float]]]:
    """calls_between, with (name, duration us) per kernel."""
    return [[(name, dur) for name, _, dur in call] for call in calls_between(trace, separators)]


def summarize_calls(calls: list[list[tuple[str, float]]]) -> list[dict]:
    """Per kernel position: name and median/min/max us over calls. Every call must launch the same
    kernels in the same order, else the positions would mix different kernels."""
    if not calls:
        raise RuntimeError("the profiler recorded no kernel between the L2 flushes")
    names = [n for n, _ in calls[0]]
    for c in calls[1:]:
        if [n for n, _ in c] != names:
            raise RuntimeError(f"calls launched different kernels: {names} against {[n for n, _ in c]}")
    out = []
    for i, name in enumerate(names):
        t = [c[i][1] for c in calls]
        out.append(dict(position=i, name=name, median_us=statistics.median(t), min_us=min(t), max_us=max(t)))
    return out


def span_us(call: list[Kernel]) -> float:
    """From the start of a call's first kernel to the end of its last."""
    return max(start + dur for _, start, dur in call) - call[0][1]


def profile_spans(fn, calls: int = 10, warmup: int = 3, slack_us: float = 0.0) -> tuple[list[dict], float]:
    """(per-kernel medians, median span in us) of `fn()` over `calls` profiled calls, each after an L2
    flush and a spin of `slack_us`."""
    flush = l2_flush_buffer()
    with profile(activities=[ProfilerActivity.CUDA]) as alone:     # which kernels the flush and spin launch
        for _ in range(3):
            flush.zero_()
            spin(slack_us)
        torch.cuda.synchronize()
    separators = {name for name, _, _ in kernels(alone)}
    if not separators:
        raise RuntimeError("the profiler saw no kernel of the L2 flush, so calls cannot be told apart")
    warm_up(fn, warmup)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            spin(slack_us)
            fn()
        flush.zero_()
        torch.cuda.synchronize()
    per_call = calls_between(kernels(prof), separators)
    rows = summarize_calls([[(name, dur) for name, _, dur in call] for call in per_call])
    return rows, statistics.median(span_us(call) for call in per_call)


def profile_call(fn, calls: int = 10, warmup: int = 3) -> list[dict]:
    """Per-kernel medians of `fn()` over `calls` profiled calls, each after an L2 flush."""
    return profile_spans(fn, calls, warmup)[0]
