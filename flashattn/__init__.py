"""FlashAttention forward kernels in CUDA, one version per chapter of the book.

    import flashattn
    out = flashattn.forward(q, k, v, version="v4")   # q [B, H, M, D], k and v [B, H, N, D], CUDA tensors

    o = flashattn.attention(q, k, v, causal=True)      # differentiable (v6): o.sum().backward() trains
    o = flashattn.attention(q, k8, v8, scale=0.1)      # grouped-query: k, v [B, H_kv, N, D], H_kv dividing H
    o = flashattn.attention(q, k, v, window=(256, 0))  # sliding window (FlashAttention-2's window_size)
    o = flashattn.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, causal=True)  # packed batch
    o = flashattn.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths)  # decoding
    o = flashattn.ring_attention(q_shard, k_shard, v_shard, causal=True)  # across the ranks of a process group

`flashattn.VERSIONS` lists every implementation in chapter order and `flashattn.INFO` what each accepts;
`flashattn.plan(q, k, v, version)` checks a call once and says which version runs it (a Plan you can call
again without the checks); `flashattn.load(version)` compiles one kernel file and returns the extension
module, whose `forward(q, k, v, causal=False)` is the raw binding; `flashattn.reference` holds the float64
reference.

`forward` and `attention` come from flashattn.autograd, imported here at once although that registers its
torch.library ops (the "flashattn" namespace): `forward` is itself one of those ops (so that
torch.compile traces it), registering them takes milliseconds and touches nothing outside that
namespace, and a lazily imported `attention` would hide from `dir(flashattn)` and from type checkers.
"""
from __future__ import annotations

from flashattn import reference
from flashattn.autograd import TRAINING_VERSIONS, attention, forward
from flashattn.decode import attention_with_kvcache
from flashattn.distributed import ring_attention
from flashattn.loader import load
from flashattn.validate import Plan, check_inputs, check_window, plan
from flashattn.varlen import attention_varlen
from flashattn.versions import FUSED_VERSIONS, INFO, KERNEL_VERSIONS, VERSIONS

__all__ = ["VERSIONS", "KERNEL_VERSIONS", "FUSED_VERSIONS", "TRAINING_VERSIONS", "INFO", "forward", "attention",
           "attention_with_kvcache", "attention_varlen", "plan", "Plan", "load", "reference", "check_inputs",
           "check_window", "ring_attention"]
