"""The live cells of "Attention in real models" (book/real_models.ipynb): with a CUDA GPU they run the kernels
now; without one they say so in one line.

- `correctness`: grouped heads, windows and a packed batch against float64, beside SDPA's own error;
- `time_windows`: one prefill shape with windows of several widths, each beside the tiles it runs.
"""
from __future__ import annotations

import itertools

import torch

import flashattn
from flashattn import reference
from flashattn.book.notebook import LIVE_ONLY, gpu, md
from flashattn.book.real_models import tile_counts, window_tiles
from flashattn.measure.timing import time_interleaved

# (name, B, H_q, H_kv, M, N, D, causal, window)
CASES = (
    ("grouped heads 32/8, M ≠ N", 2, 32, 8, 203, 1023, 128, True, (-1, -1)),
    ("window narrower than a tile, M ≠ N", 1, 8, 2, 1023, 113, 64, False, (17, 17)),
    ("window wider than a tile, causal", 2, 16, 16, 1025, 1025, 128, True, (300, 0)),
    ("window reaching only right", 1, 4, 1, 113, 203, 64, False, (-1, 40)),
)
VARLEN_LENGTHS = (1023, 0, 1, 17, 113)


def version() -> str:
    """The fastest training version this GPU runs: v8 on Hopper, v6 elsewhere."""
    return "v8" if torch.cuda.get_device_capability() == (9, 0) else "v6"


def _grads(o, inputs, do):
    return torch.autograd.grad(o, inputs, do)


def _row(name, dims, errors, sdpa_errors) -> str:
    ours = " / ".join(f"{e:.1e}" for e in errors)
    theirs = " / ".join(f"{e:.1e}" for e in sdpa_errors)
    return f"| {name} | {dims} | {ours} | {theirs} |"


def correctness(cases=CASES):
    """Output and gradients (o / dq / dk / dv) of flashattn.attention against float64, beside the errors of
    SDPA on the same bf16 inputs (windows as an explicit mask); then a packed batch with sequences of length 0
    and 1 through flashattn.attention_varlen."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    g = torch.Generator(device="cuda").manual_seed(0)
    v_name = version()
    lines = ["| case | B, H_q / H_kv, M, N, D, window | ours: o / dq / dk / dv | SDPA: o / dq / dk / dv |",
             "|---|---|--:|--:|"]
    for name, B, H_q, H_kv, M, N, D, causal, window in cases:
        q = torch.randn(B, H_q, M, D, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
        k, v = (torch.randn(B, H_kv, N, D, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
                for _ in range(2))
        do = torch.randn(B, H_q, M, D, device="cuda", generator=g, dtype=torch.bfloat16)
        ref = reference.attention_reference(q, k, v, causal, window=window)
        ref_grads = reference.attention_gradients(q, k, v, do, causal, window=window)
        errors, sdpa_errors = [], []
        ours = flashattn.attention(q, k, v, causal=causal, version=v_name, window=window)
        theirs = reference.sdpa(q, k, v, causal, window=window)
        for o, out in ((ours, errors), (theirs, sdpa_errors)):
            out.append(reference.relative_error(o, ref))
            out += [reference.relative_error(a, b) for a, b in zip(_grads(o, (q, k, v), do), ref_grads)]
        dims = f"{B}, {H_q} / {H_kv}, {M}, {N}, {D}, {window}{' causal' if causal else ''}"
        lines.append(_row(name, dims, errors, sdpa_errors))
    lines.append(_varlen_row(g, v_name))
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()} by {v_name}, bf16 inputs; "
              "relative errors (norm of the difference over the norm of the float64 result).")


def _varlen_row(g, v_name: str) -> str:
    H_q, H_kv, D = 8, 2, 128
    total = sum(VARLEN_LENGTHS)
    q = torch.randn(total, H_q, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(total, H_kv, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(VARLEN_LENGTHS)], dtype=torch.int32, device="cuda")
    longest = max(VARLEN_LENGTHS)
    o = flashattn.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, version=v_name)
    worst = sdpa_worst = 0.0
    for start, n in zip(cu.tolist(), VARLEN_LENGTHS):
        if n == 0:
            continue
        qi, ki, vi = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))
        ref = reference.attention_reference(qi, ki, vi, True)
        worst = max(worst, reference.relative_error(o[start:start + n].transpose(0, 1)[None], ref))
        sdpa_worst = max(sdpa_worst, reference.relative_error(reference.sdpa(qi, ki, vi, True), ref))
    return _row("packed batch, worst sequence (forward)", f"lengths {VARLEN_LENGTHS}, {H_q} / {H_kv}, {D}, causal",
                [worst], [sdpa_worst])


def time_windows(B: int = 1, H_q: int = 32, H_kv: int = 8, N: int = 8192, D: int = 128, lefts=(-1, 4096, 1024, 256)):
    """flashattn.forward (causal) with sliding windows of `lefts` keys (-1: causal alone), one interleaved run
    (CUDA events, L2 flushed, median), each beside the tiles it runs relative to causal alone."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    v_name = version()
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(B, H_q, N, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(B, H_kv, N, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    calls = {left: (lambda left=left: flashattn.forward(q, k, v, version=v_name, causal=True, window=(left, 0)),
                    None) for left in lefts}
    with torch.no_grad():
        timed = time_interleaved({str(k_): (fn, torch.no_grad) for k_, (fn, _) in calls.items()}, warmup=5,
                                 repetitions=30, rounds=3, max_seconds=1.0)
    base_tiles = None
    lines = ["| window | tiles run | relative to causal | µs | relative to causal |", "|---|--:|--:|--:|--:|"]
    base_us = timed[str(lefts[0])].summary()["median_us"]
    for left in lefts:
        c = tile_counts(window_tiles(N, N, 128, 128, left, 0))
        run = c["unmasked"] + c["masked"]
        base_tiles = base_tiles or run
        us = timed[str(left)].summary()["median_us"]
        label = "causal" if left < 0 else f"({left}, 0)"
        lines.append(f"| {label} | {run} | {run / base_tiles:.2f} | {us:,.1f} | {us / base_us:.2f} |")
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}: {v_name}, B = {B}, "
              f"{H_q} / {H_kv} heads, N = {N}, D = {D}, bf16; tiles of 128 × 128 per (batch, head).")
