"""flashattn.book.swizzle_modes: each mode a permutation of its atom, 128B equal to kernels/v7.cu's own
cp.async swizzle (compiled from the source), and a conflict-free 8-row column read."""
import matplotlib
import pytest
from test_wgmma_descriptor import run_kernel_host

from flashattn.book import swizzle_modes as sm
from flashattn.book import wgmma_descriptor as wd
from flashattn.measure.geometry import swizzle as v6_swizzle

matplotlib.use("Agg")


def test_128b_is_the_kernels_formula(tmp_path):
    cases = [(r, c) for r in range(16) for c in range(8)]
    got = run_kernel_host(tmp_path, [f"o 16 {r} {c}" for r, c in cases])
    assert [(off % 128) // 16 for off in got] == [sm.stored_chunk("128B", r, c) for r, c in cases]
    assert all(sm.stored_chunk("128B", r, c) == v6_swizzle(r, c) for r, c in cases)


@pytest.mark.parametrize("mode", list(sm.MODES))
def test_each_mode_permutes_its_atom(mode):
    w = sm.width(mode)
    for r in range(sm.ROWS_PER_ATOM):
        assert sorted(sm.stored_chunk(mode, r, c) for c in range(w // 16)) == list(range(w // 16))
    atom = range(sm.ROWS_PER_ATOM * w)
    assert sorted(sm.swizzle_address(mode, a) for a in atom) == list(atom)
    with pytest.raises(ValueError):
        sm.stored_chunk(mode, 0, w // 16)


def test_128b_column_read_hits_distinct_banks():
    for c in range(8):
        groups = {((r * 128 + sm.stored_chunk("128B", r, c) * 16) // 4) % 32 // 4 for r in range(8)}
        assert len(groups) == 8   # eight 4-bank groups: all 32 banks once
        assert sm.column_read_wavefronts("128B", c) == 1
    assert sm.column_read_wavefronts("128B", swizzled=False) == 8


def test_mode_numbers_agree_with_the_descriptor():
    assert wd.decode(wd.encode(0, 16, 1024))["swizzle"] == "128B"   # make_desc's (1ull << 62)
    assert {m: wd.decode(wd.encode(0, 16, 1024, m))["swizzle"] for m in sm.MODES} == {m: m for m in sm.MODES}
    assert [sm.cutlass_name(m) for m in ("128B", "64B", "32B")] == ["Swizzle<3,4,3>", "Swizzle<2,4,3>",
                                                                     "Swizzle<1,4,3>"]


def test_table_and_figure():
    table = sm.modes_table().splitlines()
    assert len(table) == 2 + len(sm.MODES)
    assert "c ⊕ (r mod 8)" in table[-1] and table[-1].rstrip(" |").endswith("| 1 | 8")
    fig = sm.FIGURES["swizzle_modes"]()
    assert len(fig.axes) == 1
