"""The single-launch variable-length forward and backward of v8: kernels/v8.cu and kernels/v8_backward.cu built
with FLASHATTN_VARLEN, as the torch.library ops that `flashattn.attention_varlen` runs for version="v8".

    o = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, scale)     # inference
    o, lse = varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal,
                                      deterministic, scale, max_seqlen_k=...)                # differentiable
    dq, dk, dv = varlen_attention_backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, causal, deterministic, scale)      # its gradients

q [total_q, H, D], k and v [total_k, H_kv, D], int32 cumulative lengths on the GPU (FlashAttention-2's
varlen layout). The kernel reads the lengths itself: one launch for the whole batch and no copy to the
host, so the forward can be captured in a CUDA graph. lse is float32 [H, total_q], FlashAttention-2's
varlen layout. Both ops are called with inputs already checked (flashattn.varlen.check_varlen);
max_seqlen_q must be at least the longest sequence (rows past it are not computed) and at most total_q.

The backward is one launch of each of v8_backward.cu's three kernels for the whole batch (the row terms,
the gradients, dQ's conversion), each block of the main kernel a key tile of one (sequence, kv head) that
reads its lengths on the GPU, so it makes no copy to the host either. `backward_per_sequence`, the first
version, runs v8's fixed-length backward once per sequence on its slices (the lengths copied to the host,
six copies in and three out per sequence); flashattn.measure.varlen_bench times both.

The forward's pre-pass (its row blocks, longest work first), the kernels' item mapping, bands, TMA
coordinates, masks and padded rows are checked on the CPU (tests/test_varlen_bounds.py,
tests/test_varlen_backward_bounds.py), their results against float64 on an H200 by tests/test_varlen.py;
their speed by flashattn.measure.varlen_bench (results/h200/varlen.json on the H200: the forward 0.99x
FlashAttention-4's varlen forward and 5.7x cuDNN on the padded batch, the backward 0.90x FlashAttention-4's
and 1.50x backward_per_sequence), the forward's order step by flashattn.measure.varlen_order.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from flashattn.autograd import attention_backward
from flashattn.loader import build, check_device
from flashattn.validate import aligned

# The build: FLASHATTN_VARLEN compiles the packed-batch kernels (flash_fwd_varlen; in v8_backward.cu
# flash_bwd_varlen and its pre-pass and conversion), FLASHATTN_LSE the forward's that also write lse; each
# module exports only its varlen functions.
VARLEN_FLAGS = ("-DFLASHATTN_LSE=1", "-DFLASHATTN_VARLEN=1")
VARLEN_FUNCTIONS = ("forward_varlen", "forward_varlen_lse")
VARLEN_BACKWARD_FLAGS = ("-DFLASHATTN_VARLEN=1",)
VARLEN_BACKWARD_FUNCTIONS = ("backward_varlen",)


@functools.cache
def varlen_module():
    """kernels/v8.cu built with VARLEN_FLAGS (forward_varlen, forward_varlen_lse); built once per process."""
    check_device("v8")
    return build("v8", extra_cuda_cflags=list(VARLEN_FLAGS), functions=VARLEN_FUNCTIONS,
                 module_name="flashattn_v8_varlen")


@functools.cache
def varlen_backward_module():
    """kernels/v8_backward.cu built with VARLEN_BACKWARD_FLAGS (backward_varlen); built once per process."""
    check_device("v8")
    return build("v8_backward", extra_cuda_cflags=list(VARLEN_BACKWARD_FLAGS), functions=VARLEN_BACKWARD_FUNCTIONS,
                 module_name="flashattn_v8_backward_varlen")


# ------------------------------------------------------------------------------------------ the ops
@torch.library.custom_op("flashattn::varlen_forward", mutates_args=(), device_types="cuda")
def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, causal: bool, scale: float,
                   window_left: int = -1, window_right: int = -1) -> torch.Tensor:
    """o [total_q, H, D] for the packed batch, in one launch of v8's varlen kernel."""
    return varlen_module().forward_varlen(aligned(q), aligned(k), aligned(v), cu_seqlens_q.contiguous(),
                                          cu_seqlens_k.contiguous(), max_seqlen_q, causal, scale, window_left,
                                          window_right)


@varlen_forward.register_fake
def _varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, scale, window_left=-1,
                         window_right=-1):
    return q.new_empty(q.shape)


@torch.library.custom_op("flashattn::varlen_attention_forward", mutates_args=(), device_types="cuda")
def varlen_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             cu_seqlens_k: torch.Tensor, max_seqlen_q: int, causal: bool, deterministic: bool,
                             scale: float, window_left: int = -1,
                             window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o [total_q, H, D] and lse float32 [H, total_q] (-inf for rows that see no key), in one
    launch. `deterministic` is not used by the forward; it travels here for the backward."""
    return varlen_module().forward_varlen_lse(aligned(q), aligned(k), aligned(v), cu_seqlens_q.contiguous(),
                                              cu_seqlens_k.contiguous(), max_seqlen_q, causal, scale, window_left,
                                              window_right)


@varlen_attention_forward.register_fake
def _varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, deterministic, scale,
                                   window_left=-1, window_right=-1):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, _, causal, deterministic, scale, window_left, window_right = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.causal, ctx.deterministic, ctx.scale, ctx.window = causal, deterministic, scale, (window_left, window_right)
    ctx.mark_non_differentiable(lse)


@torch.library.custom_op("flashattn::varlen_attention_backward", mutates_args=(), device_types="cuda")
def varlen_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                              do: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool,
                              deterministic: bool, scale: float, window_left: int = -1,
                              window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the packed batch, shaped like q, k, v, in one launch of each of v8's backward kernels."""
    return varlen_backward_module().backward_varlen(aligned(q), aligned(k), aligned(v), aligned(o), lse.contiguous(),
                                                    aligned(do), cu_seqlens_q.contiguous(),
                                                    cu_seqlens_k.contiguous(), causal, deterministic, scale,
                                                    window_left, window_right)


@varlen_attention_backward.register_fake
def _varlen_attention_backward_fake(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, causal, deterministic, scale,
                                    window_left=-1, window_right=-1):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# Which backward autograd runs: the single launch, or (inside `per_sequence_backward()`, for the benchmark's
# step column) the first version's loop over the sequences.
# A module flag, not a thread-local one: autograd runs a CUDA backward on its own device thread.
_PER_SEQUENCE = {"on": False}


@contextlib.contextmanager
def per_sequence_backward():
    """Within this block, backward passes of varlen_attention_forward run backward_per_sequence (every thread)."""
    before = _PER_SEQUENCE["on"]
    _PER_SEQUENCE["on"] = True
    try:
        yield
    finally:
        _PER_SEQUENCE["on"] = before


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    run = backward_per_sequence if _PER_SEQUENCE["on"] else varlen_attention_backward
    dq, dk, dv = run(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, ctx.causal, ctx.deterministic, ctx.scale,
                     *ctx.window)
    return dq, dk, dv, None, None, None, None, None, None, None, None


varlen_attention_forward.register_autograd(_backward, setup_context=_setup_context)


# ------------------------------------------------------------------- the first version, for comparison
def sequence(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows start:end of a packed [total, H, D] tensor as a contiguous [1, H, end - start, D]."""
    return t[start:end].transpose(0, 1).unsqueeze(0).contiguous()


def backward_per_sequence(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, causal: bool, deterministic: bool,
                          scale: float, window_left: int = -1, window_right: int = -1):
    """varlen_attention_backward's gradients as the first version computed them: v8's fixed-length backward once
    per non-empty sequence, on contiguous copies of its slices (the lengths copied to the host first)."""
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (q0, q1), (k0, k1) in zip(zip(bounds_q[:-1], bounds_q[1:]), zip(bounds_k[:-1], bounds_k[1:])):
        if q1 == q0 or k1 == k0:          # no row, or no key (output 0): the gradients stay 0
            continue
        lse_i = lse[:, q0:q1].unsqueeze(0).contiguous()                  # [H, total_q] -> [1, H, M_b]
        grads = attention_backward(sequence(q, q0, q1), sequence(k, k0, k1), sequence(v, k0, k1),
                                   sequence(o, q0, q1), lse_i, sequence(do, q0, q1), causal, "v8",
                                   deterministic, scale, window_left, window_right)
        for full, grad, (a, b) in zip((dq, dk, dv), grads, ((q0, q1), (k0, k1), (k0, k1))):
            full[a:b] = grad[0].transpose(0, 1)
    return dq, dk, dv
