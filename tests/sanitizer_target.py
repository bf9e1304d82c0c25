"""Runs every kernel on a small and an odd shape; tests/test_sanitizer.py runs this file under
compute-sanitizer (memcheck, then racecheck). Kernels are built before the sanitizer starts."""
import sys

import torch

import flashattn

SHAPES = [(1, 2, 64, 64), (2, 1, 17, 113), (1, 2, 130, 67)]   # B, H, M, N: small, odd, M > N


def head_dims(info):
    """Every head dim the kernel itself supports (a D outside them would run the fallback version
    instead); versions that take any D get 64 and an odd 40."""
    return info.head_dims or (64, 40)


def run(versions):
    for version in versions:
        info = flashattn.INFO[version]
        for B, H, M, N in SHAPES:
            if info.self_attention_only:
                N = M
            for D in head_dims(info):
                for dtype in info.dtypes:
                    for causal in ((False, True) if info.causal else (False,)):
                        q = torch.randn(B, H, M, D, device="cuda", dtype=dtype)
                        k = torch.randn(B, H, N, D, device="cuda", dtype=dtype)
                        v = torch.randn(B, H, N, D, device="cuda", dtype=dtype)
                        out = flashattn.forward(q, k, v, version=version, causal=causal)
                        torch.cuda.synchronize()
                        assert torch.isfinite(out).all(), (version, dtype, causal)
                        if causal and M > N:    # rows that see no key (bottom-right mask) are 0, not NaN
                            assert (out[:, :, :M - N] == 0).all(), (version, dtype, "fully masked rows")
                        print(f"ran {version} {dtype} causal={causal} B={B} H={H} M={M} N={N} D={D}", flush=True)

if __name__ == "__main__":
    versions = sys.argv[1:] or list(flashattn.KERNEL_VERSIONS)
    if "--build-only" in versions:
        for version in flashattn.KERNEL_VERSIONS:
            flashattn.load(version)
    else:
        run(versions)
