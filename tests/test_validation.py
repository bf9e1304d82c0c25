"""Bad input is refused before any launch, with the argument named, and needs no GPU to detect."""
import pytest
import torch

import flashattn
import flashattn.measure.bench
from flashattn import check_inputs


def qkv(B=2, H=3, M=17, N=33, D=64, dtype=torch.float32, device="cpu"):
    return tuple(torch.randn(B, H, L, D, device=device).to(dtype) for L in (M, N, N))


@pytest.mark.parametrize("version", flashattn.VERSIONS)
def test_cpu_tensors_are_refused(version):
    q, k, v = qkv(M=33, dtype=flashattn.INFO[version].dtypes[0])   # a dtype the version takes
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        check_inputs(q, k, v, version)


@pytest.mark.parametrize("version", ["v0", "v1", "v3", "v4", "v5"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int32])
def test_wrong_dtype(version, dtype):
    q, k, v = qkv(M=33, dtype=dtype)
    with pytest.raises(TypeError, match=r"^q has dtype"):
        check_inputs(q, k, v, version)


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^k has dtype float64"):
        check_inputs(q, k.double(), v, "v4")
    with pytest.raises(TypeError, match="share one dtype"):
        check_inputs(q.bfloat16(), k.half(), v.half(), "v6")


@pytest.mark.parametrize("bad,arg", [("q", "q"), ("k", "k"), ("v", "v")])
def test_rank(bad, arg):
    t = dict(zip("qkv", qkv()))
    t[bad] = t[bad][0]
    with pytest.raises(ValueError, match=rf"^{arg} must have rank 4"):
        check_inputs(t["q"], t["k"], t["v"], "v4")


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="v must be a torch.Tensor; got list"):
        check_inputs(q, k, v.tolist(), "v4")


@pytest.mark.parametrize("k_shape,match", [
    ((3, 3, 33, 64), "k must match q in batch, heads and head_dim"),
    ((2, 4, 33, 64), "k must match q in batch, heads and head_dim"),
    ((2, 3, 33, 32), "k must match q in batch, heads and head_dim"),
])
def test_mismatched_b_h_d(k_shape, match):
    q, _, v = qkv()
    with pytest.raises(ValueError, match=match):
        check_inputs(q, torch.randn(k_shape), v, "v4")


def test_k_v_length_mismatch():
    q, k, _ = qkv()
    with pytest.raises(ValueError, match="v must have the same shape as k"):
        check_inputs(q, k, torch.randn(2, 3, 34, 64), "v4")


@pytest.mark.parametrize("dim", range(4))
def test_empty_dimension(dim):
    shape = [2, 3, 17, 64]
    shape[dim] = 0
    q = torch.randn(shape)
    k = torch.randn(shape[:2] + [33, shape[3]])
    with pytest.raises(ValueError, match="q has an empty dimension"):
        check_inputs(q, k, k.clone(), "v4")


def test_empty_keys():
    q, k, v = qkv(N=0)
    with pytest.raises(ValueError, match="k has an empty dimension"):
        check_inputs(q, k, v, "v2")


def test_unsupported_head_dims():
    with pytest.raises(ValueError, match="head_dim D=129 is too large for v2: the general path takes 1 <= D <= 128"):
        check_inputs(*qkv(D=129), "v2")
    with pytest.raises(ValueError, match="head_dim D=256 is too large for v4"):
        check_inputs(*qkv(D=256), "v4")
    with pytest.raises(ValueError, match=r"head_dim D=80 is not supported by v6; it takes D in \(64, 128\)"):
        check_inputs(*qkv(D=80, dtype=torch.bfloat16), "v6")


def test_self_attention_only_v0():
    with pytest.raises(ValueError, match="v0 computes self-attention only"):
        check_inputs(*qkv(M=17, N=33), "v0")


def test_causal_only_where_implemented():
    with pytest.raises(ValueError, match="causal=True is not implemented by v4"):
        check_inputs(*qkv(), "v4", causal=True)


def test_unknown_version():
    with pytest.raises(ValueError, match="version must be one of baseline, sdpa, v0"):
        check_inputs(*qkv(), "v9")
    with pytest.raises(ValueError, match="load\\(\\) builds CUDA kernels"):
        flashattn.load("sdpa")


def test_head_dim_routing_is_decided_before_the_device_check():
    # D = 40 on v3/v4/v5 goes to v2; the CPU tensors are still refused afterwards.
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        check_inputs(*qkv(D=40), "v4")


@pytest.mark.gpu
def test_routing_on_gpu():
    assert check_inputs(*qkv(D=40, device="cuda"), "v4") == "v2"
    assert check_inputs(*qkv(D=64, device="cuda"), "v4") == "v4"
    assert check_inputs(*qkv(D=128, device="cuda"), "v5") == "v5"


def test_plan_checks_like_check_inputs():
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flashattn.plan(*qkv(), "v4")
    with pytest.raises(ValueError, match="causal=True is not implemented by v2"):
        flashattn.plan(*qkv(), "v2", causal=True)


@pytest.mark.gpu
def test_plan_names_the_version_that_runs_and_runs_it_unchecked():
    import dataclasses
    q, k, v = qkv(D=40, device="cuda")
    p = flashattn.plan(q, k, v, "v4")
    assert (p.version, p.runs_as, p.causal) == ("v4", "v2", False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.runs_as = "v4"
    out = p.run(q, k, v)
    assert torch.equal(out, flashattn.forward(q, k, v, version="v4"))
    assert flashattn.reference.relative_error(out, flashattn.reference.attention_reference(q, k, v)) < 1e-5
    fn, _, runs_as = flashattn.measure.bench.make_call("v4", q, k, v, False)
    assert runs_as == "v2" and torch.equal(fn(), out)


@pytest.mark.gpu
@pytest.mark.parametrize("version", [v for v in flashattn.KERNEL_VERSIONS])
def test_good_call_after_refused_calls(version):
    """A refused call leaves nothing behind: the next good call returns the right answer."""
    dtype = flashattn.INFO[version].dtypes[0]
    info = flashattn.INFO[version]
    # a head dim the version does not take, from what it declares (v8 takes 256 since it grew wide head dims);
    # v3, v4 and v5 hand the dims they are not built for to v2, so theirs must be too large for v2 as well
    if info.head_dims is None or info.fallback:
        bad_D = flashattn.INFO[info.fallback or version].max_head_dim + 8
    else:
        bad_D = next(d for d in (80, 96, 48) if d not in info.head_dims)
    bad_calls = [
        lambda: flashattn.forward(*qkv(M=33, N=33, dtype=dtype), version=version),                # CPU
        lambda: flashattn.forward(*qkv(M=33, N=33, D=bad_D, dtype=dtype, device="cuda"), version=version),
        lambda: flashattn.forward(*qkv(M=33, N=33, dtype=torch.int32, device="cuda"), version=version),
    ]
    for call in bad_calls:
        with pytest.raises((ValueError, TypeError)):
            call()
    q, k, v = qkv(M=33, N=33, dtype=dtype, device="cuda")
    out = flashattn.forward(q, k, v, version=version)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert flashattn.reference.relative_error(out, flashattn.reference.attention_reference(q, k, v)) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v0", "v1", "v2", "v3", "v4", "v5"])
def test_raw_binding_refuses_and_recovers(version):
    """The copied .cu alone (no Python checks) still refuses bad input with a message, then works."""
    module = flashattn.load(version)
    q, k, v = qkv(M=33, N=33, device="cuda")
    with pytest.raises(RuntimeError, match="causal=True is not implemented by this kernel"):
        module.forward(q, k, v, True)
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        module.forward(q.cpu(), k, v, False)
    with pytest.raises(RuntimeError, match="k must be float32"):
        module.forward(q, k.double(), v, False)
    with pytest.raises(RuntimeError, match="v must be contiguous"):
        module.forward(q, k, v.transpose(2, 3).contiguous().transpose(2, 3), False)
    with pytest.raises(RuntimeError, match="v must have the shape of k"):
        module.forward(q, k, v[:, :, :-1].contiguous(), False)
    if version in ("v3", "v4"):
        with pytest.raises(RuntimeError, match="compiled for head_dim 64 only"):
            module.forward(*qkv(D=40, device="cuda"), False)
    out = module.forward(q, k, v, False)
    assert flashattn.reference.relative_error(out, flashattn.reference.attention_reference(q, k, v)) < 1e-5


@pytest.mark.gpu
def test_non_contiguous_and_misaligned_inputs_are_copied():
    q, k, v = qkv(M=65, N=65, device="cuda")
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)          # same values, strided layout
    k_mis = torch.randn(2 * 3 * 65 * 64 + 1, device="cuda")[1:].view(2, 3, 65, 64)  # 4-byte offset
    k_mis.copy_(k)
    ref = flashattn.reference.attention_reference(q, k, v)
    for version in ("v2", "v4"):
        out = flashattn.forward(qt, k_mis, v, version=version)
        assert flashattn.reference.relative_error(out, ref) < 1e-5
    assert not qt.is_contiguous() and k_mis.data_ptr() % 16 != 0


def test_check_call_remembers_a_passing_call_and_refuses_a_failing_one_every_time(monkeypatch):
    """check_call: a passing call is checked once (its key holds every argument with its type); a refused
    one is checked, and refused, at every call; 1.0 and True are not taken for 1 from a remembered call."""
    from flashattn import validate
    monkeypatch.setattr(validate, "_CHECKED", {})
    runs = []
    real = validate.check_inputs

    def counted(*args):
        runs.append(args[3])
        try:
            return real(*args)
        except ValueError as e:            # CPU tensors: everything but the device check passes
            assert "must be a CUDA tensor" in str(e)
            return args[3]
    monkeypatch.setattr(validate, "check_inputs", counted)
    q, k, v = qkv(M=33, dtype=torch.bfloat16)
    assert validate.check_call(q, k, v, "v8", True, None, (5, -1)) == ("v8", (5, 0))
    assert validate.check_call(q, k, v, "v8", True, None, (5, -1)) == ("v8", (5, 0))
    assert len(runs) == 1
    assert validate.check_call(q, k, v, "v8", True, None, [5, -1]) == ("v8", (5, 0))   # a list: its own key
    assert len(runs) == 2
    for _ in range(2):
        with pytest.raises(TypeError, match="window must be a pair of ints"):
            validate.check_call(q, k, v, "v8", True, None, (5.0, -1))
        with pytest.raises(TypeError, match="scale must be a float"):
            validate.check_call(q, k, v, "v8", True, True, (5, -1))
    monkeypatch.setattr(validate, "check_inputs", real)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):     # nothing remembered for CPU tensors
        validate.check_call(*qkv(M=33, N=65, dtype=torch.bfloat16), "v8")

