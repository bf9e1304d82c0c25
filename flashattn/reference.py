"""PyTorch implementations: the float64 reference used by tests and notebooks, the explicit "baseline"
and SDPA. None of them needs this project's kernels.

Causal masking is bottom-right aligned: query row i (of M) may attend key j (of N) when
j <= i + (N - M), which is what a decoder sees when the last M of N tokens are the queries. When M > N the
first M - N rows see no key at all; the reference returns zeros for them.
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


def attention_reference(q, k, v, causal: bool = False, dtype=torch.float64, max_chunk_bytes=1 << 29):
    """softmax(q k^T / sqrt(D)) v computed in `dtype` (float64 by default) on the inputs' device.

    Works through the (batch x head) pairs in chunks so that the materialised score matrix stays under
    `max_chunk_bytes`, which lets tests use the reference on long sequences.
    """
    B, H, M, D = q.shape
    N = k.shape[2]
    qf, kf, vf = (t.to(dtype).reshape(B * H, t.shape[2], D) for t in (q, k, v))
    out = torch.empty(B * H, M, D, dtype=dtype, device=q.device)
    per_pair = M * N * torch.finfo(dtype).bits // 8
    step = max(1, max_chunk_bytes // max(per_pair, 1))
    mask = causal_mask(M, N, q.device) if causal else None
    for s in range(0, B * H, step):
        scores = qf[s:s + step] @ kf[s:s + step].transpose(1, 2) / math.sqrt(D)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        if mask is not None:
            p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key
        out[s:s + step] = p @ vf[s:s + step]
    return out.reshape(B, H, M, D)


def attention_gradients(q, k, v, do, causal: bool = False, dtype=torch.float64, max_chunk_bytes=1 << 29):
    """(dq, dk, dv) of softmax(q k^T / sqrt(D)) v given the output's gradient `do`, in `dtype`, written out
    rather than through autograd so that it runs in the same (batch x head) chunks as `attention_reference`
    (autograd would keep every chunk's scores alive at once):
    dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D).
    Rows with no visible key have P = 0 and give nothing."""
    B, H, M, D = q.shape
    N = k.shape[2]
    qf, kf, vf, dof = (t.to(dtype).reshape(B * H, t.shape[2], D) for t in (q, k, v, do))
    grads = [torch.empty(B * H, L, D, dtype=dtype, device=q.device) for L in (M, N, N)]
    step = max(1, max_chunk_bytes // max(M * N * torch.finfo(dtype).bits // 8, 1))
    mask = causal_mask(M, N, q.device) if causal else None
    scale = 1 / math.sqrt(D)
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
    return tuple(g.reshape(B, H, g.shape[1], D) for g in grads)


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (Frobenius norms); NaN anywhere gives NaN, never a pass."""
    diff = out.to(torch.float64) - ref.to(torch.float64)
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref.to(torch.float64))).item()


def baseline(q, k, v, causal: bool = False):
    """The explicit attention most people write first: S = QK^T, P = softmax(S), O = PV, in q's dtype."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa(q, k, v, causal: bool = False):
    """PyTorch's fused attention with its own backend choice (for float32 on sm80+: the CUTLASS
    memory-efficient kernel; for bf16/fp16: cuDNN or FlashAttention-2)."""
    if causal and q.shape[2] != k.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
