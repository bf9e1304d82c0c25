"""Runs every kernel on a small and an odd shape, the kernels that take grouped-query heads (and a
softmax scale) on grouped and multi-query shapes too, and those that take a sliding window on an odd
windowed shape; tests/test_sanitizer.py runs this file under compute-sanitizer (memcheck, then racecheck).
Kernels are built before the sanitizer starts."""
import sys

import torch

import flashattn

SHAPES = [(1, 2, 64, 64), (2, 1, 17, 113), (1, 2, 130, 67)]   # B, H, M, N: small, odd, M > N
# B, H, H_kv, M, N: 3 query heads per kv head and a one-key tail tile per kv head; multi-query with M > N
GQA_SHAPES = [(2, 6, 2, 70, 129), (1, 4, 1, 130, 67)]
# B, H, H_kv, M, N, window: a band narrower than a key tile, M > N so that whole query tiles see no key
WINDOW_SHAPES = [(1, 4, 2, 203, 77, (17, 3))]


def head_dims(info):
    """Every head dim the kernel itself supports (a D outside them would run the fallback version
    instead); versions that take any D get 64 and an odd 40."""
    return info.head_dims or (64, 40)


def run(versions):
    for version in versions:
        info = flashattn.INFO[version]
        # (B, H, H_kv, M, N, scale); grouped shapes with a scale other than 1/sqrt(D)
        shapes = [(B, H, H, M, N, None) for B, H, M, N in SHAPES]
        shapes += [(*shape, 0.3) for shape in GQA_SHAPES] if info.gqa else []
        for B, H, H_kv, M, N, scale in shapes:
            if info.self_attention_only:
                N = M
            for D in head_dims(info):
                for dtype in info.dtypes:
                    for causal in ((False, True) if info.causal else (False,)):
                        q = torch.randn(B, H, M, D, device="cuda", dtype=dtype)
                        k = torch.randn(B, H_kv, N, D, device="cuda", dtype=dtype)
                        v = torch.randn(B, H_kv, N, D, device="cuda", dtype=dtype)
                        out = flashattn.forward(q, k, v, version=version, causal=causal, scale=scale)
                        torch.cuda.synchronize()
                        assert torch.isfinite(out).all(), (version, dtype, causal)
                        if causal and M > N:    # rows that see no key (bottom-right mask) are 0, not NaN
                            assert (out[:, :, :M - N] == 0).all(), (version, dtype, "fully masked rows")
                        print(f"ran {version} {dtype} causal={causal} B={B} H={H} H_kv={H_kv} M={M} N={N} D={D}",
                              flush=True)
        for B, H, H_kv, M, N, window in WINDOW_SHAPES if info.window and info.kernel else []:
            for D in head_dims(info):
                for dtype in info.dtypes:
                    q = torch.randn(B, H, M, D, device="cuda", dtype=dtype)
                    k, v = (torch.randn(B, H_kv, N, D, device="cuda", dtype=dtype) for _ in range(2))
                    out = flashattn.forward(q, k, v, version=version, window=window)
                    torch.cuda.synchronize()
                    assert torch.isfinite(out).all(), (version, dtype, window)
                    print(f"ran {version} {dtype} window={window} B={B} H={H} H_kv={H_kv} M={M} N={N} D={D}",
                          flush=True)

if __name__ == "__main__":
    versions = sys.argv[1:] or list(flashattn.KERNEL_VERSIONS)
    if "--build-only" in versions:
        for version in flashattn.KERNEL_VERSIONS:
            flashattn.load(version)
    else:
        run(versions)
