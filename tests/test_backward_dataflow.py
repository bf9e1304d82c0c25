"""flashattn.book.backward_dataflow: the labels it reads from kernels/v6_backward.cu, the numpy dataflow of one key
tile against float64 autograd, and the figure. No GPU."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from flashattn.book import backward_dataflow as bd  # noqa: E402


def test_kernel_facts_come_from_the_kernel():
    f = bd.kernel_facts()
    assert f["bulk"].startswith("cp.reduce.async.bulk") and f["bulk"].endswith(".add.f32")
    assert f["red"].startswith("red.global.add")
    assert f["fence"].startswith("fence.proxy.async")
    assert f["accumulators"] == ("dv", "dk")
    assert set(bd.SHARED) <= set(f["shared"])
    assert "[B_c][D]" in f["shared"]["sK"] and "fp32" in f["shared"]["sdQ"]


@pytest.mark.parametrize("old, new", [("cp.reduce.async.bulk", "cp.async.bulk"), ("float* sdQ", "float* sAcc"),
                                      ("red.global.add", "atom.global.add"), ("float dv[2]", "float acc_v[2]")])
def test_kernel_facts_fail_when_the_kernel_changes(tmp_path, old, new):
    text = bd.KERNEL.read_text()
    assert old in text
    changed = tmp_path / "v6_backward.cu"
    changed.write_text(text.replace(old, new))
    with pytest.raises(ValueError, match="no longer has"):
        bd.kernel_facts(changed)


@pytest.mark.parametrize("kw", [dict(), dict(key_tiles=2), dict(key_tiles=3, query_tiles=2, B_r=5, B_c=2, D=8),
                                dict(B_r=4, B_c=4, key_tiles=2, causal=True)])
def test_worked_example_matches_autograd(kw):
    ex = bd.worked_example(**kw)
    assert ex["shape"]["M"] == kw.get("query_tiles", 2) * kw.get("B_r", 3)
    for name, diff in ex["max_abs_diff"].items():
        assert diff < 1e-12, (name, diff)
        assert np.abs(ex["ref"][name]).max() > 1e-3      # not a comparison of zeros


def test_dq_needs_every_key_block_while_dk_dv_need_only_their_own():
    """dK_j, dV_j of a block are final when its loop ends; dQ is right only after every block has added into it."""
    ex = bd.worked_example(key_tiles=2)
    rng = np.random.default_rng(0)          # the inputs worked_example draws, in its order
    M, N, D = 6, 8, 4
    Q, dO = rng.standard_normal((M, D)), rng.standard_normal((M, D))
    K, V = rng.standard_normal((N, D)), rng.standard_normal((N, D))
    tau = D ** -0.5
    S = tau * Q @ K.T
    lse = np.log(np.exp(S).sum(1))
    Dvec = (dO * (np.exp(S - lse[:, None]) @ V)).sum(1)
    acc = np.zeros((M, D))
    dK0, dV0 = bd.key_tile_backward(Q, K[:4], V[:4], dO, lse, Dvec, acc, tau, 3)
    assert np.allclose(dK0, ex["ref"]["dK"][:4], atol=1e-12) and np.allclose(dV0, ex["ref"]["dV"][:4], atol=1e-12)
    assert not np.allclose(tau * acc, ex["ref"]["dQ"], atol=1e-3)          # half of the sum is still missing
    bd.key_tile_backward(Q, K[4:], V[4:], dO, lse, Dvec, acc, tau, 3)
    assert np.allclose(tau * acc, ex["ref"]["dQ"], atol=1e-12)


def test_causal_example_needs_a_square_problem():
    with pytest.raises(ValueError, match="as many queries as keys"):
        bd.worked_example(causal=True)


def test_figure_labels_are_the_kernels():
    assert set(bd.FIGURES) == {"backward_dataflow"}
    fig = bd.FIGURES["backward_dataflow"]()
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    f = bd.kernel_facts()
    for label in (f["bulk"], f["red"], f["fence"], "sK, sV", "sQ, sdO", "sL, sDv", "sP, sdS", "sdQ", "dv, dk"):
        assert label in texts, label
    for product in ("S = Q_i K_jᵀ", "dV_j += Pᵀ dO_i", "dP = dO_i V_jᵀ", "dK_j += dSᵀ Q_i", "dQ_i += dS K_j"):
        assert product in texts, product


def test_saved_png_is_committed():
    assert bd.OUTPUT.exists() and bd.OUTPUT.stat().st_size > 20_000
