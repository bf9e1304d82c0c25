"""Runs every kernel on a small and an odd shape; tests/test_sanitizer_gpu.py runs this file under
compute-sanitizer (memcheck, then racecheck). Kernels are built before the sanitizer starts."""
import sys

import torch

import flashattn

SHAPES = [(1, 2, 64, 64, 64), (2, 1, 17, 113, 40)]       # B, H, M, N, D: a small one and an odd one


def run(versions):
    for name in versions:
        info = flashattn.INFO[name]
        for B, H, M, N, D in SHAPES:
            if info.self_attention_only:
                N = M
            if info.head_dims and D not in info.head_dims and info.fallback is None:
                D = info.head_dims[0]
            for dtype in info.dtypes:
                for causal in ((False, True) if info.causal else (False,)):
                    q = torch.randn(B, H, M, D, device="cuda", dtype=dtype)
                    k = torch.randn(B, H, N, D, device="cuda", dtype=dtype)
                    v = torch.randn(B, H, N, D, device="cuda", dtype=dtype)
                    out = flashattn.forward(q, k, v, version=name, causal=causal)
                    torch.cuda.synchronize()
                    assert torch.isfinite(out).all() or causal, (name, dtype, causal)
                    print(f"ran {name} {dtype} causal={causal} B={B} H={H} M={M} N={N} D={D}", flush=True)


if __name__ == "__main__":
    versions = sys.argv[1:] or list(flashattn.KERNEL_VERSIONS)
    if "--build-only" in versions:
        for name in flashattn.KERNEL_VERSIONS:
            flashattn.load(name)
    else:
        run(versions)
