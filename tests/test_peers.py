"""FlashAttention-4 as a benchmark column: refused with a clear reason where it does not import, and, given a
stand-in with its calling convention ((batch, seq, heads, dim) tensors), the transposes in and out are right
for the forward and for the gradients."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from flashattn.measure import peers
from flashattn.measure.backward import backward_call
from flashattn.measure.bench import make_call


def _stand_in(q, k, v, causal=False):
    """FlashAttention-4's convention: (B, S, H, D) in and out, (out, lse) returned."""
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         is_causal=causal)
    return o.transpose(1, 2), None


@pytest.fixture
def fake_fa4(monkeypatch):
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["flash_attn.cute"].flash_attn_func = _stand_in


def _inputs(M=17, N=23):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, M, 64, generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 3, N, 64, generator=g, dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


def test_refused_with_its_reason_when_it_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)       # an import of it raises ImportError
    assert peers.fa4_function() is None
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="fa4: flash_attn.cute"):
        make_call("fa4", q, k, v, False)


def test_wrong_dtype_is_refused(fake_fa4):
    q, k, v = (t.float() for t in _inputs())
    with pytest.raises(ValueError, match="fa4: takes bfloat16 or float16"):
        peers.forward_call("fa4", q, k, v, False)


@pytest.mark.parametrize("causal", (False, True))
def test_forward_comes_back_in_our_layout(fake_fa4, causal):
    q, k, v = _inputs()
    out = peers.forward_call("fa4", q, k, v, causal)()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert out.shape == q.shape
    assert torch.equal(out, ref)


def test_gradients_come_back_in_our_layout(fake_fa4):
    q, k, v = _inputs()
    do = torch.randn_like(q)
    got = backward_call("fa4", q, k, v, do, causal=True)()
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True),
                              (qr, kr, vr), do)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r)
    assert [t.shape for t in backward_call("fa4", q, k, v, do)()] == [q.shape, k.shape, v.shape]   # again


def test_unknown_peer_is_refused():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="name must be one of fa4"):
        peers.forward_call("fa3", q, k, v, False)
