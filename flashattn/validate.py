"""Input checks that run before any launch and need no GPU, and the plan of a call they give.

`plan(q, k, v, version, causal)` checks the inputs once and resolves the call: which version really runs
(v3, v4 and v5 hand head dims they are not specialised for to v2) and the function that runs it.
The benchmark and the book's helpers time the plan's binding directly, without checking again and
without the custom op `flashattn.forward` goes through.

Every message names the argument at fault. Structural checks (type, rank, dtype, shapes, head
dimension) come first and the device check last, so all of them can be exercised on a machine without
a GPU; a CPU tensor that is otherwise well formed is refused with its own message.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashattn import loader, reference
from flashattn.versions import INFO, Version

INT32_MAX = 2**31 - 1


def _version(version: str) -> Version:
    if version not in INFO:
        raise ValueError(f"version must be one of {', '.join(INFO)}; got {version!r}")
    return INFO[version]


def check_inputs(q, k, v, version: str = "v4", causal: bool = False) -> str:
    """Validate q [B, H, M, D], k and v [B, H, N, D] for `version`.

    Returns the name of the version that will run: v3, v4 and v5 are specialised for a few head
    dimensions and hand the others to their general fallback (v2).
    """
    info = _version(version)
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{arg} must have rank 4 [B, H, seq_len, head_dim]; got shape {tuple(t.shape)}")
        if t.dtype not in info.dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in info.dtypes)
            raise TypeError(f"{arg} has dtype {str(t.dtype).replace('torch.', '')}; {version} takes {allowed}")
        if t.numel() == 0:
            raise ValueError(f"{arg} has an empty dimension: shape {tuple(t.shape)}; every dimension must be >= 1")
        if any(s > INT32_MAX for s in t.shape):
            raise ValueError(f"{arg} has a dimension above 2**31 - 1: shape {tuple(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    (B, H, M, D), (Bk, Hk, N, Dk) = q.shape, k.shape
    if (Bk, Hk, Dk) != (B, H, D):
        raise ValueError(f"k must match q in batch, heads and head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the same shape as k [B, H, N, D]: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if info.self_attention_only and M != N:
        raise ValueError(f"{version} computes self-attention only: q and k need the same sequence length; "
                         f"got M={M}, N={N} (v1 and later take M != N)")
    if causal and not info.causal:
        causal_ones = ", ".join(n for n, i in INFO.items() if i.causal)
        raise ValueError(f"causal=True is not implemented by {version}; use one of {causal_ones}")
    runs_as = version
    if info.head_dims is not None and D not in info.head_dims:
        if info.fallback is None:
            raise ValueError(f"head_dim D={D} is not supported by {version}; it takes D in {info.head_dims}")
        runs_as = info.fallback
        info = INFO[runs_as]
    if D > info.max_head_dim:
        raise ValueError(f"head_dim D={D} is too large for {version}: the general path takes 1 <= D <= "
                         f"{info.max_head_dim}")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise ValueError(f"{arg} must be a CUDA tensor; got a tensor on {t.device}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    return runs_as


def aligned(t: torch.Tensor) -> torch.Tensor:
    """Dense [B, H, L, D] memory with a 16-byte aligned base (v4 and later load float4s); a misaligned
    view, such as x[..., 1:, :], is copied."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


@dataclass(frozen=True)
class Plan:
    """A checked call: `version` as asked, `runs_as` the version that runs it, and `run(q, k, v)`, which
    calls it without checking again. A plan holds for the tensors it was made from and any others of the
    same shapes, dtype and device."""
    version: str
    runs_as: str
    causal: bool
    binding: Callable = field(repr=False, compare=False)   # forward(q, k, v, causal) of the version that runs

    def run(self, q, k, v):
        if INFO[self.runs_as].kernel:
            q, k, v = aligned(q), aligned(k), aligned(v)
        return self.binding(q, k, v, self.causal)

    __call__ = run


def plan(q, k, v, version: str = "v4", causal: bool = False) -> Plan:
    """Check q [B, H, M, D], k and v [B, H, N, D] for `version` (ValueError or TypeError naming the
    argument) and resolve the call; a kernel is compiled or loaded here, before anything is timed."""
    runs_as = check_inputs(q, k, v, version, causal)
    binding = loader.load(runs_as).forward if INFO[runs_as].kernel else getattr(reference, runs_as)
    return Plan(version, runs_as, causal, binding)
