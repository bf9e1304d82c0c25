"""PyTorch implementations: the float64 reference used by tests and notebooks, the explicit "baseline"
and SDPA. None of them needs this project's kernels.

Causal masking is bottom-right aligned: query row i (of M) may attend key j (of N) when
j <= i + (N - M), which is what a decoder sees when the last M of N tokens are the queries. When M > N the
first M - N rows see no key at all; the reference returns zeros for them. A sliding window (left, right),
FlashAttention-2's window_size, is aligned the same way: row i sees key j when
i + (N - M) - left <= j <= i + (N - M) + right, a side -1 bounding nothing; causal is the window (-1, 0) and
narrows any other to right = 0. Rows whose window holds no key are zeros in the reference too.

The attention functions take grouped-query attention (k and v with H_kv heads, H_kv dividing q's H heads:
query head h reads kv head h // (H / H_kv)) and `scale`, the softmax scale (None: 1/sqrt(D)).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def causal_mask(M: int, N: int, device=None) -> torch.Tensor:
    """Boolean [M, N] mask, True where query i may attend key j (bottom-right aligned)."""
    i = torch.arange(M, device=device)[:, None]
    j = torch.arange(N, device=device)[None, :]
    return j <= i + (N - M)


def window_mask(M: int, N: int, causal: bool = False, window=(-1, -1), device=None) -> torch.Tensor | None:
    """Boolean [M, N] mask, True where query i may attend key j under `causal` and the sliding `window`
    (bottom-right aligned, see the module docstring); None when every key is visible to every row."""
    left, right = window[0], 0 if causal else window[1]
    if left < 0 and right < 0:
        return None
    offset = torch.arange(N, device=device)[None, :] - torch.arange(M, device=device)[:, None] - (N - M)
    mask = torch.ones(M, N, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= offset >= -left
    if right >= 0:
        mask &= offset <= right
    return mask


def window_narrows(causal: bool, window) -> bool:
    """Whether `window` hides keys that `causal` alone does not (a left bound, or without causal a right
    one): the calls that must carry it."""
    return window[0] >= 0 or (not causal and window[1] >= 0)


def softmax_scale(q, scale: float | None = None) -> float:
    """The softmax scale a call runs with: `scale`, or 1/sqrt(D) for None (D = q's head dim)."""
    return 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def expand_heads(t, heads: int):
    """k or v [B, H_kv, N, D] with each head repeated for the heads // H_kv query heads that read it
    (grouped-query attention), so that head h of the result is the one query head h reads; `t` itself
    when it already has `heads` heads."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def attention_reference(q, k, v, causal: bool = False, dtype=torch.float64, max_chunk_bytes=1 << 29,
                        scale: float | None = None, window=(-1, -1)):
    """softmax(scale * q k^T) v computed in `dtype` (float64 by default) on the inputs' device, masked by
    `causal` and the sliding `window` (window_mask).

    Works through the (batch x head) pairs in chunks so that the materialised score matrix stays under
    `max_chunk_bytes`, which lets tests use the reference on long sequences.
    """
    B, H, M, D = q.shape
    N = k.shape[2]
    scale = softmax_scale(q, scale)
    qf, kf, vf = (expand_heads(t.to(dtype), H).reshape(B * H, t.shape[2], D) for t in (q, k, v))
    out = torch.empty(B * H, M, D, dtype=dtype, device=q.device)
    per_pair = M * N * torch.finfo(dtype).bits // 8
    step = max(1, max_chunk_bytes // max(per_pair, 1))
    mask = window_mask(M, N, causal, window, q.device)
    for s in range(0, B * H, step):
        scores = qf[s:s + step] @ kf[s:s + step].transpose(1, 2) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        if mask is not None:
            p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key
        out[s:s + step] = p @ vf[s:s + step]
    return out.reshape(B, H, M, D)


def attention_gradients(q, k, v, do, causal: bool = False, dtype=torch.float64, max_chunk_bytes=1 << 29,
                        scale: float | None = None, window=(-1, -1)):
    """(dq, dk, dv) of softmax(scale * q k^T) v given the output's gradient `do`, in `dtype`, written out
    rather than through autograd so that it runs in the same (batch x head) chunks as `attention_reference`
    (autograd would keep every chunk's scores alive at once):
    dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
    Rows with no visible key have P = 0 and give nothing. With grouped-query heads, dk and dv of a kv head
    are the sums over the query heads that read it (shaped like k and v)."""
    B, H, M, D = q.shape
    N, H_kv = k.shape[2], k.shape[1]
    qf, kf, vf, dof = (expand_heads(t.to(dtype), H).reshape(B * H, t.shape[2], D) for t in (q, k, v, do))
    grads = [torch.empty(B * H, L, D, dtype=dtype, device=q.device) for L in (M, N, N)]
    step = max(1, max_chunk_bytes // max(M * N * torch.finfo(dtype).bits // 8, 1))
    mask = window_mask(M, N, causal, window, q.device)
    scale = softmax_scale(q, scale)
    for s in range(0, B * H, step):
        c = slice(s, s + step)
        scores = qf[c] @ kf[c].transpose(1, 2) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        del scores
        row_term = (dof[c] * (p @ vf[c])).sum(-1, keepdim=True)
        ds = p * (dof[c] @ vf[c].transpose(1, 2) - row_term)
        grads[0][c] = ds @ kf[c] * scale
        grads[1][c] = ds.transpose(1, 2) @ qf[c] * scale
        grads[2][c] = p.transpose(1, 2) @ dof[c]
    dq, dk, dv = (g.reshape(B, H, g.shape[1], D) for g in grads)
    dk, dv = (g.reshape(B, H_kv, H // H_kv, N, D).sum(2) for g in (dk, dv))
    return dq, dk, dv


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (Frobenius norms); NaN anywhere gives NaN, never a pass."""
    diff = out.to(torch.float64) - ref.to(torch.float64)
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref.to(torch.float64))).item()


def baseline(q, k, v, causal: bool = False, scale: float | None = None, window=(-1, -1)):
    """The explicit attention most people write first: S = QK^T, P = softmax(S), O = PV, in q's dtype."""
    k, v = expand_heads(k, q.shape[1]), expand_heads(v, q.shape[1])
    scores = q @ k.transpose(-2, -1)
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    mask = window_mask(q.shape[2], k.shape[2], causal, window, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa(q, k, v, causal: bool = False, scale: float | None = None, window=(-1, -1)):
    """PyTorch's fused attention with its own backend choice (for float32 on sm80+: the CUTLASS
    memory-efficient kernel; for bf16/fp16: cuDNN or FlashAttention-2), grouped-query heads by its
    enable_gqa. A sliding window goes in as an explicit boolean mask (SDPA has no window of its own), which
    leaves it the backends that take one."""
    gqa = dict(enable_gqa=True) if k.shape[1] != q.shape[1] else {}
    if window_narrows(causal, window):
        mask = window_mask(q.shape[2], k.shape[2], causal, window, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)
    if causal and q.shape[2] != k.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                              scale=scale, **gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa)
