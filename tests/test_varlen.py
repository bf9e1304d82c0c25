"""flashattn.attention_varlen: packed sequences of different lengths in FlashAttention-2's conventions.

CPU: every bad argument (cu_seqlens not int32, decreasing, not starting at 0, not ending at the packed length,
of a different batch than the other; max_seqlen too small; a bad window; heads that do not divide; a dtype or
head dim the version does not take; a CPU tensor among CUDA ones) raises before any launch, naming it;
validate=False skips the checks of the lengths' values and only those. GPU: each sequence's rows of the
output and of dq, dk, dv against float64 on that sequence alone, within twice SDPA's own error
(tests/test_v7.py's check_output, tests/test_backward.py's compare_grads): lengths 0, 1, 17, 113, 203 and 1023
in one batch, M != N both ways, causal and not, grouped heads, a scale; sequences without keys give 0 and
gradient 0. Windows per sequence: tests/test_window.py.

v8's single launch (flashattn.varlen_kernel; its index arithmetic on the CPU: tests/test_varlen_bounds.py and,
for the backward, tests/test_varlen_backward_bounds.py), GPU only: both dtypes, every head dim, causal, windows,
grouped heads against float64 per sequence, forward and gradients; o and lse bit-identical to v8's
fixed-length kernel on each sequence alone, and the gradients to the per-sequence backward (dK and dV bit for
bit; dQ too in the deterministic mode); validate=False making no synchronising call (torch.cuda's sync debug
mode), forward or backward, and capturing in a CUDA graph; bad lengths on the GPU still refused by name with
validate=True; compute-sanitizer's memcheck, racecheck and synccheck clean on a packed batch, forward and
backward, both modes. CPU: the backward's build exports backward_varlen and checks before the GPU.
"""
from __future__ import annotations

import itertools
import sys
import zlib
from pathlib import Path

import conftest
import pytest
import torch
from test_backward import compare_grads
from test_v7 import check_output, is_hopper

import flashattn
from flashattn import varlen_kernel as vk
from flashattn.autograd import attention_forward
from flashattn.varlen import check_varlen


def packed(lengths_q, lengths_k, H=4, H_kv=2, D=64, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), H, D, generator=g).to(dtype)
    k, v = (torch.randn(sum(lengths_k), H_kv, D, generator=g).to(dtype) for _ in range(2))
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
          for lens in (lengths_q, lengths_k)]
    return [t.to(device) for t in (q, k, v, *cu)]


def call_args(lengths_q=(3, 7), lengths_k=(5, 7), **kw):
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q),
                max_seqlen_k=max(lengths_k))
    args.update(kw)
    return args


# ================================================================ CPU: refused before any launch
BAD = [
    (dict(cu_seqlens_q=torch.tensor([0, 3, 10], dtype=torch.int64)), TypeError, "^cu_seqlens_q must be int32"),
    (dict(cu_seqlens_q=[0, 3, 10]), TypeError, "^cu_seqlens_q must be an int32 torch.Tensor"),
    (dict(cu_seqlens_k=torch.tensor([0, 8, 5, 12], dtype=torch.int32)), ValueError, "^cu_seqlens_k has 4 entries"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 3], dtype=torch.int32)), ValueError, "^cu_seqlens_q must not decrease"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 10], dtype=torch.int32)), ValueError, "^cu_seqlens_q must start at 0"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 11], dtype=torch.int32)), ValueError,
     "^cu_seqlens_k must end at the packed length 12"),
    (dict(cu_seqlens_q=torch.tensor([[0, 3, 10]], dtype=torch.int32)), ValueError, "^cu_seqlens_q must be 1-D"),
    (dict(max_seqlen_q=6), ValueError, r"^max_seqlen_q must be an int at least the longest sequence \(7\)"),
    (dict(max_seqlen_k=7.0), ValueError, "^max_seqlen_k must be an int"),
    (dict(window=(128, -2)), ValueError, r"^window sides must be -1"),
    (dict(scale=-1.0), ValueError, "^scale must be a finite number > 0"),
    (dict(causal=1), TypeError, "^causal must be a bool"),
    (dict(version="v4"), ValueError, "^version must be one of v6, v7, v8"),
    (dict(q=torch.randn(10, 3, 64, dtype=torch.bfloat16)), ValueError, "^k has 2 heads, which must divide q's 3"),
    (dict(q=torch.randn(10, 4, 32, dtype=torch.bfloat16)), ValueError, "^k must have q's head_dim"),
    (dict(q=torch.randn(10, 4, 64)), TypeError, "^q, k and v must share one dtype"),
    (dict(q=torch.randn(10, 64, dtype=torch.bfloat16)), ValueError, r"^q must have rank 3 \[total_tokens"),
    (dict(v=torch.randn(12, 1, 64, dtype=torch.bfloat16)), ValueError, "^v must have the shape of k"),
    (dict(q=torch.randn(10, 4, 64), k=torch.randn(12, 2, 64), v=torch.randn(12, 2, 64)), TypeError,
     "^q has dtype float32; v8 takes"),
    (dict(q=torch.randn(10, 4, 32).bfloat16(), k=torch.randn(12, 2, 32).bfloat16(),
          v=torch.randn(12, 2, 32).bfloat16()), ValueError, r"^head_dim D=32 is not supported by v8"),
    (dict(validate=1), TypeError, "^validate must be a bool"),
    ({}, ValueError, "^q must be a CUDA tensor"),           # well formed: only the device is wrong
]


@pytest.mark.parametrize("bad,error,says", BAD, ids=[s.strip("^").split(" ")[0] + str(i) for i, (_, _, s) in
                                                     enumerate(BAD)])
@pytest.mark.parametrize("call", [check_varlen, flashattn.attention_varlen], ids=["check", "call"])
def test_bad_arguments_are_refused_naming_them(call, bad, error, says):
    with pytest.raises(error, match=says):
        call(**call_args(**bad))


VALUES = [(dict(cu_seqlens_q=torch.tensor([0, 5, 3], dtype=torch.int32)), "^cu_seqlens_q must not decrease"),
          (dict(cu_seqlens_q=torch.tensor([1, 3, 10], dtype=torch.int32)), "^cu_seqlens_q must start at 0"),
          (dict(cu_seqlens_k=torch.tensor([0, 5, 11], dtype=torch.int32)), "^cu_seqlens_k must end at the packed"),
          (dict(max_seqlen_q=6), r"^max_seqlen_q must be an int at least the longest sequence \(7\)")]


@pytest.mark.parametrize("bad,says", VALUES, ids=["decreasing", "start", "end", "max_seqlen"])
def test_validate_false_skips_the_value_checks_and_only_them(bad, says):
    """The values need a copy to the host; validate=False skips exactly those checks (the call then fails
    here only because the tensors are on the CPU), and never the structural ones."""
    with pytest.raises(ValueError, match=says):
        check_varlen(**call_args(**bad))
    with pytest.raises(ValueError, match="^q must be a CUDA tensor"):
        check_varlen(**call_args(**bad), validate=False)


def test_validate_false_still_checks_the_lengths_tensors():
    with pytest.raises(TypeError, match="^cu_seqlens_q must be int32"):
        check_varlen(**call_args(cu_seqlens_q=torch.tensor([0, 3, 10])), validate=False)
    with pytest.raises(ValueError, match="^cu_seqlens_k has 4 entries"):
        check_varlen(**call_args(cu_seqlens_k=torch.tensor([0, 8, 5, 12], dtype=torch.int32)), validate=False)
    with pytest.raises(ValueError, match="^max_seqlen_q must be an int"):
        check_varlen(**call_args(max_seqlen_q=7.0), validate=False)


def test_varlen_build_exports_its_two_functions_and_checks_before_the_gpu():
    """kernels/v8.cu builds with FLASHATTN_VARLEN (nvcc and the host compiler, no GPU needed) and exports
    forward_varlen and forward_varlen_lse with named arguments; the binding's first checks need no GPU."""
    mod = vk.varlen_module()
    for name in ("forward_varlen", "forward_varlen_lse"):
        assert "(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: " \
               "torch.Tensor, max_seqlen_q:" in getattr(mod, name).__doc__
        q, k, v, cu_q, cu_k = packed((3, 7), (5, 7))
        with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
            getattr(mod, name)(q, k, v, cu_q, cu_k, 7)
        with pytest.raises(RuntimeError, match="q must be bfloat16 or float16"):
            getattr(mod, name)(q.float(), k, v, cu_q, cu_k, 7)


def test_varlen_backward_build_exports_backward_varlen_and_checks_before_the_gpu():
    """kernels/v8_backward.cu builds with FLASHATTN_VARLEN and exports backward_varlen, whose arguments have
    no longest lengths (its grid depends on the totals alone); the binding's first checks need no GPU."""
    mod = vk.varlen_backward_module()
    assert "backward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, " \
           "dout: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool = False, " \
           "deterministic: bool = False," in mod.backward_varlen.__doc__
    q, k, v, cu_q, cu_k = packed((3, 7), (5, 7))
    lse = torch.zeros(q.shape[1], q.shape[0])
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        mod.backward_varlen(q, k, v, q, lse, q, cu_q, cu_k)
    with pytest.raises(RuntimeError, match="q must be bfloat16 or float16"):
        mod.backward_varlen(q.float(), k, v, q, lse, q, cu_q, cu_k)


@pytest.mark.gpu
def test_lengths_on_the_cpu_are_refused_when_q_is_on_the_gpu():
    args = call_args()
    args.update({n: args[n].cuda() for n in ("q", "k", "v", "cu_seqlens_k")})
    with pytest.raises(ValueError, match="^cu_seqlens_q must be a CUDA tensor"):
        flashattn.attention_varlen(**args)
    args["cu_seqlens_q"] = args["cu_seqlens_q"].cuda()
    assert flashattn.attention_varlen(**args).shape == args["q"].shape     # the next good call works


# ================================================================ GPU: each sequence against float64
LENGTHS = [((17, 1, 0, 113, 203, 1023, 5), (17, 1, 4, 203, 113, 1023, 0)),     # M = N, M != N both ways, empty
           ((1, 64, 130), (1, 64, 130))]


def per_sequence(t, bounds, i):
    """Sequence i's rows of a packed [total, H, D] tensor as [1, H, L, D]."""
    return t[bounds[i]:bounds[i + 1]].transpose(0, 1).unsqueeze(0)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H,H_kv", [(8, 2), (4, 4)])
@pytest.mark.parametrize("lengths", LENGTHS, ids=["mixed", "even"])
@pytest.mark.parametrize("version", list(flashattn.TRAINING_VERSIONS))
def test_every_sequence_matches_float64(version, lengths, H, H_kv, causal, scale):
    if version in ("v7", "v8") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"{version} needs a GPU of compute capability 9.0")
    seed = zlib.crc32(repr((version, lengths, H, H_kv, causal, scale)).encode())
    q, k, v, cu_q, cu_k = packed(*lengths, H=H, H_kv=H_kv, D=64, device="cuda", seed=seed)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lengths[0]), max(lengths[1]), causal=causal,
                                     scale=scale, version=version)
    assert out.shape == q.shape and out.dtype == q.dtype
    do = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bq) - 1):
        if bq[i + 1] == bq[i]:
            continue
        qi, ki, vi, oi, doi = (per_sequence(t, b, i) for t, b in ((q, bq), (k, bk), (v, bk), (out, bq), (do, bq)))
        if bk[i + 1] == bk[i]:                       # no key: output 0, gradient 0
            assert (oi == 0).all() and (per_sequence(dq, bq, i) == 0).all()
            continue
        check_output(oi.detach(), qi.detach(), ki.detach(), vi.detach(), causal, scale)
        got = tuple(per_sequence(g, b, i) for g, b in ((dq, bq), (dk, bk), (dv, bk)))
        compare_grads(got, qi.detach(), ki.detach(), vi.detach(), doi, causal, scale)


# ================================================================ GPU: v8's single launch
needs_hopper = pytest.mark.skipif(not is_hopper(), reason="v8 needs a GPU of compute capability 9.0")


def sequences(bounds_q, bounds_k):
    """(i, q0, q1, k0, k1) per sequence."""
    return [(i, bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]) for i in range(len(bounds_q) - 1)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("window", [(-1, -1), (37, 5), (100, -1)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 96, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_single_launch_matches_float64(dtype, D, causal, window):
    """Forward and gradients of every sequence against float64 on that sequence alone (lengths 0, 1, 17, 113,
    203, 1023, M != N both ways, a sequence without keys and one without queries, more items than SMs so
    that the persistent blocks loop), grouped heads."""
    lengths = LENGTHS[0]
    seed = zlib.crc32(repr(("single", dtype, D, causal, window)).encode())
    q, k, v, cu_q, cu_k = packed(*lengths, H=8, H_kv=2, D=D, dtype=dtype, device="cuda", seed=seed)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lengths[0]), max(lengths[1]), causal=causal,
                                     window=window, version="v8")
    assert out.shape == q.shape and out.dtype == q.dtype
    do = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i, q0, q1, k0, k1 in sequences(bq, bk):
        if q1 == q0:                                  # no query: its keys get no gradient
            assert (dk[k0:k1] == 0).all() and (dv[k0:k1] == 0).all()
            continue
        qi, ki, vi, oi, doi = (per_sequence(t, b, i) for t, b in ((q, bq), (k, bk), (v, bk), (out, bq), (do, bq)))
        if k1 == k0:                                  # no key: output 0, gradient 0
            assert (oi == 0).all() and (per_sequence(dq, bq, i) == 0).all()
            continue
        check_output(oi.detach(), qi.detach(), ki.detach(), vi.detach(), causal, None, window)
        got = tuple(per_sequence(g, b, i) for g, b in ((dq, bq), (dk, bk), (dv, bk)))
        compare_grads(got, qi.detach(), ki.detach(), vi.detach(), doi, causal, None, window)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H,H_kv", [(8, 2), (4, 4)])
@pytest.mark.parametrize("D", [64, 96, 128])
def test_single_launch_is_the_fixed_length_kernel_per_sequence(D, H, H_kv, causal):
    """Each item runs the fixed-length kernel's arithmetic on its sequence (the same tiles, the same band, keys
    of the next sequence masked where the fixed-length box reads zeros): o and lse bit-identical to v8's
    forward_lse on each sequence alone; lse in FlashAttention-2's varlen layout [H, total_q]."""
    lengths = LENGTHS[0]
    q, k, v, cu_q, cu_k = packed(*lengths, H=H, H_kv=H_kv, D=D, device="cuda", seed=D + H)
    scale = 0.3
    o, lse = vk.varlen_attention_forward(q, k, v, cu_q, cu_k, max(lengths[0]), causal, False, scale)
    assert lse.shape == (H, q.shape[0]) and lse.dtype == torch.float32
    for i, q0, q1, k0, k1 in sequences(cu_q.tolist(), cu_k.tolist()):
        if q1 == q0:
            continue
        if k1 == k0:
            assert (o[q0:q1] == 0).all() and (lse[:, q0:q1] == float("-inf")).all()
            continue
        qi, ki, vi = (t[a:b].transpose(0, 1).unsqueeze(0).contiguous() for t, a, b in ((q, q0, q1), (k, k0, k1),
                                                                                      (v, k0, k1)))
        oi, lse_i = attention_forward(qi, ki, vi, causal, "v8", False, scale)
        assert torch.equal(o[q0:q1], oi[0].transpose(0, 1)), i
        assert torch.equal(lse[:, q0:q1], lse_i[0]), i


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("window", [(-1, -1), (37, 5)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H,H_kv,D", [(8, 2, 64), (4, 4, 128), (6, 3, 96)])
def test_single_launch_backward_is_the_per_sequence_backward(H, H_kv, D, causal, window):
    """One launch for the whole batch computes what v8's fixed-length backward computes on each sequence alone
    (the first version, backward_per_sequence): the same tiles from the sequence's first token, the next
    sequence's rows in a tile's tail giving P = 0 where the fixed-length boxes read zeros. dK and dV bit for bit
    (each written once from the same sums); in the deterministic mode dQ too (its key tiles add in index
    order), otherwise within float32 rounding of the order the additions land in."""
    lengths = LENGTHS[0]
    q, k, v, cu_q, cu_k = packed(*lengths, H=H, H_kv=H_kv, D=D, device="cuda", seed=H + D)
    scale = 0.2
    o, lse = vk.varlen_attention_forward(q, k, v, cu_q, cu_k, max(lengths[0]), causal, False, scale, *window)
    do = torch.randn_like(q)
    for deterministic in (True, False):
        args = (q, k, v, o, lse, do, cu_q, cu_k, causal, deterministic, scale, *window)
        got, want = vk.varlen_attention_backward(*args), vk.backward_per_sequence(*args)
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), "dK, dV"
        if deterministic:
            assert torch.equal(got[0], want[0]), "dQ in the deterministic mode"
        else:
            torch.testing.assert_close(got[0], want[0], rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@needs_hopper
def test_validate_false_backward_never_waits_for_the_gpu():
    """The single-launch backward reads the lengths on the GPU too: forward and autograd.grad with
    validate=False make no synchronising call."""
    lengths = LENGTHS[0]
    q, k, v, cu_q, cu_k = packed(*lengths, H=8, H_kv=2, D=128, device="cuda", seed=6)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    args = (q, k, v, cu_q, cu_k, max(lengths[0]), max(lengths[1]))
    first = torch.autograd.grad(flashattn.attention_varlen(*args, causal=True, validate=False), (q, k, v),
                                torch.ones_like(q))                          # builds the modules
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = flashattn.attention_varlen(*args, causal=True, validate=False)
        again = torch.autograd.grad(out, (q, k, v), torch.ones_like(q))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2) for a, b in zip(again, first))


@pytest.mark.gpu
@needs_hopper
def test_validate_false_never_waits_for_the_gpu_and_captures_in_a_cuda_graph():
    lengths = LENGTHS[0]
    q, k, v, cu_q, cu_k = packed(*lengths, H=8, H_kv=2, D=128, device="cuda", seed=5)
    args = (q, k, v, cu_q, cu_k, max(lengths[0]), max(lengths[1]))
    eager = flashattn.attention_varlen(*args, causal=True, validate=False)     # builds the module
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = flashattn.attention_varlen(*args, causal=True, validate=False)
        with pytest.raises(RuntimeError, match="synchroniz"):                  # the control: validate copies
            flashattn.attention_varlen(*args, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(again, eager)       # outside the check: torch.equal's answer on the host is a sync itself
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashattn.attention_varlen(*args, causal=True, validate=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashattn.attention_varlen(*args, causal=True, validate=False)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flashattn.attention_varlen(*args, causal=True))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("bad,says", VALUES, ids=["decreasing", "start", "end", "max_seqlen"])
def test_bad_lengths_on_the_gpu_are_refused_naming_them(bad, says):
    args = call_args(**bad)
    args = {n: t.cuda() if isinstance(t, torch.Tensor) else t for n, t in args.items()}
    with pytest.raises(ValueError, match=says):
        flashattn.attention_varlen(**args)


@pytest.mark.gpu
@needs_hopper
def test_binding_refuses_bad_lengths_naming_them():
    q, k, v, cu_q, cu_k = packed((3, 7), (5, 7), device="cuda")
    mod = vk.varlen_module()
    for args, says in [((q, k, v, cu_q.long(), cu_k, 7), "cu_seqlens_q must be int32"),
                       ((q, k, v, cu_q, cu_k.cpu(), 7), "cu_seqlens_k must be a CUDA tensor"),
                       ((q, k, v, cu_q[None], cu_k, 7), "cu_seqlens_q must be 1-D"),
                       ((q, k, v, cu_q, cu_k[:2], 7), "cu_seqlens_k must have as many entries as cu_seqlens_q"),
                       ((q, k, v, torch.stack([cu_q, cu_q], 1)[:, 0], cu_k, 7), "cu_seqlens_q must be contiguous"),
                       ((q, k, v, cu_q, cu_k, q.shape[0] + 1), "max_seqlen_q must be >= 0 and at most"),
                       ((q[None], k, v, cu_q, cu_k, 7), "q must have rank 3"),
                       ((q, k[:, :, :32].contiguous(), v, cu_q, cu_k, 7), "k must match q in head_dim")]:
        with pytest.raises(RuntimeError, match=says):
            mod.forward_varlen(*args)


# ================================================================ GPU: compute-sanitizer
# a packed batch with empty sequences, M != N both ways and tails of every tile size, and its (causal, window)
SANITIZE_LENGTHS = ((17, 1, 0, 203, 130), (17, 1, 4, 113, 300))
SANITIZE_MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (40, 8))]


def sanitize_target() -> None:
    """What the sanitizer runs: v8's single-launch forward and backward (both modes) at every head dim and
    mask, grouped heads, bf16; one line per call."""
    for D, (causal, window) in itertools.product((64, 96, 128), SANITIZE_MASKS):
        q, k, v, cu_q, cu_k = packed(*SANITIZE_LENGTHS, H=4, H_kv=2, D=D, device="cuda", seed=D)
        o, lse = vk.varlen_attention_forward(q, k, v, cu_q, cu_k, max(SANITIZE_LENGTHS[0]), causal, False, 0.3, *window)
        do = torch.randn_like(q)
        for det in (False, True):
            grads = vk.varlen_attention_backward(q, k, v, o, lse, do, cu_q, cu_k, causal, det, 0.3, *window)
            assert all(torch.isfinite(g).all() for g in grads)
            print(f"ran varlen D={D} causal={causal} window={window} deterministic={det}", flush=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_single_launch_sanitizer_clean(tool):
    vk.varlen_module(), vk.varlen_backward_module()          # built outside the sanitizer
    out, ran = conftest.run_sanitized(tool, Path(__file__).resolve(), "--sanitize", tag="ran varlen ")
    assert len(ran) == 3 * len(SANITIZE_MASKS) * 2, out[-4000:]


if __name__ == "__main__" and "--sanitize" in sys.argv:
    sanitize_target()
