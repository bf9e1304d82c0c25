"""flashattn.attention_varlen: packed sequences of different lengths in FlashAttention-2's conventions.

CPU: every bad argument (cu_seqlens not int32, decreasing, not starting at 0, not ending at the packed length,
of a different batch than the other; max_seqlen too small; a bad window; heads that do not divide; a CPU
tensor among CUDA ones) raises before any launch, naming it. GPU: each sequence's rows of the output and of
dq, dk, dv against float64 on that sequence alone, within twice SDPA's own error (tests/test_v7.py's
check_output, tests/test_backward.py's compare_grads): lengths 0, 1, 17, 113, 203 and 1023 in one batch,
M != N both ways, causal and not, grouped heads, a scale; sequences without keys give 0 and gradient 0.
Windows per sequence: tests/test_window.py.
"""
from __future__ import annotations

import zlib

import pytest
import torch
from test_backward import compare_grads
from test_v7 import check_output

import flashattn
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
    ({}, ValueError, "^q must be a CUDA tensor"),           # well formed: only the device is wrong
]


@pytest.mark.parametrize("bad,error,says", BAD, ids=[s.strip("^").split(" ")[0] + str(i) for i, (_, _, s) in
                                                     enumerate(BAD)])
@pytest.mark.parametrize("call", [check_varlen, flashattn.attention_varlen], ids=["check", "call"])
def test_bad_arguments_are_refused_naming_them(call, bad, error, says):
    with pytest.raises(error, match=says):
        call(**call_args(**bad))


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
