"""The kernels as PyTorch operators: `flashattn.forward` (every version) and `flashattn.attention` (the one
that trains).

    import flashattn
    o = flashattn.forward(q, k, v, version="v4")     # q [B, H, M, D], k, v [B, H, N, D]
    o = flashattn.attention(q, k, v, causal=True)    # version="v6" (or "v7", "v8")
    o.sum().backward()                               # dq, dk, dv from kernels/v6_backward.cu (v8: v8_backward.cu)
    o = flashattn.attention(q, k4, v4, scale=0.1)    # grouped-query: k4, v4 [B, H / G, N, D]
    o = flashattn.attention(q, k, v, window=(256, 0))  # sliding window: each row sees its last 257 keys
    o = flashattn.attention(q, k, v, version="v8", backward="v6_backward")  # V8 on V6's mma.sync backward

v6, v7 and v8 (and the PyTorch versions) take grouped-query attention, k and v with H_kv heads dividing
q's H (query head h reads kv head h // (H / H_kv); H_kv = 1 is multi-query), with dk and dv shaped like k
and v, `scale`, the softmax scale (None: 1/sqrt(D), which `forward` and `attention` hand the kernels
as a number), and `window` = (left, right), FlashAttention-2's sliding window (flashattn.validate.check_window:
row i of M sees key j of N iff i + N - M - left <= j <= i + N - M + right, a side -1 bounding nothing;
causal is (-1, 0)).

Three `torch.library.custom_op`s in the "flashattn" namespace carry the kernel calls:

* ``flashattn::forward(q, k, v, version, causal, scale=None, window_left=-1, window_right=-1) -> o``: one
  version's plain forward binding;
* ``flashattn::attention_forward(q, k, v, causal, version, deterministic, scale=None, window_left=-1,
  window_right=-1, backward="") -> (o, lse)``: the forward that also returns the row-wise log-sum-exp
  (float32 [B, H, M]), the one number per row the backward needs to recompute P without storing it;
* ``flashattn::attention_backward(q, k, v, o, lse, do, causal, version, deterministic, scale=None,
  window_left=-1, window_right=-1, backward="") -> (dq, dk, dv)``; `backward` names the backward kernel
  file ("" is the version's own, Version.backward).

The window's sides are passed only when it narrows what `causal` sees (reference.window_narrows), and
`backward` only when it is not the version's own, so that the calls without them are the calls they
always were.

All three have a fake (meta) implementation, so `torch.compile(fullgraph=True)` traces `flashattn.forward`
and `flashattn.attention` without running anything and without a graph break: building a kernel (which sets
CUDA_HOME for the compiler) happens inside the ops, where Dynamo does not look. `register_autograd`
connects the second and third (the forward saves q, k, v, o, lse). The ops allocate through PyTorch's
caching allocator and never synchronise, so they can be captured in a CUDA graph (build the kernels before
capturing: call the function once).

In eager mode with plain tensors, `attention` (and `forward` with an input that requires grad) skips the
dispatcher: a torch.autograd.Function calls the same two bindings, since a custom op's Python-to-C++-to-Python
hops cost a small model's host-bound training step 270 to 400 µs per layer (the section "eager path" below;
`python -m flashattn.measure.host_cost`). Tracing (torch.compile, make_fx, FakeTensorMode) and tensor
subclasses still see the ops.

The input checks (`flashattn.check_inputs`: types, ranks, dtypes, shapes, head dim, device) run in Python
before the ops, and look only at shapes, dtypes and devices, so Dynamo traces them as guards. In eager mode
a call that passed them is remembered by those (flashattn.validate.check_call), so a training loop's next
call costs a dictionary lookup, not the checks. Pointer alignment and contiguity are handled inside the ops,
which Dynamo does not look into.

An input that requires grad (with grad enabled) goes through the differentiable op when its version has a
backward kernel (TRAINING_VERSIONS); any other version raises, naming those that train, rather than return
an output cut off from the graph or train through something else than the version asked for.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from flashattn import reference
from flashattn.loader import build, check_device, load
from flashattn.validate import aligned, check_backward, check_backward_head_dim, check_call
from flashattn.versions import INFO

TRAINING_VERSIONS: tuple[str, ...] = tuple(n for n, v in INFO.items() if v.backward)
BACKWARD_DTYPES = (torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------------------ kernels
@functools.cache
def forward_module(version: str):
    """The version's kernel file built with its training binding `forward_lse` next to `forward`
    (FLASHATTN_LSE=1: v7 and v8 compile forward_lse's kernels only when asked; v6 always does)."""
    check_device(version)
    return build(version, extra_cuda_cflags=["-DFLASHATTN_LSE=1"], functions=("forward", "forward_lse"),
                 module_name=f"flashattn_{version}_train")


@functools.cache
def backward_module(version: str, kernel: str | None = None):
    """The extension built from a backward kernel file that trains `version` (`backward(...)` binding):
    `kernel`, or None for the version's own (Version.backward)."""
    check_device(version)
    return build(kernel or INFO[version].backward, functions=("backward",))


# ------------------------------------------------------------------------------------------ the ops
@torch.library.custom_op("flashattn::forward", mutates_args=(), device_types="cuda")
def kernel_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, version: str, causal: bool,
                   scale: float | None = None, window_left: int = -1, window_right: int = -1) -> torch.Tensor:
    """o = softmax(scale * q k^T) v by the forward binding of kernel version `version` (the version that
    runs, as check_inputs resolved it: no fallback happens here). scale=None: 1/sqrt(D), the only scale
    of the bindings that take none (v0 to v5), which take no window either."""
    if (window_left, window_right) != (-1, -1):
        return load(version).forward(aligned(q), aligned(k), aligned(v), causal, scale, window_left, window_right)
    if scale is None:
        return load(version).forward(aligned(q), aligned(k), aligned(v), causal)
    return load(version).forward(aligned(q), aligned(k), aligned(v), causal, scale)


@kernel_forward.register_fake
def _kernel_forward_fake(q, k, v, version, causal, scale=None, window_left=-1, window_right=-1):
    return q.new_empty(q.shape)       # every binding returns o like q: same shape, dtype, dense layout


@torch.library.custom_op("flashattn::attention_forward", mutates_args=(), device_types="cuda")
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, version: str,
                      deterministic: bool, scale: float | None = None, window_left: int = -1,
                      window_right: int = -1, backward: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o = softmax(scale * q k^T) v, lse float32 [B, H, M] (-inf for rows that see no key);
    scale=None is 1/sqrt(D). `deterministic` and `backward` are not used by the forward; they travel here
    so that the backward can read them."""
    return forward_module(version).forward_lse(aligned(q), aligned(k), aligned(v), causal, scale, window_left,
                                               window_right)


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal, version, deterministic, scale=None, window_left=-1, window_right=-1,
                            backward=""):
    B, H, M, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, M), dtype=torch.float32)


@torch.library.custom_op("flashattn::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, causal: bool, version: str, deterministic: bool,
                       scale: float | None = None, window_left: int = -1, window_right: int = -1,
                       backward: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the attention output o given its gradient do, dk and dv shaped like k and v (with
    grouped-query heads: summed over the query heads that read them); deterministic=True sums dQ without
    atomics (bit-identical from run to run, slower). `backward`: the kernel file ("" is the version's)."""
    module = backward_module(version, backward or None)
    return module.backward(aligned(q), aligned(k), aligned(v), aligned(o), aligned(lse), aligned(do), causal,
                           deterministic, scale, window_left, window_right)


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, o, lse, do, causal, version, deterministic, scale=None, window_left=-1,
                             window_right=-1, backward=""):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, version, deterministic, scale, window_left, window_right, backward = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.version, ctx.deterministic, ctx.scale = causal, version, deterministic, scale
    ctx.window, ctx.backward = (window_left, window_right), backward
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(q, k, v, o, lse, do.contiguous(), ctx.causal, ctx.version,
                                    ctx.deterministic, ctx.scale, *ctx.window, ctx.backward)
    return dq, dk, dv, None, None, None, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------ eager path
# A call through a torch.library.custom_op hops Python -> dispatcher (C++) -> autograd kernel (Python) ->
# dispatcher -> the implementation (Python), twice per training step (forward and backward), with the
# op's checks on every argument: tens of microseconds per call (pytorch/pytorch#139500, #176592). A small
# model's training step is bound by the host, so that time is step time. In eager mode with plain tensors
# `attention` therefore calls the bindings from a torch.autograd.Function instead; torch.compile, make_fx,
# FakeTensorMode, tensor subclasses and dispatch modes see the custom ops (the two paths run the same
# bindings on the same arguments: tests/test_autograd.py checks their bits agree).
_always_through_ops = False


@contextlib.contextmanager
def through_custom_ops():
    """Every call of `attention` inside goes through the custom ops, as under torch.compile (the host-cost
    benchmark's comparison and the tests of the two paths)."""
    global _always_through_ops
    was, _always_through_ops = _always_through_ops, True
    try:
        yield
    finally:
        _always_through_ops = was


def _eager(q, k, v) -> bool:
    """Plain tensors, no tracing: nothing needs to see the op."""
    return (not _always_through_ops and type(q) is torch.Tensor and type(k) is torch.Tensor
            and type(v) is torch.Tensor and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None and not torch._C._is_torch_function_mode_enabled())


class _Attention(torch.autograd.Function):
    """attention_forward and attention_backward's bindings without the dispatcher in between. q, k and v
    are saved as the kernels read them (dense copies of strided views), so the backward copies nothing
    again, as FlashAttention-2's autograd function does."""

    @staticmethod
    def forward(ctx, q, k, v, causal, version, deterministic, scale, window_left, window_right, backward):
        q, k, v = aligned(q), aligned(k), aligned(v)
        o, lse = forward_module(version).forward_lse(q, k, v, causal, scale, window_left, window_right)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, deterministic, scale, window_left, window_right)
        ctx.module = backward_module(version, backward or None) if ctx.needs_input_grad[:3] != (False,) * 3 else None
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ctx.module.backward(q, k, v, o, lse, aligned(do), *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None


# ------------------------------------------------------------------------------------------ user API
def requires_grad(q, k, v) -> bool:
    """Whether autograd will want gradients of the attention output."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def forward(q, k, v, version: str = "v4", causal: bool = False, scale: float | None = None, window=(-1, -1)):
    """Attention output softmax(scale * q k^T) v, computed by `version`; scale=None is 1/sqrt(D), the only
    scale of versions without `scale` in flashattn.INFO. k and v may have fewer heads than q where the
    version has `gqa` (grouped-query attention: H_q a multiple of H_kv); window=(left, right) is a sliding
    window (flashattn.validate.check_window) where the version has `window`.

    Inputs are checked before anything is launched (ValueError or TypeError naming the argument).
    Non-contiguous inputs are accepted: they are copied to contiguous memory first, since every kernel
    indexes a dense [B, H, L, D] layout. v3, v4 and v5 hand head dims they are not specialised for to v2.
    With an input that requires grad, the versions that train (TRAINING_VERSIONS) run their differentiable
    op; the others raise ValueError (run them under torch.no_grad()).
    """
    runs_as, window = check_call(q, k, v, version, causal, scale, window)
    if requires_grad(q, k, v):
        return _differentiable(q, k, v, causal, version, False, scale, window)
    return _forward(q, k, v, runs_as, causal, scale, window)


def attention(q, k, v, causal: bool = False, version: str = "v6", deterministic: bool = False,
              scale: float | None = None, window=(-1, -1), backward: str | None = None):
    """softmax(scale * q k^T) v by `version`, differentiable when the version has a backward kernel;
    scale=None is 1/sqrt(D); window=(left, right) a sliding window, FlashAttention-2's window_size
    (flashattn.validate.check_window), which the backward masks too.

    q [B, H, M, D], k and v [B, H_kv, N, D] on one CUDA device, H_kv = H or, grouped-query attention
    (v6, v7, v8), any H_kv dividing H: query head h reads kv head h // (H / H_kv), and the gradients of k
    and v sum over the query heads that read them. Bad input raises ValueError or TypeError naming the
    argument before any launch. A version without a backward (all but v6, v7 and v8)
    raises when an input requires grad (instead of returning a tensor detached from the graph); with no
    gradient needed it runs its plain forward. deterministic=True makes dQ bit-identical from run to
    run (a separate dQ kernel instead of float32 atomics; see kernels/v6_backward.cu for the cost).
    backward: the backward kernel file, None for the version's own: kernels/v6_backward.cu for v6,
    kernels/v8_backward.cu (wgmma, TMA, warp specialization) for v7 and v8, which can also train on
    "v6_backward" (the Hopper backward was 1.42x to 1.74x as fast at the four shapes of
    results/h200/bench_backward.json).
    """
    runs_as, window = check_call(q, k, v, version, causal, scale, window)
    backward = check_backward(backward, version)
    if version in TRAINING_VERSIONS or requires_grad(q, k, v):
        return _differentiable(q, k, v, causal, version, deterministic, scale, window, backward)
    return _forward(q, k, v, runs_as, causal, scale, window)


def _forward(q, k, v, runs_as: str, causal: bool, scale: float | None, window: tuple[int, int]):
    if not INFO[runs_as].kernel:   # PyTorch code, which Dynamo traces as it is
        return getattr(reference, runs_as)(q, k, v, causal, scale, window)
    if reference.window_narrows(causal, window):
        return kernel_forward(q, k, v, runs_as, causal, reference.softmax_scale(q, scale), *window)
    if INFO[runs_as].scale:
        return kernel_forward(q, k, v, runs_as, causal, reference.softmax_scale(q, scale))
    return kernel_forward(q, k, v, runs_as, causal)


def _differentiable(q, k, v, causal: bool, version: str, deterministic: bool, scale: float | None,
                    window: tuple[int, int], backward: str | None = None):
    if version not in TRAINING_VERSIONS:
        raise ValueError(f"version {version!r} has no backward pass, but an input requires grad; "
                         f"versions that train: {', '.join(TRAINING_VERSIONS)} "
                         f"(or run {version!r} under torch.no_grad())")
    if requires_grad(q, k, v) and q.dtype not in BACKWARD_DTYPES:
        raise TypeError(f"q has dtype {str(q.dtype).replace('torch.', '')}; the backward of {version} takes "
                        f"bfloat16 and float16 (float32 runs forward only, in TF32 mode, under torch.no_grad())")
    if requires_grad(q, k, v):
        check_backward_head_dim(q.shape[-1], version, backward)
    left, right = window if reference.window_narrows(causal, window) else (-1, -1)
    kernel = "" if backward in (None, INFO[version].backward) else backward   # "": the version's own
    scale = reference.softmax_scale(q, scale)
    if _eager(q, k, v):
        return _Attention.apply(q, k, v, causal, version, deterministic, scale, left, right, kernel)
    # the op's trailing defaults stay unwritten, so that a call without them traces as it always did
    extra = [left, right, kernel] if kernel else [left, right] if (left, right) != (-1, -1) else []
    o, _ = attention_forward(q, k, v, causal, version, deterministic, scale, *extra)
    return o
