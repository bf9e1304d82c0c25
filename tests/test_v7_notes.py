"""flashattn.book.v7_notes on the committed records: the V7 chapter's step table has a row per sweep variant in the
order of flashattn.measure.variants.V7_TILES with the record's numbers, the pair-by-pair steps compare what the
record holds, the excerpts are the kernel's own lines, and the correctness and profile cells read their records."""
from __future__ import annotations

import re

import pytest

from flashattn.book import records, v7_notes
from flashattn.loader import source
from flashattn.measure import results
from flashattn.measure.variants import V7_TILES

SWEEP = records.RESULTS / "v7_sweep.json"
needs_sweep = pytest.mark.skipif(not SWEEP.exists(), reason="results/h200/v7_sweep.json is not recorded")


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the first Markdown table in `markdown`, each a list of stripped cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def recorded() -> dict[str, dict]:
    return {r["name"]: r for r in results.read(SWEEP, "sweep")["rows"]}


@needs_sweep
def test_steps_table_has_every_variant_in_the_order_of_v7_tiles():
    rows = table_rows(v7_notes.steps_table().data)
    names = [r[0] for r in rows]
    tiles = [v.name for v in V7_TILES]
    assert names[:len(tiles)] == tiles
    extra = [n for n in recorded() if n not in tiles]
    assert names[len(tiles):] == extra, "a recorded variant outside V7_TILES must still get a row"


@needs_sweep
def test_steps_table_numbers_are_the_records():
    got = recorded()
    checked = 0
    for name, regs, blocks, median, cudnn in table_rows(v7_notes.steps_table().data):
        if name not in got:
            assert regs == "not in the record"
            continue
        r = got[name]
        assert regs == str(r["ptxas"]["registers"])
        assert blocks == str(r["occupancy"]["blocks_per_sm"])
        assert median == f"{r['timing']['median_us']:,.1f}"
        assert cudnn == f"{r['vs']['sdpa_cudnn']:.2f}×"
        checked += 1
    assert checked == len(got)


@needs_sweep
def test_step_pairs_table_compares_the_recorded_times():
    got = recorded()
    rows = table_rows(v7_notes.step_pairs_table().data)
    assert len(rows) == len(v7_notes.STEPS)
    for (D, before, after, what), row in zip(v7_notes.STEPS, rows):
        assert row[0] == str(D) and row[1] == what
        if before not in got or after not in got:
            assert row[2] == "not in the record"
            continue
        ta, tb = got[before]["timing"]["median_us"], got[after]["timing"]["median_us"]
        assert row[2] == f"{ta:,.1f} → {tb:,.1f}"
        assert row[3] == f"{-100 * (ta - tb) / ta:+.1f}%"


def test_steps_compare_variants_of_the_sweep_at_their_head_dim():
    tiles = {v.name: v for v in V7_TILES}
    for D, before, after, _ in v7_notes.STEPS:
        assert tiles[before].D == D and tiles[after].D == D


def test_excerpt_is_the_kernels_own_lines():
    text = v7_notes.excerpt_text("uint64_t make_desc(", "(1ull << 62);")
    assert text in source("v7")
    assert text.splitlines()[0].lstrip().startswith("__device__") and text.rstrip().endswith("(1ull << 62);")
    assert v7_notes.excerpt_text("Wgmma<D, T>::rs(o, a, make_desc(").count("\n") == 0
    with pytest.raises(ValueError, match="kernels/v7.cu has no line containing"):
        v7_notes.excerpt_text("no such line in the kernel")


def test_accumulator_layout_repeats_mma_sync():
    assert v7_notes.accumulator_check().count("True") == 2


def test_refusals_name_the_dtype_and_the_head_dim():
    lines = v7_notes.refusals().splitlines()
    assert lines[0].startswith("float32, D=64: TypeError") and lines[1].startswith("bfloat16, D=96: ValueError")


def test_recorded_errors_are_the_benchmarks():
    rows = [r for r in records.bench_rows(records.RESULTS / "bench_v7.json") if r["version"] in ("v7", "sdpa")
            and r["dtype"] == "bfloat16" and not r["causal"] and r.get("rel_error") is not None]
    table = table_rows(v7_notes.recorded_errors("bfloat16", False).data)
    assert len(table) == len(rows)
    assert [t[-1] for t in table] == [f"{r['rel_error']:.1e}" for r in rows]


def test_tensor_paths_compare_per_sm_and_cycle():
    s6, s7 = records.profile_summary("v6"), records.profile_summary("v7")
    if s6 is None or s7 is None:
        pytest.skip("a profile report is not committed")
    text = v7_notes.tensor_paths()
    peaks = [int(p.replace(",", "")) for p in re.findall(r"peak ([\d,]+) ops per SM per cycle", text)]
    sms = records.ceilings()["sm_count"]
    assert peaks == [round(s["tensor_peak_ops_per_s"] / s["sm_frequency_hz"] / sms) for s in (s6, s7)]
    assert "op_hmma" in text.splitlines()[0] and "op_hgmma" in text.splitlines()[1]


def test_mma_path_ceilings_reads_the_gemm_ceiling():
    text = v7_notes.mma_path_ceilings().data
    assert f"| {records.ceilings()['bf16'] / 1e12:,.0f} | `ceilings.json` |" in text


def test_recorded_comparison_has_a_row_per_recorded_shape():
    path = records.RESULTS / "bench_v7.json"
    if not path.exists():
        pytest.skip("results/h200/bench_v7.json is not recorded")
    shapes = {(r["batch_size"], r["num_heads"], r["seq_len_q"], r["head_dim"], r["dtype"], bool(r["causal"]))
              for r in records.bench_rows(path) if r["version"] == "v7"}
    assert len(table_rows(v7_notes.recorded_comparison().data)) == len(shapes)
