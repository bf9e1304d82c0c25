"""flashattn.book.records and flashattn.measure.table: the book's tables of what was recorded on the H200, from the
committed files or from small files written here; a missing record says so instead of failing."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_bench_file

from flashattn.book import clocks, records
from flashattn.measure import results as record
from flashattn.measure import table

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("IPython")


def text(obj) -> str:
    return obj.data if hasattr(obj, "data") else str(obj)


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An empty results folder in place of results/h200 (with the committed ceilings)."""
    (tmp_path / "ceilings.json").write_text((records.RESULTS / "ceilings.json").read_text())
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    monkeypatch.setattr(clocks, "RESULTS", tmp_path)
    return tmp_path


def test_recorded_table_from_a_bench_file(results):
    write_bench_file(results)
    t = text(records.recorded(["baseline", "sdpa", "v4"]))
    assert "| V4 | 2048 | 1,200.0 |" in t and f"{1500 / 1200:.2f}× faster" in t
    assert f"{(1200 / 2000 - 1) * 100:+.1f}%" in t
    assert "NVIDIA H200" in t and "abcdef1234" in t
    assert "| V4 | 1,200.0 |" in text(records.latency_grid())
    assert "| V4 | Optimized V3 | 1,200.00 |" in text(records.results_table())


def test_missing_records_say_so(results):
    assert "No recorded benchmark yet" in text(records.recorded(["v4"]))
    assert "No Nsight Compute report recorded yet" in text(records.profile_table("v4"))
    assert "flash_v6_s8192_profile" in text(records.stall_table("v6", seq_len=8192))
    assert "No recorded benchmark yet" in text(records.results_table())
    assert "No recorded sweep yet" in text(records.sweep_table("v5"))


def test_ceilings_come_from_the_record_and_give_the_ridge_points():
    doc = record.read(records.RESULTS / "ceilings.json", "ceilings")
    value = {r["name"]: r["value"] for r in doc["rows"]}
    c = records.ceilings()
    assert c["fp32"] == value["fp32_cuda_core_tflops"] * 1e12 and c["dram"] == value["dram_copy_tbps"] * 1e12
    assert c["sm_count"] == doc["meta"]["sm_count"] and c["source"]
    ridge = value["fp32_cuda_core_tflops"] / value["dram_copy_tbps"]
    assert f"| {ridge:,.0f} FLOP/byte |" in text(records.ceilings_table())


def test_clock_log_counts_power_capped_samples(results):
    assert clocks.clock_log() is None and "No clock log" in text(clocks.clock_table())
    (results / "gpu_clocks.csv").write_text(
        "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, "
        "clocks_event_reasons.active\n"
        "2026/11/29 15:30:55.505, 345 MHz, 3201 MHz, 78.2 W, 35, 0x0000000000000001\n"
        "2026/11/29 15:30:55.705, 1980 MHz, 3201 MHz, 655.0 W, 41, 0x0000000000000000\n"
        "2026/11/29 15:30:55.905, 1755 MHz, 3201 MHz, 691.7 W, 42, 0x0000000000000004\n")
    c = clocks.clock_log()
    assert c == dict(busy_samples=2, capped_samples=1, peak_watts=691.7, max_mhz=1980, min_capped_mhz=1755)
    assert "| 2 | 1 samples | 692 W | up to 1980 MHz | 1755 MHz |" in text(clocks.clock_table())


def test_repeat_table_groups_runs_by_shape(results):
    assert "No repeated runs" in text(records.repeat_table())

    def row(version, L, us):
        return dict(version=version, batch_size=1, num_heads=1, seq_len_q=L, seq_len_kv=L, head_dim=64,
                    dtype="bfloat16", causal=False, status="ok", median_us=us)
    for i in range(2):
        for L in (64, 128):
            record.append(results / "bench_v6_repeat.json", "bench",
                          [row("v6", L, 100.0 + i), row("sdpa_flash", L, 110.0), row("sdpa", L, 80.0)], meta={})
    lines = [l for l in text(records.repeat_table()).splitlines() if l.startswith("| 1, 1,")]
    assert [l.split("|")[1].strip() for l in lines] == ["1, 1, 64, 64"] * 2 + ["1, 1, 128, 64"] * 2
    assert f"| 100.0 | 110.0 | {110 / 100:.2f}× |" in lines[0] and f"| 101.0 | 110.0 | {110 / 101:.2f}× |" in lines[1]


@pytest.mark.parametrize("version", ["v5", "v6"])
def test_sweep_table_has_a_row_per_recorded_variant(version):
    doc = record.read(records.RESULTS / f"{version}_sweep.json", "sweep")
    assert doc["meta"]["version"] == version
    t = text(records.sweep_table(version))
    for r in doc["rows"]:
        assert f"| {r['name']} | {r['D']} |" in t
        assert f"| {r['timing']['median_us']:,.1f} |" in t
    fastest = min((r for r in doc["rows"] if r["D"] == 64 and r.get("correct") is not False),
                  key=lambda r: r["timing"]["median_us"])
    assert f"D=64: {fastest['name']}" in t


def test_gpu_tests_sentence_counts_the_junit_record(tmp_path):
    missing = table.gpu_tests_sentence(tmp_path / "pytest_junit.xml")
    assert missing.startswith("No GPU test run is recorded yet")
    xml = tmp_path / "pytest_junit.xml"
    xml.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="flashattn at 0123456789abc" '
                   'errors="1" failures="2" skipped="3" tests="40" time="1.0" timestamp="2026-11-30T10:00:00">'
                   '</testsuite></testsuites>')
    s = table.gpu_tests_sentence(xml)
    assert "34 passed, 3 skipped, 3 failed" in s and "`0123456789`" in s and "2026-11-30" in s
    xml.write_text(xml.read_text().replace("flashattn at 0123456789abc", "pytest"))
    (tmp_path / "git_commit.txt").write_text("fedcba9876543 (FLASHATTN_GIT_COMMIT)\n")
    assert "`fedcba9876`" in table.gpu_tests_sentence(xml, tmp_path / "git_commit.txt")


def test_junit_parts_merge_into_one_run(tmp_path, capsys):
    def part(name, tests, failures, commit="0123456789abc"):
        path = tmp_path / f"{name}.xml"
        path.write_text(f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="flashattn at {commit}" '
                        f'errors="0" failures="{failures}" skipped="1" tests="{tests}" time="1.0" '
                        f'timestamp="2026-12-03T10:00:00"></testsuite></testsuites>')
        return path
    parts = [part("hopper-backward", 30, 1), part("rest1", 20, 0), part("rest2", 10, 0)]
    assert table.main(["--merge-junit", *map(str, parts), "--out", str(tmp_path / "all.xml")]) == 0
    assert "56 passed, 3 skipped, 1 failed" in capsys.readouterr().out
    assert "56 passed, 3 skipped, 1 failed" in table.gpu_tests_sentence(tmp_path / "all.xml")
    with pytest.raises(ValueError, match="different runs"):   # a part from another commit
        table.merge_junit([*parts, part("old", 5, 0, commit="fedcba")], tmp_path / "all.xml")


def test_readme_block_is_replaced_between_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- gpu-tests:start -->\nold\n<!-- gpu-tests:end -->\nb\n")
    table.main(["--gpu-tests", str(tmp_path / "none.xml"), "--update-readme", str(readme)])
    body = readme.read_text()
    assert "old" not in body and "No GPU test run is recorded yet" in body and body.endswith("b\n")


def test_step_table_of_a_recorded_chain(results):
    """records.step_rows/step_table on a small v6_steps.json: speedups against the step before and the first
    step of the same head dim, metric and SASS columns, the order of "steps"."""
    def variant(name, D, us, change, conflicts=None, lds=None):
        r = dict(name=name, D=D, change=change, correct=True, max_rel_error=1e-3, shape=[4, 12, 2048, 2048],
                 timing={"median_us": us}, geometry={"smem": 1024}, ptxas={"registers": 200})
        if conflicts is not None:
            r["metrics"] = {"shape": [2, 8, 1024, 1024, D], "counters": {"bank_conflicts_ld": conflicts},
                            "stalls": {"barrier": 0.25}}
        if lds is not None:
            r["sass_hot_loop"] = {"LDS": lds, "LDSM": 0}
        return r
    meta = {"version": "v6", "set": "v6-steps", "dtype": "bfloat16", "steps": ["d64 a", "d64 b", "d64 c", "d128 a"],
            "references": [], "device": {"name": "NVIDIA H200"}, "git": {"commit": "abc123"}}
    variants = [variant("d128 a", 128, 900.0, "first"), variant("d64 c", 64, 100.0, "third", 0, 3),
                variant("d64 b", 64, 150.0, "second", 4096, 227), variant("d64 a", 64, 300.0, "first")]
    record.write(results / "v6_steps.json", "sweep", variants, meta, {"timing": "interleaved"})
    rows = records.step_rows("v6")
    assert [r["name"] for r in rows] == meta["steps"] and [r["step"] for r in rows] == [1, 2, 3, 1]
    assert rows[1]["vs_previous"] == pytest.approx(2.0) and rows[2]["vs_previous"] == pytest.approx(1.5)
    assert rows[2]["vs_first"] == pytest.approx(3.0) and rows[3]["vs_previous"] is None
    assert rows[1]["bank conflicts ld"] == 4096 and rows[1]["LDS"] == 227 and rows[0]["stall barrier"] is None
    t = text(records.step_table("v6", D=64, columns=("bank conflicts ld", "LDS", "stall barrier")))
    assert "| 64 | 2 | second | yes | 150.0 | 2.00× | 2.00× | 4,096 | 227 | 0.25 |" in t
    assert "| 128 |" not in t and "1024" in t.replace(",", "")
    sentence = records.step_sentence("v6", 2)
    assert "Step 2 (second): at D = 64 it goes from 300.0 µs to 150.0 µs (2.00× the speed" in sentence
    (results / "v6_steps.json").unlink()
    assert "No recorded step chain" in text(records.step_table("v6"))
