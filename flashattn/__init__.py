"""FlashAttention forward kernels in CUDA, one version per chapter of the book.

    import flashattn
    out = flashattn.forward(q, k, v, version="v4")   # q [B, H, M, D], k and v [B, H, N, D], CUDA tensors

    o = flashattn.attention(q, k, v, causal=True)      # differentiable (v6): o.sum().backward() trains

`flashattn.VERSIONS` lists every implementation in chapter order and `flashattn.INFO` what each accepts;
`flashattn.plan(q, k, v, version)` checks a call once and says which version runs it (a Plan you can call
again without the checks); `flashattn.load(version)` compiles one kernel file and returns the extension
module; `flashattn.reference` holds the float64 reference; `flashattn.attention` (from flashattn.autograd,
imported on first use, since it registers torch.library ops) is the operator that also has a backward.
"""
from __future__ import annotations

from flashattn import reference
from flashattn.loader import load
from flashattn.validate import Plan, check_inputs, plan
from flashattn.versions import FUSED_VERSIONS, INFO, KERNEL_VERSIONS, VERSIONS

__all__ = ["VERSIONS", "KERNEL_VERSIONS", "FUSED_VERSIONS", "INFO", "forward", "plan", "Plan", "load",
           "reference", "check_inputs", "attention"]


def __getattr__(name: str):
    if name == "attention":
        from flashattn.autograd import attention
        return attention
    raise AttributeError(f"module 'flashattn' has no attribute {name!r}")


def forward(q, k, v, version: str = "v4", causal: bool = False):
    """Attention output softmax(q k^T / sqrt(D)) v, computed by `version`.

    Inputs are checked before anything is launched (ValueError or TypeError naming the argument).
    Non-contiguous inputs are accepted: they are copied to contiguous memory first, since every kernel
    indexes a dense [B, H, L, D] layout. v3, v4 and v5 hand head dims they are not specialised for to v2.
    """
    return plan(q, k, v, version, causal).run(q, k, v)
