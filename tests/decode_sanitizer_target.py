"""Runs attention_with_kvcache on small and odd cases; tests/test_decode.py runs this file under
compute-sanitizer (memcheck, racecheck, synccheck). Arguments: -D flags of the build to run (none: the
default build), e.g. -DDECODE_FUSED_MERGE=1, whose calls here share one set of counters one after another."""
import sys

import torch

import flashattn
from flashattn import decode


def run(flags=()):
    attention = decode.variant(tuple(flags)) if flags else flashattn.attention_with_kvcache
    lengths = torch.tensor([0, 1, 130], dtype=torch.int32, device="cuda")
    for D in (64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            for M, H_q, H_kv, splits in ((1, 4, 4, 1), (3, 8, 2, 3)):
                q = torch.randn(3, M, H_q, D, device="cuda", dtype=dtype)
                k_cache, v_cache = (torch.randn(3, 200, H_kv, D, device="cuda", dtype=dtype) for _ in range(2))
                new = torch.randn(3, 1, H_kv, D, device="cuda", dtype=dtype)
                out = attention(q, k_cache, v_cache, k=new, v=new, cache_seqlens=lengths, num_splits=splits)
                pages = k_cache.view(3 * 25, 8, H_kv, D), v_cache.view(3 * 25, 8, H_kv, D)
                table = torch.arange(75, device="cuda", dtype=torch.int32).flip(0).view(3, 25)
                paged = attention(q, *pages, cache_seqlens=lengths, block_table=table, causal=False,
                                  num_splits=splits)
                bad_table = table.clone()
                bad_table[1, 0], bad_table[2, 3] = -4, 10**6       # outside the pool: clamped, never read past
                bad_lengths = torch.tensor([10**6, -3, 7], dtype=torch.int32, device="cuda")
                unchecked = attention(q, *pages, cache_seqlens=bad_lengths, block_table=bad_table,
                                      num_splits=splits, validate=False)
                torch.cuda.synchronize()
                assert torch.isfinite(out).all() and torch.isfinite(paged).all() and torch.isfinite(unchecked).all()
                print(f"ran decode {dtype} D={D} M={M} H={H_q}/{H_kv} splits={splits}", flush=True)


if __name__ == "__main__":
    run(sys.argv[1:])
