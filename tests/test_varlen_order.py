"""flashattn.measure.varlen_order's model of the varlen forward's two orders (the figure of "Attention in real
models" and the balance columns of the step's table), checked against the kernel's arithmetic as
tests/test_varlen_bounds.py transcribes it, on the CPU:

* the model's items without the pre-pass are B x H x the longest sequence's row blocks in set_item's order, and
  with it the pre-pass's list (order_pass), each item with the key tiles set_item gives it;
* both orders hold the same work, and the per-block sums add up to it;
* without a GPU the command says it needs one, in one line.
"""
from __future__ import annotations

import itertools

import pytest
from test_varlen_bounds import order_pass, set_item

from flashattn.measure import varlen_order as vo

BATCHES = [vo.LENGTHS, tuple(reversed(vo.LENGTHS)), (8192, 8192), (17, 1, 300, 129, 128, 1000)]


def kernel_tiles(lengths, causal: bool, ordered: bool) -> list[int]:
    """Each item's n_tiles from the transcribed set_item (0 for an item past its sequence's end), in the order
    the blocks take them."""
    cu = [0, *itertools.accumulate(lengths)]
    m_blocks = (max(lengths) + vo.B_R - 1) // vo.B_R
    H, BH = vo.H_Q, len(lengths) * vo.H_Q
    records = None
    items = m_blocks * BH
    if ordered:
        count, _, records = order_pass(cu, vo.B_R, m_blocks, causal, cu)
        items = count * H
    # causal: -1 / 0 as the launcher passes them (window_right 0); otherwise no bound on either side
    wl, wr = (-1, 0) if causal else (-1, -1)
    return [set_item(i, causal, BH, m_blocks, vo.B_R, vo.B_C, H, H // vo.H_KV, cu, cu, wl, wr, records)["n_tiles"]
            for i in range(items)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", BATCHES, ids=str)
def test_the_model_is_the_kernels_order(lengths, causal):
    for ordered in (False, True):
        assert vo.items(lengths, causal, ordered) == kernel_tiles(lengths, causal, ordered), ordered


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", BATCHES, ids=str)
def test_both_orders_hold_the_same_work(lengths, causal):
    before, after = (vo.items(lengths, causal, ordered) for ordered in (False, True))
    assert sorted(t for t in before if t) == sorted(after) and 0 not in after
    for tiles in (before, after):
        loads = vo.block_loads(tiles, causal)
        assert len(loads) == vo.SMS and sum(loads) == sum(tiles)
        assert vo.balance(tiles, causal) >= 1.0


def test_without_a_gpu_the_command_says_so(monkeypatch):
    monkeypatch.setattr(vo.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        vo.main([])
