"""The single-launch variable-length forward of v8: kernels/v8.cu built with FLASHATTN_VARLEN, as the
torch.library ops that `flashattn.attention_varlen` runs for version="v8".

    o = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, scale)     # inference
    o, lse = varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal,
                                      deterministic, scale)                                  # differentiable

q [total_q, H, D], k and v [total_k, H_kv, D], int32 cumulative lengths on the GPU (FlashAttention-2's
varlen layout). The kernel reads the lengths itself: one launch for the whole batch and no copy to the
host, so the forward can be captured in a CUDA graph. lse is float32 [H, total_q], FlashAttention-2's
varlen layout. Both ops are called with inputs already checked (flashattn.varlen.check_varlen);
max_seqlen_q must be at least the longest sequence (rows past it are not computed) and at most total_q.

The backward is not a single launch yet: it runs v8's backward kernel (kernels/v8_backward.cu) once per
sequence, on that sequence's slices of q, k, v, o, do and lse, which needs the lengths on the host (one
copy per backward call, which waits for the GPU's queue).

The kernel's item mapping, bands, TMA coordinates and masks are checked on the CPU
(tests/test_varlen_bounds.py), its results against float64 on an H200 by tests/test_varlen.py; its speed
by flashattn.measure.varlen_bench (results/h200/varlen.json: 0.71x FlashAttention-4's varlen forward on the
H200, 4.0x cuDNN on the padded batch).
"""
from __future__ import annotations

import functools

import torch

from flashattn.autograd import attention_backward
from flashattn.loader import build, check_device
from flashattn.validate import aligned

# The build: FLASHATTN_VARLEN compiles the packed-batch kernels (flash_fwd_varlen), FLASHATTN_LSE the ones
# that also write lse; the module exports only the two varlen functions.
VARLEN_FLAGS = ("-DFLASHATTN_LSE=1", "-DFLASHATTN_VARLEN=1")
VARLEN_FUNCTIONS = ("forward_varlen", "forward_varlen_lse")


@functools.cache
def varlen_module():
    """kernels/v8.cu built with VARLEN_FLAGS (forward_varlen, forward_varlen_lse); built once per process."""
    check_device("v8")
    return build("v8", extra_cuda_cflags=list(VARLEN_FLAGS), functions=VARLEN_FUNCTIONS,
                 module_name="flashattn_v8_varlen")


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


def sequence(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows start:end of a packed [total, H, D] tensor as a contiguous [1, H, end - start, D]."""
    return t[start:end].transpose(0, 1).unsqueeze(0).contiguous()


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()   # the host copy the per-sequence loop needs
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (q0, q1), (k0, k1) in zip(zip(bounds_q[:-1], bounds_q[1:]), zip(bounds_k[:-1], bounds_k[1:])):
        if q1 == q0 or k1 == k0:          # no row, or no key (output 0): the gradients stay 0
            continue
        lse_i = lse[:, q0:q1].unsqueeze(0).contiguous()                  # [H, total_q] -> [1, H, M_b]
        grads = attention_backward(sequence(q, q0, q1), sequence(k, k0, k1), sequence(v, k0, k1),
                                   sequence(o, q0, q1), lse_i, sequence(do, q0, q1), ctx.causal, "v8",
                                   ctx.deterministic, ctx.scale, *ctx.window)
        for full, grad, (a, b) in zip((dq, dk, dv), grads, ((q0, q1), (k0, k1), (k0, k1))):
            full[a:b] = grad[0].transpose(0, 1)
    return dq, dk, dv, None, None, None, None, None, None, None, None


varlen_attention_forward.register_autograd(_backward, setup_context=_setup_context)
