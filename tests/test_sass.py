"""flashattn.measure.sass: the hot loops' instruction mix, from nvcc and nvdisasm, without a GPU."""
import importlib.util
import re

import pytest

from flashattn.measure import sass

REASON = sass.tool_missing_reason()
needs_tools = pytest.mark.skipif(REASON is not None, reason=f"cannot disassemble here: {REASON}")

V6_BF16_D64 = "<__nv_bfloat16, 64, 2, 64, 4, false, 2, false, false>"

# Two nested loops, a wait (poll) loop inside the outer one, and the never-taken branch to itself after
# EXIT, in nvdisasm -c -g's format.
FFMAS = "".join(f"        /*{0x20 + 0x10 * k:04x}*/                   FFMA R8, R4, R5, R8 ;\n" for k in range(9))
LISTING = f"""
//--------------------- .text._Z4kernPf --------------------------
.text._Z4kernPf:
	//## File "k.cu", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
	//## File "k.cu", line 12
        /*0010*/                   LDS.128 R4, [R2] ;
.L_x_1:
	//## File "k.cu", line 13
{FFMAS}        /*00b0*/               @P0 BRA `(.L_x_1) ;
	//## File "k.cu", line 15
        /*00c0*/                   MUFU.EX2 R10, R9 ;
.L_x_3:
        /*00d0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R0], RZ ;
        /*00e0*/              @!P1 BRA `(.L_x_3) ;
        /*00f0*/              @!P1 BRA `(.L_x_0) ;
        /*0100*/                   EXIT ;
.L_x_2:
        /*0110*/                   BRA `(.L_x_2) ;
"""


def test_parse_finds_loops_and_classes():
    (fn,) = sass.parse(LISTING)
    assert fn.name == "_Z4kernPf" and len(fn.instructions) == 18
    assert [(lp.start, lp.end) for lp in fn.loops()] == [(0x10, 0xF0), (0x20, 0xB0), (0xD0, 0xE0)]
    hot = fn.hot_loop()
    assert (hot.start, hot.end) == (0x20, 0xB0) and hot.lines == (13, 13)
    assert hot.counts() == {"FFMA": 9, "branch": 1}
    assert [(lp.start, lp.end) for lp in fn.innermost_loops()] == [(0x20, 0xB0)], "the poll loop is no loop"
    outer = fn.loops()[0]
    assert outer.opcodes()["LDS.128"] == 1 and outer.counts()["MUFU"] == 1 and outer.counts()["BAR/sync"] == 1
    bra = fn.instructions[11]
    assert bra.opcode == "BRA" and bra.predicate.strip() == "@P0" and bra.target == ".L_x_1"


def test_classes_do_not_overlap_and_unknown_is_other():
    seen = [op for ops in sass.CLASSES.values() for op in ops]
    assert len(seen) == len(set(seen)), "an opcode is listed in two classes"
    assert sass.class_of("FFMA") == "FFMA" and sass.class_of("NOTANOPCODE") == "other"


def test_tool_is_found_where_triton_is_installed():
    """CI has no CUDA toolkit of its own but installs torch, which brings triton and its nvdisasm."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed, so there is no bundled nvdisasm to find")
    path = sass.find_tool("nvdisasm")
    assert path is not None, "triton is installed but its nvdisasm was not found"


@needs_tools
def test_v4_loop_is_ffma_and_shared_loads_without_local_memory():
    fn = sass.function("v4")
    hot = fn.hot_loop().counts()
    assert hot["FFMA"] > 0 and hot["LDS"] > 0
    assert all(lp.counts()["LDL/STL"] == 0 for lp in fn.innermost_loops())
    assert not any(i.opcode in ("LDL", "STL") for i in fn.instructions)


@needs_tools
def test_v5_hot_loop_is_almost_all_ffma():
    hot = sass.function("v5").hot_loop()
    assert hot.counts()["FFMA"] / len(hot.instructions) > 0.85
    assert hot.counts()["FFMA"] > 8 * hot.counts()["LDS"]


@needs_tools
def test_v6_hot_loop_uses_tensor_cores_and_ldmatrix():
    fn = sass.function("v6", V6_BF16_D64)
    hot = fn.hot_loop().counts()
    assert hot["HMMA"] > 0 and hot["LDSM"] > 0 and hot["LDL/STL"] == 0


@needs_tools
def test_table_and_excerpt():
    table = sass.loop_table("v4")
    head, rule, *rows = table.splitlines()
    assert head.startswith("| loop: its most frequent source line | instructions |") and "FFMA share" in head
    assert len(rows) == len(sass.function("v4").innermost_loops()) and rule.count("|") == head.count("|")
    assert any("LDS.128" in r for r in rows), "V4's 16-byte Q broadcasts show in the width column"
    text = sass.excerpt(sass.function("v4").hot_loop(), 5)
    assert len(text.splitlines()) == 6 and "more instructions" in text


@needs_tools
def test_unknown_kernel_names_the_kernels():
    with pytest.raises(ValueError, match="flash_v4_kernel"):
        sass.function("v4", "no such kernel")


def test_wgmma_windows_count_every_depth_of_the_opcode():
    """Instruction texts and cuobjdump's SASS (offsets, predicates, encoding lines) give the same windows; a
    window opens at 'one group left' (0x1), closes at 'none left' (0x0), and one left open is not counted."""
    texts = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
             "MUFU.EX2 R1, R1", "@!P0 MUFU.EX2 R2, R2", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R3, R3",
             "WARPGROUP.DEPBAR.LE gsb0, 0x1", "STS.64 [R2+0x28400], R152", "STS [R11+UR7], R216",
             "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR8+0x30428], RZ", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
             "WARPGROUP.DEPBAR.LE gsb0, 0x1", "REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR4][R2.64], R8"]
    dump = "".join(f"        /*{16 * k:04x}*/                   {t} ;   /* 0x000fe20000000800 */\n"
                   f"                                                     /* 0x000fc40000000000 */\n"
                   for k, t in enumerate(texts))
    for windows in (sass.wgmma_windows(texts), sass.wgmma_windows(dump)):
        assert len(windows) == 2
        first, second = windows
        assert first == {"MUFU": 2, "MUFU.EX2": 2}
        assert (second["STS"], second["STS.64"], second["SYNCS"], second["SYNCS.ARRIVE"], second["REDG"]) == \
            (2, 1, 1, 1, 0)
        assert second["SYNCS.ARRIVE.TRANS64.A1T0"] == 1 and second["BRA"] == 0
    # every stretch from one wait to the next, and the one after the last wait, with the wait's N
    gaps = sass.wgmma_gaps(texts)
    assert [n for n, _, _ in gaps] == [1, 0, 1, 0, 1]
    assert gaps[1][2] == {"MUFU": 1, "MUFU.EX2": 1} and gaps[3][2] == {} and gaps[4][2]["REDG"] == 1
    assert gaps[1][1] == ["MUFU.EX2 R3, R3"] and gaps[3][1] == []
    # cuobjdump's lines keep their offsets and drop the encoding lines: the same instructions, counted alike
    from_dump = sass.wgmma_gaps(dump)
    assert [(n, c) for n, _, c in from_dump] == [(n, c) for n, _, c in gaps]
    assert [[re.search(r"\*/\s+(.*?)\s*;", line)[1] for line in body] for _, body, _ in from_dump] == \
        [body for _, body, _ in gaps]
