"""flashattn.book.backward_hopper and book/backward_hopper.ipynb ("The backward on Hopper"), without a GPU:

* the Layout and Registers structs as the chapter evaluates them from kernels/v8_backward.cu: regions back to
  back, every tile 1024-byte aligned, what exercise 2's solution says about three and four stages, and an
  evaluator that follows an edited struct;
* the figure: its shared-memory rectangles are Layout's regions to scale, and the committed PNG is what the
  code draws now;
* the machine code (nvcc for sm_90a here): the offsets it uses are Layout's, each step's SASS holds what the
  chapter says (wgmma count, waits, both windows, the masked copy's selects), V6's loop and V8's step do the
  same tensor work, and the build without V8B_EXP_FENCE moves exponentials out of dP^T's window;
* the page: every excerpt marker exists, the word budget and the shape of a kernel chapter (build cell,
  exercises with collapsed solutions), its place in the table of contents, and GPU cells that store either
  the one line saying they need a Hopper GPU or a measured table, never a typed number.
"""
from __future__ import annotations

import ast
import re

import nbformat
import pytest
import torch

from flashattn.book import backward_hopper as notes
from flashattn.book import backward_hopper_live as live
from flashattn.book import figure_files, words
from flashattn.loader import REPO_ROOT, source
from flashattn.measure import sass

PAGE = REPO_ROOT / "book" / "backward_hopper.ipynb"
needs_tools = pytest.mark.skipif(sass.tool_missing_reason() is not None, reason=str(sass.tool_missing_reason()))


def book():
    return nbformat.read(PAGE, as_version=4)


# ------------------------------------------------------------------------------------------- the structs
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("D", notes.HEAD_DIMS)
def test_layout_regions_are_back_to_back_and_aligned(D, stages):
    L = notes.layout(D, stages)
    regions = notes.regions(L)
    assert regions[0][1] == 0
    for (_, off, size), (_, nxt, _) in zip(regions, regions[1:]):
        assert off + size == nxt
    for name, off, _ in regions:
        if not name.startswith(("lse2", "D_i", "barriers")):
            assert off % 1024 == 0, f"{name} at {off}: the 128-byte swizzle needs 1024-byte aligned tiles"
    assert L["BR"] * D == 64 * 128 and L["THREADS"] == 384
    assert L["STAGE_TX"] == 2 * L["QO_BYTES"] + 2 * L["ROW_BYTES"]
    assert L["BYTES"] - L["BAR_OFF"] == 8 * (1 + 2 * stages) and L["DYNAMIC"] == L["BYTES"] + 1024


def test_exercise_two_answer():
    """Three stages fit at both head dims, four at neither, at D = 128 by less than a hundred bytes."""
    assert all(notes.layout(D, 3)["DYNAMIC"] <= notes.SMEM_OPTIN for D in notes.HEAD_DIMS)
    assert all(notes.layout(D, 4)["DYNAMIC"] > notes.SMEM_OPTIN for D in notes.HEAD_DIMS)
    assert notes.layout(128, 4)["DYNAMIC"] - notes.SMEM_OPTIN < 100
    assert notes.layout(128, 4)["BYTES"] <= notes.SMEM_OPTIN   # it is the alignment kilobyte that tips it
    table = notes.smem_table((3, 4))
    assert table.count("| yes |") == 2 and table.count("| no |") == 2


def test_registers_split_fits_the_launch():
    R = notes.registers()
    assert R["ENTRY"] == 65536 // notes.layout(128)["THREADS"] // 8 * 8
    assert R["PRODUCER"] + 2 * R["CONSUMER"] <= 3 * R["ENTRY"]


def test_evaluator_follows_an_edited_struct():
    text = source("v8_backward")
    edited = text.replace("BR = D == 64 ? 128 : 64;", "BR = D == 64 ? 128 : 32;")
    assert edited != text
    assert notes.layout(128, text=edited)["BR"] == 32 and notes.layout(128, text=text)["BR"] == 64
    assert notes.layout(64, text=text.replace("#define V8B_STAGES 2", "#define V8B_STAGES 3"))["STAGES"] == 3
    with pytest.raises(ValueError, match="struct Layout"):
        notes.layout(64, text=text.replace("struct Layout {", "struct Tiles {"))


# ------------------------------------------------------------------------------------------- the figure
def test_figure_rectangles_are_the_layout_to_scale():
    fig = notes.fig_dataflow()
    for D in notes.HEAD_DIMS:
        L = notes.layout(D)
        rects = {p.get_gid().split(":", 2)[2]: p for p in fig.axes[0].patches
                 if (p.get_gid() or "").startswith(f"smem:D{D}:")}
        assert set(rects) == {name for name, _, _ in notes.regions(L)}
        scale = rects["K_j"].get_width() / L["KV_BYTES"]
        x0 = rects["K_j"].get_x()
        for name, off, size in notes.regions(L):
            assert rects[name].get_x() == pytest.approx(x0 + off * scale)
            assert rects[name].get_width() == pytest.approx(size * scale)
        assert (rects["barriers"].get_x() + rects["barriers"].get_width() - x0) / scale == pytest.approx(L["BYTES"])


def test_committed_png_is_what_the_code_draws():
    assert figure_files.differences(notes.FIGURES, notes.FOLDER) == {}, \
        "run python -m flashattn.book.backward_hopper and commit"
    markdown = "".join(c.source for c in book().cells if c.cell_type == "markdown")
    for name in notes.FIGURES:
        assert f"_static/backward_hopper/{name}.png" in markdown


# ------------------------------------------------------------------------------------ the machine code
@needs_tools
@pytest.mark.parametrize("D", notes.HEAD_DIMS)
def test_sass_uses_layout_offsets(D):
    L, got = notes.layout(D), notes.sass_offsets(notes.texts(D))
    assert got["barriers"] == [L["BAR_OFF"] + 8 * k for k in range(1 + 2 * L["STAGES"])]
    rows = [o for o in got["row terms"] if o >= L["LSE_OFF"]]
    assert rows == [L["LSE_OFF"] + 32 * t for t in range(L["BR"] // 8)] + \
        [L["DVEC_OFF"] + 32 * t for t in range(L["BR"] // 8)]


@needs_tools
def test_step_rows_hold_what_the_chapter_says():
    rows = notes.step_rows()
    assert [(r["D"], r["step"]) for r in rows] == [(64, "plain"), (64, "masked"), (128, "plain"), (128, "masked")]
    for r in rows:
        L = notes.layout(r["D"])
        assert r["hgmma"] == 2 * r["D"] // 16 + L["BC"] // 16 + 2 * L["BR"] // 16
        assert r["register_a"] == 2 * L["BR"] // 16 and r["transposed_a"] == L["BC"] // 16
        assert r["waits"] == 4 and r["bar"] == 1
        assert r["windows"] == [(L["BR"] // 2, 0), (0, 16)] and r["ex2"] == L["BR"] // 2 and r["redg"] == 16
        assert r["fsel"] == (0 if r["step"] == "plain" else L["BR"] // 2)


@needs_tools
def test_exercise_one_answer():
    fenced, loose = notes.step_rows(), notes.step_rows(("-DV8B_EXP_FENCE=0",))
    for a, b in zip(fenced, loose):
        assert (b["hgmma"], b["waits"]) == (a["hgmma"], a["waits"])
        assert b["windows"][0][0] < a["windows"][0][0] // 2, "most exponentials leave dP^T's window"


@needs_tools
def test_v6_and_v8_do_the_same_tensor_work_per_warp():
    rows = notes.v6_rows()
    for v6, v8 in zip(rows[::2], rows[1::2]):
        assert v6["their FLOPs"] == v8["their FLOPs"] > 0
        assert v6["tensor-core instructions"] == 10 * v8["tensor-core instructions"]   # "a tenth"
        assert v8["ldmatrix"] == 0 < v6["ldmatrix"]
        assert (v6["bar.sync"], v8["bar.sync"]) == (2, 1)


def test_tensor_flops_of_one_instruction():
    assert notes.tensor_flops("HMMA.16816.F32.BF16 R4, R8, R12, R4") == 4096
    assert notes.tensor_flops("HGMMA.64x128x16.F32.BF16 R24, R184, gdesc[UR20].tnspB, R24") == 2 * 64 * 128 * 16 // 4
    assert notes.tensor_flops("HGMMA.64 x64x16.F32.BF16 R184, gdesc[UR24], RZ, !UPT") == 2 * 64 * 64 * 16 // 4
    assert notes.tensor_flops("LDSM.16.M88.4 R4, [R2]") == 0


def test_step_spans_cut_at_the_slot_wait_and_release():
    lines = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x28400], R0", "MOV R1, R2",
             "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR18+0x28408], R5", "WARPGROUP.ARRIVE",
             "HGMMA.64x64x16.F32.BF16 R184, gdesc[UR24], RZ, !UPT", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
             "MUFU.EX2 R1, R1", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR18+0x28418], RZ"]
    (span,) = notes.step_spans(lines)
    assert span == lines[2:]
    c = notes.span_counts(span)
    assert (c["hgmma"], c["waits"], c["ex2"], c["windows"]) == (1, 2, 1, [(1, 0)])


# ------------------------------------------------------------------------------------------- the log
def test_log_lines_read_each_command_once(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("# first: pytest -k a\n....                  [100%]\n4 passed in 1.0s\n\n"
                   "# second (stopped)\n..F.. [ 50%]\n...\n"
                   "# first: pytest -k a\n....                  [100%]\n4 passed in 1.0s\n")
    text = notes.log_lines(log)
    assert text.count("first: pytest -k a") == 1
    assert "4 passed, 0 failed, 0 errors; pytest's summary: 4 passed in 1.0s" in text
    assert "7 passed, 1 failed, 0 errors; pytest's summary: none (the run stopped)" in text


def test_committed_log_is_read():
    text = notes.log_lines()
    assert "tests/test_v8_backward.py -k sanitizer" in text and "0 failed, 0 errors" in text


# ------------------------------------------------------------------------------------------- the page
def excerpt_calls(cells) -> list[tuple[str, tuple]]:
    calls = []
    for c in cells:
        if c.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(c.source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("excerpt", "v6_excerpt"):
                calls.append((node.func.attr, tuple(ast.literal_eval(a) for a in node.args)))
    return calls


def test_every_excerpt_marker_exists():
    calls = excerpt_calls(book().cells)
    assert len(calls) >= 6
    for name, args in calls:
        assert getattr(notes, name)(*args).strip()


def test_page_within_budget_and_shaped_like_a_kernel_chapter():
    count = words.count(PAGE)
    assert count.markdown <= words.PROSE_BUDGET and count.output <= words.OUTPUT_BUDGET, count
    cells = book().cells
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# The backward on Hopper")
    builds = [c for c in cells if c.cell_type == "code" and 'load_inline_call("v8_backward")' in c.source]
    assert builds and any("load_inline(" in "".join(o.get("text", "")) for c in builds for o in c.outputs)
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert "## Exercises" in text and len(re.findall(r"\{dropdown\}\s*Solution", text)) >= 3
    assert "(backward.ipynb)" in text and "(v8.ipynb)" in text
    assert "not measured yet" in text and "not been timed" in text


def test_page_follows_the_backward_chapter_in_the_toc():
    toc = re.findall(r"file:\s*(\S+)", (REPO_ROOT / "_toc.yml").read_text())
    assert toc.index("book/backward_hopper") == toc.index("book/backward_lab") + 1


def test_gpu_cells_store_the_refusal_or_a_measurement():
    live_cells = [c for c in book().cells if c.cell_type == "code" and "live." in c.source]
    assert len(live_cells) == 2
    for c in live_cells:
        stored = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
                         for o in c.outputs)
        assert stored.startswith("Needs a Hopper GPU") or "Measured now on" in stored, stored[:200]


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
                    reason="a Hopper GPU runs these cells for real")
def test_live_cells_say_they_need_a_hopper(capsys):
    assert live.correctness() is None and live.timing() is None
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and all(line.startswith("Needs a Hopper GPU") for line in out)
