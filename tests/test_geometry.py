"""Kernel geometry and occupancy without a GPU: flashattn.measure.geometry reads tile sizes from the kernel files,
flashattn.measure.resources turns registers and shared memory into blocks per SM, flashattn.book.tiles prints both."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

import flashattn
from flashattn import loader
from flashattn.book import tiles
from flashattn.measure import geometry, results
from flashattn.measure.resources import load_record, occupancy
from flashattn.measure.variants import SETS, Variant

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "results" / "compile" / "resources.json"
pytest.importorskip("IPython")


def text(obj) -> str:
    return obj.data if hasattr(obj, "data") else str(obj)


# ------------------------------------------------------------------------------------------ occupancy
def test_occupancy_matches_the_kernel_headers():
    v2 = occupancy(40, 58112, 128)      # v2.cu: "only three blocks (12 warps) fit on an SM"
    assert v2["blocks"] == 3 and v2["warps"] == 12 and v2["limited_by"] == ["shared memory"]
    v3 = occupancy(64, 32768, 256)      # 4 blocks by registers: 64 * 256 * 4 = 65,536
    assert v3["blocks"] == 4 and v3["limited_by"] == ["registers"] and v3["occupancy_pct"] == 50.0


def test_registers_are_allocated_per_warp_in_units_of_256():
    # 65 registers/thread -> 2080 per warp -> rounded up to 2304, so 8 warps need 18,432: 3 blocks, not 3.94
    assert occupancy(65, 0, 256)["by"]["registers"] == 3
    assert occupancy(64, 0, 256)["by"]["registers"] == 4
    assert occupancy(0, 0, 1024)["by"]["warps"] == 2


def test_shared_memory_reservation_counts_per_block():
    # 228 KB per SM, 1 KB reserved per block: 56 KB blocks fit 4 times (4 x 57 = 228), 57 KB ones only 3
    assert occupancy(32, 56 * 1024, 128)["by"]["shared memory"] == 4
    assert occupancy(32, 57 * 1024, 128)["by"]["shared memory"] == 3
    assert occupancy(32, 0, 32)["by"]["shared memory"] == 32     # capped at the 32 blocks an SM can hold


# -------------------------------------------------------------------------------- geometry of v1-v4
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_shared_memory_budget_is_the_one_the_kernel_header_states(version):
    """The arrays read from the kernel file add up to the budget its header comment states, and the
    chapter's table prints that total."""
    parts = geometry.smem_parts(version)
    total = geometry.smem_bytes(parts)
    assert f"{total:,} B" in (ROOT / "kernels" / f"{version}.cu").read_text()
    table = text(tiles.smem_layout(version))
    assert re.search(r"\*\*([\d,]+)\*\* \(", table).group(1) == f"{total:,}"
    assert table.startswith(f"{version.upper()} at D = 64:")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_dynamic_shared_memory_of_the_launch_is_the_budget(version):
    threads, dyn = geometry.launch_of(version, f"flash_{version}_kernel")
    assert dyn == geometry.smem_bytes(geometry.smem_parts(version))
    assert threads == 32 * geometry.constant(version, "WARPS")


def test_constant_refuses_a_name_the_file_lacks():
    with pytest.raises(KeyError, match="no integer constant"):
        geometry.constant("v1", "NO_SUCH_TILE")


def test_v5_formula_matches_what_the_runtime_reported():
    """kernel_info (the compiled binding asking the CUDA runtime) recorded threads and shared memory for
    every swept tile shape; the Python formula must give the same for each."""
    doc = results.read(ROOT / "results" / "h200" / "v5_sweep.json", "sweep")
    checked = 0
    for r in doc["rows"]:
        rt = r.get("runtime")
        if not rt:
            continue
        g = geometry.v5_tiles(r["D"], rt["B_r"], rt["B_c"], rt["TM"], rt["TN"])
        assert (g["threads"], g["smem"]) == (rt["threads"], rt["smem_bytes"]), r["name"]
        checked += 1
    assert checked >= 10


def test_sweep_variants_have_the_geometry_of_their_macros():
    for name, variant in SETS["v5"].items():
        g = geometry.variant_geometry(variant)
        D = variant.D
        assert (g["B_r"], g["B_c"]) == (variant.macros[f"V5_D{D}_BR"], variant.macros[f"V5_D{D}_BC"]), name
    defaults = geometry.v5_default_tiles()
    assert geometry.variant_geometry(Variant("default", "v5", 64)) == defaults[64]


def test_launch_of_covers_every_recorded_kernel():
    for version, per_arch in load_record(RECORD)[1].items():
        for k in per_arch.get("sm_90", []):
            assert geometry.launch_of(version, k["name"]) is not None, (version, k["name"])


def test_resources_table_has_every_kernel_of_the_record():
    record = load_record(RECORD)[1]
    for version in ("v0", "v1", "v2", "v3", "v4"):
        table = text(tiles.resources_table(version))
        for k in record[version]["sm_90"]:
            assert f"`{k['name'].split('<')[0].split('::')[-1]}`" in table
            assert f"| {k['registers']} |" in table


# ------------------------------------------------------------------------------------- tile arithmetic
def test_tile_options_grid_and_reuse():
    B_r, B_c, D, M, BH = 64, 32, 64, 2048, 48
    table = text(tiles.tile_options([(B_r, B_c)], regs=64, D=D, M=M, BH=BH))
    row = next(l for l in table.splitlines() if l.startswith(f"| {B_r} | {B_c} |"))
    smem = 4 * (B_r * D + B_c * D + B_r * B_c)           # Q_i + one K/V tile + P_ij
    grid = math.ceil(M / B_r) * BH
    assert f"| {32 * B_r // 8} |" in row and f"{smem:,} B" in row and f"| {grid:,} |" in row
    assert f"| {math.ceil(M / B_r)}× |" in row


@pytest.mark.parametrize("stride,ways", [(64, 32), (65, 1), (66, 2), (68, 4), (72, 8), (33, 1)])
def test_bank_conflicts(stride, ways):
    assert geometry.conflict_degree(stride) == ways
    assert geometry.conflict_degree(stride, d=17) == ways      # the same for every column d


def test_swizzle_is_a_permutation_that_spreads_columns():
    for r in range(8):
        assert sorted(geometry.swizzle(r, c) for c in range(8)) == list(range(8))
    for c in range(8):                                    # one logical chunk of 8 rows: 8 physical chunks
        assert sorted(geometry.swizzle(r, c) for r in range(8)) == list(range(8))


def test_mma_accumulator_layout():
    own = geometry.mma_accumulator_owner(16, 8)
    counts = {lane: int((own == lane).sum()) for lane in range(32)}
    assert set(counts.values()) == {4}                    # 16 x 8 floats over 32 lanes: 4 each (c0..c3)
    assert own[0, 0] == own[0, 1] == own[8, 0] == own[8, 1] == 0
    assert own[7, 7] == 31


@pytest.mark.gpu
def test_v5_formula_matches_the_compiled_binding():
    """The truth: the v5 binding's kernel_info asks the CUDA runtime about the kernel it compiled."""
    flashattn.load("v5")                      # refuses a GPU older than sm_80 with the reason
    module = loader.build("v5", functions=("forward", "kernel_info"), module_name="flashattn_v5_info")
    for D, g in geometry.v5_default_tiles().items():
        B_r, B_c, TM, TN, threads, smem, *_ = module.kernel_info(D)
        assert (B_r, B_c, TM, TN, threads, smem) == (g["B_r"], g["B_c"], g["TM"], g["TN"], g["threads"], g["smem"])
