"""flashattn.schedule (the ping-pong model of the V8 chapter) and the V8 helpers of flashattn.sass, on
inputs small enough to check by hand."""
from __future__ import annotations

import pytest

from flashattn import sass, schedule


def test_pingpong_issues_in_turn_and_keeps_the_tensor_cores_busier():
    turns = schedule.simulate(warpgroups=2, tiles=3, pingpong=True)
    products = [p for p in turns if p.kind == "products"]
    assert [p.warpgroup for p in products] == [0, 1, 0, 1, 0, 1]
    for a, b in zip(products, products[1:]):          # one warpgroup on the tensor cores at a time
        assert b.start >= a.end
    lockstep = schedule.simulate(warpgroups=2, tiles=3, pingpong=False)
    shared = [p for p in lockstep if p.kind == "products" and p.tile == 0]
    assert shared[0].start == shared[1].start and shared[0].end == shared[1].end == 2.0
    assert schedule.tensor_busy(turns) > schedule.tensor_busy(lockstep)
    assert schedule.tensor_busy(lockstep) == pytest.approx(2 / 3)


def test_overlap_window_counts_exponentials_and_finds_a_write_in_flight():
    lines = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0",          # S: from shared memory
             "HGMMA.64x64x16.F32.BF16 R56, R100, gdesc[UR8].tnspB, R56, gsb0",  # P V: A in R100..R103
             "WARPGROUP.DEPBAR.LE gsb0, 0x1",
             "MUFU.EX2 R5, R5", "MUFU.EX2 R6, R6", "FMUL R60, R60, R5",     # R60: an O_i accumulator
             "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R7, R7"]
    (length, exps, clobbered), = sass.overlap_windows(lines)
    assert (length, exps) == (3, 2) and clobbered == ["FMUL R60, R60, R5"]
    assert sass.overlap_windows(lines[:2] + lines[6:]) == []


def test_register_moves_reads_setmaxnreg():
    lines = ["USETMAXREG.DEALLOC.CTAPOOL 0x18", "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0", "MOV R1, R2"]
    assert sass.register_moves(lines) == {"release": [24], "claim": [240]}
