"""flashattn.autograd: the custom ops, their fake implementations, autograd wiring, input checks (CPU),
and on the GPU opcheck, torch.compile(fullgraph=True) and CUDA-graph capture."""
from __future__ import annotations

import contextlib

import pytest
import torch
from test_v7 import is_hopper
from torch._subclasses.fake_tensor import FakeTensorMode

import flashattn.autograd as fa
from flashattn.measure.backward import backward_call, backward_flops
from flashattn.measure.bench import attention_flops
from flashattn.reference import relative_error


# ================================================================ CPU
def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def test_ops_registered_with_fake_shapes():
    assert hasattr(torch.ops.flashattn, "attention_forward") and hasattr(torch.ops.flashattn, "attention_backward")
    q, k = meta(2, 3, 17, 64), meta(2, 3, 40, 64)
    o, lse = torch.ops.flashattn.attention_forward(q, k, k, True, "v6", False)
    assert (o.shape, o.dtype) == (q.shape, q.dtype)
    assert (lse.shape, lse.dtype) == ((2, 3, 17), torch.float32)
    dq, dk, dv = torch.ops.flashattn.attention_backward(q, k, k, o, lse, o, True, "v6", False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16


def test_autograd_wiring_on_meta():
    """register_autograd: the forward op's output has a grad_fn whose backward calls the backward op
    (its fake here) and gives each input a gradient of its own shape; lse is not differentiable."""
    q, k, v = meta(2, 3, 17, 128, grad=True), meta(2, 3, 5, 128, grad=True), meta(2, 3, 5, 128, grad=True)
    o, lse = torch.ops.flashattn.attention_forward(q, k, v, False, "v6", False)
    assert o.requires_grad and not lse.requires_grad
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_fake_tensor_trace_has_no_break():
    """With fake CUDA tensors (no GPU needed) the user function traces to one graph holding the op."""
    from torch.fx.experimental.proxy_tensor import make_fx
    with FakeTensorMode():
        q = torch.empty(2, 3, 17, 64, dtype=torch.float16, device="cuda")
        k = torch.empty(2, 3, 33, 64, dtype=torch.float16, device="cuda")
        graph = make_fx(lambda a, b, c: fa.attention(a, b, c, causal=True))(q, k, k)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.flashattn.attention_forward.default in targets


def test_eager_path_only_for_plain_tensors_outside_tracing():
    """The autograd.Function path skips the dispatcher only where nothing needs to see the op."""
    q = torch.empty(1, 1, 4, 64)
    assert fa._eager(q, q, q)
    with fa.through_custom_ops():
        assert not fa._eager(q, q, q)
        with fa.through_custom_ops():
            pass
        assert not fa._eager(q, q, q)          # the inner exit restores the outer setting
    assert fa._eager(q, q, q)
    with FakeTensorMode():
        f = torch.empty(1, 1, 4, 64)
        assert not fa._eager(f, f, f)
    assert not fa._eager(q, torch.nn.Parameter(q), q)    # a subclass goes through the ops


@pytest.mark.parametrize("case,exc,match", [
    ("cpu", ValueError, "q must be a CUDA tensor"),
    ("rank3", ValueError, "q must have rank 4"),
    ("int", TypeError, "q has dtype int32"),
    ("k head_dim", ValueError, "k must match q"),
    ("v length", ValueError, "v must have the same shape as k"),
    ("D=80", ValueError, "head_dim"),
    ("empty", ValueError, "q has an empty dimension"),
])
def test_bad_input_names_the_argument(case, exc, match):
    q = torch.randn(1, 2, 9, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 11, 64, dtype=torch.bfloat16)
    args = {"cpu": (q, k, k), "rank3": (q[0], k, k), "int": (q.int(), k.int(), k.int()),
            "k head_dim": (q, k[..., :32], k), "v length": (q, k, k[:, :, :5]),
            "D=80": (q[..., :40].repeat(1, 1, 1, 2), k[..., :40].repeat(1, 1, 1, 2), k[..., :40].repeat(1, 1, 1, 2)),
            "empty": (q[:, :, :0], k, k)}[case]
    with pytest.raises(exc, match=match):
        fa.attention(*args)


def test_version_without_backward_refuses_grad():
    with FakeTensorMode():
        q = torch.empty(1, 2, 9, 64, device="cuda", requires_grad=True)
        with pytest.raises(ValueError, match=r"'v5' has no backward pass.*versions that train: v6, v7, v8"):
            fa.attention(q, q, q, version="v5")
        h = torch.empty(1, 2, 9, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="has no backward"):
            fa.attention(h, h, h.requires_grad_(True), version="sdpa")
        with pytest.raises(TypeError, match="backward of v6 takes bfloat16 and float16"):
            fa.attention(q, q, q, version="v6")


def fake_cuda(*shape, dtype=torch.float32, grad=False):
    """A CUDA tensor without a GPU: call inside FakeTensorMode."""
    return torch.empty(*shape, device="cuda", dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("version,dtype,D", [("v0", torch.float32, 64), ("v4", torch.float32, 64),
                                             ("v6", torch.bfloat16, 128), ("v8", torch.float16, 64)])
def test_forward_op_has_a_fake_of_the_bindings_shape(version, dtype, D):
    assert hasattr(torch.ops.flashattn, "forward")
    with FakeTensorMode():
        q, k = fake_cuda(2, 3, 40, D, dtype=dtype), fake_cuda(2, 3, 40 if version == "v0" else 57, D, dtype=dtype)
        for o in (torch.ops.flashattn.forward(q, k, k, version, False), fa.forward(q, k, k, version=version)):
            assert (o.shape, o.dtype, o.device.type) == (q.shape, dtype, "cuda") and o.is_contiguous()


def test_forward_traces_as_one_graph_under_dynamo():
    """Dynamo with fullgraph semantics (strict export) over fake CUDA tensors: flashattn.forward becomes the
    op, the fallback (v4 at D=32 runs v2) is resolved while tracing, and nothing of the build is traced."""
    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            return fa.forward(q, k, v, version="v4") * 2

    for D, runs in ((64, "v4"), (32, "v2")):
        with FakeTensorMode():
            q, k, v = fake_cuda(1, 2, 33, D), fake_cuda(1, 2, 65, D), fake_cuda(1, 2, 65, D)
        program = torch.export.export(Model(), (q, k, v), strict=True)
        calls = [n for n in program.graph.nodes if n.op == "call_function"]
        assert calls[0].target == torch.ops.flashattn.forward.default and calls[0].args[3:] == (runs, False)
        assert [n.target for n in calls[1:]] == [torch.ops.aten.mul.Tensor]


def test_forward_with_grad_trains_or_refuses():
    """flashattn.forward on inputs that require grad: v6 goes through the differentiable op (the output has
    a grad_fn); a version without a backward raises naming the versions that train; under no_grad it runs."""
    with FakeTensorMode():
        h = fake_cuda(1, 2, 9, 64, dtype=torch.bfloat16, grad=True)
        o = fa.forward(h, h, h, version="v6", causal=True)
        assert o.requires_grad and "attention_forward" in type(o.grad_fn).__name__.lower()
        q = fake_cuda(1, 2, 9, 32, grad=True)
        for version in ("v4", "v0", "baseline", "sdpa"):           # v4 at D=32 would run v2
            with pytest.raises(ValueError, match=rf"'{version}' has no backward pass.*versions that train: v6, v7, v8"):
                fa.forward(q, q, q, version=version)
        with torch.no_grad():
            assert not fa.forward(q, q, q, version="v4").requires_grad
        assert not fa.forward(q.detach(), q.detach(), q.detach(), version="v4").requires_grad


def test_backward_flops_and_names():
    for causal in (False, True):
        assert backward_flops(2, 3, 100, 70, 64, causal) == 2.5 * attention_flops(2, 3, 100, 70, 64, causal)
    assert backward_flops(1, 1, 10, 10, 8, True) == backward_flops(1, 1, 10, 10, 8, False) / 2
    x = torch.empty(1, 1, 4, 64)
    with pytest.raises(ValueError, match="name must be one of"):
        backward_call("v5", x, x, x, x)
    with pytest.raises(ValueError, match="do must have the shape of q"):
        backward_call("v6", x, x, x, x[..., :32])


# ================================================================ GPU
def cuda_inputs(B=2, H=3, M=77, N=130, D=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype) for L in (M, N, N, M)]


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck(deterministic):
    q, k, v, do = cuda_inputs()
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    torch.library.opcheck(torch.ops.flashattn.attention_forward.default, (q, k, v, True, "v6", deterministic))
    o, lse = torch.ops.flashattn.attention_forward(q.detach(), k.detach(), v.detach(), True, "v6", False)
    torch.library.opcheck(torch.ops.flashattn.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), o, lse, do, True, "v6", deterministic))


@pytest.mark.gpu
def test_attention_matches_raw_kernels_and_handles_views():
    """The op gives the binding's exact bits, also from non-contiguous and misaligned views."""
    q, k, v, do = cuda_inputs(M=65, N=65)
    big = torch.randn(2, 3, 66, 64, device="cuda", dtype=torch.bfloat16)
    big[:, :, 1:] = q
    qv = big[:, :, 1:]                      # starts 128 bytes in: contiguous rows, offset base
    kt = k.transpose(2, 3).contiguous().transpose(2, 3)   # non-contiguous
    leaves = [t.detach().requires_grad_(True) for t in (qv, kt, v)]
    o = fa.attention(*leaves, causal=True, deterministic=True)
    o.backward(do)
    from flashattn.autograd import backward_module, forward_module
    o_raw, lse = forward_module("v6").forward_lse(q, k, v, True)
    raw = backward_module("v6").backward(q, k, v, o_raw, lse, do, True, True)
    assert torch.equal(o, o_raw)
    for leaf, r in zip(leaves, raw):
        assert torch.equal(leaf.grad, r)


@pytest.mark.gpu
@pytest.mark.skipif(not is_hopper(), reason="v7 and v8 need a GPU of compute capability 9.0")
@pytest.mark.parametrize("version", ["v7", "v8"])
def test_hopper_versions_train(version):
    """attention(version="v7" / "v8"): the Hopper forward (its exact output) and v6's backward, through
    the op, bit-identical to the raw kernels (the gradients' accuracy: test_backward.py's
    test_hopper_forward_trains)."""
    import flashattn
    from flashattn.autograd import backward_module, forward_module
    q, k, v, do = cuda_inputs(M=203, N=113)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = fa.attention(*leaves, causal=True, version=version, deterministic=True)
    o.backward(do)
    assert torch.equal(o, flashattn.forward(q, k, v, version=version, causal=True))
    o_raw, lse = forward_module(version).forward_lse(q, k, v, True)
    raw = backward_module(version).backward(q, k, v, o_raw, lse, do, True, True)
    assert torch.equal(o, o_raw)
    for leaf, r in zip(leaves, raw):
        assert torch.equal(leaf.grad, r)


@pytest.mark.gpu
def test_no_grad_version_runs_forward():
    q, k, v, _ = cuda_inputs(dtype=torch.float32)
    import flashattn
    with torch.no_grad():
        out = fa.attention(q, k, v, version="v5")
    assert torch.equal(out, flashattn.forward(q, k, v, version="v5"))


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v4", "v6"])
def test_compiled_forward_matches_eager(version):
    """torch.compile(fullgraph=True) of a function calling flashattn.forward runs and gives eager's bits
    (the op is opaque to the compiler; the scaling around it is one elementwise op either way)."""
    import flashattn
    dtype = torch.float32 if version == "v4" else torch.bfloat16
    q, k, v, _ = cuda_inputs(M=100, N=70, dtype=dtype)
    f = lambda q, k, v: flashattn.forward(q * 0.5, k, v, version=version) + 1
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))
    assert not torch.equal(compiled(q, k, v), compiled(q, v, k))     # it computes, not a constant


@pytest.mark.gpu
def test_forward_with_grad_runs_the_differentiable_op():
    import flashattn
    q, k, v, do = cuda_inputs(M=65, N=65)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = flashattn.forward(*leaves, version="v6", causal=True)
    o.backward(do)
    ref = [t.detach().requires_grad_(True) for t in (q, k, v)]
    fa.attention(*ref, causal=True).backward(do)
    assert torch.equal(o, flashattn.forward(q, k, v, version="v6", causal=True))
    assert all(a.grad is not None and torch.equal(a.grad, b.grad) for a, b in zip(leaves, ref))


@pytest.mark.gpu
@pytest.mark.parametrize("version,backward", [("v6", None), ("v8", "v8_backward")])
@pytest.mark.parametrize("case", ["causal", "window", "gqa", "strided"])
def test_eager_path_matches_the_custom_ops_bit_for_bit(version, backward, case):
    """The autograd.Function that eager calls take and the custom ops (torch.compile's path) run the same
    bindings on the same arguments: output and gradients agree bit for bit (deterministic dQ)."""
    if version == "v8" and not is_hopper():
        pytest.skip("v8 needs a GPU of compute capability 9.0")
    B, H, M, N, D = 2, 4, 203, 113, 64
    q, k, v, do = cuda_inputs(B=B, H=H, M=M, N=N, D=D, seed=11)
    kw = dict(causal=case != "window", window=(40, 7) if case == "window" else (-1, -1))
    if case == "gqa":
        k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    projection = torch.randn(B, M, 3, H, D, device="cuda", dtype=q.dtype)   # "strided": q, k, v views of it

    def leaves_and_inputs():
        if case == "strided":   # as a model makes them: [B, L, H, D] slices of one projection, transposed
            qkv = projection.clone().requires_grad_(True)
            return [qkv], [t.transpose(1, 2) for t in qkv.unbind(2)]
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        return leaves, leaves

    grads = []
    for through_ops in (False, True):
        leaves, inputs = leaves_and_inputs()
        with fa.through_custom_ops() if through_ops else contextlib.nullcontext():
            o = fa.attention(*inputs, version=version, backward=backward, deterministic=True, **kw)
        assert (o.grad_fn.name() == "_AttentionBackward") != through_ops
        grads.append([o] + list(torch.autograd.grad(o, leaves, do)))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


class TinyAttention(torch.nn.Module):
    def __init__(self, dim=128, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        o = fa.attention(q, k, v, causal=True, deterministic=True)
        return self.proj(o.transpose(1, 2).reshape(B, L, C))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(backend):
    torch.manual_seed(0)
    model = TinyAttention().cuda().to(torch.bfloat16)
    x = torch.randn(2, 100, 128, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    outs, grads = [], []
    for m in (model, compiled):
        m.zero_grad()
        y = m(x)
        (y.float() ** 2).mean().backward()
        outs.append(y.detach())
        grads.append([p.grad.detach().clone() for p in model.parameters()])
    # the same op both ways; the rest may be fused differently by the backend
    assert relative_error(outs[1], outs[0]) < 1e-2
    for a, b in zip(grads[1], grads[0]):
        assert relative_error(a, b) < 2e-2


@pytest.mark.gpu
def test_cuda_graph_replays_forward_and_backward():
    q, k, v, do = cuda_inputs(M=200, N=200, D=128, dtype=torch.float16)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    step = lambda: torch.autograd.grad(fa.attention(q, k, v, causal=True, deterministic=True), (q, k, v), do)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up: builds the kernels, fills the allocator's graph pool
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_grads = step()
    fresh = cuda_inputs(M=200, N=200, D=128, dtype=torch.float16, seed=5)
    with torch.no_grad():
        for t, f in zip((q, k, v, do), fresh):
            t.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    expected = step()
    for got, want in zip(static_grads, expected):
        assert torch.equal(got, want)
