"""The book's figures are legible: drawn with the Agg backend from the committed records, checked for size,
tick labels and line styles (the properties a reader relies on)."""
import base64
import struct
from pathlib import Path

import matplotlib
import nbformat

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashattn.book import diagrams, figures, notebook, summary  # noqa: E402
from flashattn.book.records import primary_rows  # noqa: E402
from flashattn.measure.geometry import v5_default_tiles  # noqa: E402
from flashattn.measure.table import label  # noqa: E402


@pytest.fixture(autouse=True)
def _book_defaults():
    notebook.setup()     # the book's dpi and fonts
    yield
    plt.close("all")


def pixels(fig):
    w, h = fig.get_size_inches() * fig.dpi
    return int(w), int(h)


def test_register_tile_is_large_and_labelled():
    fig = diagrams.fig_register_tile(show=False)
    w, h = pixels(fig)
    assert w >= 1000 and h >= 800, (w, h)
    tile, block = fig.axes[:2]
    t = v5_default_tiles()[64]
    threads = (t["B_r"] // t["TM"]) * (t["B_c"] // t["TN"])
    numbers = sorted(int(x.get_text()) for x in block.texts)
    assert numbers == list(range(threads)), "the enlarged block names the owner of every cell"
    markers = [c for c in tile.collections if c.get_offsets().shape[0] > 0 and c.get_offsets().ndim == 2]
    owned = [c.get_offsets().shape[0] for c in markers if c.get_offsets().shape[1] == 2]
    assert owned.count(t["TM"] * t["TN"]) == 4, "each highlighted thread shows its T_M x T_N elements"
    assert min(x.get_fontsize() for x in block.texts) >= 9


def test_scaling_ticks_are_the_sequence_lengths():
    rows = primary_rows()
    assert rows, "results/h200/bench.json is committed: its primary rows must read back"
    fig = figures.fig_scaling(show=False)
    fig.canvas.draw()
    lens = sorted({r["seq_len_q"] for r in rows})
    for ax in fig.axes:
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert shown == [f"{n:,}" for n in lens]
        assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()], "minor labels overprint"
    assert pixels(fig)[0] >= 1000


def test_attention_bytes_ticks_are_plain_numbers():
    fig = figures.fig_attention_bytes(show=False)
    fig.canvas.draw()
    for ax in fig.axes:
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert shown and all(s.replace(",", "").isdigit() for s in shown), shown


@pytest.mark.parametrize("versions,highlight", [(["v1", "v4", "v5"], "v5"), (["v4", "v5", "v6"], "v6")])
def test_roofline_measured_and_datasheet_roofs_differ(versions, highlight):
    pytest.importorskip("ncu_report")   # the points come from the committed .ncu-rep reports
    fig = figures.roofline(versions, highlight=highlight, show=False)
    (ax,) = fig.axes
    roofs = {ln.get_label(): (ln.get_linestyle(), ln.get_color()) for ln in ax.get_lines()
             if ln.get_label().startswith(("measured", "datasheet", "Nsight"))}
    kinds = {}
    for name, (style, _) in roofs.items():
        kinds.setdefault(name.split()[0], set()).add(style)
    assert {"measured", "datasheet"} <= set(kinds)
    assert all(len(s) == 1 for s in kinds.values()), "one line style per kind of roof"
    styles = [next(iter(s)) for s in kinds.values()]
    assert len(set(styles)) == len(styles), "each kind of roof has its own line style"
    assert len(set(roofs.values())) == len(roofs), "no two roofs look the same"
    if highlight == "v6":
        assert any("BF16" in n for n in roofs) and any("TF32" in n for n in roofs)
    texts = {t.get_text() for t in ax.texts}
    assert {label(v) for v in versions} <= texts


def test_book_css_scrolls_wide_tables():
    css = (Path(__file__).resolve().parent.parent / "book" / "_static" / "book.css").read_text()
    assert "overflow-x: auto" in css and "table" in css


def test_staircase_has_every_step_in_book_order():
    s = summary.steps()
    assert s, "results/h200/bench.json is committed: the staircase must have its steps"
    names = [r["step"] for r in s]
    assert names[:6] == ["V0", "V1", "V2", "V3", "V4", "V5"] and "V6 (bf16)" in names
    assert all(r["median_us"] > 0 for r in s)


def test_roof_table_judges_each_step_by_its_own_roof():
    c = summary.ceilings()
    text = summary.roof_table().data
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| V")}
    for step, key in (("V5", "fp32"), ("V6 (TF32)", "tf32"), ("V6 (bf16)", "bf16")):
        assert step in rows, f"{step} is missing from the roof table"
        assert f"| {c[key] / 1e12:.1f} |" in rows[step], (step, rows[step])


def test_rtx4080_reference_names_its_source_and_matches_the_table():
    ref = summary.rtx4080()
    assert "original description" in ref["source"] and ref["device"]["sm_count"] == 76
    text = summary.rtx4080_table().data
    assert f"{ref['latency_us']['v4']:,.1f}" in text
    assert f"{ref['latency_us']['v3'] / ref['latency_us']['v4']:.2f}×" in text


def test_wide_figures_of_the_chapters_use_the_full_width():
    """The page's text column is about 690 px at 1280 px; a figure drawn wider would shrink its text unless
    its cell is tagged full-width (about 930 px in sphinx-book-theme)."""
    book = Path(__file__).resolve().parent.parent / "book"
    narrow = []
    for name in ("intro", "online_softmax", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "results"):
        for c in nbformat.read(book / f"{name}.ipynb", as_version=4).cells:
            for o in c.get("outputs", []) if c.cell_type == "code" else []:
                png = o.get("data", {}).get("image/png")
                if png:
                    width = struct.unpack(">I", base64.b64decode(png)[16:20])[0]
                    if width > 800 and "full-width" not in c.metadata.get("tags", []):
                        narrow.append((name, c.source[:40], width))
    assert not narrow, narrow
