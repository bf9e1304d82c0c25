"""flashattn.book.mbarrier_ring: the ring arithmetic against the kernels' own expressions, compiled with g++."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashattn.book import host_cpp, mbarrier_ring  # noqa: E402
from flashattn.loader import KERNELS_DIR  # noqa: E402

needs_gxx = pytest.mark.skipif(host_cpp.COMPILER is None, reason=host_cpp.MISSING)


def test_three_stage_ring_by_hand():
    rows = mbarrier_ring.ring_schedule(3, 7)
    assert [(r.slot, r.full_parity, r.empty_parity, r.phases) for r in rows] == [
        (0, 0, None, 1), (1, 0, None, 1), (2, 0, None, 1),
        (0, 1, 0, 2), (1, 1, 0, 2), (2, 1, 0, 2), (0, 0, 1, 3)]


@needs_gxx
@pytest.mark.parametrize("version", ["v7", "v8"])
def test_kernel_expressions_give_the_same_schedule(version):
    rows = mbarrier_ring.kernel_rows(version, loads=24)
    for stages, got in rows.items():
        assert got == mbarrier_ring.ring_schedule(stages, 24), (version, stages)


def test_patterns_fail_loudly_when_the_kernel_changes():
    text = (KERNELS_DIR / "v8.cu").read_text().replace("auto wait_k = [&](int t)", "auto wait_k = [&](int tile)")
    with pytest.raises(ValueError, match="no longer matches"):
        mbarrier_ring.kernel_expressions("v8", text)


@needs_gxx
def test_a_wrong_parity_in_the_kernel_is_caught():
    text = (KERNELS_DIR / "v8.cu").read_text().replace("((u / STAGES) - 1) & 1", "(u / STAGES) & 1")
    rows = mbarrier_ring.kernel_rows("v8", loads=8, text=text)
    assert rows[2] != mbarrier_ring.ring_schedule(2, 8)
    assert rows[2][2].empty_parity == 1 and mbarrier_ring.ring_schedule(2, 8)[2].empty_parity == 0


def test_check_parity_table_names_the_wrong_entries():
    right = [(r.slot, r.full_parity, r.empty_parity) for r in mbarrier_ring.ring_schedule(3, 6)]
    assert mbarrier_ring.check_parity_table(right) == []
    answer = [list(row) for row in right]
    answer[0][2] = "-"                 # "-" means no wait: still right
    answer[4][1] = 0                   # wrong
    answer[3][2] = None                # wrong: load 3 must wait
    assert mbarrier_ring.check_parity_table(answer) == ["load 3: empty parity is 0, not none",
                                                        "load 4: full parity is 1, not 0"]


def test_parity_table_and_figure():
    table = mbarrier_ring.parity_table(3, 6).split("\n")
    assert len(table) == 2 + 6 and table[5] == "| 3 | 0 | 1 | 0 | 2 |"
    assert (KERNELS_DIR.parent / "book" / "_static" / "concepts" / "mbarrier_ring.png").is_file()   # the book's copy
    fig = mbarrier_ring.FIGURES["mbarrier_ring"]()
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["2-stage ring", "3-stage ring"]
    plt.close(fig)
