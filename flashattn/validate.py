"""Input checks that run before any launch and need no GPU, and the plan of a call they give.

`plan(q, k, v, version, causal, scale, window)` checks the inputs once and resolves the call: which
version really runs (v3, v4 and v5 hand head dims they are not specialised for to v2) and the function
that runs it. The benchmark and the book's helpers time the plan's binding directly, without checking
again and without the custom op `flashattn.forward` goes through. The softmax scale is None (1/sqrt(D),
every version's default) or, for the versions with `scale` in flashattn.versions, a finite number > 0; k
and v may have fewer heads than q, dividing them, for the versions with `gqa`; a sliding window
(left, right), FlashAttention-2's window_size, is taken by the versions with `window` (check_window).

Every message names the argument at fault. Structural checks (type, rank, dtype, shapes, head
dimension) come first and the device check last, so all of them can be exercised on a machine without
a GPU; a CPU tensor that is otherwise well formed is refused with its own message.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashattn import loader, reference
from flashattn.versions import BACKWARD_HEAD_DIMS, INFO, Version

INT32_MAX = 2**31 - 1
FLOAT32_RANGE = (torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max)   # the kernels take scale as float


def _version(version: str) -> Version:
    if version not in INFO:
        raise ValueError(f"version must be one of {', '.join(INFO)}; got {version!r}")
    return INFO[version]


def taking(feature: str) -> str:
    """The versions whose Version has `feature` set ("gqa", "scale", "causal"), as a list for a message."""
    return ", ".join(n for n, i in INFO.items() if getattr(i, feature))


def check_scale(scale, version: str = "v6") -> None:
    """`scale` is None (1/sqrt(D)) or a finite number > 0 that float32 holds, and `version` takes it."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float (or None for 1/sqrt(D)); got {type(scale).__name__}")
    if not (math.isfinite(scale) and FLOAT32_RANGE[0] <= scale <= FLOAT32_RANGE[1]):
        raise ValueError(f"scale must be a finite number > 0 in float32's range (or None for 1/sqrt(D)); "
                         f"got {scale!r}")
    if not _version(version).scale:
        raise ValueError(f"scale is not taken by {version}, whose kernel has 1/sqrt(D) built in; versions that "
                         f"take scale: {taking('scale')} (or pass scale=None)")


def check_window(window, causal: bool = False, version: str = "v6") -> tuple[int, int]:
    """`window` = (left, right), FlashAttention-2's window_size: query row i (of M) sees key j (of N) iff
    i + N - M - left <= j <= i + N - M + right, a side -1 bounding nothing. Returns it as a tuple of
    ints, with right = 0 when `causal` (causal is the window (-1, 0), and sets a window's right side to 0,
    as in FlashAttention-2). A pair of ints >= -1 (and below 2**31), and a version with `window` in
    flashattn.versions unless it is (-1, -1); TypeError or ValueError naming window otherwise."""
    if not isinstance(window, (tuple, list)) or len(window) != 2 or \
            any(isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in window):
        raise TypeError(f"window must be a pair of ints (left, right), -1 for no bound on that side; got {window!r}")
    left, right = (int(w) for w in window)
    if not -1 <= min(left, right) or max(left, right) > INT32_MAX:
        raise ValueError(f"window sides must be -1 (no bound) or 0 .. 2**31 - 1; got {(left, right)}")
    if (left, right) != (-1, -1) and not _version(version).window:
        raise ValueError(f"window is not taken by {version}; versions that take a sliding window: "
                         f"{taking('window')} (or pass window=(-1, -1))")
    return (left, 0) if causal else (left, right)


def check_backward(backward, version: str = "v6") -> str:
    """The backward kernel file that trains `version`: `backward` = None (the version's own, Version.backward)
    or one of its Version.backwards ("v8_backward" for v7 and v8). TypeError or ValueError naming backward
    otherwise."""
    info = _version(version)
    if backward is None:
        return info.backward
    if not isinstance(backward, str):
        raise TypeError(f"backward must be a kernel file name (str) or None; got {type(backward).__name__}")
    allowed = ((info.backward,) if info.backward else ()) + info.backwards
    if backward not in allowed:
        raise ValueError(f"backward={backward!r} cannot train {version}; it trains on "
                         f"{', '.join(allowed) if allowed else 'nothing (no backward kernel)'} (or pass None)")
    return backward


def check_backward_head_dim(D: int, version: str = "v8", backward: str | None = None) -> None:
    """For a call whose inputs require grad: ValueError naming head_dim when the backward kernel file
    `backward` (None: `version`'s own) does not take D, though the forward does (v8's forward takes D = 192
    and 256; V6's backward, which v8 can also train on, does not take 96)."""
    info = _version(version)
    dims = BACKWARD_HEAD_DIMS.get(backward or info.backward)
    if dims is not None and D not in dims:
        which = f"{backward} (training {version})" if backward and backward != info.backward else version
        raise ValueError(f"head_dim D={D} has no backward in {which}: its backward kernels take D in {dims}, "
                         f"and an input requires grad (the forward alone runs D={D} under torch.no_grad())")


def check_inputs(q, k, v, version: str = "v4", causal: bool = False, scale: float | None = None,
                 window=(-1, -1)) -> str:
    """Validate q [B, H, M, D], k and v [B, H_kv, N, D], the softmax scale and the sliding window
    (check_window) for `version`. H_kv = H everywhere; versions with grouped-query attention (`gqa` in
    flashattn.versions) also take H_kv dividing H (query head h reads kv head h // (H / H_kv)).

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
    if not info.gqa and (Bk, Hk, Dk) != (B, H, D):
        hint = f"; k with fewer heads than q (grouped-query attention) is taken by {taking('gqa')}" \
            if (Bk, Dk) == (B, D) and H % Hk == 0 else ""
        raise ValueError(f"k must match q in batch, heads and head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}{hint}")
    if (Bk, Dk) != (B, D):
        raise ValueError(f"k must match q in batch and head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if H % Hk != 0:
        raise ValueError(f"k has {Hk} heads, which must divide q's {H} heads (grouped-query attention: each k, v "
                         f"head serves H_q / H_kv query heads): q {tuple(q.shape)}, k {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the same shape as k [B, H_kv, N, D]: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if info.self_attention_only and M != N:
        raise ValueError(f"{version} computes self-attention only: q and k need the same sequence length; "
                         f"got M={M}, N={N} (v1 and later take M != N)")
    if causal and not info.causal:
        raise ValueError(f"causal=True is not implemented by {version}; use one of {taking('causal')}")
    check_scale(scale, version)
    check_window(window, causal, version)
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


_CHECKED: dict = {}        # check_call's successful checks, by everything a check reads (at most _CHECKED_MAX)
_CHECKED_MAX = 1024


def _typed(x):
    """x with its type beside it: 1, 1.0 and True are equal keys of a dict, but not the same argument."""
    if isinstance(x, (tuple, list)):
        return type(x), tuple(_typed(e) for e in x)
    return type(x), x


def check_call(q, k, v, version: str = "v4", causal: bool = False, scale: float | None = None,
               window=(-1, -1)) -> tuple[str, tuple[int, int]]:
    """check_inputs and check_window at once: (the version that runs, the window as check_window returns it).

    A call whose arguments pass is remembered by what the checks read (the tensors' types, shapes, dtypes and
    devices, and the other arguments with their types), so a training loop's repeated call is checked once
    and pays a dictionary lookup after that; arguments that fail are checked, and refused, every time."""
    # (under torch.compile the checks are traced as guards instead: no dictionary for Dynamo to follow)
    if (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor
            and not torch.compiler.is_compiling()):
        try:
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
                   _typed(version), _typed(causal), _typed(scale), _typed(window))
            hit = _CHECKED.get(key)
        except TypeError:          # an unhashable argument: no key, the full check says what is wrong
            key, hit = None, None
        if hit is not None:
            return hit
    else:
        key = None
    checked = check_inputs(q, k, v, version, causal, scale, window), check_window(window, causal, version)
    if key is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = checked
    return checked


def aligned(t: torch.Tensor) -> torch.Tensor:
    """Dense [B, H, L, D] memory with a 16-byte aligned base (v4 and later load float4s); a misaligned
    view, such as x[..., 1:, :], is copied."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()



@dataclass(frozen=True)
class Plan:
    """A checked call: `version` as asked, `runs_as` the version that runs it, and `run(q, k, v)`, which
    calls it without checking again. A plan holds for the tensors it was made from and any others of the
    same shapes, dtype and device. `scale`: the softmax scale, passed on when not None (None is 1/sqrt(D),
    every binding's default); `window`: the sliding window as check_window returns it, passed on when it
    hides keys that `causal` alone does not (reference.window_narrows)."""
    version: str
    runs_as: str
    causal: bool
    binding: Callable = field(repr=False, compare=False)   # forward(q, k, v, causal[, scale[, window]]) of runs_as
    scale: float | None = None
    window: tuple[int, int] = (-1, -1)

    def run(self, q, k, v):
        kernel = INFO[self.runs_as].kernel
        if kernel:
            q, k, v = aligned(q), aligned(k), aligned(v)
        if reference.window_narrows(self.causal, self.window):   # bindings take its two sides, PyTorch the pair
            return self.binding(q, k, v, self.causal, self.scale, *(self.window if kernel else (self.window,)))
        if self.scale is None:
            return self.binding(q, k, v, self.causal)
        return self.binding(q, k, v, self.causal, self.scale)

    __call__ = run


def plan(q, k, v, version: str = "v4", causal: bool = False, scale: float | None = None,
         window=(-1, -1)) -> Plan:
    """Check q [B, H, M, D], k and v [B, H_kv, N, D] for `version` (ValueError or TypeError naming the
    argument) and resolve the call; a kernel is compiled or loaded here, before anything is timed."""
    runs_as = check_inputs(q, k, v, version, causal, scale, window)
    binding = loader.load(runs_as).forward if INFO[runs_as].kernel else getattr(reference, runs_as)
    return Plan(version, runs_as, causal, binding, None if scale is None else float(scale),
                check_window(window, causal, version))
