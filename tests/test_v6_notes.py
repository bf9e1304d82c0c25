"""flashattn.book.v6_notes on the committed records: the V6 chapter's step table, TF32 errors and clock table
print what the records hold, and the fragment figure agrees with the PTX ISA's mma.m16n8k16 layouts."""
from __future__ import annotations

import json

import pytest

from flashattn.book import records, v6_notes
from flashattn.measure import geometry

STEPS = json.loads((records.RESULTS / v6_notes.STEPS_FILE).read_text())


def raw_step(D: int, step: int) -> dict:
    names = [n for n in STEPS["meta"]["steps"] if next(r for r in STEPS["rows"] if r["name"] == n)["D"] == D]
    return next(r for r in STEPS["rows"] if r["name"] == names[step - 1])


def test_step_summary_has_one_row_per_recorded_step():
    rows = v6_notes.step_summary_rows()
    per_d = {D: sum(1 for r in STEPS["rows"] if r["D"] == D) for D in (64, 128)}
    assert [r["step"] for r in rows] == list(range(1, max(per_d.values()) + 1))
    table = v6_notes.step_summary().data
    assert sum(1 for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()) == len(rows)


@pytest.mark.parametrize("D", (64, 128))
def test_step_summary_times_and_ratios_are_the_record(D):
    rows = v6_notes.step_summary_rows()
    for r in rows:
        us = raw_step(D, r["step"])["timing"]["median_us"]
        assert r[f"us{D}"] == pytest.approx(us)
        if r["step"] > 1:
            assert r[f"x{D}"] == pytest.approx(raw_step(D, r["step"] - 1)["timing"]["median_us"] / us)
        assert f"{us:,.1f}" in v6_notes.step_summary().data


def test_step_summary_counters_are_the_record():
    rows = {r["step"]: r for r in v6_notes.step_summary_rows()}
    # step 2 takes the stores of P out of the hot loop; step 7 one barrier
    assert rows[2]["before"] == raw_step(64, 1)["sass_hot_loop"]["STS"] > 0 == rows[2]["after"]
    assert rows[7]["after"] == raw_step(64, 7)["sass_hot_loop"]["BAR/sync"] < rows[7]["before"]
    # step 3: padding removes most of the load bank conflicts the counters saw on plain rows
    assert rows[3]["before"] > 100 * rows[3]["after"]
    assert rows[3]["after"] == records.step_rows("v6")[2]["bank conflicts ld"]


def test_tf32_errors_are_the_bench_record():
    errors = v6_notes.tf32_errors()
    assert set(errors) >= {"v6", "sdpa"}
    assert errors["v6"] > 10 * errors["sdpa"]          # TF32 gives up float32 accuracy, as the prose says
    recorded = {r["version"]: r["rel_error"] for r in records.bench_rows(records.RESULTS / "bench_v6.json")
                if r["dtype"] == "float32" and r["seq_len_q"] == 2048 and r["head_dim"] == 64 and not r["causal"]}
    assert errors["v6"] == recorded["v6"]
    assert f"{errors['v6']:.1e}" in v6_notes.tf32_error_line()


def test_refusals_name_the_head_dims():
    text = v6_notes.refusals()
    assert "v6, D = 80: ValueError" in text and "not supported by v6" in text
    assert "v6 is specialised for D in (64, 128); any other D is refused" in text


def test_clock_table_peak_is_rate_times_clock():
    rows = v6_notes.clock_rows()
    if not rows:
        pytest.skip("no Nsight Compute report readable here (ncu_report)")
    per_ghz = [peak / ghz for _, _, peak, ghz in rows]
    assert max(per_ghz) == pytest.approx(min(per_ghz), rel=0.01)    # same FFMA rate per cycle on every row


def test_fragment_figure_is_the_ptx_layout():
    """The figure draws geometry.mma_accumulator_owner(16, 16) with register (c % 2) + 2 * (row >= 8) and the
    title lane = 4 * (row mod 8) + floor((column mod 8) / 2); each must agree with the PTX ISA's accumulator
    layout and with its bf16 A operand, element a_i = c_(i mod 4) of n8 tile i // 4."""
    drawn = geometry.mma_accumulator_owner(16, 16)
    acc_lane, acc_elem = v6_notes.accumulator_owner(2)
    a_lane, a_elem = v6_notes.a_operand_owner()
    for r in range(16):
        for c in range(16):
            title = 4 * (r % 8) + (c % 8) // 2
            assert drawn[r, c] == acc_lane[r, c] == a_lane[r, c] == title
            assert acc_elem[r, c] == (c % 2) + 2 * (r >= 8)
            assert a_elem[r, c] == 4 * (c // 8) + acc_elem[r, c]
    assert drawn[0, 8] == 0          # lane 0 holds column 8 too: the title's formula needs column mod 8
