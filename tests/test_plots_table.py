"""The roofline figure and the README table, from synthetic inputs and from committed results."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashattn.book import plots
from flashattn.measure import results, table
from flashattn.versions import INFO, VERSIONS

RESULTS = Path(__file__).resolve().parent.parent / "results" / "h200"
REPORTS = sorted(RESULTS.glob("flash_*_profile.ncu-rep"))   # the version profiles (others: one-off comparisons)
BENCH = RESULTS / "bench.json"

pytest.importorskip("matplotlib")


def _labels(ax):
    return sorted(t.get_text() for t in ax.texts)


def test_roofline_from_synthetic_points(tmp_path):
    points = [
        {"label": "v1", "intensity": 43.4, "flops_per_s": 0.34e12, "fp32_peak": 60e12, "dram_peak": 4.8e12},
        {"label": "v4", "intensity": 376.0, "flops_per_s": 14.1e12, "fp32_peak": 60e12, "dram_peak": 4.8e12},
        {"label": "v6", "intensity": 900.0, "flops_per_s": 300e12, "fp32_peak": 60e12, "dram_peak": 4.8e12,
         "tensor_peak": 990e12},
    ]
    fig, ax = plots.roofline(points)
    assert _labels(ax) == ["v1", "v4", "v6"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    roofs = [l.get_label() for l in ax.get_lines() if "roof" in l.get_label()]
    assert len(roofs) == 2 and any("tensor" in r for r in roofs)
    fig.savefig(tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").stat().st_size > 0


def test_roofline_without_tensor_roof():
    _, ax = plots.roofline([{"label": "v2", "intensity": 70.0, "flops_per_s": 0.56e12, "fp32_peak": 60e12,
                             "dram_peak": 4.8e12}])
    assert _labels(ax) == ["v2"]
    assert [l.get_label() for l in ax.get_lines() if "roof" in l.get_label()] == [
        "FP32 roof 60.0 TFLOP/s, DRAM 4.80 TB/s"]


@pytest.mark.skipif(not REPORTS, reason="no Nsight Compute report committed under results/h200/ yet")
def test_roofline_from_committed_reports():
    pytest.importorskip("ncu_report")
    fig, ax = plots.roofline(plots.points_from_reports(REPORTS))
    from flashattn.measure.ncu import version_of
    assert _labels(ax) == sorted(version_of(r.name) for r in REPORTS)


def _run(rows, **settings):
    return {"meta": {"device": {"name": "NVIDIA H200"}, "driver": "580.00", "torch": "2.11.0", "cuda_runtime": "13.0",
                     "git": {"commit": "abcdef1234567"}},
            "settings": {"warmup": 25, "repetitions": 100, **settings}, "rows": rows}


def _row(version, us, L=2048, status="ok", calls=100, **kw):
    r = dict(version=version, batch_size=4, num_heads=12, seq_len_q=L, seq_len_kv=L, head_dim=64, dtype="float32",
             causal=False, status=status, message=None if status == "ok" else "takes float32 only",
             median_us=us, calls_timed=calls, requested_repetitions=100)
    r.update(kw)
    return r


def synthetic_doc():
    rows = [_row("v4", 3810.3, change_vs_baseline_pct=-68.1, speedup_vs_sdpa=1.445),
            _row("baseline", 11940.15), _row("sdpa", 5507.07, change_vs_baseline_pct=-53.9, speedup_vs_sdpa=1.0),
            _row("v1", 241906.6, calls=12, change_vs_baseline_pct=1926.0, speedup_vs_sdpa=0.0228),
            _row("v0", None, status="unsupported"), _row("v4", 999.0, L=1024)]
    run = _run(rows)
    return results.document("bench", run["rows"], run["meta"], run["settings"])


def test_table_from_synthetic_json(tmp_path):
    path = tmp_path / "bench.json"
    results.save(path, synthetic_doc())
    md = table.results_table(path)
    lines = md.splitlines()
    assert lines[0] == "| Version | Title | Latency (µs) | Δ vs. baseline | vs. SDPA | Description |"
    body = [l for l in lines[2:] if l.startswith("| ")]
    assert [l.split("|")[1].strip() for l in body] == ["Baseline", "SDPA", "V0", "V1", "V4"]   # book order
    v4 = next(l for l in body if l.startswith("| V4 "))
    assert "3,810.30" in v4 and "−68.1%" in v4 and "1.45× faster" in v4 and "999" not in md
    assert "241,906.60†" in md and "† fewer timed calls" in md
    assert "not run: takes float32 only" in md
    assert "NVIDIA H200" in md and "M=2048" in md and "abcdef1234" in md
    from flashattn.versions import INFO
    assert INFO["v4"].title in v4 and INFO["v4"].description in v4


def test_update_readme_replaces_only_the_marked_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{table.START}\nold table\n{table.END}\noutro\n")
    table.update_readme(readme, "| new |")
    assert readme.read_text() == f"intro\n{table.START}\n| new |\n{table.END}\noutro\n"
    (tmp_path / "bad.md").write_text("no markers")
    with pytest.raises(ValueError):
        table.update_readme(tmp_path / "bad.md", "x")


def test_table_cli(tmp_path, capsys):
    path = tmp_path / "bench.json"
    results.save(path, synthetic_doc())
    assert table.main([str(path), "--seq-len", "1024"]) == 0
    assert "999.00" in capsys.readouterr().out


@pytest.mark.skipif(not BENCH.exists(), reason="results/h200/bench.json not committed yet")
def test_table_from_committed_bench():
    md = table.results_table(BENCH)
    names = [l.split("|")[1].strip() for l in md.splitlines()[2:] if l.startswith("| ")]
    fp32 = [v for v in VERSIONS if torch.float32 in INFO[v].dtypes]   # the recorded table is float32
    assert names[:2] == ["Baseline", "SDPA"] and len(names) >= len(fp32)


def _timed(version, median_us, causal=False, backward=False, B=2, H=16, L=8192, D=128):
    flops = (2.5 if backward else 1.0) * 4 * B * H * L * L * D / (2 if causal else 1)
    row = dict(version=version, batch_size=B, num_heads=H, seq_len_q=L, seq_len_kv=L, head_dim=D, dtype="bfloat16",
               causal=causal, status="ok", median_us=median_us, tflops=flops / (median_us * 1e-6) / 1e12)
    return dict(row, direction="backward") if backward else row


def test_v7_and_backward_tables_and_a_file_not_recorded(tmp_path, capsys):
    """--compare --tflops: the ratios and rates follow from the medians; backward rows are never read as
    forward ones; a missing file leaves a plain 'Not recorded yet' in the README block, nothing else."""
    bwd = tmp_path / "bench_backward.json"
    run = _run([_timed("v6", 4000.0, backward=True), _timed("sdpa_flash", 6000.0, backward=True)])
    results.write(bwd, "bench", run["rows"], run["meta"], run["settings"])
    text = table.comparison_table(table.load(bwd), "v6", ["sdpa_flash", "sdpa_cudnn"], tflops=True)
    rate = 2.5 * 4 * 2 * 16 * 8192 * 8192 * 128 / 4000e-6 / 1e12
    assert f"| 2, 16, 8192, 128 | bfloat16 | no | 4,000.0 | {rate:,.0f} | 6,000.0 | 1.50× | n/a | — |" in text
    with pytest.raises(ValueError, match="no benchmark rows"):
        table.select_rows(table.load(bwd))                     # forward by default: none in this file
    assert len(table.select_rows(table.load(bwd), seq_len=8192, direction="backward")[0]) == 2
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- v7-table:start -->\nold\n<!-- v7-table:end -->\nb\n")
    assert table.main([str(tmp_path / "bench_v7.json"), "--compare", "v7", "v6", "--update-readme", str(readme)]) == 0
    assert readme.read_text() == f"a\n<!-- v7-table:start -->\n{table.not_recorded(tmp_path / 'bench_v7.json')}\n" \
                                 "<!-- v7-table:end -->\nb\n"
    assert "Not recorded yet" in capsys.readouterr().out

