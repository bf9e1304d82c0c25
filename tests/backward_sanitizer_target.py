"""Runs v6's forward_lse and backward (atomic and deterministic dQ) on small and odd shapes, on
grouped-query and multi-query ones with a softmax scale, and on an odd one with a sliding window;
tests/test_backward.py runs this file under compute-sanitizer (memcheck, then racecheck). The kernels are
built by the test before the sanitizer starts. `--variant NAME` runs the backward built with the macros of
flashattn.measure.variants.backward(NAME) (variant_module) instead of the default build; `--forward VERSION` takes
the log-sum-exp from that version's forward_lse (v7, v8) instead of v6's."""
import itertools
import sys

import torch

from flashattn.autograd import backward_module, forward_module

SHAPES = [(1, 2, 64, 64), (2, 1, 17, 113), (1, 2, 130, 67)]   # B, H, M, N: small, odd, M > N
# B, H, H_kv, M, N: 3 query heads per kv head over several query and key tiles; multi-query with M > N
GQA_SHAPES = [(2, 6, 2, 200, 129), (1, 4, 1, 130, 67)]
# B, H, H_kv, M, N and a window narrower than a tile, M > N so that whole query tiles see no key
WINDOW_SHAPE, WINDOW = (1, 4, 2, 203, 77), (17, 3)


def cases():
    shapes = [(B, H, H, M, N) for B, H, M, N in SHAPES] + GQA_SHAPES
    for (B, H, H_kv, M, N), D, causal in itertools.product(shapes, (64, 128), (False, True)):
        dtype = torch.float16 if (M + D) % 3 == 0 else torch.bfloat16   # both dtypes, half the launches
        yield B, H, H_kv, M, N, D, causal, dtype, (-1, -1)
    for D in (64, 128):
        yield *WINDOW_SHAPE, D, False, torch.bfloat16, WINDOW


def run(variant=None, forward="v6"):
    from flashattn.book.backward_steps import variant_module
    fwd = forward_module(forward)
    bwd = backward_module("v6") if variant is None else variant_module(variant)
    for B, H, H_kv, M, N, D, causal, dtype, window in cases():
        scale = None if H_kv == H else 0.3   # grouped shapes also with a scale other than 1/sqrt(D)
        q, do = (torch.randn(B, H, M, D, device="cuda", dtype=dtype) for _ in range(2))
        k, v = (torch.randn(B, H_kv, N, D, device="cuda", dtype=dtype) for _ in range(2))
        o, lse = fwd.forward_lse(q, k, v, causal, scale, *window)
        for deterministic in (False, True):
            grads = bwd.backward(q, k, v, o, lse, do, causal, deterministic, scale, *window)
            torch.cuda.synchronize()
            assert all(torch.isfinite(g).all() for g in grads), (B, H, H_kv, M, N, D, causal, deterministic)
        print(f"ran {forward} forward_lse + v6 backward {dtype} causal={causal} window={window} B={B} H={H} "
              f"H_kv={H_kv} M={M} N={N} D={D}", flush=True)


if __name__ == "__main__":
    def option(name, default):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default
    run(option("--variant", None), option("--forward", "v6"))
