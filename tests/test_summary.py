"""flashattn.book.summary's staircase by phase: every step of every version, read from the records.

The V5 and V6 step files are built here as synthetic fixtures (in a copy of results/h200 without them),
so the tests do not depend on which step files are committed; nothing drawn from them is saved.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from flashattn.book import records, summary  # noqa: E402
from flashattn.measure import results as record  # noqa: E402

REAL = Path(records.RESULTS)
SHAPE = [4, 12, 2048, 2048, 64]


def _write_steps(path: Path, version: str, chain: list[tuple[str, float, str]], dtype: str) -> None:
    """A step file as `python -m flashattn.measure.sweep VERSION-steps` writes it, with a D=128 copy of every step
    that the staircase must leave out."""
    variants = []
    for D, shape in ((64, SHAPE), (128, [2, 16, 8192, 8192, 128])):
        variants += [dict(name=f"d{D} {n}", D=D, change=c, shape=shape, correct=True, max_rel_error=1e-6 * (i + 1),
                          timing=dict(median_us=us * (1 if D == 64 else 10)))
                     for i, (n, us, c) in enumerate(chain)]
    record.write(path, "sweep", variants, {"version": version, "dtype": dtype, "steps": [v["name"] for v in variants]})


V5_CHAIN = [("register tiles", 2000.0, "register tiles"), ("cp.async", 1600.0, "double buffering"),
            ("exp2 (default)", 1250.0, "exp2 softmax")]
V6_CHAIN = [("P via shared memory", 300.0, "mma.sync, P through shared memory"),
            ("P in registers", 250.0, "P kept in registers"), ("1 barrier (default)", 170.0, "one barrier")]


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A copy of the committed records without any step file, as records.RESULTS."""
    for f in REAL.glob("*.json"):
        if not f.name.endswith("_steps.json"):
            shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    return tmp_path


def test_without_step_files_each_version_is_one_step(results):
    fp32 = summary.phase_steps("fp32")
    assert [r["version"] for r in fp32] == ["v0", "v1", "v2", "v3", "v4", "v5"]
    assert all(r["file"] == "bench.json" and r["same_run"] == (i > 0) for i, r in enumerate(fp32))
    bf16 = summary.phase_steps("bf16")
    assert bf16[0]["version"] == "v6" and bf16[0]["file"] == "bench_v6.json"
    # v7 and v8 come from their sweeps, as the chains listed in SWEEP_CHAINS
    for v in ("v7", "v8"):
        names = [r["name"] for r in bf16 if r["version"] == v]
        assert len(names) == len(summary.SWEEP_CHAINS[v])
        assert all(r["change"] for r in bf16 if r["version"] == v)


def test_step_files_replace_the_versions_by_their_steps(results):
    _write_steps(results / "v5_steps.json", "v5", V5_CHAIN, "float32")
    _write_steps(results / "v6_steps.json", "v6", V6_CHAIN, "bfloat16")
    fp32 = summary.phase_steps("fp32")
    v5 = [r for r in fp32 if r["version"] == "v5"]
    assert [r["us"] for r in v5] == [2000.0, 1600.0, 1250.0]          # D=64 only, in the file's order
    assert [r["change"] for r in v5] == [c for _, _, c in V5_CHAIN]
    assert v5[0]["same_run"] is False and v5[1]["same_run"] and v5[2]["same_run"]
    assert v5[1]["vs_previous"] == pytest.approx(2000 / 1600)
    v4 = next(r for r in fp32 if r["version"] == "v4")
    assert v5[0]["vs_previous"] == pytest.approx(v4["us"] / 2000)
    c = summary.ceilings()
    assert v5[2]["share"] == pytest.approx(4 * 4 * 12 * 2048 * 2048 * 64 / 1250e-6 / c["fp32"])
    assert v5[2]["error"] == pytest.approx(3e-6)

    bf16 = summary.phase_steps("bf16")
    assert [r["us"] for r in bf16[:3]] == [300.0, 250.0, 170.0]
    assert bf16[3]["version"] == "v7" and bf16[3]["same_run"] is False

    text = summary.phase_table("fp32").data
    lines = text.splitlines()
    assert lines[7].startswith("| 6 | V5: register tiles | register tiles | 2,000.0 |")
    assert "†" in lines[7] and "†" not in lines[8]             # V4 -> V5 crosses runs; V5's steps do not
    fig = summary.fig_phase("bf16", show=False)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:3] == ["V6: P via shared memory", "V6: P in registers", "V6: 1 barrier (default)"]


def test_phase_summary_reads_the_record(results):
    rows = summary.phase_steps("fp32")
    text = summary.phase_summary("fp32")
    assert f"{rows[0]['us']:,.1f} µs" in text and f"{rows[-1]['us']:,.1f} µs" in text
    assert f"{rows[0]['us'] / rows[-1]['us']:,.1f}×" in text
