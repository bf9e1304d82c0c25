"""The float64 reference itself, checked against an independent NumPy computation (CPU only)."""
import math

import numpy as np
import pytest
import torch

from flashattn.reference import attention_gradients, attention_reference, baseline, causal_mask, relative_error


def numpy_attention(q, k, v, causal=False):
    q, k, v = (t.double().numpy() for t in (q, k, v))
    M, N = q.shape[2], k.shape[2]
    s = np.einsum("bhmd,bhnd->bhmn", q, k) / math.sqrt(q.shape[-1])
    if causal:
        allowed = np.arange(N)[None, :] <= np.arange(M)[:, None] + (N - M)
        s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhmn,bhnd->bhmd", np.nan_to_num(p), v)


@pytest.mark.parametrize("M,N,D", [(1, 1, 16), (17, 113, 40), (113, 17, 64), (64, 64, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_numpy(M, N, D, causal):
    q, k, v = torch.randn(2, 3, M, D), torch.randn(2, 3, N, D), torch.randn(2, 3, N, D)
    ref = attention_reference(q, k, v, causal=causal)
    assert ref.dtype == torch.float64
    np.testing.assert_allclose(ref.numpy(), numpy_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


def test_chunking_does_not_change_the_result():
    q, k, v = torch.randn(3, 4, 37, 16), torch.randn(3, 4, 41, 16), torch.randn(3, 4, 41, 16)
    whole = attention_reference(q, k, v)
    chunked = attention_reference(q, k, v, max_chunk_bytes=1)  # one (batch, head) pair at a time
    assert torch.equal(whole, chunked)


def test_large_logits_stay_finite():
    q = torch.randn(1, 2, 33, 64) * 20
    k = torch.randn(1, 2, 33, 64) * 20
    ref = attention_reference(q, k, torch.randn(1, 2, 33, 64))
    assert torch.isfinite(ref).all()


def test_causal_mask_is_bottom_right_aligned():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # More queries than keys: the first M - N rows see nothing and the reference returns zeros there.
    q, k, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    out = attention_reference(q, k, v, causal=True)
    assert torch.equal(out[0, 0, :2], torch.zeros(2, 8, dtype=torch.float64))
    assert (out[0, 0, 2:] != 0).all()


def test_baseline_is_close_to_reference_in_float32():
    q, k, v = torch.randn(2, 2, 65, 64), torch.randn(2, 2, 63, 64), torch.randn(2, 2, 63, 64)
    assert relative_error(baseline(q, k, v), attention_reference(q, k, v)) < 1e-6
    # causal with M <= N: PyTorch's softmax gives NaN for rows that see no key, the reference gives 0
    q = q[:, :, :60]
    assert relative_error(baseline(q, k, v, causal=True), attention_reference(q, k, v, causal=True)) < 1e-6


def test_relative_error_never_passes_nan():
    ref = torch.ones(4)
    assert relative_error(ref, ref) == 0
    assert math.isnan(relative_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref))
    assert relative_error(ref * 1.001, ref) == pytest.approx(1e-3, rel=1e-4)


@pytest.mark.parametrize("causal,M,N", [(False, 17, 29), (True, 29, 17), (True, 17, 29), (False, 1, 5)])
def test_attention_gradients_match_float64_autograd(causal, M, N):
    """The chunked, written-out gradients equal autograd's through the reference, across chunk borders,
    rows with no visible key (causal, M > N) included."""
    g = torch.Generator().manual_seed(M * 100 + N)
    q, k, v = (torch.randn(2, 3, L, 8, dtype=torch.float64, generator=g, requires_grad=True) for L in (M, N, N))
    do = torch.randn(2, 3, M, 8, dtype=torch.float64, generator=g)
    want = torch.autograd.grad(attention_reference(q, k, v, causal), (q, k, v), do)
    got = attention_gradients(q.detach(), k.detach(), v.detach(), do, causal, max_chunk_bytes=2 * M * N * 8)
    for a, b in zip(got, want):
        assert a.shape == b.shape and relative_error(a, b) < 1e-12
