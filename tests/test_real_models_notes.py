"""The arithmetic behind the figures of "Attention in real models" (flashattn.book.real_models), on the CPU."""
import itertools

import matplotlib
import numpy as np
import pytest

from flashattn import reference
from flashattn.book import real_models as notes

matplotlib.use("Agg")


def tiles_from_mask(M, N, B_r, B_c, left, right):
    """The classification straight from flashattn.reference's element-wise mask."""
    mask = reference.window_mask(M, N, False, (left, right))
    mask = np.ones((M, N), dtype=bool) if mask is None else mask.numpy()
    grid = np.zeros((-(-M // B_r), -(-N // B_c)), dtype=int)
    for a, b in itertools.product(range(grid.shape[0]), range(grid.shape[1])):
        blk = mask[a * B_r:(a + 1) * B_r, b * B_c:(b + 1) * B_c]
        full = blk.all() and (b + 1) * B_c <= N
        grid[a, b] = notes.SKIP if not blk.any() else (notes.FULL if full else notes.MASKED)
    return grid


@pytest.mark.parametrize("M,N", [(1, 1), (17, 113), (113, 17), (203, 203), (300, 129)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (0, 0), (3, 0), (17, 17), (100, 50), (-1, 40), (250, -1)])
def test_window_tiles_match_the_reference_mask(M, N, window):
    assert (notes.window_tiles(M, N, 32, 16, *window) == tiles_from_mask(M, N, 32, 16, *window)).all()


def test_window_counts_of_exercise_two():
    grid = notes.window_tiles(8192, 8192, 128, 128, 1024, 0)
    row = grid[40]                                   # a query tile far from the start
    assert (row != notes.SKIP).sum() == 9 and (row == notes.FULL).sum() == 7
    causal = notes.tile_counts(notes.window_tiles(8192, 8192, 128, 128, -1, 0))
    assert causal["unmasked"] + causal["masked"] == 64 * 65 // 2


def test_figures_draw():
    for fig in (notes.fig_gqa(), notes.fig_padding(), notes.fig_window(), notes.fig_varlen()):
        assert fig.axes


def test_prefill_table_adds_the_wide_dims_when_recorded(tmp_path):
    """The wide record's rows come below the main table, forward then backward (96 trains), each with
    FlashAttention-4's time over ours; without the record the table is the main one alone, forward and backward."""
    with_wide = notes.prefill_table().data
    without = notes.prefill_table(wide=tmp_path / "none.json").data
    title = "Head dims 96, 192 and 256"
    assert title in with_wide and title not in without
    main, wide = with_wide.split(title)
    shape_rows = lambda text: [r for r in text.splitlines() if r[:4] in ("| 1,", "| 2,", "| 4,")]   # noqa: E731
    forward, backward = wide.split("Backward, every column")
    assert len(shape_rows(forward)) == 5 and len(shape_rows(backward)) == 2
    assert all(r.rstrip(" |").endswith("×") for r in shape_rows(wide))
    assert "Backward, every column" in main and len(shape_rows(main.split("Backward, every column")[1])) == 2
