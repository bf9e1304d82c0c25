"""The backward benchmark's pieces: the FLOP count of a backward and a callable per backward path.

flashattn.measure.bench times them (`--backward`); flashattn.book.backward_steps.time_backward from Python.
"""
from __future__ import annotations

import contextlib

import torch

from flashattn.autograd import TRAINING_VERSIONS, attention
from flashattn.measure import peers
from flashattn.measure.sdpa_backends import SDPA_BACKENDS, sdpa_backend_context
from flashattn.reference import sdpa
from flashattn.validate import check_inputs

BACKWARD_NAMES = ("v6", "v6_deterministic", "v8_backward", "v8_backward_deterministic", "sdpa", "sdpa_flash",
                  "sdpa_cudnn", "sdpa_efficient") + peers.PEERS


def backward_flops(B: int, H: int, M: int, N: int, D: int, causal: bool = False) -> float:
    """2.5 x the forward's 4*B*H*M*N*D: five matrix products of 2*M*N*D each (S and dP recomputed, dV,
    dK, dQ) against the forward's two; causal masking skips about half."""
    flops = 2.5 * 4.0 * B * H * M * N * D
    return flops / 2 if causal else flops


def backward_call(name: str, q, k, v, do, causal: bool = False, deterministic: bool = False):
    """A zero-argument callable that computes (dq, dk, dv) given do, and nothing else: the forward runs
    once, here, and every call is `torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` on its output,
    the path a user's training step takes, for every name alike. name: "v6" (flashattn.attention, its
    backward kernels; `deterministic` picks the dQ path), "v7" and "v8" (their forwards and their own backward,
    kernels/v8_backward.cu),
    "v6_deterministic" (v6 with deterministic=True), "v8_backward" (v8's forward trained by
    kernels/v8_backward.cu: attention(version="v8", backward="v8_backward")), "v8_backward_deterministic" (the
    same with deterministic=True), "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient" (PyTorch's backward
    of that SDPA backend) or a peer of flashattn.measure.peers ("fa4")."""
    if name not in BACKWARD_NAMES + TRAINING_VERSIONS:
        raise ValueError(f"name must be one of {', '.join(BACKWARD_NAMES + TRAINING_VERSIONS)}; got {name!r}")
    if do.shape != q.shape:
        raise ValueError(f"do must have the shape of q {tuple(q.shape)}; got {tuple(do.shape)}")
    if name in peers.PEERS:
        return peers.backward_call(name, q, k, v, do, causal)
    if name.endswith("_deterministic"):
        name, deterministic = name.removesuffix("_deterministic"), True
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    if name == "v8_backward":
        check_inputs(q, k, v, "v8", causal)
        o = attention(q, k, v, causal=causal, version="v8", deterministic=deterministic, backward=name)
    elif name in TRAINING_VERSIONS:
        check_inputs(q, k, v, name, causal)
        o = attention(q, k, v, causal=causal, version=name, deterministic=deterministic)
    else:
        context = sdpa_backend_context(name) if name in SDPA_BACKENDS else contextlib.nullcontext
        with context():   # the backend is chosen in the forward; autograd then runs that backend's backward
            o = sdpa(q, k, v, causal=causal)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
