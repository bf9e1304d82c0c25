"""flashattn.book.v5_notes on the committed records: the V5 chapter's tables have the rows the records have and
print the records' numbers."""
from __future__ import annotations

import re

import pytest
import torch

from flashattn.book import records, v5_notes
from flashattn.measure import results

pytestmark = pytest.mark.skipif(not v5_notes.STEP_RECORD.exists(), reason="no results/h200/v5_steps.json")


def text(obj) -> str:
    return obj.data if hasattr(obj, "data") else str(obj)


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of every Markdown table in `markdown`, split into stripped cells."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines
            if not re.fullmatch(r"\|[-:| ]+\|", ln) and not ln.startswith(("| step |", "| D |", "| kernel |"))]


def test_step_summary_has_a_row_per_step_with_the_recorded_times():
    rows = records.step_rows("v5")
    body = table_rows(text(v5_notes.step_summary()))
    assert len(body) == len({r["step"] for r in rows}) == len(v5_notes.STEPS)
    for r in rows:
        line = body[r["step"] - 1]
        assert line[0].startswith(f"{r['step']}. ")
        assert f"{r['us']:,.1f}" in line
    # the evidence column of step 2 is the load bank conflicts before and after, at D = 64
    d64 = {r["step"]: r for r in rows if r["D"] == 64}
    assert f"{d64[1]['bank conflicts ld']:,.0f} → {d64[2]['bank conflicts ld']:,.0f}" in body[1][-1]


def test_step_summary_quotes_sdpa_and_the_blocked_sum_errors_of_the_records():
    out = text(v5_notes.step_summary())
    for D, us in v5_notes.sdpa_times().items():
        assert f"{us:,.1f} µs at D = {D}" in out
    sweep = {v["name"]: v for v in results.read(v5_notes.SWEEP_RECORD)["rows"]}
    errors = v5_notes.blocked_sum_errors()
    assert errors == {"blocked": sweep["d64_64x64_4x8"]["primary_rel_error"],
                      "plain": sweep["d64_64x64_4x8_flat"]["primary_rel_error"]}
    assert errors["blocked"] < errors["plain"]        # what the chapter says the step is for
    assert f"{errors['plain']:.1e} → {errors['blocked']:.1e}" in out


def test_chain_summary_names_the_largest_step_of_each_head_dim():
    lines = v5_notes.chain_summary().splitlines()
    rows = records.step_rows("v5")
    assert len(lines) == len({r["D"] for r in rows})
    for line in lines:
        D = int(line.split(":")[0].removeprefix("D="))
        chain = [r for r in rows if r["D"] == D]
        best = max(chain[1:], key=lambda r: r["vs_previous"])
        assert f"{chain[0]['us']:,.1f} µs -> {chain[-1]['us']:,.1f} µs" in line
        assert repr(best["name"].split(" ", 1)[1]) in line


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_step_compare_shows_the_step_and_the_one_before_at_each_head_dim(k):
    body = table_rows(text(v5_notes.step_compare(k, ("instructions",))))
    rows = [r for r in records.step_rows("v5") if r["step"] in (k - 1, k)]
    assert len(body) == len(rows)
    for line, r in zip(body, rows):
        assert line[0] == str(r["D"]) and line[1].startswith(f"{r['step']}. ")
        assert line[-1] == f"{r['instructions']:,.0f}"


def test_step1_vs_sdpa_is_the_ratio_of_the_recorded_times():
    sd = v5_notes.sdpa_times()
    for r in (r for r in records.step_rows("v5") if r["step"] == 1):
        assert f"({sd[r['D']] / r['us']:.2f}x SDPA's speed)" in v5_notes.step1_vs_sdpa()


@pytest.mark.skipif(not v5_notes.EXPLORE_RECORD.exists(), reason="no results/h200/v5_explore.json")
@pytest.mark.parametrize("D", [64, 128])
def test_explore_tables_have_every_build_of_every_shape_fastest_first(D):
    out = text(v5_notes.explore_tables(D, v5_notes.D128_LABELS if D == 128 else v5_notes.SMALL_TILE_LABELS))
    shapes = [r for r in results.read(v5_notes.EXPLORE_RECORD)["rows"] if r["shape"][4] == D]
    assert out.count("**B=") == len(shapes)
    body = table_rows(out)
    assert len(body) == sum(len(r["results"]) for r in shapes)
    assert "SDPA" in out and "| 1.00 |" in out
    for table in out.split("**B=")[1:]:
        us = [float(row[1].replace(",", "")) for row in table_rows(table)]
        assert us == sorted(us)


@pytest.mark.skipif(not v5_notes.SDPA_RAW.exists(), reason="no results/h200/sdpa_vs_v5_d128.raw.csv")
def test_sdpa_launches_show_sdpa_on_the_tensor_pipe_and_v5_on_ffma():
    launches = v5_notes.sdpa_launches()
    assert len(launches) == 2
    sdpa, v5 = (next(x for x in launches if key in x["kernel"]) for key in ("fmha", "flash_v5"))
    assert sdpa["tensor pipe"] > v5["tensor pipe"] and v5["FFMA"] > sdpa["FFMA"]
    assert v5["warp instructions"] > sdpa["warp instructions"]
    assert len(table_rows(text(v5_notes.sdpa_vs_v5_table()))) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the table is measured now")
def test_large_logits_without_a_gpu_lists_the_last_steps_odd_shapes():
    doc = results.read(v5_notes.STEP_RECORD)
    last = [r for r in doc["rows"] if r["name"] == f"d{r['D']} {v5_notes.STEPS[-1]}"]
    body = table_rows(text(v5_notes.large_logits()))
    assert len(body) == sum(len(r["odd_shapes"]) for r in last)
    assert any(float(row[2]) > 1 for row in body)        # the record has scaled logits


def test_profile_summary_reads_both_recorded_profiles():
    if not records.ncu_report_importable():
        pytest.skip("ncu_report cannot be imported here")
    s = v5_notes.profiles()
    lines = v5_notes.profile_summary().splitlines()
    assert [int(line.split(":")[0].removeprefix("D=")) for line in lines] == sorted(s)
    for line, x in zip(lines, s.values()):
        assert f"{x['issued_ipc']:.2f} instructions issued" in line
