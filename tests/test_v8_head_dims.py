"""v8's head dims beyond 64 and 128: the wide ones, D = 192 and 256 (Gemma's 256, forward only), and D = 96
(Phi-3's), which runs D = 128's tiles with columns 96 .. 127 read as zeros, forward and backward: the
kernel's instances, the refusals of what it still does not take, and (on a Hopper GPU) what the instances
compute.

CPU tests (no GPU): D = 80, 160 and 320 are refused naming head_dim, and so is a call at D = 192 or 256
whose inputs require grad (the backward kernels take 64, 96 and 128), or at D = 96 through V6's backward,
before any launch. That the instances compile for sm_90a as their flags ask, without spills or a stack
frame, is tests/test_v8.py's compile test, which covers every head dim.

GPU tests (compute capability 9.0 only): forward and forward_lse against float64, error at most twice
what PyTorch's SDPA makes in the same dtype (test_v7.check_output): odd shapes, M != N both ways, several B
and H, causal, a sliding window, grouped-query heads, large logits, more items than SMs, poisoned outputs;
the varlen forward at D = 256 and at D = 96, with sequences of 0 and 1 tokens; gradients at D = 96 through
`flashattn.attention` and `attention_varlen` against float64 (tests/test_v8_backward.py runs the backward
kernel's own tests at 96 too); and compute-sanitizer (memcheck, racecheck, synccheck) at D = 256 and 96,
running this file as its own driver (`python tests/test_v8_head_dims.py --sanitize`).
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path
from unittest import mock

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import conftest  # noqa: E402
from test_backward_choice import check_attention_grads  # noqa: E402
from test_v7 import check_output, is_hopper  # noqa: E402

import flashattn  # noqa: E402
from flashattn import reference  # noqa: E402
from flashattn.varlen import check_varlen  # noqa: E402

WIDE = [D for D in flashattn.INFO["v8"].head_dims if D > 128]
PADDED = [D for D in flashattn.INFO["v8"].head_dims if D % 64]   # on the next panel's tiles
NEW = PADDED + WIDE                                              # the forward tests' dims
BACKWARD_DIMS = flashattn.INFO["v8"].backward_head_dims


def test_wide_dims_are_v8s_new_ones():
    assert WIDE == [192, 256] and PADDED == [96]
    assert set(BACKWARD_DIMS) < set(flashattn.INFO["v8"].head_dims) and 96 in BACKWARD_DIMS


# ================================================================ CPU: refusals, before any launch
def qkv(D, M=17, N=33, H=2, H_kv=2, device="cpu", grad=False):
    return tuple(torch.randn(1, h, L, D, device=device, dtype=torch.bfloat16).requires_grad_(grad)
                 for h, L in ((H, M), (H_kv, N), (H_kv, N)))


@pytest.mark.parametrize("D", [80, 160, 320])
def test_head_dims_without_a_tile_are_refused(D):
    with pytest.raises(ValueError, match=rf"^head_dim D={D} is not supported by v8; it takes D in \(64, 96, 128, "
                                         r"192, 256\)"):
        flashattn.check_inputs(*qkv(D), "v8")


@pytest.mark.parametrize("D", WIDE)
def test_wide_dims_pass_validation(D):
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):   # the next check, not head_dim's
        flashattn.check_inputs(*qkv(D), "v8")


def refuses_before_launch():
    """Patches: inputs on the CPU pass the input checks (check_call, with the default window), and any launch
    fails the test."""
    def launched(*args, **kwargs):
        pytest.fail("a kernel was called for inputs that should have been refused")
    return (mock.patch("flashattn.autograd.check_call", return_value=("v8", (-1, -1))),
            mock.patch("flashattn.autograd.attention_forward", launched),
            mock.patch("flashattn.autograd.kernel_forward", launched))


@pytest.mark.parametrize("backward", [None, "v8_backward"])
@pytest.mark.parametrize("D", WIDE)
def test_gradients_at_a_wide_dim_are_refused_naming_head_dim(D, backward):
    q, k, v = qkv(D, grad=True)
    a, b, c = refuses_before_launch()
    with a, b, c, pytest.raises(ValueError, match=rf"^head_dim D={D} has no backward in v8: its backward kernels "
                                                  rf"take D in \(64, 96, 128\)"):
        flashattn.attention(q, k, v, version="v8", backward=backward)
    with a, b, c, pytest.raises(ValueError, match=rf"^head_dim D={D} has no backward"):
        flashattn.forward(q, k, v, version="v8")


def test_gradients_at_96_through_v6s_backward_are_refused():
    """V6's backward (which v8 also trains on, by name) has no D = 96: refused before the forward runs."""
    q, k, v = qkv(96, grad=True)
    a, b, c = refuses_before_launch()
    with a, b, c, pytest.raises(ValueError, match=r"^head_dim D=96 has no backward in v6_backward \(training v8\): "
                                                  r"its backward kernels take D in \(64, 128\)"):
        flashattn.attention(q, k, v, version="v8", backward="v6_backward")


def packed(D, lengths=(3, 0, 1, 7), H=4, H_kv=2, device="cpu", grad=False, dtype=torch.bfloat16, seed=0):
    """q [total, H, D], k and v [total, H_kv, D] and the cumulative lengths (the same for q and k)."""
    g = torch.Generator(device=device).manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, H, D, generator=g, device=device).to(dtype).requires_grad_(grad)
    k, v = (torch.randn(total, H_kv, D, generator=g, device=device).to(dtype).requires_grad_(grad)
            for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, cu, cu, max(lengths), max(lengths)


@pytest.mark.parametrize("D", WIDE)
def test_varlen_gradients_at_a_wide_dim_are_refused(D):
    with pytest.raises(ValueError, match=rf"^head_dim D={D} has no backward in v8"):
        check_varlen(*packed(D, grad=True))
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):   # without grad: past head_dim
        check_varlen(*packed(D))
    with pytest.raises(ValueError, match=r"^head_dim D=80 is not supported by v8"):
        check_varlen(*packed(80))


# ================================================================ GPU: what the instances compute
needs_hopper = pytest.mark.skipif(not is_hopper(), reason="v8 needs a GPU of compute capability 9.0")
DTYPES = conftest.HALF_DTYPES
SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (1, 1023), (1023, 17), (1023, 1023)]   # M, N


@pytest.fixture(scope="module")
def v8():
    return flashattn.load("v8")


@pytest.fixture(scope="module")
def train():
    from flashattn.autograd import forward_module
    return forward_module("v8")


def inputs(B, H, H_kv, M, N, D, dtype, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, H, M, D, device="cuda", generator=g) * q_scale).to(dtype)
    k, v = (torch.randn(B, H_kv, N, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    conftest.poison_allocator(q)   # the output's future memory holds NaN: a forgotten element stays NaN
    return q, k, v


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("B,H", [(1, 1), (2, 3)])
@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", NEW)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_matches_float64(v8, dtype, D, causal, M, N, B, H):
    seed = zlib.crc32(repr(("wide", dtype, D, causal, M, N, B, H)).encode())
    q, k, v = inputs(B, H, H, M, N, D, DTYPES[dtype], seed)
    check_output(v8.forward(q, k, v, causal), q, k, v, causal)


def lse_reference(q, k, causal, scale, window=(-1, -1)):
    """ln(sum_j exp(scale * q_i k_j)) over the visible keys, float64 (-inf for a row that sees none)."""
    kf = reference.expand_heads(k.double(), q.shape[1])
    scores = q.double() @ kf.transpose(2, 3) * scale
    mask = reference.window_mask(q.shape[2], k.shape[2], causal, window, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.logsumexp(scores, dim=-1)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("M,N", [(113, 203), (203, 113), (1023, 17)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", NEW)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_lse_matches_float64_and_forward(v8, train, dtype, D, causal, M, N):
    seed = zlib.crc32(repr(("wide lse", dtype, D, causal, M, N)).encode())
    q, k, v = inputs(2, 4, 2, M, N, D, DTYPES[dtype], seed)
    o, lse = train.forward_lse(q, k, v, causal, None, -1, -1)
    check_output(o, q, k, v, causal)
    assert torch.equal(o, v8.forward(q, k, v, causal)), "forward_lse's o differs from forward's"
    ref = lse_reference(q, k, causal, D ** -0.5)
    seen = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), seen) and (lse[~seen] == float("-inf")).all()
    assert (lse.double()[seen] - ref[seen]).abs().max().item() < 1e-3 * max(1.0, ref[seen].abs().max().item())


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("window", [(17, 3), (100, -1), (0, 0)], ids=str)
@pytest.mark.parametrize("D", NEW)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_sliding_window_and_grouped_heads(v8, dtype, D, window):
    """A window narrower than a key tile, one open on the right, the diagonal alone; H_q = 4 H_kv; M > N
    puts whole query tiles past the keys."""
    for M, N in [(203, 77), (113, 1023)]:
        seed = zlib.crc32(repr(("wide window", dtype, D, window, M, N)).encode())
        q, k, v = inputs(2, 8, 2, M, N, D, DTYPES[dtype], seed)
        check_output(v8.forward(q, k, v, False, 0.3, *window), q, k, v, False, 0.3, window)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", NEW)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_large_logits(v8, dtype, D, causal):
    # q x 20: scores far beyond exp's range without the running max
    seed = zlib.crc32(repr(("wide logits", dtype, D, causal)).encode())
    q, k, v = inputs(2, 2, 2, 300, 517, D, DTYPES[dtype], seed, q_scale=20.0)
    check_output(v8.forward(q, k, v, causal), q, k, v, causal)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("D", NEW)
def test_persistent_blocks_take_several_items(v8, D):
    """More items than SMs: the K/V ring, Q_i's reuse and the ping-pong turns carry over between items."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B, H, M, N = 4, 20, 300, 517
    assert B * H * -(-M // 128) > sms
    for causal in (False, True):
        seed = zlib.crc32(repr(("wide persistent", D, causal)).encode())
        q, k, v = inputs(B, H, H, M, N, D, torch.bfloat16, seed)
        check_output(v8.forward(q, k, v, causal), q, k, v, causal)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("D", WIDE)
def test_public_api_runs_the_forward_and_refuses_gradients(D):
    q, k, v = inputs(1, 4, 2, 113, 203, D, torch.bfloat16, seed=D)
    check_output(flashattn.attention(q, k, v, causal=True, version="v8"), q, k, v, True)
    with torch.no_grad():
        check_output(flashattn.forward(q, k, v, version="v8"), q, k, v, False)
    for t in (q, k, v):
        t.requires_grad_(True)
    with pytest.raises(ValueError, match=rf"^head_dim D={D} has no backward in v8"):
        flashattn.attention(q, k, v, version="v8")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("B,H,H_kv,M,N,causal,window,deterministic", [
    (2, 3, 3, 113, 203, False, (-1, -1), False),
    (1, 8, 2, 203, 113, True, (-1, -1), False),
    (1, 4, 1, 1023, 1025, True, (-1, -1), True),
    (1, 6, 2, 300, 517, False, (40, 8), False),
    (2, 2, 2, 1, 17, False, (-1, -1), False),
    (1, 4, 4, 17, 1, True, (-1, -1), False),
])
def test_gradients_at_96_match_float64(B, H, H_kv, M, N, causal, window, deterministic):
    """D = 96 trains (v8's forward and kernels/v8_backward.cu, both on 128-wide tiles with zero columns) through
    the path a user calls; outputs and gradients poisoned first."""
    check_attention_grads(("d96 grads", deterministic), B, H, H_kv, M, N, 96, causal, window, check_forward=True,
                          version="v8", deterministic=deterministic)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_varlen_forward_at_256(dtype, causal):
    """A packed batch with sequences of 0 and 1 tokens, M != N per sequence both ways, grouped heads."""
    lengths_q, lengths_k = (17, 1, 0, 113, 203, 1, 5), (17, 1, 4, 203, 113, 0, 1)
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr(("wide varlen", dtype, causal)).encode()))
    q = torch.randn(sum(lengths_q), 8, 256, generator=g, device="cuda").to(DTYPES[dtype])
    k, v = (torch.randn(sum(lengths_k), 2, 256, generator=g, device="cuda").to(DTYPES[dtype]) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for n in (lengths_q, lengths_k))
    conftest.poison_allocator(q)
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lengths_q)):
        oi, qi = (t[bq[i]:bq[i + 1]].transpose(0, 1).unsqueeze(0) for t in (out, q))
        ki, vi = (t[bk[i]:bk[i + 1]].transpose(0, 1).unsqueeze(0) for t in (k, v))
        if qi.shape[2] == 0:
            continue
        if ki.shape[2] == 0:   # no key: output 0
            assert (oi == 0).all()
            continue
        check_output(oi, qi, ki, vi, causal)


# ---------------------------------------------------------------- compute-sanitizer
# B, H, H_kv, M, N: a small square one; odd tails both ways with grouped heads and M > N (causal: rows
# that see no key)
SANITIZE_SHAPES = [(1, 2, 2, 64, 64), (2, 4, 1, 130, 67)]


SANITIZE_DIMS = [256, 96]   # the widest, and the padded one (its backward: tests/test_v8_backward.py)


def sanitize_target() -> None:
    """What the sanitizer runs: forward at D = 256 and 96 for each shape, dtype and mask, forward_lse on the
    odd shape, one line per call so that a report names the call before it."""
    from flashattn.autograd import forward_module
    v8, train = flashattn.load("v8"), forward_module("v8")
    for D in SANITIZE_DIMS:
        for B, H, H_kv, M, N in SANITIZE_SHAPES:
            for dtype in DTYPES.values():
                for causal in (False, True):
                    q, k, v = inputs(B, H, H_kv, M, N, D, dtype, seed=M)
                    out = v8.forward(q, k, v, causal)
                    if M != N:
                        out, _ = train.forward_lse(q, k, v, causal, None, -1, -1)
                    torch.cuda.synchronize()
                    assert torch.isfinite(out).all()
                    print(f"ran v8 {dtype} causal={causal} B={B} H={H} H_kv={H_kv} M={M} N={N} D={D}", flush=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_clean_at_256_and_96(tool):
    from flashattn.autograd import forward_module
    flashattn.load("v8"), forward_module("v8")   # outside the sanitizer: nvcc under it is slow
    out, ran = conftest.run_sanitized(tool, Path(__file__).resolve(), "--sanitize", tag="ran v8 ")
    assert len(ran) == len(SANITIZE_DIMS) * len(SANITIZE_SHAPES) * len(DTYPES) * 2, out[-4000:]


if __name__ == "__main__" and "--sanitize" in sys.argv:
    sanitize_target()
