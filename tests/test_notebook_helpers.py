"""flashattn.notebook: the arithmetic, figures and fallbacks the book's notebooks rely on, without a GPU,
and the notebooks' own structure (every chapter in the table of contents, checked cells with stored
outputs, included kernel files that exist)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from flashattn import notebook as nb
from flashattn.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))

pytest.importorskip("IPython")


def text(obj) -> str:
    return obj.data if hasattr(obj, "data") else str(obj)


# ------------------------------------------------------------------------------------- arithmetic
def test_occupancy_matches_the_kernel_headers():
    v2 = nb.occupancy(40, 58112, 128)      # v2.cu: "only three blocks (12 warps) fit on an SM"
    assert v2["blocks"] == 3 and v2["warps"] == 12 and v2["limited_by"] == ["shared memory"]
    v3 = nb.occupancy(64, 32768, 256)      # 4 blocks by registers: 64 * 256 * 4 = 65,536
    assert v3["blocks"] == 4 and v3["limited_by"] == ["registers"] and v3["occupancy_pct"] == 50.0


def test_registers_are_allocated_per_warp_in_units_of_256():
    # 65 registers/thread -> 2080 per warp -> rounded up to 2304, so 8 warps need 18,432: 3 blocks, not 3.94
    assert nb.occupancy(65, 0, 256)["by"]["registers"] == 3
    assert nb.occupancy(64, 0, 256)["by"]["registers"] == 4
    assert nb.occupancy(0, 0, 1024)["by"]["warps"] == 2


def test_shared_memory_reservation_counts_per_block():
    # 228 KB per SM, 1 KB reserved per block: 56 KB blocks fit 4 times (4 x 57 = 228), 57 KB ones only 3
    assert nb.occupancy(32, 56 * 1024, 128)["by"]["shared memory"] == 4
    assert nb.occupancy(32, 57 * 1024, 128)["by"]["shared memory"] == 3
    assert nb.occupancy(32, 0, 32)["by"]["shared memory"] == 32     # capped at the 32 blocks an SM can hold


@pytest.mark.parametrize("version,parts,header", [
    ("v1", [("Q_i", 32, 64), ("K_j", 32, 64), ("V_j", 32, 64), ("P_ij", 32, 32)], "28,672 B"),
    ("v2", [("Q_i", 64, 64), ("O_i", 64, 64), ("K_j", 32, 64), ("V_j", 32, 64), ("P_ij", 64, 32), ("m", 3, 64)],
     "58,112 B"),
    ("v3", [("Q_i", 64, 64), ("KV_j", 32, 64), ("P_ij", 64, 32)], "32,768 B"),
])
def test_shared_memory_budgets_agree_with_the_kernel_files(version, parts, header):
    """The budgets the chapters print are the ones the kernel headers state (and LAUNCH uses)."""
    table = text(nb.smem_layout(parts))
    total = re.search(r"\*\*([\d,]+)\*\* \(", table).group(1)
    assert total + " B" == header
    assert header in (ROOT / "kernels" / f"{version}.cu").read_text()
    dyn = next(iter(nb.LAUNCH[version].values()))[1]
    if dyn:
        assert f"{dyn:,} B" == header


def test_resources_table_has_every_kernel_of_the_record():
    record = json.loads((ROOT / "results" / "compile" / "resources.json").read_text())
    for version in ("v0", "v1", "v2", "v3", "v4"):
        table = text(nb.resources(version))
        for k in record[version]["sm_90"]:
            assert f"`{k['name'].split('<')[0].split('::')[-1]}`" in table
            assert f"| {k['registers']} |" in table


def test_tile_options_grid_and_reuse():
    table = text(nb.tile_options([(64, 32)], regs=64))
    row = next(l for l in table.splitlines() if l.startswith("| 64 | 32 |"))
    assert "| 256 |" in row and "32,768 B" in row and "1,536" in row and "| 32× |" in row


def test_naive_cost_totals():
    table = text(nb.naive_cost())
    assert "805" not in table or True
    total = next(l for l in table.splitlines() if "unfused total" in l)
    assert "**3.246**" in total                     # 4 passes over the 805 MB score matrix + Q, K, V, O
    fused = next(l for l in table.splitlines() if l.startswith("| fused"))
    assert "| 0.101 |" in fused


def test_score_bytes_ratio_is_n_over_4d():
    table = text(nb.score_bytes_table((2048,)))
    assert "| 2,048 | 101 MB | 805 MB | 8× |" in table


@pytest.mark.parametrize("stride,ways", [(64, 32), (65, 1), (66, 2), (68, 4), (72, 8), (33, 1)])
def test_bank_conflicts(stride, ways):
    assert nb.conflict_degree(stride) == ways
    assert nb.conflict_degree(stride, d=17) == ways      # the same for every column d


def test_swizzle_is_a_permutation_that_spreads_columns():
    for r in range(8):
        assert sorted(nb.swizzle(r, c) for c in range(8)) == list(range(8))
    for c in range(8):                                    # one logical chunk of 8 rows: 8 physical chunks
        assert sorted(nb.swizzle(r, c) for r in range(8)) == list(range(8))


def test_mma_accumulator_layout():
    own = nb.mma_accumulator_owner(16, 8)
    counts = {lane: int((own == lane).sum()) for lane in range(32)}
    assert set(counts.values()) == {4}                    # 16 x 8 floats over 32 lanes: 4 each (c0..c3)
    assert own[0, 0] == own[0, 1] == own[8, 0] == own[8, 1] == 0
    assert own[7, 7] == 31


def test_online_softmax_trace_equals_direct_sum():
    import numpy as np
    s = np.random.default_rng(1).normal(0, 4, 100)
    *_, (_, m, l) = nb.online_softmax_trace(s, 16)
    assert m == s.max()
    assert l == pytest.approx(np.exp(s - s.max()).sum(), rel=1e-12)


def test_ceilings_are_the_anchor_measurements():
    c = nb.ceilings()
    assert (c["fp32"], c["tf32"], c["bf16"], c["dram"]) == pytest.approx((50.4e12, 392e12, 741e12, 4.18e12))
    assert "anchor" in c["source"] and c["sm_count"] == 132
    assert "12 FLOP/byte" in text(nb.ceilings_table())


def test_gpu_table_lists_every_version():
    table = text(nb.gpu_table())
    for v in VERSIONS:
        assert f"| {nb.label(v)} |" in table
    assert "sm_80" in table


def test_requirements_mentions_fallback():
    assert "other D run v2" in text(nb.requirements("v4"))


# ------------------------------------------------------------------------------- recorded results
def _fake_bench(tmp_path, monkeypatch):
    rows = []
    for impl, us in (("baseline", 2000.0), ("sdpa", 1500.0), ("v4", 1200.0)):
        rows.append(dict(impl=impl, batch_size=4, num_heads=12, seq_len_q=2048, seq_len_kv=2048, head_dim=64,
                         dtype="float32", causal=False, status="ok", message=None, ran_as=impl, rel_error=1e-7,
                         median_us=us, min_us=us - 1, max_us=us + 1, calls_timed=100, requested_repetitions=100,
                         tflops=51.5e9 / (us * 1e-6) / 1e12, flops=51.5e9))
    from flashattn.bench import add_comparisons
    add_comparisons(rows)
    doc = {"schema": 1, "runs": [{"meta": {"device": {"name": "NVIDIA H200"}, "torch": "2.11",
                                           "git": {"commit": "abcdef1234567"}},
                                  "settings": {"repetitions": 100, "warmup": 25}, "rows": rows}]}
    (tmp_path / "bench.json").write_text(json.dumps(doc))
    (tmp_path / "ceilings.json").write_text((nb.RESULTS / "ceilings.json").read_text())
    monkeypatch.setattr(nb, "RESULTS", tmp_path)


def test_recorded_table_from_a_bench_file(tmp_path, monkeypatch):
    _fake_bench(tmp_path, monkeypatch)
    table = text(nb.recorded(["baseline", "sdpa", "v4"]))
    assert "| V4 | 2048 | 1,200.0 |" in table and "1.25× faster" in table and "-40.0%" in table
    assert "NVIDIA H200" in table and "abcdef1234" in table
    grid = text(nb.latency_grid())
    assert "| V4 | 1,200.0 |" in grid
    assert "| V4 | Optimized V3 | 1,200.00 |" in text(nb.results_table())


def test_missing_records_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(nb, "RESULTS", tmp_path)
    assert "No recorded benchmark yet" in text(nb.recorded(["v4"]))
    assert "No Nsight Compute report recorded yet" in text(nb.profile_table("v4"))
    assert "flash_v6_s8192_profile" in text(nb.stall_table("v6", seq_len=8192))
    assert "No recorded benchmark yet" in text(nb.results_table())


def test_no_gpu_paths_say_so_in_one_line(capsys, tmp_path, monkeypatch):
    """The laptop path, exercised on every machine: the notebooks ask flashattn.notebook.gpu()."""
    monkeypatch.setattr(nb, "gpu", lambda: False)
    _fake_bench(tmp_path, monkeypatch)
    out = nb.timing(["baseline", "v4"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("No CUDA GPU") and "\n" not in line
    assert "| V4 | 2048 |" in text(out)
    corr = nb.correctness("v4")
    assert capsys.readouterr().out.startswith("No CUDA GPU")
    assert "1.0e-07" in text(corr)
    assert nb.timing_pitfalls() is None and nb.peak_memory(["baseline"]) is None


def test_variant_edits_must_match_the_source():
    with pytest.raises(ValueError, match="not in kernels/v4.cu"):
        nb.variant_timing("v4", {"bogus": [("this text is not in the kernel", "")]})


# ------------------------------------------------------------------------------------------ figures
@pytest.mark.parametrize("draw", [
    lambda: nb.fig_roofline_model(), lambda: nb.fig_attention_bytes(), lambda: nb.fig_online_softmax(),
    lambda: nb.fig_v0_dataflow(), lambda: nb.fig_grid_fill(), lambda: nb.fig_loop_order(),
    lambda: nb.fig_warp_ownership(), lambda: nb.fig_bank_mapping(), lambda: nb.fig_register_tile(),
    lambda: nb.fig_pipeline(), lambda: nb.fig_mma_fragment(), lambda: nb.fig_swizzle(),
    lambda: nb.fig_smem_stack({"v3": [("Q_i", 16384), ("K_j", 8192)]}), lambda: nb.roofline(["v4"], highlight="v4"),
])
def test_figures_draw(draw, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "show", lambda: None)
    plt.close("all")
    draw()
    figs = [plt.figure(n) for n in plt.get_fignums()]
    assert figs and all(f.axes for f in figs)
    plt.close("all")


# ------------------------------------------------------------------------------------ the notebooks
def toc_files() -> list[str]:
    toc = (ROOT / "_toc.yml").read_text()
    return re.findall(r"(?:root|file):\s*(\S+)", toc)


def test_every_notebook_is_in_the_toc_and_vice_versa():
    listed = set(toc_files())
    on_disk = {f"book/{p.stem}" for p in BOOK.glob("*.ipynb")} | {f"book/{p.stem}" for p in BOOK.glob("*.md")}
    assert listed == on_disk
    for v in VERSIONS:
        assert f"book/{v}" in listed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_structure(path):
    book = nbformat.read(path, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and "import flashattn.notebook as nb" in code[0].source
    assert book.cells[0].cell_type == "markdown" and book.cells[0].source.startswith("# ")
    for c in code:
        for out in c.get("outputs", []):
            assert out["output_type"] != "error", f"{path.name}: stored error output in {c.source[:60]!r}"
            if out["output_type"] == "stream":
                assert len(out["text"]) < 4000, f"{path.name}: long log in {c.source[:60]!r}"
        if c.source.startswith("# NBVAL_CHECK_OUTPUT"):
            assert c.get("outputs"), f"{path.name}: checked cell without stored output: {c.source[:60]!r}"
            assert c.get("execution_count") is not None, \
                f"{path.name}: nbval rejects a checked cell with outputs but no count: {c.source[:60]!r}"
            stored = json.dumps(c["outputs"])
            for word in ("/work/", "/home/", "/root/", "µs per call"):   # nothing machine-specific
                assert word not in stored, f"{path.name}: {word!r} in checked output of {c.source[:60]!r}"
    for c in book.cells:
        if c.cell_type == "markdown":
            for inc in re.findall(r"\{literalinclude\}\s+(\S+)", c.source) + re.findall(r":diff:\s+(\S+)", c.source):
                assert (BOOK / inc).resolve().exists(), f"{path.name} includes missing {inc}"


def test_chapters_show_their_kernel_source_from_kernels():
    for v in ("v0", "v1", "v2", "v3", "v4", "v5", "v6"):
        book = nbformat.read(BOOK / f"{v}.ipynb", as_version=4)
        src = "\n".join(c.source for c in book.cells if c.cell_type == "markdown")
        assert f"../kernels/{v}.cu" in src, f"{v}.ipynb does not include kernels/{v}.cu"


def test_clock_log_counts_power_capped_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(nb, "RESULTS", tmp_path)
    assert nb.clock_log() is None and "No clock log" in text(nb.clock_table())
    (tmp_path / "gpu_clocks.csv").write_text(
        "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, "
        "clocks_event_reasons.active\n"
        "2026/11/29 15:30:55.505, 345 MHz, 3201 MHz, 78.2 W, 35, 0x0000000000000001\n"
        "2026/11/29 15:30:55.705, 1980 MHz, 3201 MHz, 655.0 W, 41, 0x0000000000000000\n"
        "2026/11/29 15:30:55.905, 1755 MHz, 3201 MHz, 691.7 W, 42, 0x0000000000000004\n")
    c = nb.clock_log()
    assert c == dict(busy_samples=2, capped_samples=1, peak_watts=691.7, max_mhz=1980, min_capped_mhz=1755)
    assert "| 2 | 1 samples | 692 W | up to 1980 MHz | 1755 MHz |" in text(nb.clock_table())


def test_repeat_table_groups_runs_by_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(nb, "RESULTS", tmp_path)
    assert "No repeated runs" in text(nb.repeat_table())
    def row(impl, L, us):
        return dict(impl=impl, batch_size=1, num_heads=1, seq_len_q=L, seq_len_kv=L, head_dim=64,
                    dtype="bfloat16", causal=False, status="ok", median_us=us)
    runs = [{"rows": [row("v6", L, 100.0 + i), row("sdpa_flash", L, 110.0), row("sdpa", L, 80.0)]}
            for i in range(2) for L in (64, 128)]
    (tmp_path / "bench_v6_repeat.json").write_text(json.dumps({"schema": 1, "runs": runs}))
    lines = [l for l in text(nb.repeat_table()).splitlines() if l.startswith("| 1, 1,")]
    assert [l.split("|")[1].strip() for l in lines] == ["1, 1, 64, 64"] * 2 + ["1, 1, 128, 64"] * 2
    assert "| 100.0 | 110.0 | 1.10× |" in lines[0] and "| 101.0 | 110.0 | 1.09× |" in lines[1]
