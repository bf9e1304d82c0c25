"""The Decoding chapter's live cells (book/decoding.ipynb): with a CUDA GPU they run attention_with_kvcache now;
without one they say so in one line (and `time_one_shape` shows the record's row instead).
"""
from __future__ import annotations

import math

import torch

from flashattn import decode
from flashattn.book.decoding import (
    COLUMNS,
    TILE_KEYS,
    bytes_moved,
    floor_us,
    not_recorded,
    ok,
    part_rows,
    record,
)
from flashattn.book.notebook import LIVE_ONLY, NO_GPU, gpu, md
from flashattn.measure import decode_bench
from flashattn.measure.sdpa_backends import sdpa_backend_context
from flashattn.measure.timing import time_cuda
from flashattn.reference import relative_error

CASES = (
    ("lengths 1, 17 and 1023 in one batch", dict(H_q=8, H_kv=8, M=1, lengths=(1, 17, 1023), D=128)),
    ("GQA 32/8, 4 new tokens appended, causal", dict(H_q=32, H_kv=8, M=4, lengths=(300, 2045), D=128, append=True)),
    ("paged: pages of 16 rows, shuffled", dict(H_q=8, H_kv=2, M=1, lengths=(100, 777), D=64, page_size=16)),
    ("one sequence of 40,000 keys", dict(H_q=16, H_kv=16, M=1, lengths=(40000,), D=64)),
)


def _case_inputs(H_q, H_kv, M, lengths, D, page_size=None, append=False, seed=0):
    """q, the caches (paged when page_size), lengths before any append, new k and v (append) and the table."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    B = len(lengths)
    cap = max(lengths) + (M if append else 0)
    if page_size:
        cap = math.ceil(cap / page_size) * page_size

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)
    q, k_cache, v_cache = randn(B, M, H_q, D), randn(B, cap, H_kv, D), randn(B, cap, H_kv, D)
    k_new, v_new = (randn(B, M, H_kv, D), randn(B, M, H_kv, D)) if append else (None, None)
    table = None
    if page_size:
        k_cache, v_cache, table = decode.paged_copy(k_cache, v_cache, page_size, generator=g)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, lens, k_new, v_new, table


def correctness(cases=CASES):
    """attention_with_kvcache against decode.reference (float64) at odd shapes, beside SDPA's own error on the
    same bf16 inputs; without a GPU one line says the check runs live only."""
    if not gpu():
        print(LIVE_ONLY)
        return None

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines = ["| case | B, H_q / H_kv, M, lengths, D | splits (rule) | ours: rel. error | SDPA: rel. error |",
             "|---|---|--:|--:|--:|"]
    with torch.no_grad():
        for name, c in cases:
            q, kc, vc, lens, k_new, v_new, table = _case_inputs(**c)
            out = decode.attention_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=lens, block_table=table,
                                                causal=True)
            valid = lens + (c["M"] if c.get("append") else 0)
            ref = decode.reference(q, kc, vc, cache_seqlens=valid, block_table=table, causal=True)
            sdpa = decode.sdpa_reference(q, kc, vc, cache_seqlens=valid, block_table=table, causal=True)
            B = len(c["lengths"])
            splits = decode.splits_for(B, c["M"], c["H_q"], c["H_kv"], valid.tolist(), TILE_KEYS, sms)
            lengths = ", ".join(f"{x:,}" for x in valid.tolist())
            lines.append(f"| {name} | {B}, {c['H_q']} / {c['H_kv']}, {c['M']}, ({lengths}), {c['D']} | {splits} | "
                         f"{relative_error(out, ref):.1e} | {relative_error(sdpa, ref):.1e} |")
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, bf16 inputs.")


PRIMARY_SHAPE = ("batch8_16k", (8, 32, 32, 1, 16384, 128))


def _time_row(name, us, nb) -> str:
    return f"| {name} | {us:,.1f} | {nb / us / 1e6:.2f} | {100 * floor_us(nb) / us:.0f}% |"


def time_one_shape(shape=PRIMARY_SHAPE, doc: dict | None = None):
    """Ours against SDPA's cuDNN backend on the same cache (views [B, H, N, D]), timed now (CUDA events, L2
    flushed before each call, median); without a GPU one line says so and the record's row is shown."""
    name, (B, H_q, H_kv, M, N, D) = shape
    nb = bytes_moved(B, H_q, H_kv, M, [N] * B, D)
    head = ["| call | µs | TB/s | % of the floor |", "|---|--:|--:|--:|"]
    if not gpu():
        print(NO_GPU.format(what="the times"))
        doc = record() if doc is None else doc
        got = {r["column"]: r for r in part_rows(doc, "peers") if r["shape"] == name and ok(r)}
        if "ours" not in got:
            return md(not_recorded("peers"))
        lines = head + [_time_row(COLUMNS.get(c, c), got[c]["median_us"], got[c]["bytes"])
                        for c in ("ours", "cudnn") if c in got]
        return md("\n".join(lines) + f"\n\n{name}, bf16, non-causal, from the record.")

    q, k, v = decode_bench.inputs(B, H_q, H_kv, M, N, D)        # the benchmark's inputs and calls
    with torch.no_grad():
        ours = time_cuda(decode_bench.ours(q, k, v), warmup=10, repetitions=50)
        with sdpa_backend_context("sdpa_cudnn")():
            cudnn = time_cuda(decode_bench.sdpa_call(q, k, v), warmup=10, repetitions=50)
    lines = head + [_time_row("ours", ours.median_ms * 1e3, nb), _time_row("cuDNN", cudnn.median_ms * 1e3, nb)]
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}: {name}, bf16, non-causal.")
