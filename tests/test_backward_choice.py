"""`flashattn.attention(..., backward=...)`: which backward kernel file trains a version.

v6 trains on kernels/v6_backward.cu; v7 and v8 train on kernels/v8_backward.cu by default and can also train on
kernels/v6_backward.cu (backward="v6_backward"). The choice is checked before any launch and
travels through the autograd op to the backward. CPU tests check the validation and the op schema; the GPU
tests (Hopper) check gradients through the path a user calls against float64, and that the autograd path
runs the chosen kernel (dK and dV, which v8_backward writes without atomics, equal its raw call's bits).
"""
from __future__ import annotations

import inspect
import sys
import zlib
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402
from test_backward import compare_grads  # noqa: E402
from test_gqa import make  # noqa: E402
from test_v7 import check_output, is_hopper  # noqa: E402

import flashattn  # noqa: E402
from flashattn.autograd import backward_module, forward_module  # noqa: E402
from flashattn.measure import kernel_trace  # noqa: E402
from flashattn.measure.backward import BACKWARD_NAMES, backward_call  # noqa: E402
from flashattn.validate import check_backward  # noqa: E402
from flashattn.versions import INFO  # noqa: E402

needs_hopper = pytest.mark.skipif(not is_hopper(), reason="the v8 backward needs a GPU of compute capability 9.0 "
                                                          "(an sm_90a build: wgmma, TMA)")


# ================================================================ CPU
@pytest.mark.parametrize("version,own", [("v6", "v6_backward"), ("v7", "v8_backward"), ("v8", "v8_backward")])
def test_none_is_the_versions_own_backward(version, own):
    assert check_backward(None, version) == INFO[version].backward == own
    assert check_backward(own, version) == own


@pytest.mark.parametrize("version", ["v7", "v8"])
def test_hopper_versions_also_take_v6s_backward(version):
    assert check_backward("v6_backward", version) == "v6_backward"


@pytest.mark.parametrize("backward,version,error,says", [
    ("v8_backward", "v6", ValueError, "cannot train v6; it trains on v6_backward"),
    ("v7_backward", "v8", ValueError, "trains on v8_backward, v6_backward"),
    ("v8_backward", "v4", ValueError, "no backward kernel"),
    (8, "v8", TypeError, "backward must be a kernel file name"),
])
def test_a_backward_that_cannot_train_the_version_is_refused_by_name(backward, version, error, says):
    with pytest.raises(error, match=says):
        check_backward(backward, version)


def test_attention_checks_backward_before_anything_runs():
    """On CPU tensors the device check speaks first; a bad backward with CUDA-less inputs never gets further
    than Python either way (nothing is built or launched)."""
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        flashattn.attention(q, q, q, version="v8", backward="v8_backward")
    assert "backward" in inspect.signature(flashattn.attention).parameters


def test_the_ops_carry_the_backward_after_the_window():
    """The kernel file's name is the last argument of both ops, "" (the version's own) by default, so the
    calls that do not choose keep their old form."""
    for op in (torch.ops.flashattn.attention_forward, torch.ops.flashattn.attention_backward):
        schema = str(op.default._schema)
        assert 'SymInt window_right=-1, str backward="") ->' in schema, schema


def test_the_backward_benchmark_has_a_column_for_the_hopper_backward():
    assert "v8_backward" in BACKWARD_NAMES
    with pytest.raises(ValueError, match="name must be one of"):
        backward_call("v9_backward", *(torch.zeros(1, 1, 1, 64),) * 4)


def test_backward_module_builds_the_named_file():
    """backward_module(version, kernel) builds `kernel` (cached per pair), None the version's own file."""
    with pytest.MonkeyPatch.context() as mp:
        built = []
        mp.setattr("flashattn.autograd.check_device", lambda version: None)
        mp.setattr("flashattn.autograd.build", lambda kernel, functions: built.append((kernel, functions)) or kernel)
        backward_module.cache_clear()
        try:
            assert backward_module("v8") == "v8_backward"
            assert backward_module("v8", "v6_backward") == "v6_backward"
        finally:
            backward_module.cache_clear()
    assert built == [("v8_backward", ("backward",)), ("v6_backward", ("backward",))]


# ================================================================ GPU
@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("version", ["v7", "v8"])
@pytest.mark.parametrize("B,H,H_kv,M,N,D,causal,window", [
    (2, 3, 3, 113, 203, 64, False, (-1, -1)),
    (1, 4, 2, 203, 113, 128, True, (-1, -1)),
    (2, 8, 2, 1023, 1025, 128, True, (-1, -1)),
    (1, 6, 1, 300, 517, 64, False, (40, 8)),
    (1, 2, 2, 1, 17, 128, False, (-1, -1)),
])
def test_gradients_through_attention_match_float64(version, B, H, H_kv, M, N, D, causal, window):
    check_attention_grads(("choice", version), B, H, H_kv, M, N, D, causal, window, version=version,
                          backward="v8_backward")


def check_attention_grads(tag, B, H, H_kv, M, N, D, causal, window, check_forward=False, **attention_kw):
    """Fresh inputs (bf16 or fp16, by the seed from `tag` and the shape) through flashattn.attention(...,
    **attention_kw) and torch.autograd.grad: dq, dk, dv against float64 within twice SDPA's error, from
    memory filled with NaN first; with check_forward, o too (its memory poisoned as well)."""
    seed = zlib.crc32(repr((*tag, B, H, H_kv, M, N, D, causal, window)).encode())
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    q, k, v, do = make(B, H, H_kv, M, N, D, dtype, seed)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    if check_forward:
        conftest.poison_allocator(q)
    o = flashattn.attention(*leaves, causal=causal, window=window, **attention_kw)
    if check_forward:
        check_output(o.detach(), q, k, v, causal, None, window)
    conftest.poison_allocator(q, k, v)   # dq, dk, dv come from memory filled with NaN first
    got = torch.autograd.grad(o, leaves, do)
    compare_grads(got, q, k, v, do, causal, window=window)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("backward,launched,not_launched", [(None, "flash_bwd_ws", "bwd_dkdv"),
                                                           ("v6_backward", "bwd_dkdv", "flash_bwd_ws")])
def test_v8_trains_on_the_hopper_backward_by_default(backward, launched, not_launched):
    """What CUPTI sees in the backward of attention(version="v8"): kernels/v8_backward.cu's warp-specialized
    kernel by default, V6's key-tile kernels when asked for."""
    q, k, v, do = make(1, 4, 2, 203, 113, 64, torch.bfloat16, seed=4)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = flashattn.attention(*leaves, causal=True, version="v8", backward=backward)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        got = torch.autograd.grad(o, leaves, do)
        torch.cuda.synchronize()
    names = [name for name, _, _ in kernel_trace.kernels(prof)]
    assert any(launched in n for n in names) and not any(not_launched in n for n in names), names
    compare_grads(got, q, k, v, do, True)


@pytest.mark.gpu
@needs_hopper
def test_autograd_runs_the_chosen_kernel():
    """The autograd path launches kernels/v8_backward.cu's warp-specialized kernel (seen by CUPTI), not V6's,
    and its dK and dV equal, bit for bit, a raw call of that file on the same o and lse (dQ is summed in
    fp32 from many key tiles, so only its value is compared). The bits alone cannot tell the two files
    apart: on the H200 V6's backward gave the same dK and dV at this shape, the same products summed in
    the same order."""
    q, k, v, do = make(2, 4, 2, 333, 200, 128, torch.bfloat16, seed=3)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = flashattn.attention(*leaves, causal=True, version="v8", backward="v8_backward")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dq, dk, dv = torch.autograd.grad(o, leaves, do)
        torch.cuda.synchronize()
    names = [name for name, _, _ in kernel_trace.kernels(prof)]
    assert any("flash_bwd_ws" in n for n in names), names
    assert not any("bwd_dkdv" in n for n in names), names
    o_raw, lse = forward_module("v8").forward_lse(q, k, v, True, None, -1, -1)
    assert torch.equal(o_raw, o.detach())
    raw = backward_module("v8", "v8_backward").backward(q, k, v, o_raw, lse, do, True, False, None, -1, -1)
    assert torch.equal(raw[1], dk) and torch.equal(raw[2], dv)
    torch.testing.assert_close(raw[0], dq, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@needs_hopper
def test_deterministic_travels_to_the_hopper_backward():
    """deterministic=True reaches kernels/v8_backward.cu through autograd: two backward passes give the same
    bits, within float64's bound."""
    q, k, v, do = make(2, 8, 2, 1023, 1025, 128, torch.bfloat16, seed=1)
    grads = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o = flashattn.attention(*leaves, causal=True, version="v8", deterministic=True, backward="v8_backward")
        grads.append(torch.autograd.grad(o, leaves, do))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    compare_grads(grads[0], q, k, v, do, True)


@pytest.mark.gpu
@needs_hopper
def test_the_benchmark_column_trains_on_the_hopper_backward():
    q, k, v, do = make(1, 2, 2, 256, 256, 64, torch.bfloat16, seed=2)
    got = backward_call("v8_backward", q, k, v, do, causal=True)()
    compare_grads(got, q, k, v, do, True)
