"""Variable-length batches in FlashAttention-2's conventions: `flashattn.attention_varlen`.

    total = int(cu_seqlens[-1])                          # the sequences packed one after another
    q = torch.randn(total, H, D, ...)                    # [total_q, H, D]; k, v [total_k, H_kv, D]
    o = flashattn.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)

Sequence i owns rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] of q and cu_seqlens_k[i]:cu_seqlens_k[i + 1] of k
and v; the cumulative lengths are int32, start at 0, never decrease, and end at the packed totals.
causal=True is bottom-right aligned per sequence (row m of a sequence with M queries and N keys sees key j
iff j <= m + N - M), as every kernel of the book aligns it, and so is window=(left, right), FlashAttention-2's
sliding window (row m sees key j iff m + N - M - left <= j <= m + N - M + right, a side -1 bounding nothing);
a row that sees no key (a sequence with no keys, M > N, or an empty window) gets output 0 and gradient 0.
Grouped-query heads (H_kv dividing H), `scale` and `window` are the training kernels' (flashattn.attention).

version="v8" runs the whole batch in one launch (flashattn.varlen_kernel): kernels/v8.cu's varlen kernel
reads cu_seqlens on the GPU, each work item a (sequence, query head, row block) with its own lengths and
band, so the forward makes no copy to the host and no Python step per sequence; so does its backward
(kernels/v8_backward.cu's varlen kernels, each block a key tile of one sequence and kv head).
Its index arithmetic is checked on the CPU (tests/test_varlen_bounds.py, test_varlen_backward_bounds.py) and the
launches against float64 on an H200 (tests/test_varlen.py; results/h200/logs/pytest_varlen_2bac294.xml); timed by
flashattn.measure.varlen_bench (results/h200/varlen.json).
The other versions (v6, v7) run one kernel call per non-empty sequence, each through flashattn.attention
(differentiable, and exactly as accurate as the kernels): a launch and a Python step per sequence.

Every argument is checked before anything is launched, each error naming it. The lengths live on the GPU,
so checking their values (starting at 0, never decreasing, ending at the packed lengths, max_seqlen at
least the longest) costs one copy to the host, which waits for the GPU's queue. validate=False skips those
value checks (and only those), as flashattn.attention_with_kvcache's does: with v8 the forward then never
waits for the GPU (it can be captured in a CUDA graph); wrong lengths give a wrong result (a sequence longer
than max_seqlen_q has rows that are not computed). The per-sequence path needs the lengths on the host
anyway. A batch in which no sequence has a key returns zeros (v6, v7: with no graph).
"""
from __future__ import annotations

import torch

from flashattn import reference
from flashattn.autograd import TRAINING_VERSIONS, attention, requires_grad
from flashattn.validate import check_backward_head_dim, check_scale, check_window
from flashattn.varlen_kernel import varlen_attention_forward, varlen_forward
from flashattn.versions import INFO

__all__ = ["attention_varlen", "check_varlen", "single_launch"]


def _check_packed(arg: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor; got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(f"{arg} must have rank 3 [total_tokens, heads, head_dim]; got shape {tuple(t.shape)}")
    if t.shape[1] == 0 or t.shape[2] == 0:
        raise ValueError(f"{arg} has no heads or an empty head_dim: shape {tuple(t.shape)}")


def _check_cu(arg: str, cu, total: int, batch: int | None, validate: bool = True) -> list[int] | None:
    """The lengths' bounds as host ints, after checking the tensor's type, dtype and values; validate=False:
    no values (None), no copy to the host."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{arg} must be an int32 torch.Tensor; got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{arg} must be int32 (FlashAttention's convention); got {str(cu.dtype).replace('torch.', '')}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{arg} must be 1-D with batch + 1 >= 2 entries; got shape {tuple(cu.shape)}")
    if batch is not None and cu.numel() != batch + 1:
        raise ValueError(f"{arg} has {cu.numel()} entries; cu_seqlens_q has {batch + 1}: one per sequence + 1 each")
    if not validate:
        return None
    bounds = cu.tolist()                    # one copy to the host (it waits for the GPU's queue)
    if bounds[0] != 0:
        raise ValueError(f"{arg} must start at 0; got {bounds[0]}")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        i = next(i for i in range(1, len(bounds)) if bounds[i] < bounds[i - 1])
        raise ValueError(f"{arg} must not decrease; entry {i} is {bounds[i]} after {bounds[i - 1]}")
    if bounds[-1] != total:
        raise ValueError(f"{arg} must end at the packed length {total}; its last entry is {bounds[-1]}")
    return bounds


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None,
                 window=(-1, -1), version="v8", validate=True) -> tuple[list[int] | None, list[int] | None,
                                                                         tuple[int, int]]:
    """Check a varlen call before any launch; return the two lists of sequence bounds (host ints), or with
    validate=False (no look at the lengths' values, no copy to the host) None for both, and the window as
    check_window returns it."""
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool; got {type(validate).__name__}")
    if version not in TRAINING_VERSIONS:
        raise ValueError(f"version must be one of {', '.join(TRAINING_VERSIONS)} for attention_varlen; got {version!r}")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        _check_packed(arg, t)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in INFO[version].dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in INFO[version].dtypes)
        raise TypeError(f"q has dtype {str(q.dtype).replace('torch.', '')}; {version} takes {allowed}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the shape of k [total_k, H_kv, D]: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k must have q's head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"k has {k.shape[1]} heads, which must divide q's {q.shape[1]} heads (grouped-query)")
    if INFO[version].head_dims is not None and q.shape[2] not in INFO[version].head_dims:
        raise ValueError(f"head_dim D={q.shape[2]} is not supported by {version}; it takes D in "
                         f"{INFO[version].head_dims}")
    if requires_grad(q, k, v):
        check_backward_head_dim(q.shape[2], version)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    check_scale(scale, version)
    window = check_window(window, causal, version)
    bounds_q = _check_cu("cu_seqlens_q", cu_seqlens_q, q.shape[0], None, validate)
    bounds_k = _check_cu("cu_seqlens_k", cu_seqlens_k, k.shape[0], cu_seqlens_q.numel() - 1, validate)
    for arg, given, bounds in (("max_seqlen_q", max_seqlen_q, bounds_q), ("max_seqlen_k", max_seqlen_k, bounds_k)):
        longest = 0 if bounds is None else max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
        if isinstance(given, bool) or not isinstance(given, int) or given < longest:
            raise ValueError(f"{arg} must be an int at least the longest sequence ({longest}); got {given!r}")
    for arg, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not t.is_cuda:
            raise ValueError(f"{arg} must be a CUDA tensor; got a tensor on {t.device}")
        if t.device != q.device:
            raise ValueError(f"{arg} must be on q's device {q.device}; got {t.device}")
    return bounds_q, bounds_k, window


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                     causal: bool = False, scale: float | None = None, window=(-1, -1), version: str = "v8",
                     deterministic: bool = False, validate: bool = True):
    """softmax(scale * q_i k_i^T) v_i for every packed sequence i; see the module docstring. Differentiable.

    version="v8": one launch for the forward and one of each backward kernel (the lengths read on the GPU;
    validate=False: no copy to the host at all). v6, v7: a kernel call per sequence, forward and backward."""
    bounds_q, bounds_k, window = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              causal, scale, window, version, validate)
    if version == "v8":
        return single_launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, scale, window,
                             deterministic)
    if bounds_q is None:                      # the per-sequence path cuts the batch on the host
        bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs = []
    for (q0, q1), (k0, k1) in zip(zip(bounds_q[:-1], bounds_q[1:]), zip(bounds_k[:-1], bounds_k[1:])):
        if q1 == q0:
            continue
        if k1 == k0:                          # no key: every row of this sequence is 0 (and so is its gradient)
            outs.append(q.new_zeros(q1 - q0, *q.shape[1:]))
            continue
        qi, ki, vi = (t[a:b].transpose(0, 1).unsqueeze(0) for t, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        oi = attention(qi, ki, vi, causal=causal, version=version, deterministic=deterministic, scale=scale,
                       window=window)
        outs.append(oi.squeeze(0).transpose(0, 1))
    return torch.cat(outs) if outs else q.new_zeros(q.shape)


def single_launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, causal: bool, scale: float | None,
                  window: tuple[int, int], deterministic: bool = False):
    """v8's varlen kernel on checked inputs (flashattn.varlen_kernel): one launch, differentiable when an
    input requires grad. max_seqlen_q is capped at the packed length (more would only add empty items)."""
    sides = window if reference.window_narrows(causal, window) else (-1, -1)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, min(max_seqlen_q, q.shape[0]), causal)
    if requires_grad(q, k, v):
        return varlen_attention_forward(*args, deterministic, reference.softmax_scale(q, scale), *sides)[0]
    return varlen_forward(*args, reference.softmax_scale(q, scale), *sides)
