"""Attention kernels from outside this project, timed as columns of our own runs: FlashAttention-4.

FlashAttention-4 (the `flash-attn-4` package, imported as `flash_attn.cute`) is written in NVIDIA's CuTe DSL;
on sm_90 its kernels follow FlashAttention-3's design (wgmma, TMA, warp specialization, ping-pong). It is not
a dependency of this project: where it does not import, its rows say so ("unsupported") and the run goes on.
On the H200 host it comes from `../shared/fa4-wheels.sh`.

Its inputs are (batch, seq, heads, head_dim) where ours are (batch, heads, seq, head_dim). The inputs are
transposed and made contiguous once, before any timing, so a timed call is FlashAttention-4's kernel and
nothing else; the outputs (and gradients) are handed back as transposed views, which cost nothing. The
backward, like every backward column, goes through `torch.autograd.grad` on the forward's output.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import warnings

import torch

PEERS = ("fa4",)


def fa4_module():
    """`flash_attn.cute`; ValueError saying why when it does not import."""
    try:
        return importlib.import_module("flash_attn.cute")
    except Exception as err:   # ImportError, or a CuTe DSL that cannot load its libraries on this machine
        raise ValueError(f"fa4: flash_attn.cute (FlashAttention-4) does not import here "
                         f"({type(err).__name__}: {err})") from None


def fa4_function(name: str = "flash_attn_func"):
    """FlashAttention-4's function `name` (`flash_attn_func`, or `flash_attn_varlen_func` for caches), or None
    when `flash_attn.cute` does not import."""
    try:
        return getattr(fa4_module(), name)
    except ValueError:
        return None


def versions() -> dict[str, str | None]:
    """The installed version of each peer's package (None: not installed), for a record's meta."""
    out = {}
    for name, dist in (("fa4", "flash-attn-4"),):
        try:
            out[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _fa4(q):
    fn = fa4_module().flash_attn_func
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"fa4: takes bfloat16 or float16; got {q.dtype}")
    return fn


def _first(out):
    return out[0] if isinstance(out, tuple) else out       # some versions return (out, lse)


@contextlib.contextmanager
def quiet():
    """FlashAttention-4's CuTe DSL warns when it JIT-compiles, about an argument type it passes through:
    noise kept out of the caller's output (a notebook's, a log's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Argument aux_data", category=UserWarning)
        yield


def _compiled(call):
    """`call`, run once untimed so that the JIT compile happens here, quietly."""
    with quiet():
        call()
    return call


def forward_call(name: str, q, k, v, causal: bool):
    """A zero-argument callable running the peer's forward on (B, H, S, D) inputs and returning its output
    as a (B, H, M, D) view. ValueError when the peer cannot take the inputs here."""
    if name not in PEERS:
        raise ValueError(f"name must be one of {', '.join(PEERS)}; got {name!r}")
    fn = _fa4(q)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return _compiled(lambda: _first(fn(qt, kt, vt, causal=causal)).transpose(1, 2))


def backward_call(name: str, q, k, v, do, causal: bool):
    """A zero-argument callable returning the peer's (dq, dk, dv) given `do`, each as a (B, H, S, D) view:
    the forward runs once, here, and every call is torch.autograd.grad on its output (retain_graph=True)."""
    if name not in PEERS:
        raise ValueError(f"name must be one of {', '.join(PEERS)}; got {name!r}")
    fn = _fa4(q)
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    dot = do.transpose(1, 2).contiguous()
    with quiet():
        o = _first(fn(qt, kt, vt, causal=causal))
    return _compiled(lambda: tuple(g.transpose(1, 2)
                                   for g in torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)))
