"""flashattn.book.backward_notes on the committed records: the backward chapter's step table, key profile numbers,
bank-conflict runs, step tables and excerpts print what the records and the kernel file hold (no GPU, no nvcc)."""
from __future__ import annotations

import json

import pytest

from flashattn.book import backward_notes as notes
from flashattn.book import records
from flashattn.book.backward_steps import RECORD_NAMES
from flashattn.measure import ncu_pages

CONFIGS = ((4, 12, 2048, 64, False), (2, 16, 8192, 128, False), (4, 12, 2048, 64, True), (2, 16, 8192, 128, True))


def last_run(step: str) -> dict[tuple, dict[str, float]]:
    """{config: {version: median µs}} of the last run in a step's record, read here without the module."""
    data = json.loads((records.RESULTS / f"{RECORD_NAMES[step]}.json").read_text())
    rows = data["rows"]
    if "runs" in data["meta"]:     # a record of several runs tags each row with its run
        rows = [r for r in rows if r["run"] == len(data["meta"]["runs"]) - 1]
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("median_us"):
            key = (r["batch_size"], r["num_heads"], r["seq_len_q"], r["head_dim"], r["causal"])
            out.setdefault(key, {})[r["version"]] = r["median_us"]
    return out


def table_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[1:]]


def test_by_config_matches_the_record():
    for step in ("layouts", "dq", "tile", "det"):
        assert notes.by_config(notes.step_run(step)[0]) == last_run(step)


def test_steps_table_ratios_are_the_records():
    rows = {r[0]: r for r in table_rows(notes.steps_table())}
    assert len(rows) == len(notes.STEP_ROWS) + 2
    for label, step, before, after in notes.STEP_ROWS:
        run = last_run(step)
        for col, key in enumerate(CONFIGS, start=2):
            cell = rows[label][col]
            if step == "tile" and key[3] == 128:
                assert cell == "same kernel"
            else:
                assert cell == f"{run[key][before] / run[key][after]:.2f}×"
    tile = last_run("tile")
    fa2 = rows["today's kernels against FlashAttention-2"]
    assert fa2[2] == f"{tile[CONFIGS[0]]['sdpa_flash'] / tile[CONFIGS[0]]['v6_layout2_bulk_br128']:.2f}×"
    assert fa2[3] == f"{tile[CONFIGS[1]]['sdpa_flash'] / tile[CONFIGS[1]]['v6_layout2_bulk']:.2f}×"


def raw(step: str) -> dict[str, dict]:
    info = records.ncu_record(records.RESULTS / f"{RECORD_NAMES[step]}_ncu.json")
    pages = ncu_pages.read_raw_rows(records.RESULTS / info["raw_csv"])
    return dict(zip(info["kernels"], pages))


def test_key_profile_numbers_are_the_records():
    text = notes.key_profile_table()
    assert len(table_rows(text)) == sum(1 + len(names) for *_, names in notes.KEY_STEPS)
    layouts, dq = raw("layouts"), raw("dq")
    ldsm = "smsp__inst_executed_op_ldsm.sum"
    assert f"| {float(layouts['v6_layout0'][ldsm][0]):,.0f} | {float(layouts['v6_layout2'][ldsm][0]):,.0f} |" in text
    stall = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
    assert f"| {float(dq['v6_layout2'][stall][0]):.2f} | {float(dq['v6_layout2_bulk'][stall][0]):.2f} |" in text


def test_bank_conflict_runs_show_both_records_of_layout_2():
    lines = notes.bank_conflict_runs("v6_layout2")
    metric = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
    counts = [raw(step)["v6_layout2"][metric][0] for step in ("layouts", "dq")]
    assert len(lines) == 2
    for line, count in zip(lines, counts):
        assert f": {count} shared-load bank conflicts" in line
    assert counts[0] != counts[1]    # what the lab notes say: the counter varies between runs


@pytest.mark.parametrize("step", ("layouts", "dq", "tile"))
def test_profile_table_has_one_row_per_profiled_build(step):
    rows = table_rows(notes.profile_table(step))
    assert [r[0] for r in rows] == [notes.COLUMNS.get(k, k) for k in raw(step)]


def test_layout_and_det_tables_have_one_row_per_configuration():
    for step in ("layouts", "dq", "tile"):
        rows, _ = notes.step_run(step)
        assert len(table_rows(notes.layout_table(rows, step))) == len(last_run(step))
    rows, meta = notes.step_run("det")
    det = table_rows(notes.det_table(rows, meta))
    run = last_run("det")
    assert len(det) == len(run)
    first = run[CONFIGS[0]]
    assert det[0][-1] == f"+{100 * (first['v6_layout2_bulk_br128'] / first['atomic'] - 1):.0f}%"


def test_default_variant_is_the_kernel_files_build():
    assert notes.default_variant(64, "tile") == "v6_layout2_bulk_br128"
    assert notes.default_variant(128, "tile") == "v6_layout2_bulk"
    assert notes.default_variant(128, "layouts") == "v6_layout2"


def test_excerpt_reads_the_kernel_and_fails_loudly():
    text = notes.excerpt("// BULK_DQ: query tile it's dQ image", "};")
    assert text in notes.SOURCE.read_text()
    assert "bulk_reduce_add_f32" in text
    with pytest.raises(ValueError):
        notes.excerpt("no such line in the kernel", "};")


def test_work_table_counts_five_and_seven_products():
    text = notes.work_table()
    assert "| backward, dQ by atomics |" in text and "10·M·N·D | 2.5× |" in text and "14·M·N·D | 3.5× |" in text
