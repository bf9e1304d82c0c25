"""flashattn.book.staircase: V0..V8 and the backward's steps from the committed records, each step's idea and its
computed speedup, the dtype change shown, and the figure. No GPU."""
from __future__ import annotations

import re

import matplotlib
import pytest

matplotlib.use("Agg")

from flashattn.book import staircase  # noqa: E402
from flashattn.measure import kernel_source, variants  # noqa: E402
from flashattn.versions import INFO  # noqa: E402


@pytest.fixture(scope="module")
def fwd():
    return staircase.forward_steps()


def test_every_version_in_book_order(fwd):
    assert [r["version"] for r in fwd] == ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v6", "v7", "v8"]
    assert [r["dtype"] for r in fwd] == ["float32"] * 7 + ["bfloat16"] * 3
    assert [r["roof"] for r in fwd] == ["fp32"] * 6 + ["tf32"] + ["bf16"] * 3


def test_speedups_are_computed_and_only_the_dtype_change_crosses_runs(fwd):
    assert fwd[0]["speedup"] is None
    for prev, r in zip(fwd, fwd[1:]):
        assert r["speedup"] == pytest.approx(prev["us"] / r["us"])
        assert r["same_run"] == (not r["dtype_change"])
    changes = [r for r in fwd if r["dtype_change"]]
    assert [r["name"] for r in changes] == ["V6 (bf16)"]
    assert "bf16 inputs" in changes[0]["idea"]
    # the bf16 phase is one run that timed V6, V7 and V8 together
    assert len({(r["file"], r["run"]) for r in fwd[7:]}) == 1


def test_ideas_come_from_the_version_descriptions(fwd):
    for r in fwd:
        plain = re.sub(r" \([^)]*\)", "", INFO[r["version"]].description)
        core = r["idea"].split(" (")[0] if r["dtype_change"] else r["idea"]
        if r["name"] == "V6 (TF32)":
            assert core.startswith(INFO["v6"].title) and "TF32" in core
        elif not r["dtype_change"]:
            assert core in plain, (r["name"], core)
        assert len(core) < 100
    assert fwd[-1]["idea"] == "FlashAttention-3's scheduling"
    assert not any(r["idea"].startswith("V") for r in fwd[1:] if not r["dtype_change"])


def test_one_run_skips_runs_without_every_version():
    assert staircase.one_run(("v6", "v7", "v8"), "bfloat16", ("bench_v6.json",)) is None
    assert staircase.one_run(("v8",), "float32", ("bench_v8.json",)) is None


def test_backward_chain_ends_at_the_kernels_defaults():
    bwd = staircase.backward_steps()
    assert [r["name"] for r in bwd] == ["v6_layout0", "v6_layout1", "v6_layout2", "v6_layout2_bulk",
                                        "v6_layout2_bulk_br128"]
    assert bwd[0]["speedup"] is None and all(r["same_run"] and r["speedup"] > 0 for r in bwd[1:])
    assert set(bwd[-1]["refs"]) == {"sdpa_flash", "sdpa_cudnn"}
    kernel = variants.backward("v6_layout2").path.read_text()
    defaults = kernel_source.defaults(kernel)
    for macro, value in variants.backward(bwd[-1]["name"]).macros.items():
        assert int(defaults[macro]) == value, macro


def test_figure_shows_every_step_and_the_dtype_change():
    assert set(staircase.FIGURES) == {"staircase"}
    fig = staircase.FIGURES["staircase"]()
    fwd_ax, bwd_ax = fig.axes
    ticks = " ".join(t.get_text() for t in fwd_ax.get_yticklabels())
    for name in ("V0", "V1", "V2", "V3", "V4", "V5", "V6 (TF32)", "V6 (bf16)", "V7 (bf16)", "V8 (bf16)"):
        assert f"{name}:" in ticks, name
    texts = [t.get_text() for t in fwd_ax.texts]
    assert any("inputs change" in t for t in texts)
    assert any(t.endswith("×") for t in texts) and any(t.endswith("† ") or t.endswith("†") for t in texts)
    assert len(bwd_ax.get_yticklabels()) == 5


def test_saved_png_is_committed():
    assert staircase.OUTPUT.exists() and staircase.OUTPUT.stat().st_size > 20_000
