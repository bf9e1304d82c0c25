"""flashattn.book.backward_hopper(_figure, _live) and book/backward_hopper.ipynb ("The backward on Hopper"),
without a GPU:

* the Layout and Registers structs as the chapter evaluates them from kernels/v8_backward.cu: regions back to
  back, every tile 1024-byte aligned, dQ's image where it fits (V8B_DQ_BULK and the stage count decide), what
  exercise 2's solution says about three and four stages, and an evaluator that follows an edited struct,
  booleans, && and conditionals included;
* the figure: its shared-memory rectangles are Layout's regions to scale, and the committed PNG is what the
  code draws now;
* the machine code (nvcc for sm_90a here): the offsets it uses are Layout's, each step's SASS holds what the
  chapter says (wgmma count, waits, both windows: the exponentials in the first, dQ's 16 image stores and
  one arrival in the second, no branch), the V8B_DQ_BULK=0 build puts 16 red.global there instead and has
  no bulk reduction, the dQ writer's loop holds the deterministic mode's acquire, full wait and release,
  V6's loop and V8's step do the same tensor work, and the build without V8B_EXP_FENCE moves exponentials
  out of dP^T's window;
* exercise 4's answer: the image's stores hit every bank twice;
* the page: every excerpt marker exists, the word budget and the shape of a kernel chapter (build cell,
  exercises with collapsed solutions), its place in the table of contents, GPU cells that store either the
  one line saying they need a Hopper GPU or a measured table, never a typed number, and timing columns that
  are flashattn.measure.backward's names.
"""
from __future__ import annotations

import ast
import re
import shutil
from collections import Counter

import nbformat
import pytest
import torch

from flashattn.book import backward_hopper as notes
from flashattn.book import backward_hopper_figure as figure
from flashattn.book import backward_hopper_live as live
from flashattn.book import backward_hopper_profile as profile
from flashattn.book import figure_files, records, words
from flashattn.loader import REPO_ROOT, source
from flashattn.measure import sass
from flashattn.measure.backward import BACKWARD_NAMES

PAGE = REPO_ROOT / "book" / "backward_hopper.ipynb"
LAB = REPO_ROOT / "book" / "backward_hopper_lab.ipynb"
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
        if not name.startswith(("lse2", "D_i", "dQ image", "barriers")):
            assert off % 1024 == 0, f"{name} at {off}: the 128-byte swizzle needs 1024-byte aligned tiles"
    # dQ_i's tile in two 64 x 64 halves, or at B_r = 80 (V8B_BR80, the default at D = 128) dQ_i^T in two 64 x 80
    assert (L["BR"] * D == 64 * 128 or (D, L["BR"], L["DQ_T"]) == (128, 80, 1)) and L["THREADS"] == 384
    assert L["STAGE_TX"] == 2 * L["QO_BYTES"] + 2 * L["ROW_BYTES"]
    assert L["NBARS"] == 1 + 2 * stages + 2   # K/V; full and empty per stage; dq_full, dq_empty
    assert L["BYTES"] - L["BAR_OFF"] == 8 * L["NBARS"] and L["DYNAMIC"] == L["BYTES"] + 1024
    if L["DQ_BULK"]:   # the bulk copy's source: 16-byte aligned, a multiple of 16 bytes
        assert ("dQ image", L["DQ_OFF"], D * L["BR"] * 4) in regions and L["DQ_OFF"] % 16 == 0
    assert L["DQ_BULK"] == (L["DQ_OFF"] + L["DQ_IMAGE"] + 8 * L["NBARS"] + 1024 <= notes.SMEM_OPTIN)


def test_exercise_two_answer():
    """Three stages fit every kernel, with dQ's image only at D = 128 with a band (B_r = 64); four fit none,
    image or not, the B_r = 64 kernel by less than a hundred bytes."""
    kernels = [notes.layout(D, stages, banded=banded) for stages in (3, 4) for D, banded, _ in notes.INSTANCES]
    assert [(L["BR"], L["STAGES"]) for L in kernels] == [(128, 3), (64, 3), (80, 3), (128, 4), (64, 4), (80, 4)]
    assert all(L["DYNAMIC"] <= notes.SMEM_OPTIN for L in kernels[:3])
    assert [L["DQ_BULK"] for L in kernels[:3]] == [0, 1, 0]
    assert all(L["DYNAMIC"] > notes.SMEM_OPTIN and not L["DQ_BULK"] for L in kernels[3:])
    assert kernels[4]["DYNAMIC"] - notes.SMEM_OPTIN < 100
    assert kernels[4]["BYTES"] <= notes.SMEM_OPTIN   # it is the alignment kilobyte that tips it
    table = notes.smem_table((3, 4))
    assert table.count("| yes |") == 3 and table.count("| no |") == 3 and table.count("no room") == 5
    assert all(notes.layout(D)["DQ_BULK"] for D in notes.HEAD_DIMS), "the default build has the image"


def test_registers_split_fits_the_launch():
    R = notes.registers()
    assert R["ENTRY"] == 65536 // notes.layout(128)["THREADS"] // 8 * 8
    assert R["PRODUCER"] + 2 * R["CONSUMER"] <= 3 * R["ENTRY"]


def test_evaluator_follows_an_edited_struct():
    text = source("v8_backward")
    edited = text.replace("BR = D == 64 ? 128 : V8B_BR80 != 0 && !BANDED ? 80 : 64;",
                          "BR = D == 64 ? 128 : V8B_BR80 != 0 && !BANDED ? 80 : 32;")
    assert edited != text
    assert notes.layout(128, text=edited, banded=True)["BR"] == 32
    assert notes.layout(128, text=text, banded=True)["BR"] == 64
    # V8B_BR80 (the default): 80 rows in the unbanded instance only, dQ_i^T's flag with them; 0 gives it 64
    br80 = notes.layout(128)
    assert (br80["BR"], br80["DQ_T"], br80["DQ_BULK"]) == (80, 1, 1)
    assert notes.layout(128, flags=["-DV8B_BR80=1"]) == br80
    br64 = notes.layout(128, flags=["-DV8B_BR80=0"])
    assert (br64["BR"], br64["DQ_T"], br64["DQ_BULK"]) == (64, 0, 1)
    assert notes.layout(64, text=text.replace("#define V8B_STAGES 2", "#define V8B_STAGES 3"))["STAGES"] == 3
    with pytest.raises(ValueError, match="struct Layout"):
        notes.layout(64, text=text.replace("struct Layout {", "struct Tiles {"))
    # the build's macros: a -D flag, or an edited #define, switches the image off
    assert notes.layout(128, flags=notes.DQ_ATOMICS)["DQ_BULK"] == 0
    assert notes.layout(128, text=text.replace("#define V8B_DQ_BULK 1", "#define V8B_DQ_BULK 0"))["DQ_BULK"] == 0
    L = notes.layout(128, flags=notes.DQ_ATOMICS)
    assert L["BAR_OFF"] == L["DQ_OFF"] and ("dQ image", L["DQ_OFF"], L["DQ_IMAGE"]) not in notes.regions(L)


def test_expressions_as_python():
    values = {"A": 3, "B": 0}
    for c, expected in (("A != 0 && B <= 2", True), ("A == 3 || B", True), ("!(A == 3) && 1", False),
                        ("10 + (B ? 100 : 7)", 17), ("A == 4 ? 1 : A == 3 ? 2 : 3", 2), ("7 / 2 * 2", 6),
                        ("(A > 1 ? A : 1) * (B ? 2 : 5)", 15)):
        assert eval(notes._python(c), {"__builtins__": {}}, values) == expected, (c, notes._python(c))
    with pytest.raises(ValueError, match="parenthesise"):
        notes._python("A ? B ? 1 : 2 : 3")


# ------------------------------------------------------------------------------------------- the figure
def test_figure_rectangles_are_the_layout_to_scale():
    fig = figure.fig_dataflow()
    for D in notes.HEAD_DIMS:
        L = notes.layout(D, banded=True)   # at D = 128 the B_r = 64 kernel whose step the figure draws
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
    assert figure_files.differences(figure.FIGURES, figure.FOLDER) == {}, \
        "run python -m flashattn.book.backward_hopper_figure and commit"
    markdown = "".join(c.source for c in book().cells if c.cell_type == "markdown")
    for name in figure.FIGURES:
        assert f"_static/backward_hopper/{name}.png" in markdown


# ------------------------------------------------------------------------------------ the machine code
@needs_tools
@pytest.mark.parametrize("D", notes.HEAD_DIMS)
def test_sass_uses_layout_offsets(D):
    L, got = notes.layout(D, flags=notes.BR64), notes.sass_offsets(notes.texts(D, flags=notes.BR64))
    assert got["barriers"] == [L["BAR_OFF"] + 8 * k for k in range(L["NBARS"])]
    rows = [o for o in got["row terms"] if o >= L["LSE_OFF"]]
    assert rows == [L["LSE_OFF"] + 32 * t for t in range(L["BR"] // 8)] + \
        [L["DVEC_OFF"] + 32 * t for t in range(L["BR"] // 8)]
    # a warp's 16 stores into the image, 32 lanes x 8 bytes apart (the warp's own part in a register)
    assert got["image"] == [L["DQ_OFF"] + 256 * k for k in range(16)]


@needs_tools
def test_step_rows_hold_what_the_chapter_says():
    """The step the chapter describes: B_r = 128 at D = 64, 64 at D = 128 (the banded kernel, and the unbanded
    one's before V8B_BR80, which the lab's step table compiles)."""
    rows = notes.step_rows(notes.BR64)
    assert [(r["D"], r["step"]) for r in rows] == [(64, "plain"), (64, "masked"), (128, "plain"), (128, "masked")]
    for r in rows:
        L = notes.layout(r["D"], flags=notes.BR64)
        assert r["hgmma"] == 2 * r["D"] // 16 + L["BC"] // 16 + 2 * L["BR"] // 16
        assert r["register_a"] == 2 * L["BR"] // 16 and r["transposed_a"] == L["BC"] // 16
        assert r["waits"] == 4 and r["bar"] == 1 and r["ex2"] == L["BR"] // 2 and r["redg"] == 0
        first, second = r["windows"]
        assert first["MUFU.EX2"] == L["BR"] // 2 and first["STS"] == 0
        assert (second["STS.64"], second["SYNCS.ARRIVE"], second["REDG"], second["BRA"], second["MUFU"]) == \
            (16, 1, 0, 0, 0)
        assert r["image_stores"] == 16 and r["ds_stores"] == L["BR"] // 4
        assert r["fsel"] == (0 if r["step"] == "plain" else L["BR"] // 2)
        assert notes.out_of_window(second) == "16 st.shared.v2, 1 arrive, 0 branches"
    assert [(r["hgmma"], r["ds_stores"]) for r in notes.step_rows(notes.BR64, banded=True)] == \
        [(r["hgmma"], r["ds_stores"]) for r in rows]


@needs_tools
def test_step_rows_of_the_taller_tile():
    """The default's unbanded D = 128 kernel (B_r = 80): dQ_i^T's 8 wgmma with A = K_j transposed, dS by B_r / 16
    stmatrix, dQ^T's image by B_r / 2 4-byte stores and one arrival while dK_j runs (the lab's exercise)."""
    L = notes.layout(128)
    for r in notes.step_rows()[2:]:
        assert (r["D"], L["BR"]) == (128, 80)
        assert (r["hgmma"], r["register_a"], r["transposed_a"]) == (34, 10, 8)
        assert (r["waits"], r["bar"], r["ex2"], r["redg"]) == (4, 1, 40, 0)
        assert (r["ds_stores"], r["image_stores"]) == (80 // 16, 80 // 2)
        assert notes.out_of_window(r["windows"][1]) == "40 st.shared, 1 arrive, 0 branches"


@needs_tools
def test_dq_rows_show_the_step_from_the_first_version():
    rows = notes.dq_rows()
    assert [(r["D"], r["build"].split()[0]) for r in rows] == [
        (64, "V8B_DQ_BULK=1"), (64, "V8B_DQ_BULK=0"), (128, "V8B_DQ_BULK=1"), (128, "V8B_DQ_BULK=0")]
    for bulk, first in zip(rows[::2], rows[1::2]):
        assert bulk["while dV_j, dK_j run"] == "16 st.shared.v2, 1 arrive, 0 branches"
        assert first["while dV_j, dK_j run"] == "16 red.global, 0 branches"
        assert (bulk["UBLKRED in the kernel"], first["UBLKRED in the kernel"]) == (1, 0)
        L, L0 = notes.layout(bulk["D"], flags=notes.BR64), notes.layout(bulk["D"], flags=notes.BR64 + notes.DQ_ATOMICS)
        assert (bulk["shared memory"], first["shared memory"]) == (notes.kb(L["DYNAMIC"]), notes.kb(L0["DYNAMIC"]))
        assert L["DYNAMIC"] - L0["DYNAMIC"] == L["DQ_IMAGE"] == 32 * 1024
        assert abs(bulk["step instructions"] - first["step instructions"]) < 10, "about as long either way"


@needs_tools
@pytest.mark.parametrize("D", notes.HEAD_DIMS)
def test_writer_lines_hold_both_modes(D):
    L = notes.layout(D)
    lines = notes.writer_lines(D).splitlines()
    assert lines[0].startswith("SYNCS.PHASECHK") and f"{L['BAR_OFF'] + 8 * (1 + 2 * L['STAGES']):#x}]" in lines[0]
    ops = [line.split("//")[1].strip() for line in lines]
    freed = next(k for k, line in enumerate(lines) if f"{L['BAR_OFF'] + 8 * (2 + 2 * L['STAGES']):#x}]" in line)
    assert lines[freed].startswith("SYNCS.ARRIVE") and ops[freed - 1] == "cp.async.bulk.wait_group.read", \
        "the image goes back to the consumers once the copy engine has read it"
    assert ops[-1] == "red.release.gpu.global.add.s32" and "cp.async.bulk.wait_group" in ops[freed:], \
        "the turn passes on only after the additions have landed"
    assert ops.count("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32") == 1
    for ptx in ("ld.acquire.gpu.global.s32", "red.release.gpu.global.add.s32", "cp.async.bulk.wait_group",
                "cp.async.bulk.wait_group.read", "fence.proxy.async.global"):
        assert ptx in ops, ptx
    assert any(line.startswith("UBLKRED") for line in lines)


@needs_tools
def test_exercise_one_answer():
    fenced, loose = notes.step_rows(notes.ROWS_LATE), notes.step_rows(notes.ROWS_LATE + ("-DV8B_EXP_FENCE=0",))
    for a, b in zip(fenced, loose):
        assert (b["hgmma"], b["waits"]) == (a["hgmma"], a["waits"])
        if a["dv_early"]:   # dV_j's wgmma reads the packed P^T: the exponentials stay ahead of it without a fence
            assert b["windows"][0]["MUFU.EX2"] == a["windows"][0]["MUFU.EX2"] == a["ex2"]
        else:
            assert b["windows"][0]["MUFU.EX2"] < a["windows"][0]["MUFU.EX2"] // 2, "most exponentials leave"
    early = notes.step_rows(notes.BR64 + ("-DV8B_EARLY_DV=1",))   # measured at B_r = 64 (it spills at 80)
    assert [r["D"] for r in early if r["dv_early"]] == [128, 128], "dV_j before dP^T's wait at D=128 only"
    assert not any(r["dv_early"] for r in fenced)


def test_exercise_four_answer():
    """Each store of the image (fixed warp w, column group t, row half h) writes 32 consecutive float pairs:
    256 contiguous bytes, every bank twice (2 wavefronts); the kernel's store has that address."""
    text = " ".join(source("v8_backward").split())
    assert "float2* img = reinterpret_cast<float2*>(gbase + L::DQ_OFF) + (cwg * 4 + wq) * 16 * 32 + lane;" in text
    assert "img[(2 * t + h) * 32] = make_float2(" in text
    for w in range(8):
        for t in range(8):
            for h in range(2):
                pairs = [(w * 16 + 2 * t + h) * 32 + lane for lane in range(32)]
                words_ = [2 * p + e for p in pairs for e in range(2)]
                assert words_ == list(range(words_[0], words_[0] + 64)) and words_[0] % 64 == 0
                assert sorted(Counter(x % 32 for x in words_).values()) == [2] * 32


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
    (span,) = notes.step_spans(lines, {"BAR_OFF": 0x28400, "STAGES": 2})
    assert span == lines[2:]
    c = notes.span_counts(span)
    assert (c["hgmma"], c["waits"], c["ex2"], c["windows"]) == (1, 2, 1, [{"MUFU": 1, "MUFU.EX2": 1}])
    # dQ's image has an arrival of its own (dq_full, BAR_OFF + 40 here) inside the step: not the step's end
    lines.insert(-1, "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR8+0x28428], RZ")
    (span,) = notes.step_spans(lines, {"BAR_OFF": 0x28400, "STAGES": 2})
    assert span == lines[2:]


# ------------------------------------------------------------------------------------------- the log
def test_log_lines_read_each_command_once(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("# first: pytest -k a\n....                  [100%]\n4 passed in 1.0s\n\n"
                   "# second (stopped)\n..F.. [ 50%]\n...\n"
                   "# first: pytest -k a\n....                  [100%]\n4 passed in 1.0s\n")
    other = tmp_path / "other.log"
    other.write_text("# third\n..F.\nFAILED tests/t.py::x - E: RACECHECK SUMMARY: 5 hazards displayed\n"
                     "RACECHECK SUMMARY: 5 hazards displayed\n1 failed, 3 passed in 2.0s\n")
    text = profile.log_lines((log, other))
    assert text.count("first: pytest -k a") == 1
    assert "first: pytest -k a\n    4 passed in 1.0s\n" in text
    assert "second (stopped)\n    no summary (the run stopped); progress marks: 7 passed, 1 failed\n" in text
    assert text.endswith("third\n    1 failed, 3 passed in 2.0s\n    failed: tests/t.py::x\n"
                         "    racecheck's summary: 5 hazards")


def test_committed_logs_are_read():
    text = profile.log_lines()
    assert "failed: tests/test_v8_backward.py::test_sanitizer_clean[racecheck]" in text
    assert "racecheck's summary:" in text and "tests/test_v8_backward.py -k sanitizer\n    3 passed" in text
    assert "(stopped by its 200 s limit)\n    no summary (the run stopped); progress marks: " in text
    assert text.endswith(" passed, 0 failed")


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
    for name, args in calls + excerpt_calls(nbformat.read(LAB, as_version=4).cells):
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
    assert "(backward.ipynb)" in text and "(v8.ipynb)" in text and "(backward_hopper_lab.ipynb" in text
    sources = [c.source for c in cells if c.cell_type == "code"]
    assert any("profile.pair_table()" in s for s in sources) and any("profile.stall_pair()" in s for s in sources)


def test_page_follows_the_backward_chapter_in_the_toc():
    toc = re.findall(r"file:\s*(\S+)", (REPO_ROOT / "_toc.yml").read_text())
    assert toc.index("book/backward_hopper") == toc.index("book/backward_lab") + 1


def test_gpu_cells_store_the_refusal_or_a_measurement():
    live_cells = [c for c in book().cells if c.cell_type == "code" and "live." in c.source]
    assert len(live_cells) == 3
    for c in live_cells:
        stored = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
                         for o in c.outputs)
        assert stored.startswith("Needs a Hopper GPU") or "Measured now on" in stored, stored[:200]


def test_timing_columns_are_the_benchmarks_names():
    names = list(live.COLUMNS.values())
    assert set(names) <= set(BACKWARD_NAMES) and len(set(names)) == len(live.COLUMNS)
    assert {"v6", "v8_backward", "v8_backward_deterministic", "sdpa_cudnn", "fa4"} == set(names)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
                    reason="a Hopper GPU runs these cells for real")
def test_live_cells_say_they_need_a_hopper(capsys):
    assert live.correctness() is None and live.timing() is None and live.dq_step() is None
    assert live.step_times("order") is None and live.main(["descriptors"]) == 1 and live.main(["nope"]) == 2
    out = [line for line in capsys.readouterr().out.strip().splitlines() if line]
    assert len(out) == 5 and all(line.startswith("Needs a Hopper GPU") for line in out)


def test_profile_pair_reads_both_reports(tmp_path, monkeypatch):
    """The tables set two reports side by side (here two copies of V6's committed backward report under the
    names the chapter reads), and say what is missing while a report is not recorded."""
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    assert all("Not recorded yet" in t().data for t in (profile.pair_table, profile.pipe_table, profile.stall_pair))
    if not records.ncu_report_importable():
        pytest.skip("ncu_report is not installed (pip install ncu-report)")
    for name in profile.PAIR:
        shutil.copy(REPO_ROOT / "results" / "h200" / "flash_v6_backward_s2048_profile.ncu-rep",
                    records.report_path(name, profile.SHAPE["seq_len"]))
    table = profile.pair_table().data.splitlines()
    assert table[0].count("|") == 4 and len(table) >= 2 + len(profile.ROWS) - 1
    assert all(row.count("|") == 4 for row in table[2:] if row.startswith("|"))
    stalls = profile.stall_pair().data.splitlines()
    rows = [r for r in stalls[2:] if r.startswith("|")]
    assert rows and all(r.count("|") == 4 and r.split("|")[2] == r.split("|")[3] for r in rows)   # one report twice
    pipes = [r for r in profile.pipe_table().data.splitlines()[2:] if r.startswith("|")]
    assert len(pipes) == len(profile.PIPES) + 1 and all(r.rstrip(" |").endswith(("1.00×", "—")) for r in pipes)


@needs_tools
@pytest.mark.parametrize("flags", [(), notes.DESC_MAKE], ids=["default", "desc_make"])
@pytest.mark.parametrize("D", notes.HEAD_DIMS)
def test_mix_puts_every_instruction_of_the_plain_step_in_one_group(D, flags):
    """The lab notes' opcode groups add up to the plain step's length, the wgmma group holds its wgmma and the
    P, dS group its exponentials, and nothing but a handful falls outside the named groups."""
    rows = notes.mix_rows(D, flags)
    plain = next(r for r in notes.step_rows(flags) if r["D"] == D and r["step"] == "plain")
    assert sum(rows.values()) == plain["instructions"]
    assert rows["wgmma, its fences and waits"] >= plain["hgmma"] + plain["waits"]
    assert rows["P, dS: FFMA, FADD, FMUL, MUFU, FSEL, F2FP"] >= plain["ex2"]
    assert rows["other"] <= 10


@needs_tools
@pytest.mark.parametrize("D", notes.HEAD_DIMS)
def test_descriptors_plus_offsets_take_instructions_out_of_the_step(D):
    """V8B_DESC_ADD (the default) against make_desc for every wgmma: the same wgmma and the same P, dS work, and
    fewer uniform and integer instructions in the plain step."""
    new, old = notes.mix_rows(D), notes.mix_rows(D, notes.DESC_MAKE)
    for same in ("wgmma, its fences and waits", "P, dS: FFMA, FADD, FMUL, MUFU, FSEL, F2FP"):
        assert new[same] == old[same], same
    assert sum(new.values()) < sum(old.values()) - 100


def test_order_table_reads_the_three_reports(tmp_path, monkeypatch):
    """The two steps' table puts the first version's report, the new default's and FlashAttention-4's side by
    side, and says which report is missing while one is."""
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    assert "Not recorded yet" in profile.order_table().data
    if not records.ncu_report_importable():
        pytest.skip("ncu_report is not installed (pip install ncu-report)")
    for name in profile.ORDER:
        shutil.copy(REPO_ROOT / "results" / "h200" / "flash_v6_backward_s2048_profile.ncu-rep",
                    records.report_path(name, profile.SHAPE["seq_len"]))
    rows = [r for r in profile.order_table().data.splitlines() if r.startswith("|")]
    assert len(rows) == 2 + len(profile.ORDER_ROWS) + 1
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]
    assert all(len(set(c[1:])) == 1 for c in cells[:-1])   # one report three times: the same value
    assert cells[-1][1:] == ["1.00×"] * 3


@pytest.mark.parametrize("log,columns", [("backward_order_l2_wip.log", 7), ("backward_descriptors_916a455.log", 3)])
def test_step_logs_hold_the_four_targets(log, columns):
    """The lab notes' step tables are the ones the H200 printed: a row per target shape, every cell a time or a
    ratio, and the sentence that says how they were measured."""
    text = profile.step_log(log).data
    rows = [r for r in text.splitlines() if r.startswith("| ") and not r.startswith("| B,")]
    assert len(rows) == len(live.TARGETS) == 4
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")][2:]
        assert len(cells) == columns and all(re.fullmatch(r"[\d,]+\.\d|\d\.\d\d×", c) for c in cells), r
    assert "Measured on NVIDIA H200" in text


def test_timed_steps_compare_builds_one_switch_apart():
    """Every build a timed step names is the default or one of flashattn.measure.variants' v8-backward builds, and
    the builds of one step differ from each other in one switch (the steps taken at B_r = 64 carry V8B_BR80=0 in
    every column, so that their tables still time what the lab notes say)."""
    from flashattn.measure.variants import SETS
    macros = {"default": {}} | {name: v.macros for name, v in SETS["v8-backward"].items()}
    for step, (_, columns, _, _) in live.STEPS.items():
        builds = {b for b, _ in columns.values()}
        assert builds <= set(macros), step
        for a in builds:
            for b in builds - {a}:
                switches = {k for k in macros[a].keys() | macros[b].keys() if macros[a].get(k) != macros[b].get(k)}
                assert len(switches) == 1, (step, a, b, switches)


def test_shared_wavefronts_read_the_committed_source_counts():
    """The taller tile's SourceCounters log: every shared-memory opcode of the step (wgmma operands, the row terms'
    LDS.64, dS's STSM, dQ^T's STS) at its ideal wavefronts, beside the l1tex counters of that run."""
    table = profile.shared_wavefronts().data
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| `")]
    assert {r[0].strip("| `").split(".")[0] for r in rows} == {"HGMMA", "LDS", "STSM", "STS"}
    assert all(r[2] == r[3] and r[4].rstrip(" |") == "0" for r in rows)
    assert "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum` 926,633" in table


def test_step_stalls_read_the_committed_samples():
    """The stall log of the same run: the tensor-core waits first, then the FFMAs of P^T on the short scoreboard
    (the lab notes' reading), and shares that add up to at most the whole step."""
    table = profile.step_stalls().data
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| `")]
    assert [(r[0].strip("| `"), r[1]) for r in rows[:2]] == [("WARPGROUP", "barrier"), ("FFMA", "short sb")]
    shares = [float(r[3].rstrip(" |%")) for r in rows]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 100
    assert "0x1340 to 0x3450" in table


def test_row_stalls_hold_what_the_lab_notes_say():
    """V8B_ROW_PREFETCH's stall logs, as "Loading the row terms early" reads them: with the loads among the
    wgmmas (2) the FFMAs of P^T still wait on the short scoreboard, all at the first FFMA, and the loads wait
    for the MIO queue; with them before the wgmmas (3, at D = 64) the FFMAs' wait is gone, the FADDs' for D_i
    stays."""
    samples = {(shape, build[0]): profile._step_samples(name)[0] for (shape, build), name in profile.ROW_STALLS.items()}
    got = {build: s for (shape, build), s in samples.items() if "4096" in shape}
    d64 = [s for (shape, _), s in samples.items() if "2048" in shape]
    ffma, fadd, lds = ("FFMA", "short_sb"), ("FADD", "short_sb"), ("LDS", "mio")
    assert abs(got["2"][ffma] - got["0"][ffma]) < 0.05 * got["0"][ffma] and got["2"][lds] > 0 == got["0"][lds]
    _, rows = profile._log_rows(profile.ROW_STALLS[("(1, 8, 4096, 128)", "2 (among the wgmmas)")])
    first = next(r for r in rows if r["Source"].startswith("FFMA"))
    assert first["Address"] == "0x1b30" and profile._count(first["stall_short_sb"]) == got["2"][ffma]
    assert (d64[0][ffma], d64[1][ffma]) == (1436, 3) and d64[1][fadd] > 0.9 * d64[0][fadd]
    table = profile.row_stalls().data
    assert table.count("\n| (") == 4 and "| 1,436 |" in table
