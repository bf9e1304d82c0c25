"""Grouped-query and multi-query attention and the softmax scale in the training path: k and v
with H_kv heads dividing q's H (query head h reads kv head h // (H / H_kv)), and scale= on
flashattn.forward and flashattn.attention (v6, v7, v8 forward, kernels/v6_backward.cu behind them).

  * CPU: bad head counts and bad scales (not a number, not finite, not > 0, outside float32's range, given
    to a version with 1/sqrt(D) built in) raise before any launch on every entry point, naming k or scale;
    the float64 reference, its gradients, `baseline` and `sdpa` with grouped heads and a scale against
    PyTorch's SDPA on the CPU; the ops' fakes and autograd wiring on meta tensors, and a trace with the
    scale in the graph.
  * GPU: forward (tests/test_v7.py's check_output) and gradients (tests/test_backward.py's compare_grads)
    against float64, each within twice SDPA's own error in the same dtype (SDPA with enable_gqa and
    scale=): H / H_kv = 32/8, 8/1 (multi-query), 6/2 and 4/4, lengths 1, 17, 113, 203 and 1023 with M != N
    both ways, causal and not, scale given and None, B and H > 1, large logits, poisoned outputs. Grouped
    heads give the bits of the same heads expanded; scale=None the bits of 1/sqrt(D); the deterministic
    mode repeats bit for bit and its dK, dV are the atomic mode's.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import poison_allocator
from test_backward import compare_grads
from test_v7 import check_output, is_hopper
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import flashattn
from flashattn.reference import attention_gradients, attention_reference, baseline, expand_heads, relative_error, sdpa

HEADS = [(32, 8), (8, 1), (6, 2), (4, 4)]   # H, H_kv: Llama-3's grouping, multi-query, an odd group, none
SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (1023, 1023), (1, 203), (203, 1)]   # M, N
SCALES = [None, 0.3]
TRAINING = list(flashattn.TRAINING_VERSIONS)


def qkv(B=2, H=8, H_kv=2, M=17, N=33, D=64, dtype=torch.bfloat16, device="cpu"):
    return (torch.randn(B, H, M, D, device=device).to(dtype),
            *(torch.randn(B, H_kv, N, D, device=device).to(dtype) for _ in range(2)))


# ================================================================ CPU: refused before any launch
# Every entry point, called with CPU tensors: the device check comes last, so an error other than "q must
# be a CUDA tensor" shows that the argument was refused before anything could be launched.
ENTRY_POINTS = [flashattn.check_inputs, flashattn.plan, flashattn.forward, flashattn.attention]
entry_points = pytest.mark.parametrize("call", ENTRY_POINTS, ids=lambda f: f.__name__)


@entry_points
@pytest.mark.parametrize("H,H_kv", [(8, 3), (2, 4), (6, 4), (1, 2)])
def test_kv_heads_must_divide_q_heads(call, H, H_kv):
    with pytest.raises(ValueError, match=rf"^k has {H_kv} heads, which must divide q's {H} heads"):
        call(*qkv(H=H, H_kv=H_kv), version="v6", scale=0.5)


@entry_points
def test_batch_head_dim_and_v_still_checked(call):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^k must match q in batch and head_dim"):
        call(q, k[:1], v[:1], version="v7")
    with pytest.raises(ValueError, match=r"^k must match q in batch and head_dim"):
        call(q, k[..., :32], v[..., :32], version="v8")
    with pytest.raises(ValueError, match=r"^v must have the same shape as k"):
        call(q, k, torch.cat([v, v], dim=1), version="v6")


@pytest.mark.parametrize("version", ["v0", "v1", "v2", "v3", "v4", "v5"])
def test_versions_without_gqa_keep_their_error_and_name_those_with_it(version):
    with pytest.raises(ValueError, match=r"^k must match q in batch, heads and head_dim: q \(2, 8, 17, 64\), "
                                         r"k \(2, 2, 17, 64\); .* taken by baseline, sdpa, v6, v7, v8$"):
        flashattn.forward(*qkv(M=17, N=17, dtype=torch.float32), version=version)


@entry_points
@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf"), -float("inf"), 1e-50, 1e39])
def test_scale_must_be_finite_and_positive(call, scale):
    with pytest.raises(ValueError, match=r"^scale must be a finite number > 0"):
        call(*qkv(), version="v6", scale=scale)


@entry_points
@pytest.mark.parametrize("scale", ["0.5", True, torch.tensor(0.5), [0.5], 1j])
def test_scale_must_be_a_real_number(call, scale):
    with pytest.raises(TypeError, match=r"^scale must be a float \(or None for 1/sqrt\(D\)\); got "):
        call(*qkv(), version="v6", scale=scale)


@entry_points
@pytest.mark.parametrize("scale", [None, 0.5, 2, np.float32(0.125), np.float64(0.3)])
def test_good_scales_reach_the_device_check(call, scale):
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        call(*qkv(), version="v6", scale=scale)


@pytest.mark.parametrize("version", ["v0", "v1", "v2", "v3", "v4", "v5"])
def test_versions_with_built_in_scale_refuse_another(version):
    q, k, v = qkv(H_kv=8, M=17, N=17, dtype=torch.float32)
    with pytest.raises(ValueError, match=rf"^scale is not taken by {version}, .*: baseline, sdpa, v6, v7, v8"):
        flashattn.forward(q, k, v, version=version, scale=0.125)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flashattn.forward(q, k, v, version=version, scale=None)


def test_what_each_version_takes():
    for name, info in flashattn.INFO.items():
        assert info.gqa == info.scale == (name in ("baseline", "sdpa", *TRAINING)), name
    assert TRAINING == ["v6", "v7", "v8"]


# ================================================================ CPU: the reference, the ops' fakes
def cpu_sdpa(q, k, v, causal, scale):
    """PyTorch's SDPA on the CPU (float64 here), grouped heads by enable_gqa; rows with no key -> 0."""
    mask = flashattn.reference.causal_mask(q.shape[2], k.shape[2]) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return torch.nan_to_num(out, nan=0.0)


@pytest.mark.parametrize("H,H_kv", HEADS)
@pytest.mark.parametrize("causal,M,N", [(False, 17, 33), (True, 33, 17), (True, 17, 33), (False, 1, 5)])
@pytest.mark.parametrize("scale", [None, 0.3, 2.0])
def test_reference_takes_grouped_heads_and_a_scale(H, H_kv, causal, M, N, scale):
    g = torch.Generator().manual_seed(H * 1000 + M * 10 + N)
    q, k, v, do = (torch.randn(2, h, L, 16, dtype=torch.float64, generator=g)
                   for h, L in ((H, M), (H_kv, N), (H_kv, N), (H, M)))
    ref = attention_reference(q, k, v, causal, scale=scale)
    assert torch.equal(ref, attention_reference(q, expand_heads(k, H), expand_heads(v, H), causal, scale=scale))
    torch.testing.assert_close(ref, cpu_sdpa(q, k, v, causal, scale), rtol=1e-12, atol=1e-12)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]   # autograd sums over repeat_interleave
    want = torch.autograd.grad(attention_reference(*leaves, causal, scale=scale), leaves, do)
    got = attention_gradients(q, k, v, do, causal, max_chunk_bytes=2 * M * N * 8, scale=scale)
    for a, b, t in zip(got, want, (q, k, v)):
        assert a.shape == t.shape
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    if not (causal and M > N):   # rows with no key: NaN from PyTorch's softmax, 0 from the reference
        for fn in (baseline, sdpa):
            torch.testing.assert_close(fn(q, k, v, causal, scale), ref, rtol=1e-12, atol=1e-12)


def test_fakes_and_autograd_give_grads_shaped_like_k_and_v():
    q = torch.empty(2, 8, 17, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.empty(2, 2, 5, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    for scale in (None, 0.25):
        o, lse = torch.ops.flashattn.attention_forward(q, k, v, True, "v6", False, scale)
        assert (o.shape, lse.shape) == (q.shape, (2, 8, 17))
        o.sum().backward()
        assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
        q.grad = k.grad = v.grad = None
    dq, dk, dv = torch.ops.flashattn.attention_backward(q, k, v, o, lse, o, True, "v6", False, 0.25)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


def test_traces_with_the_scale_in_the_graph():
    """make_fx over fake CUDA tensors: one op per call, the scale a constant of it (scale=None passes
    1/sqrt(D) to the kernels that take a scale, and nothing to those that do not)."""
    with FakeTensorMode():
        q = torch.empty(2, 8, 17, 64, dtype=torch.float16, device="cuda")
        k = torch.empty(2, 2, 33, 64, dtype=torch.float16, device="cuda")
        calls = {
            "attention": lambda a, b, c: flashattn.attention(a, b, c, causal=True, scale=0.2),
            "v8": lambda a, b, c: flashattn.forward(a, b, c, version="v8"),
            "v4": lambda a, b, c: flashattn.forward(a.float(), a.float(), a.float(), version="v4"),
        }
        graphs = {name: make_fx(fn)(q, k, k) for name, fn in calls.items()}
    ops = {name: [n for n in g.graph.nodes if n.op == "call_function" and "flashattn" in str(n.target)]
           for name, g in graphs.items()}
    assert [n.args[3:] for n in ops["attention"]] == [(True, "v6", False, 0.2)]
    assert [n.args[3:] for n in ops["v8"]] == [("v8", False, 0.125)]
    assert [n.args[3:] for n in ops["v4"]] == [("v4", False)]


# ================================================================ GPU
def needs(version: str) -> None:
    if flashattn.INFO[version].archs and not is_hopper():
        pytest.skip(f"{version} needs a GPU of compute capability 9.0")


def make(B, H, H_kv, M, N, D, dtype, seed, q_scale=1.0):
    """q, k, v, do on the GPU: q and do with H heads, k and v with H_kv."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, H, M, D, device="cuda", generator=g) * q_scale).to(dtype)
    k, v = (torch.randn(B, H_kv, N, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    return q, k, v, torch.randn(B, H, M, D, device="cuda", generator=g).to(dtype)


def draw(*key):
    """A seed from the test's parameters, and from it B (1 or 2) and the dtype: fixed across runs."""
    seed = zlib.crc32(repr(key).encode())
    return seed, (1, 2)[seed % 2], (torch.bfloat16, torch.float16)[(seed >> 1) % 2]


def run_forward(version, q, k, v, causal, scale, window=(-1, -1)):
    poison_allocator(q)   # the output's future memory holds NaN: a forgotten element stays NaN
    out = flashattn.forward(q, k, v, version=version, causal=causal, scale=scale, window=window)
    torch.cuda.synchronize()
    return out


def gradients(version, q, k, v, do, causal, scale, deterministic=False, window=(-1, -1)):
    """(o, (dq, dk, dv)) through flashattn.attention, the gradients' memory poisoned first."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = flashattn.attention(*leaves, causal=causal, version=version, deterministic=deterministic, scale=scale,
                            window=window)
    poison_allocator(q, k, v, q.float(), q.float())   # dq, dk, dv and the float32 dQ accumulator
    grads = torch.autograd.grad(o, leaves, do)
    torch.cuda.synchronize()
    return o.detach(), grads


@pytest.mark.gpu
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("H,H_kv", HEADS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", TRAINING)
def test_forward_matches_float64(version, D, H, H_kv, M, N, causal, scale):
    needs(version)
    seed, B, dtype = draw("forward", version, D, H, H_kv, M, N, causal, scale)
    q, k, v, _ = make(B, H, H_kv, M, N, D, dtype, seed)
    check_output(run_forward(version, q, k, v, causal, scale), q, k, v, causal, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("M,N", [(1, 1), (113, 203), (203, 113), (1023, 1023)])
@pytest.mark.parametrize("D", [64, 128])
def test_tf32_mode_with_grouped_heads(D, M, N, causal):
    """v6's float32 inputs run as TF32 (tests/test_v6.py's bound: relative error <= 2e-3), heads grouped."""
    q, k, v, _ = make(2, 8, 2, M, N, D, torch.float32, seed=M + N + D + causal)
    out = run_forward("v6", q, k, v, causal, 0.3)
    assert torch.isfinite(out).all()
    assert relative_error(out, attention_reference(q, k, v, causal, scale=0.3)) <= 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("q_scale,scale", [(20.0, None), (1.0, 2.5)])   # scores far beyond exp's range
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H,H_kv", [(8, 1), (6, 2)])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", TRAINING)
def test_forward_large_logits(version, D, H, H_kv, causal, q_scale, scale):
    needs(version)
    seed, _, dtype = draw("large", version, D, H, H_kv, causal, scale)
    q, k, v, _ = make(2, H, H_kv, 300, 517, D, dtype, seed, q_scale)
    check_output(run_forward(version, q, k, v, causal, scale), q, k, v, causal, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("H,H_kv", HEADS)
@pytest.mark.parametrize("version", TRAINING)
def test_gradients_match_float64(version, H, H_kv, M, N, causal, scale):
    """Both dQ modes and head dims (drawn from the seed), the forward that trained checked too."""
    needs(version)
    seed, B, dtype = draw("grads", version, H, H_kv, M, N, causal, scale)
    D, deterministic = (64, 128)[(seed >> 2) % 2], bool((seed >> 3) % 2)
    q, k, v, do = make(B, H, H_kv, M, N, D, dtype, seed)
    o, grads = gradients(version, q, k, v, do, causal, scale, deterministic)
    check_output(o, q, k, v, causal, scale)
    compare_grads(grads, q, k, v, do, causal, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H,H_kv,scale", [(8, 1, None), (6, 2, 0.3), (32, 8, None)])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", TRAINING)
def test_gradients_large_logits(version, D, H, H_kv, scale, causal):
    # q x 8: scaled scores of magnitude ~30 (x 0.3 / 0.125 with scale=0.3), far past exp's range without lse
    needs(version)
    seed, _, dtype = draw("large grads", version, D, H, H_kv, causal, scale)
    q, k, v, do = make(2, H, H_kv, 300, 517, D, dtype, seed, q_scale=8.0)
    compare_grads(gradients(version, q, k, v, do, causal, scale)[1], q, k, v, do, causal, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H,H_kv", [(8, 1), (6, 2)])
@pytest.mark.parametrize("D", [64, 128])
def test_deterministic_mode_repeats_bit_for_bit(D, H, H_kv, causal):
    """The deterministic mode twice: the same bits. dK and dV never go through atomics, in either mode
    (each key tile's block sums them over the group's query heads in registers): the atomic mode's are
    the same bits too."""
    q, k, v, do = make(2, H, H_kv, 1025, 777, D, torch.bfloat16, seed=D + H + causal)
    first = gradients("v6", q, k, v, do, causal, 0.3, deterministic=True)[1]
    second = gradients("v6", q, k, v, do, causal, 0.3, deterministic=True)[1]
    atomic = gradients("v6", q, k, v, do, causal, 0.3)[1]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert torch.equal(first[1], atomic[1]) and torch.equal(first[2], atomic[2])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", TRAINING)
def test_grouped_heads_are_the_expanded_heads(version, D, causal):
    """Each query head reads its kv head exactly as it would read a copy of it: the output, and dQ of the
    deterministic mode (the same sums in the same order), are the bits of k and v expanded to H heads."""
    needs(version)
    q, k, v, do = make(2, 6, 2, 203, 113, D, torch.float16, seed=D + causal)
    kx, vx = expand_heads(k, 6), expand_heads(v, 6)
    o, grads = gradients(version, q, k, v, do, causal, None, deterministic=True)
    ox, grads_x = gradients(version, q, kx, vx, do, causal, None, deterministic=True)
    assert torch.equal(o, ox) and torch.equal(grads[0], grads_x[0])
    with torch.no_grad():
        assert torch.equal(flashattn.forward(q, k, v, version=version, causal=causal), o)


@pytest.mark.gpu
@pytest.mark.parametrize("version", TRAINING)
def test_scale_none_is_one_over_sqrt_d(version):
    """scale=None and scale=1/sqrt(D) give the same bits, through the op, a plan and the raw bindings."""
    needs(version)
    q, k, v, do = make(2, 8, 2, 130, 67, 128, torch.bfloat16, seed=3)
    s = 1 / math.sqrt(128)
    with torch.no_grad():
        out = flashattn.forward(q, k, v, version=version, causal=True)
        assert torch.equal(out, flashattn.forward(q, k, v, version=version, causal=True, scale=s))
        assert torch.equal(out, flashattn.plan(q, k, v, version, True).run(q, k, v))
        assert torch.equal(out, flashattn.plan(q, k, v, version, True, s).run(q, k, v))
        assert torch.equal(out, flashattn.load(version).forward(q, k, v, True))
    grads = gradients(version, q, k, v, do, True, None)[1]
    grads_s = gradients(version, q, k, v, do, True, s)[1]
    assert torch.equal(grads[1], grads_s[1]) and torch.equal(grads[2], grads_s[2])   # dQ: atomics


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["baseline", "sdpa", *TRAINING])
def test_plan_with_grouped_heads_and_a_scale(version):
    """A plan runs what flashattn.forward runs; the PyTorch versions (bf16 matmuls and softmax for
    baseline) are held to a plain bound, the kernels to check_output's."""
    needs(version)
    q, k, v, _ = make(2, 8, 2, 113, 203, 64, torch.bfloat16, seed=5)
    p = flashattn.plan(q, k, v, version, True, 0.3)
    assert p.scale == 0.3
    out = p.run(q, k, v)
    with torch.no_grad():
        assert torch.equal(out, flashattn.forward(q, k, v, version=version, causal=True, scale=0.3))
    if flashattn.INFO[version].kernel:
        check_output(out, q, k, v, True, 0.3)
    else:
        assert relative_error(out, attention_reference(q, k, v, True, scale=0.3)) < 2e-2


@pytest.mark.gpu
def test_torch_compile_fullgraph_with_grouped_heads():
    q, k, v, do = make(2, 8, 2, 100, 100, 64, torch.bfloat16, seed=7)
    f = lambda q, k, v: flashattn.attention(q, k, v, causal=True, deterministic=True, scale=0.3) * 2  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (f, compiled):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        results.append((out.detach(), torch.autograd.grad(out, leaves, do)))
    (o, g), (oc, gc) = results
    assert torch.equal(o, oc) and all(torch.equal(a, b) for a, b in zip(g, gc))
    assert gc[1].shape == k.shape
