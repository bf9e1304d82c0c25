"""ring_attention on two GPUs over NCCL with the kernels (v8 on Hopper, v6 anywhere from sm_80): output and
dq, dk, dv of the full sequence, gathered from both ranks, within twice SDPA's error of the float64 reference,
and equal to the one-GPU flashattn.attention of the full sequence within twice SDPA's error. Skipped below
two GPUs (the CPU tests of the same ring over gloo are in tests/test_ring.py)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import flashattn
from flashattn import ring
from flashattn.autograd import backward_module, forward_module
from flashattn.distributed import ring_attention, run_local
from flashattn.reference import attention_reference, sdpa

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL ring of 2 ranks)")]

SEED = random.randrange(2**31)
# name: (B, H, chunk k, D, causal, dtype, head_chunk); full length 2 * 2 * k causally, 2 * k otherwise
CASES = {
    "causal bf16 D128 k257": (2, 4, 257, 128, True, torch.bfloat16, None),
    "causal fp16 D64 k512": (1, 6, 512, 64, True, torch.float16, 4),
    "full bf16 D64 k300": (2, 3, 300, 64, False, torch.bfloat16, None),
    "full fp16 D128 k129": (1, 4, 129, 128, False, torch.float16, 2),
}


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)


def rel(x, y, ref, floor):
    """||x - y|| / max(||ref||, floor) in float64: the floor keeps a (near) zero reference from turning rounding
    noise into a huge relative error (tests/test_backward.py's rel_err)."""
    return torch.linalg.vector_norm(x.double() - y.double()).item() / max(torch.linalg.vector_norm(ref).item(), floor)


def grads_of(fn, q, k, v, do, **kw):
    """[o, dq, dk, dv] of fn(q, k, v, **kw) given do."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = fn(*leaves, **kw)
    return [o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype))]


def nccl_worker(rank, world, version, seed, out):
    errors = {}
    for i, name in enumerate(CASES):
        B, H, k, D, causal, dtype, head_chunk = CASES[name]
        L = (2 if causal else 1) * world * k
        g = torch.Generator(device="cuda").manual_seed(seed + i)
        q, kk, v, do = (torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype) for _ in range(4))
        mine = [ring.shard(t, rank, world, causal).contiguous().requires_grad_(True) for t in (q, kk, v)]
        o = ring_attention(*mine, causal=causal, version=version, head_chunk=head_chunk)
        o.backward(ring.shard(do, rank, world, causal))
        got = []
        for x in (o.detach(), *(m.grad for m in mine)):
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x.contiguous())
            got.append(ring.unshard(parts, causal))
        if rank:
            continue
        ref = grads_of(attention_reference, q.double(), kk.double(), v.double(), do.double(), causal=causal)
        one = grads_of(flashattn.attention, q, kk, v, do, causal=causal, version=version)
        torch_ = grads_of(sdpa, q, kk, v, do, causal=causal)
        floor = 1e-3 * torch.linalg.vector_norm(do.double()).item()
        errors[name] = {n: {"ring": rel(a, r, r, floor), "ring_vs_one_gpu": rel(a, b, r, floor),
                            "one_gpu": rel(b, r, r, floor), "sdpa": rel(t, r, r, floor), "dtype": str(a.dtype)}
                        for n, a, b, t, r in zip(("o", "dq", "dk", "dv"), got, one, torch_, ref)}
    if rank == 0:
        Path(out).write_text(json.dumps(errors))


@pytest.fixture(scope="module", params=["v6", "v8"])
def nccl_errors(request, tmp_path_factory):
    if request.param == "v8" and not is_hopper():
        pytest.skip("v8 needs a GPU of compute capability 9.0")
    forward_module(request.param), backward_module(request.param)     # built here, not by both ranks at once
    out = tmp_path_factory.mktemp("ring_nccl") / "errors.json"
    run_local(nccl_worker, 2, args=(request.param, SEED, str(out)), backend="nccl", timeout_s=600)
    return request.param, json.loads(out.read_text())


@pytest.mark.parametrize("name", CASES)
def test_two_gpu_ring_within_twice_sdpas_error(nccl_errors, name):
    version, errors = nccl_errors
    for what, e in errors[name].items():
        assert e["dtype"] == str(CASES[name][5])
        assert e["ring"] <= 2 * e["sdpa"], \
            f"{version} {name} {what}: ring {e['ring']:.2e} > 2 x SDPA's {e['sdpa']:.2e} (seed {SEED})"
        assert e["ring_vs_one_gpu"] <= 2 * e["sdpa"], \
            f"{version} {name} {what}: ring vs one GPU {e['ring_vs_one_gpu']:.2e} > 2 x SDPA's {e['sdpa']:.2e}"
