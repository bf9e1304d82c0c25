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
        from torch.nn.attention.bias import causal_lower_right
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
