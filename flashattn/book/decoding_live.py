"""The Decoding chapter's live cells (book/decoding.ipynb): with a CUDA GPU they run attention_with_kvcache now;
without one they say so in one line (and `time_one_shape` shows the record's row instead).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flashattn import decode
from flashattn.book.decoding import (
    COLUMNS,
    ROWS,
    TILE_KEYS,
    bytes_moved,
    floor_us,
    not_recorded,
    ok,
    part_rows,
    record,
    rule,
)
from flashattn.book.notebook import LIVE_ONLY, NO_GPU, gpu, md
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
        per_seq = cap // page_size
        table = torch.randperm(B * per_seq, device="cuda", generator=g).to(torch.int32).view(B, per_seq)
        pools = []
        for cache in (k_cache, v_cache):
            pool = torch.empty(B * per_seq, page_size, H_kv, D, dtype=cache.dtype, device="cuda")
            pool[table.flatten().long()] = cache.view(B * per_seq, page_size, H_kv, D)
            pools.append(pool)
        k_cache, v_cache = pools
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, lens, k_new, v_new, table


def _sdpa_per_sequence(q, k_cache, v_cache, valid, table):
    """SDPA (PyTorch's own choice of backend) on each sequence's valid keys, bottom-right causal."""
    out = []
    M, H_q = q.shape[1], q.shape[2]
    for b, L in enumerate(valid.tolist()):
        if table is None:
            keys, values = k_cache[b, :L], v_cache[b, :L]
        else:
            keys, values = (c[table[b].long()].flatten(0, 1)[:L] for c in (k_cache, v_cache))
        visible = torch.arange(L, device=q.device)[None, :] <= (L - M + torch.arange(M, device=q.device))[:, None]
        y = F.scaled_dot_product_attention(q[b:b + 1].transpose(1, 2), keys[None].transpose(1, 2),
                                           values[None].transpose(1, 2), attn_mask=visible,
                                           enable_gqa=H_q != keys.shape[1])
        out.append(y.transpose(1, 2))
    return torch.cat(out)


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
            sdpa = _sdpa_per_sequence(q, kc, vc, valid, table)
            B = len(c["lengths"])
            splits = rule([math.ceil(n / TILE_KEYS) for n in valid.tolist()],
                          c["H_kv"] * math.ceil(c["M"] * c["H_q"] // c["H_kv"] / ROWS), sms)
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

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, M, H_q, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, N, H_kv, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with torch.no_grad():
        ours = time_cuda(lambda: decode.attention_with_kvcache(q, k, v, causal=False), warmup=10, repetitions=50)
        with sdpa_backend_context("sdpa_cudnn")():
            cudnn = time_cuda(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=H_q != H_kv), warmup=10,
                              repetitions=50)
    lines = head + [_time_row("ours", ours.median_ms * 1e3, nb), _time_row("cuDNN", cudnn.median_ms * 1e3, nb)]
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}: {name}, bf16, non-causal.")
