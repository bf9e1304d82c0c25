"""flashattn.book.ring_figures: the committed PNGs are what the code draws now, and the work the zigzag figure
shows is the schedule's."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from flashattn.book import ring_figures


def test_committed_pngs_match_the_code():
    assert ring_figures.differences() == {}, "run python -m flashattn.book.ring_figures and commit"


@pytest.mark.parametrize("world", [2, 4, 5])
def test_step_work_is_even_with_zigzag_only(world):
    zigzag = ring_figures.step_work(world, True, "zigzag")
    contiguous = ring_figures.step_work(world, True, "contiguous")
    assert (zigzag == 2).all()                                   # every rank, every step: half a 2-chunk block
    assert zigzag.sum() == contiguous.sum() == 2 * world ** 2     # the same pairs, dealt differently
    assert contiguous.max(axis=1).sum() == 4 * world - 2          # the busiest rank sets every step but the first
    assert np.array_equal(ring_figures.step_work(world, False), np.full((world, world), 4.0))


def test_block_words_follow_the_schedule():
    assert [ring_figures.block_words(1, s, 4) for s in range(4)] == \
        ["own: causal", "both q × early kv", "late q × both kv", "late q × both kv"]


def test_figures_draw():
    for name, draw in ring_figures.FIGURES.items():
        fig = draw()
        assert len(fig.axes) == {"ring_steps": 2, "ring_zigzag": 3}[name]
        plt.close(fig)
