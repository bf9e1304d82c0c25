"""Sliding-window attention in the training path: window=(left, right), FlashAttention-2's window_size,
bottom-right aligned like causal -- query row i of M sees key j of N iff
i + N - M - left <= j <= i + N - M + right, a side -1 bounding nothing; causal=True is the window (-1, 0)
and narrows any other to right = 0. v6, v7 and v8 mask it in their forward (kernels/v6.cu, v7.cu, v8.cu),
kernels/v6_backward.cu behind flashattn.attention in the backward, and flashattn.attention_varlen per
sequence.

  * CPU: every refusal before any launch, naming window (not a pair of ints, a side below -1 or past
    int32, a version without `window`), on every entry point and attention_varlen; check_window's
    normalisation; the reference's mask, output and gradients against a brute-force float64 loop over
    (i, j); baseline and sdpa against the reference; the ops' fakes with a window and make_fx carrying
    it (and leaving it out where it narrows nothing); the bindings' signatures, -1 by default.
  * GPU: forward of v6, v7, v8 (tests/test_v7.py's check_output) and gradients through flashattn.attention
    (tests/test_backward.py's compare_grads) against float64, each within twice SDPA's own error with an
    explicit boolean mask in the same dtype: windows narrower than a tile, (3, 0), (0, 5), (17, 17), and
    wider, (100, 50), (300, -1), (-1, 40), causal and not, M, N in 1, 17, 113, 203 and 1023 with M != N
    both ways, grouped heads, B, dtype and D drawn per case, poisoned outputs; rows that see no key give
    0, lse -inf and gradient 0; (-1, 0) gives causal's bits and a window past every key the unmasked
    kernel's; attention_varlen per sequence; v6's TF32 mode.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from test_backward import compare_grads
from test_gqa import gradients, make, needs, qkv, run_forward
from test_v7 import check_output
from test_varlen import LENGTHS, call_args, packed, per_sequence
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import flashattn
from flashattn import loader
from flashattn.autograd import forward_module
from flashattn.reference import (
    attention_gradients,
    attention_reference,
    baseline,
    causal_mask,
    relative_error,
    sdpa,
    window_mask,
)
from flashattn.validate import check_window
from flashattn.varlen import check_varlen

TRAINING = list(flashattn.TRAINING_VERSIONS)
NARROW = [(3, 0), (0, 5), (17, 17)]          # inside one key tile (B_c = 64 or 128)
WIDE = [(100, 50), (300, -1), (-1, 40)]      # across tiles, one side unbounded
WINDOWS = NARROW + WIDE


def brute_force_mask(M, N, causal, window):
    """The window's definition, one (i, j) at a time."""
    left, right = window[0], 0 if causal else window[1]
    mask = torch.zeros(M, N, dtype=torch.bool)
    for i in range(M):
        for j in range(N):
            mask[i, j] = (left < 0 or j >= i + N - M - left) and (right < 0 or j <= i + N - M + right)
    return mask


# ================================================================ CPU: refused before any launch
ENTRY_POINTS = [flashattn.check_inputs, flashattn.plan, flashattn.forward, flashattn.attention]
entry_points = pytest.mark.parametrize("call", ENTRY_POINTS, ids=lambda f: f.__name__)
NOT_A_PAIR = [3, (3,), (1, 2, 3), "30", None, (3.0, 0), (True, 0), (1, None), torch.tensor([3, 0])]


@entry_points
def test_window_must_be_a_pair_of_ints(call):
    for window in NOT_A_PAIR:
        with pytest.raises(TypeError, match=r"^window must be a pair of ints \(left, right\)"):
            call(*qkv(), version="v6", window=window)


@entry_points
def test_window_sides_are_minus_one_or_int32(call):
    for window in [(-2, 0), (0, -5), (-100, -100), (2**31, 0), (0, 2**40)]:
        with pytest.raises(ValueError, match=r"^window sides must be -1 \(no bound\) or 0 \.\. 2\*\*31 - 1"):
            call(*qkv(), version="v7", window=window)


@pytest.mark.parametrize("version", ["v0", "v1", "v2", "v3", "v4", "v5"])
def test_versions_without_a_window_refuse_one(version):
    q, k, v = qkv(H_kv=8, M=17, N=17, dtype=torch.float32)
    for window in [(3, 0), (-1, 0), (0, -1)]:
        with pytest.raises(ValueError, match=rf"^window is not taken by {version}; .*: baseline, sdpa, v6, v7, v8"):
            flashattn.forward(q, k, v, version=version, window=window)
        with pytest.raises(ValueError, match=rf"^window is not taken by {version}"):
            flashattn.plan(q, k, v, version, window=window)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flashattn.forward(q, k, v, version=version, window=(-1, -1))


@entry_points
def test_good_windows_reach_the_device_check(call):
    for window in [(3, 0), [0, 5], (-1, 40), (300, -1), (np.int64(17), np.int32(17)), (0, 0), (-1, -1)]:
        for causal in (False, True):
            with pytest.raises(ValueError, match="q must be a CUDA tensor"):
                call(*qkv(), version="v8", causal=causal, window=window)


@pytest.mark.parametrize("window,causal,normal", [
    ((3, 0), False, (3, 0)), ([5, -1], False, (5, -1)), ((-1, -1), False, (-1, -1)), ((-1, 40), True, (-1, 0)),
    ((17, 17), True, (17, 0)), ((-1, -1), True, (-1, 0)), ((np.int64(2), np.int8(-1)), False, (2, -1))])
def test_check_window_normalises(window, causal, normal):
    got = check_window(window, causal)
    assert got == normal and all(type(w) is int for w in got)


def test_what_each_version_takes():
    for name, info in flashattn.INFO.items():
        assert info.window == (name in ("baseline", "sdpa", *TRAINING)), name


@pytest.mark.parametrize("window,error,says", [
    ((3,), TypeError, r"^window must be a pair of ints"), ((1.5, 0), TypeError, r"^window must be a pair of ints"),
    ((0, -2), ValueError, r"^window sides must be -1"), ((2**31, 2), ValueError, r"^window sides must be -1")])
@pytest.mark.parametrize("call", [check_varlen, flashattn.attention_varlen], ids=["check", "call"])
def test_varlen_refuses_bad_windows(call, window, error, says):
    with pytest.raises(error, match=says):
        call(**call_args(window=window))


@pytest.mark.parametrize("window", [(3, 0), (-1, 5), (128, 0)])
def test_varlen_takes_a_window(window):
    with pytest.raises(ValueError, match="^q must be a CUDA tensor"):     # well formed: only the device is wrong
        flashattn.attention_varlen(**call_args(window=window, causal=True))


def test_bindings_default_the_window_to_minus_one():
    """Every existing call (`forward(q, k, v, causal, scale)`, `backward(..., deterministic, scale)`) keeps
    working: the window's two sides come last, -1 by default."""
    for kernel, functions in (("v6", ("forward", "forward_lse")), ("v7", ("forward", "forward_lse")),
                              ("v8", ("forward", "forward_lse")), ("v6_backward", ("backward",))):
        src = loader.source(kernel)
        for name in functions:
            assert loader.python_signature(src, name).endswith("scale=None, window_left=-1, window_right=-1)")
            assert 'py::arg("window_left") = -1, py::arg("window_right") = -1);' in loader.module_def(src, (name,))


# ================================================================ CPU: the reference
SIZES = [(1, 1), (1, 9), (9, 1), (9, 9), (7, 13), (13, 7)]
REF_WINDOWS = [(-1, -1), (0, 0), (3, 0), (0, 5), (2, 3), (-1, 4), (6, -1), (100, 50), (-1, 0)]


@pytest.mark.parametrize("window", REF_WINDOWS)
@pytest.mark.parametrize("M,N", SIZES)
def test_window_mask_is_the_definition(M, N, window):
    for causal in (False, True):
        mask = window_mask(M, N, causal, window)
        want = brute_force_mask(M, N, causal, window)
        if mask is None:
            assert want.all()
        else:
            assert torch.equal(mask, want)
        if window == (-1, 0) or (causal and window[0] == -1):   # causal is the window (-1, 0)
            assert torch.equal(mask, causal_mask(M, N))


def brute_force_attention(q, k, v, causal, window, scale):
    """softmax(scale * q k^T) v row by row over the keys each row sees, in float64; rows with none: 0."""
    B, H, M, D = q.shape
    H_kv, N = k.shape[1], k.shape[2]
    mask = brute_force_mask(M, N, causal, window)
    rows = []
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // (H // H_kv)], v[b, h // (H // H_kv)]
            for i in range(M):
                seen = mask[i].nonzero().flatten()
                if len(seen) == 0:
                    rows.append(q.new_zeros(D))
                    continue
                p = torch.softmax(q[b, h, i] @ kh[seen].T * scale, dim=-1)
                rows.append(p @ vh[seen])
    return torch.stack(rows).reshape(B, H, M, D)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(0, 0), (3, 0), (0, 5), (2, 3), (-1, 4), (6, -1)])
@pytest.mark.parametrize("M,N", [(1, 9), (9, 1), (9, 9), (7, 13), (13, 7)])
def test_reference_and_gradients_are_the_brute_force_loop(M, N, window, causal):
    g = torch.Generator().manual_seed(zlib.crc32(repr((M, N, window, causal)).encode()))
    q, k, v, do = (torch.randn(2, h, L, 8, dtype=torch.float64, generator=g)
                   for h, L in ((4, M), (2, N), (2, N), (4, M)))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = brute_force_attention(*leaves, causal, window, 0.3)
    torch.testing.assert_close(attention_reference(q, k, v, causal, scale=0.3, window=window), want.detach(),
                               rtol=1e-12, atol=1e-12)
    want_grads = torch.autograd.grad(want, leaves, do)
    got = attention_gradients(q, k, v, do, causal, max_chunk_bytes=2 * M * N * 8, scale=0.3, window=window)
    for a, b in zip(got, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    seen = window_mask(M, N, causal, window).any(1)
    for fn in (baseline, sdpa):   # PyTorch's own softmax: NaN on rows that see no key
        torch.testing.assert_close(fn(q, k, v, causal, 0.3, window)[:, :, seen], want.detach()[:, :, seen],
                                   rtol=1e-12, atol=1e-12)


# ================================================================ CPU: the ops, traced
def test_fakes_and_autograd_take_a_window():
    q = torch.empty(2, 8, 17, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.empty(2, 2, 5, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    o, lse = torch.ops.flashattn.attention_forward(q, k, v, False, "v7", False, 0.125, 3, 0)
    assert (o.shape, lse.shape) == (q.shape, (2, 8, 17))
    o.sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    dq, dk, dv = torch.ops.flashattn.attention_backward(q, k, v, o, lse, o, True, "v8", False, 0.25, 17, 0)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert torch.ops.flashattn.forward(q, k, v, "v6", False, None, 0, 5).shape == q.shape


def test_traces_carry_the_window_only_where_it_narrows():
    """make_fx over fake CUDA tensors: the window's sides are constants of the op, normalised (causal sets
    right = 0); a window that narrows nothing beyond causal leaves the call as it was."""
    with FakeTensorMode():
        q = torch.empty(2, 8, 17, 64, dtype=torch.float16, device="cuda")
        k = torch.empty(2, 2, 33, 64, dtype=torch.float16, device="cuda")
        calls = {
            "window": lambda a, b, c: flashattn.attention(a, b, c, window=(3, 0)),
            "causal window": lambda a, b, c: flashattn.forward(a, b, c, version="v8", causal=True, window=(17, 17)),
            "causal": lambda a, b, c: flashattn.attention(a, b, c, causal=True, window=(-1, 40)),
            "none": lambda a, b, c: flashattn.forward(a, b, c, version="v7", window=[-1, -1]),
        }
        graphs = {name: make_fx(fn)(q, k, k) for name, fn in calls.items()}
    ops = {name: [n.args[3:] for n in g.graph.nodes if n.op == "call_function" and "flashattn" in str(n.target)]
           for name, g in graphs.items()}
    assert ops == {"window": [(False, "v6", False, 0.125, 3, 0)], "causal window": [("v8", True, 0.125, 17, 0)],
                   "causal": [(True, "v6", False, 0.125)], "none": [("v7", False, 0.125)]}


# ================================================================ GPU
SHAPES = [(17, 17), (113, 203), (203, 113), (1023, 1023), (1, 203), (203, 1)]   # M, N
HEADS = [(8, 2), (4, 4), (6, 1)]   # H, H_kv
# (window, causal): causal narrows (3, 0) to itself and (-1, 40) to plain causal, so those run without it
CASES = [(w, False) for w in WINDOWS] + [(w, True) for w in WINDOWS if w not in ((3, 0), (-1, 40))]


def draw(*key):
    """A seed from the test's parameters, and from it B, the dtype, D and the heads: fixed across runs."""
    seed = zlib.crc32(repr(key).encode())
    B, dtype = (1, 2)[seed % 2], (torch.bfloat16, torch.float16)[(seed >> 1) % 2]
    return seed, B, dtype, (64, 128)[(seed >> 2) % 2], HEADS[(seed >> 3) % len(HEADS)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("window,causal", CASES)
@pytest.mark.parametrize("version", TRAINING)
def test_forward_matches_float64(version, window, causal, M, N):
    needs(version)
    seed, B, dtype, D, (H, H_kv) = draw("forward", version, window, M, N, causal)
    q, k, v, _ = make(B, H, H_kv, M, N, D, dtype, seed)
    scale = None if seed % 3 else 0.3
    check_output(run_forward(version, q, k, v, causal, scale, window), q, k, v, causal, scale, window)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(17, 17), (113, 203), (203, 113), (1023, 1023)])
@pytest.mark.parametrize("window,causal", CASES)
@pytest.mark.parametrize("version", TRAINING)
def test_gradients_match_float64(version, window, causal, M, N):
    """Both dQ modes (drawn from the seed), the forward that trained checked too."""
    needs(version)
    seed, B, dtype, D, (H, H_kv) = draw("grads", version, window, M, N, causal)
    deterministic = bool((seed >> 5) % 2)
    q, k, v, do = make(B, H, H_kv, M, N, D, dtype, seed)
    o, grads = gradients(version, q, k, v, do, causal, None, deterministic, window)
    check_output(o, q, k, v, causal, None, window)
    compare_grads(grads, q, k, v, do, causal, None, window)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", TRAINING)
def test_rows_without_keys_give_zero_and_lse_minus_inf(version, D, deterministic):
    """M > N with a narrow window (2, 0): the first M - N rows' windows end before key 0, so they see no
    key (output 0, lse -inf, dq 0), whole query tiles of them included; the others check against float64."""
    needs(version)
    M, N, window = 300, 70, (2, 0)
    q, k, v, do = make(2, 6, 2, M, N, D, torch.bfloat16, seed=D + deterministic)
    o, lse = forward_module(version).forward_lse(q, k, v, False, None, *window)
    empty = ~window_mask(M, N, False, window, q.device).any(1)
    assert empty.sum() == M - N
    assert (o[:, :, empty] == 0).all() and (lse[:, :, empty] == -float("inf")).all()
    assert torch.isfinite(lse[:, :, ~empty]).all()
    o, grads = gradients(version, q, k, v, do, False, None, deterministic, window)
    compare_grads(grads, q, k, v, do, False, None, window)   # also: dq = 0 on the empty rows


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", TRAINING)
def test_window_bits_equal_causal_and_unmasked(version, D):
    """(-1, 0) is causal (the same kernel, the same bits); a window that reaches past every key on both
    sides runs the unmasked kernel: the bits of no window. Gradients too."""
    needs(version)
    M, N = 203, 339
    q, k, v, do = make(2, 8, 2, M, N, D, torch.float16, seed=D)
    with torch.no_grad():
        causal = flashattn.forward(q, k, v, version=version, causal=True)
        full = flashattn.forward(q, k, v, version=version)
        assert torch.equal(flashattn.forward(q, k, v, version=version, window=(-1, 0)), causal)
        assert torch.equal(flashattn.forward(q, k, v, version=version, causal=True, window=(N, 40)), causal)
        assert torch.equal(flashattn.forward(q, k, v, version=version, window=(N, M)), full)
        assert torch.equal(flashattn.plan(q, k, v, version, window=(2 * N, -1)).run(q, k, v), full)
    det = [gradients(version, q, k, v, do, c, None, True, w)[1] for c, w in ((True, (-1, -1)), (False, (-1, 0)))]
    assert all(torch.equal(a, b) for a, b in zip(*det))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(3, 0), (100, 50), (-1, 40)])
@pytest.mark.parametrize("version", TRAINING)
def test_varlen_window_per_sequence(version, window, causal):
    needs(version)
    lengths = LENGTHS[0]
    seed = zlib.crc32(repr((version, window, causal)).encode())
    q, k, v, cu_q, cu_k = packed(*lengths, H=8, H_kv=2, D=64, device="cuda", seed=seed)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lengths[0]), max(lengths[1]), causal=causal,
                                     window=window, version=version)
    do = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bq) - 1):
        if bq[i + 1] == bq[i] or bk[i + 1] == bk[i]:
            continue
        qi, ki, vi, oi, doi = (per_sequence(t, b, i) for t, b in ((q, bq), (k, bk), (v, bk), (out, bq), (do, bq)))
        check_output(oi.detach(), qi.detach(), ki.detach(), vi.detach(), causal, None, window)
        got = tuple(per_sequence(g, b, i) for g, b in ((dq, bq), (dk, bk), (dv, bk)))
        compare_grads(got, qi.detach(), ki.detach(), vi.detach(), doi, causal, None, window)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [(3, 0), (17, 17), (300, -1)])
@pytest.mark.parametrize("M,N", [(113, 203), (1023, 1023)])
@pytest.mark.parametrize("D", [64, 128])
def test_tf32_mode_with_a_window(D, M, N, window):
    """v6's float32 inputs run as TF32 (tests/test_v6.py's bound: relative error <= 2e-3)."""
    q, k, v, _ = make(2, 8, 2, M, N, D, torch.float32, seed=M + D + window[0])
    out = run_forward("v6", q, k, v, False, None, window)
    assert torch.isfinite(out).all()
    assert relative_error(out, attention_reference(q, k, v, False, window=window)) <= 2e-3
