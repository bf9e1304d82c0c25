"""FlashAttention forward kernels in CUDA, one version per chapter of the book.

    import flashattn
    out = flashattn.forward(q, k, v, version="v4")   # q [B, H, M, D], k and v [B, H, N, D], CUDA tensors

`flashattn.VERSIONS` lists every implementation in chapter order; `flashattn.load(name)` compiles one
kernel file and returns the extension module; `flashattn.reference` holds the float64 reference.
"""
from __future__ import annotations

from . import reference
from .loader import load
from .validate import check_inputs
from .versions import FUSED_VERSIONS, INFO, KERNEL_VERSIONS, VERSIONS

__all__ = ["VERSIONS", "KERNEL_VERSIONS", "FUSED_VERSIONS", "INFO", "forward", "load", "reference",
           "check_inputs"]


def forward(q, k, v, version: str = "v4", causal: bool = False):
    """Attention output softmax(q k^T / sqrt(D)) v, computed by `version`.

    Inputs are checked before anything is launched (ValueError or TypeError naming the argument).
    Non-contiguous inputs are accepted: they are copied to contiguous memory first, since every kernel
    indexes a dense [B, H, L, D] layout. v3, v4 and v5 hand head dims they are not specialised for to v2.
    """
    run = check_inputs(q, k, v, version, causal)
    if run == "baseline":
        return reference.baseline(q, k, v, causal)
    if run == "sdpa":
        return reference.sdpa(q, k, v, causal)
    # Dense [B, H, L, D] memory with 16-byte aligned bases (v4 and later load float4s); a misaligned
    # view, such as x[..., 1:, :], is copied.
    q, k, v = (t.contiguous() if t.data_ptr() % 16 == 0 else t.contiguous().clone() for t in (q, k, v))
    module = load(run)
    if INFO[run].causal:
        return module.forward(q, k, v, causal)
    return module.forward(q, k, v)
