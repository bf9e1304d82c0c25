"""What the chapters call besides the records: the per-version tables of flashattn.book.notebook, the cost
tables of flashattn.book.tiles, the no-GPU paths of flashattn.book.live and every figure of flashattn.book.figures,
flashattn.book.diagrams and flashattn.book.layouts."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import write_bench_file  # noqa: E402

from flashattn.book import diagrams, figures, layouts, live, notebook, records, tiles  # noqa: E402
from flashattn.measure.table import label  # noqa: E402
from flashattn.versions import INFO, VERSIONS  # noqa: E402

pytest.importorskip("IPython")


def text(obj) -> str:
    return obj.data if hasattr(obj, "data") else str(obj)


def test_naive_cost_adds_up_the_bytes_of_each_step():
    """S written and read, P written and read (4 passes over B*H*N*N floats), plus Q, K, V, O once each."""
    B, H, N, D = 4, 12, 2048, 64
    t = text(tiles.naive_cost(B, H, N, D))
    tensor, scores = 4 * B * H * N * D, 4 * B * H * N * N
    total = next(l for l in t.splitlines() if "unfused total" in l)
    assert f"**{(4 * tensor + 4 * scores) / 1e9:,.3f}**" in total
    fused = next(l for l in t.splitlines() if l.startswith("| fused"))
    assert f"| {4 * tensor / 1e9:,.3f} |" in fused
    c = records.ceilings()
    assert f"µs at {c['fp32'] / 1e12:,.1f} TFLOP/s" in t


def test_score_bytes_ratio_is_n_over_4d():
    B, H, D, N = 4, 12, 64, 2048
    t = text(tiles.score_bytes_table((N,), B, H, D))
    io, s = 16 * B * H * N * D, 4 * B * H * N * N
    assert f"| {N:,} | {io / 1e6:,.0f} MB | {s / 1e6:,.0f} MB | {N // (4 * D)}× |" in t


def test_gpu_table_lists_every_version():
    t = text(notebook.gpu_table())
    for v in VERSIONS:
        assert f"| {label(v)} |" in t
    assert "sm_80" in t


def test_requirements_say_what_each_version_takes():
    assert "other D run v2" in text(notebook.requirements("v4"))
    for v in VERSIONS:
        t = text(notebook.requirements(v))
        assert f"| causal | {'yes' if INFO[v].causal else 'no'} |" in t
        # a version whose backward takes fewer head dims than its forward says which
        backward = INFO[v].backward_head_dims
        assert (backward is not None) == ("(backward: " in t), v
        if backward is not None:
            assert "(backward: " + ", ".join(map(str, backward)) + ")" in t


def test_no_gpu_paths_say_so_in_one_line(capsys, tmp_path, monkeypatch):
    """The laptop path, exercised on every machine: the live helpers ask flashattn.book.notebook.gpu()."""
    monkeypatch.setattr(live, "gpu", lambda: False)
    write_bench_file(tmp_path)
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    monkeypatch.setattr(live, "RESULTS", tmp_path)
    out = live.timing(["baseline", "v4"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("No CUDA GPU") and "\n" not in line
    assert "| V4 | 2048 |" in text(out)
    corr = live.correctness("v4")
    assert capsys.readouterr().out.startswith("No CUDA GPU")
    assert "1.0e-07" in text(corr)
    assert live.timing_pitfalls() is None and live.peak_memory(["baseline"]) is None


def test_variant_edits_must_match_the_source():
    with pytest.raises(ValueError, match="not in kernels/v4.cu"):
        live.variant_timing("v4", {"bogus": [("this text is not in the kernel", "")]})


def test_online_softmax_trace_equals_direct_sum():
    s = np.random.default_rng(1).normal(0, 4, 100)
    *_, (_, m, l) = diagrams.online_softmax_trace(s, 16)
    assert m == s.max()
    assert l == pytest.approx(np.exp(s - s.max()).sum(), rel=1e-12)


@pytest.mark.parametrize("draw", [
    lambda: figures.fig_roofline_model(), lambda: figures.fig_attention_bytes(),
    lambda: figures.roofline(["v4"], highlight="v4"), lambda: figures.fig_scaling(),
    lambda: diagrams.fig_online_softmax(), lambda: diagrams.fig_v0_dataflow(), lambda: diagrams.fig_grid_fill(),
    lambda: diagrams.fig_loop_order(), lambda: diagrams.fig_warp_ownership(), lambda: diagrams.fig_bank_mapping(),
    lambda: diagrams.fig_register_tile(), lambda: diagrams.fig_pipeline(),
    lambda: diagrams.fig_smem_stack(("v1", "v2", "v3", "v4")),
    lambda: layouts.fig_mma_fragment(), lambda: layouts.fig_swizzle(), lambda: layouts.fig_warpgroup_accumulator(),
    lambda: layouts.fig_tma_swizzle(),
])
def test_figures_draw(draw, monkeypatch):
    monkeypatch.setattr(plt, "show", lambda: None)
    plt.close("all")
    draw()
    figs = [plt.figure(n) for n in plt.get_fignums()]
    assert figs and all(f.axes for f in figs)
    plt.close("all")
