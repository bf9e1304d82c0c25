"""v8 backward (kernels/v8_backward.cu: wgmma, TMA, warp specialization; sm_90a): what the compiler made of
it, the layouts and the tile walk emulated on the CPU, and what it computes on a Hopper GPU.

CPU tests (no GPU):
  * nvcc on the kernel half for sm_90a (tests/test_v7.py's run): 16 kernels, no spills, no stack frame, no
    warning (C7510 would be a serialised wgmma, C7508 an ignored setmaxnreg); the dK/dV kernels: the
    producer releases to 24 registers and the consumers claim 240 and use fewer, HGMMA with shared-memory
    and register A operands, TMA (UTMALDG) and bulk (UBLKCP) loads, no local memory, no mma.sync; per
    step exactly four wgmma waits (1, 0, 1, 0: nothing waits more than the source asks), P^T's
    exponentials between the first pair (V8B_EXP_FENCE) and dQ's 16 red.global between the second;
  * the binding has v6_backward.cu's parameters, so flashattn.autograd can take either file; and the
    file builds through flashattn.loader.build (load_inline, both halves);
  * the operand layouts in numpy, byte for byte: TMA's 128-byte swizzle as the tiles are written, the
    descriptors' start addresses and LBO/SBO as the kernel passes them, read back with the canonical K-major
    and MN-major layouts of the PTX ISA (the model under v7/v8's working descriptors), and the dS^T tile as
    the consumer threads store it from their accumulator registers (values and bank conflicts);
  * the block walk in float64: every key tile of every kv head walks the query tiles [it_begin, it_end)
    of its group's heads, masks only outside [plain_begin, plain_end), with the kernel's per-thread limits
    and padded row terms; the sum of its steps is the float64 gradient (no mask, causal, sliding windows).
    The formulas are the kernel's, written again in Python; a test checks that the kernel still has every
    line they mirror.
GPU tests (compute capability 9.0 only): o and lse from v8's forward_lse, then the backward binding
directly; dq, dk, dv against float64 autograd of flashattn.reference within twice the error of PyTorch's
SDPA backward in the same dtype (tests/test_backward.py's compare_grads: also finite, rows with no key get
dq = 0), poisoned outputs and workspace; odd sizes, M != N both ways, several B and H, grouped-query heads,
the softmax scale, large logits, bf16 and fp16, D 64 and 128; sliding windows (window_left, window_right,
the parameters v6_backward.cu gained meanwhile) against a band-masked float64 reference and SDPA with the
band as its mask; dK and dV bit-identical from run to run; refusals naming the argument (deterministic=True
included: not implemented); compute-sanitizer (memcheck, racecheck, synccheck) with this file as the driver
(`python tests/test_v8_backward.py --sanitize`).
"""
from __future__ import annotations

import functools
import math
import re
import sys
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "v8_backward.cu"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import conftest  # noqa: E402
import test_v7  # noqa: E402
from test_backward import compare_grads, rel_err  # noqa: E402
from test_gqa import make  # noqa: E402
from test_v7 import is_hopper, sass_functions  # noqa: E402

from flashattn.book import backward_hopper  # noqa: E402
from flashattn.book.block_order import block_tile, l2_head_group, waves  # noqa: E402
from flashattn.loader import binding_params, source  # noqa: E402
from flashattn.measure import sass as sass_tools  # noqa: E402
from flashattn.reference import attention_gradients  # noqa: E402

needs_hopper = pytest.mark.skipif(not is_hopper(), reason="the v8 backward needs a GPU of compute capability 9.0 "
                                                          "(an sm_90a build: wgmma, TMA)")
BC = 128   # keys per block (Layout::BC; flashattn.book.block_order.BC)


@functools.cache
def query_tile(D: int, flags: tuple[str, ...] = (), banded: bool = False) -> int:
    """Layout::BR: query rows per step at head dim D in a build with these -D flags (none: the default build),
    evaluated from the kernel's struct."""
    return backward_hopper.layout(tile_dim(D), flags=list(flags), banded=banded)["BR"]


# V8B_BR80 picks the unbanded D = 128 kernel's query tile: 80 (the default) or 64 (the first versions')
BR80, BR64 = "-DV8B_BR80=1", "-DV8B_BR80=0"


def tile_flags(br80: bool) -> tuple[str, ...]:
    """The flag that gives the unbanded D = 128 kernel B_r = 80 (br80) or 64, whichever is the default."""
    return (BR80,) if br80 else (BR64,)


def has_image(D: int, flags=(), banded: bool = False) -> bool:
    """Layout::DQ_BULK of the kernel a call at head dim D runs in a build with these -D flags (banded: causal or a
    window): dQ leaves through the image, and deterministic=True is taken, or by red.global, and it is refused."""
    return bool(backward_hopper.layout(tile_dim(D), flags=list(flags), banded=banded)["DQ_BULK"])


def det_kernels(flags=()) -> int:
    """The dK/dV kernels the deterministic mode adds in a build with these -D flags: its banded kernel at D = 128's
    tiles (D = 96 and 128, bf16 and fp16) takes its own row-term placement (V8B_DET_ROW_PREFETCH), a kernel of its
    own where that is not the default mode's and the tile has the bulk dQ path the mode needs."""
    L = backward_hopper.layout(128, flags=list(flags), banded=True)
    return 4 if L["V8B_DET_ROW_PREFETCH"] != L["V8B_ROW_PREFETCH"] and L["DQ_BULK"] else 0


def build_flags(flag: str | None) -> tuple[str, ...]:
    """step_build's argument as the flags it builds with."""
    return tuple(flag.split()) if flag else ()


def takes_br80(flags) -> bool:
    """Whether a build with these -D flags runs B_r = 80 (dQ_i^T = K_j^T dS_i^T) in its unbanded D = 128 kernel."""
    return query_tile(128, tuple(flags)) == 80


# (head dim, B_r = 80) of the CPU tests that emulate the tiles: B_r = 128, 64 and 80
TILES = pytest.mark.parametrize("D,br80", [(64, False), (128, False), (128, True)],
                                ids=["d64", "d128-br64", "d128-br80"])


# The head dims of the GPU tests: 96 runs D = 128's tiles with columns 96 .. 127 zero (flash_bwd_ws's DG)
GRAD_DIMS = [64, 96, 128]


# ================================================================ CPU: what nvcc made of it
def compile_v8b(tmp_path: Path, flags: list[str] | None = None) -> tuple[str, str]:
    """test_v7's nvcc + cuobjdump run, on kernels/v8_backward.cu."""
    with mock.patch.object(test_v7, "KERNEL", KERNEL):
        return test_v7.compile_v7(tmp_path, list(flags or []))


def waits(text: str) -> list[int]:
    """The wgmma waits of a kernel in order: N of each WARPGROUP.DEPBAR.LE gsb0, N."""
    return [int(n, 16) for n in re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", text)]


def windows(text: str) -> list[dict[str, int]]:
    """Per wait for one group of two (DEPBAR.LE 0x1), what runs before the wait for the last (0x0): the
    exponentials (MUFU.EX2), global reductions (REDG), shared-memory stores (STS), mbarrier operations
    (SYNCS) and branches ptxas scheduled while a product was in flight (flashattn.measure.sass.wgmma_windows)."""
    return [{"EX2": w["MUFU.EX2"], "REDG": w["REDG"], "STS": w["STS"], "SYNCS": w["SYNCS"], "BRA": w["BRA"]}
            for w in sass_tools.wgmma_windows(text)]


def head_dim(kernel: str) -> int:
    return int(re.search(r"flash_bwd_wsI\w+?Li(\d+)E", kernel).group(1))


def tile_dim(D: int) -> int:
    """The head dim of the tiles for tensors of head dim D (kernels/v8_backward.cu's tile_dim: 96 -> 128)."""
    return -(-D // 64) * 64


def dv_at(flags: list[str], D: int) -> int:
    """Where the step issues dV_j (kernels/v8_backward.cu's DV_AT): 0 with dK_j, 1 before the wait for dP^T,
    2 after the dS^T stores (the default); D=64 always 0."""
    mode = int(next((f.split("=")[1] for f in flags if f.startswith("-DV8B_EARLY_DV=")), 2))
    return mode if D == 128 else 0


@pytest.mark.parametrize("flags", [[], ["-DV8B_STAGES=3"], ["-DV8B_EXP_FENCE=0", "-DV8B_ROW_PREFETCH=0"],
                                   ["-DV8B_DQ_BULK=0"], ["-DV8B_HEAD_GROUP=1"],
                                   ["-DV8B_DESC_ADD=0"], ["-DV8B_UNIFORM_WG=1"],
                                   ["-DV8B_EARLY_DV=0"], [BR64, "-DV8B_EARLY_DV=1"], [BR64], [BR64, "-DV8B_STAGES=3"],
                                   ["-DV8B_ROW_PREFETCH=0"], ["-DV8B_ROW_PREFETCH=1"], ["-DV8B_ROW_PREFETCH=2"],
                                   ["-DV8B_ROW_PREFETCH=3"]],
                         ids=["default", "stages3", "nofence", "dq_atomics", "keys_first", "desc_make", "wg_uniform",
                              "dv_late", "dv_before_dp_wait", "br64", "br64_stages3", "rows0", "rows1", "rows2",
                              "rows3"])
def test_compiles_for_sm90a_without_spills(flags, tmp_path):
    report, sass = compile_v8b(tmp_path, flags)
    entries = re.findall(r"Compiling entry function '(\S+)'.*?Used (\d+) registers", report, re.S)
    # bwd_prep, flash_bwd_ws, bwd_convert x (bf16, fp16) x (D 64, 96, 128); flash_bwd_ws also x causal;
    # B_r = 80 (V8B_BR80): at D = 96 and 128 bwd_convert also for B_r = 80; the deterministic mode's banded kernels
    assert len(entries) == 8 * len(GRAD_DIMS) + (4 if takes_br80(flags) else 0) + det_kernels(flags), entries
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(frames) == len(entries) and all(f == ("0", "0", "0") for f in frames), frames
    for line in report.splitlines():
        assert "warning" not in line.lower(), line
    main = {name: int(regs) for name, regs in entries if "flash_bwd_ws" in name}
    assert len(main) == 4 * len(GRAD_DIMS) + det_kernels(flags)
    # with setmaxnreg ptxas reports the launch allotment: 65,536 / 384 threads, down to a multiple of 8
    assert set(main.values()) == {168}, main

    funcs = {name: text for name, text in sass_functions(sass).items() if "flash_bwd_ws" in name}
    assert sorted(funcs) == sorted(main)
    fence = "-DV8B_EXP_FENCE=0" not in flags
    for name, text in funcs.items():
        D = tile_dim(head_dim(name))   # the SASS of D = 96 is D = 128's tiles, its stores aside
        BR = query_tile(D, tuple(flags), "Lb1E" in name)
        dq_t = BR == 80   # dQ_i^T: dS by stmatrix .trans, the image by 4 x B_r / 8 scalar stores per thread
        assert text.count("STSM") == (2 * BR // 16 if dq_t else 0), f"{name}: stmatrix count"
        assert re.search(r"HGMMA\.\S+ R\d+, R\d+, gdesc", text), f"{name}: no register-A HGMMA (dV, dK)"
        assert re.search(r"HGMMA\.\S+ R\d+, gdesc", text), f"{name}: no shared-memory HGMMA (S^T, dP^T, dQ)"
        # two copies of the step (masked, plain), each with D/16 + D/16 + 8 + 2 B_r/16 wgmma
        assert text.count("HGMMA") == 2 * (D // 8 + 8 + BR // 8), f"{name}: wgmma count"
        assert "UTMALDG" in text and "UBLKCP" in text, f"{name}: no TMA box or bulk copy"
        assert not re.search(r"\b(LDL|STL)\b", text), f"{name} uses local memory"
        assert "HMMA" not in text.replace("HGMMA", ""), f"{name} has mma.sync"
        # V8B_UNIFORM_WG=1: the descriptors in uniform registers, a few copies (R2UR) from ordinary ones outside the
        # step (15 to 21 for 64 to 68 wgmma in ptxas 13.0), where the default copies before every wgmma
        copies, wgmmas = text.count("R2UR"), text.count("HGMMA")
        if "-DV8B_UNIFORM_WG=1" in flags:
            assert 2 * copies < wgmmas, f"{name}: {copies} R2UR for {wgmmas} wgmma"
        else:
            assert copies >= wgmmas, f"{name}: {copies} R2UR for {wgmmas} wgmma"
        moves = sass_tools.register_moves(text.splitlines())
        assert moves["release"] == [24] and moves["claim"] == [240], f"{name}: setmaxnreg {moves}"
        top = max(int(r) for r in re.findall(r"\bR(\d+)\b", text))
        assert top < 240, f"{name}: register R{top} past the 240 claimed"
        # the waits the source asks for and no more (ptxas adds a full wait where it serialises); with dV_j
        # issued before the wait for dP^T, that wait leaves one group (dV_j) in flight
        at = dv_at(flags, D)
        assert waits(text) == ([1, 1, 1, 0] if at == 1 else [1, 0, 1, 0]) * 2, f"{name}: waits {waits(text)}"
        # what each step issues between its waits: dV_j's B_r / 16 register-A wgmma sit between the waits
        # for S^T and dP^T (1), between the wait for dP^T and dQ's (2), or after it with dK_j's (0)
        gaps = [body for _, body, _ in sass_tools.wgmma_gaps(text)]
        rs = [sum(bool(re.search(r"HGMMA\.\S+ R\d+, R\d+, gdesc", line)) for line in gap) for gap in gaps]
        kdv = BR // 16
        expect = {0: [0, 2 * kdv, 0], 1: [kdv, kdv, 0], 2: [0, 2 * kdv, 0]}[at]
        assert rs[:3] == expect and rs[4:7] == expect, f"{name}: register-A wgmma between waits {rs}"
        if at == 2:   # dV_j's wgmma issued before the named barrier, dK_j's after it
            second = gaps[1]
            bar = next(i for i, line in enumerate(second) if re.search(r"\bBAR\.SYNC", line))
            before = [bool(re.search(r"HGMMA\.\S+ R\d+, R\d+, gdesc", line)) for line in second[:bar]]
            assert sum(before) == kdv, f"{name}: dV_j's wgmma not before the named barrier"
        # the stretches from a wait that leaves one group in flight to the wait for none: P^T's (not with dV_j
        # issued before dP^T's wait, which leaves a group in flight there) and dQ's way out
        wins = windows(text)
        assert len(wins) == (2 if at == 1 else 4), f"{name}: {wins}"
        # dQ leaves while dK_j (and dV_j) are on the tensor cores: as 16 red.global per thread, or (V8B_DQ_BULK,
        # which does not fit beside 3 stages at D = 64) as 16 stores into the image and one mbarrier
        # arrival, and no branch there either way
        bulk = has_image(D, flags, "Lb1E" in name)
        out = wins if at == 1 else wins[1::2]
        stores = BR // 2 if dq_t else 16
        if bulk:
            assert [(w["STS"], w["SYNCS"], w["REDG"]) for w in out] == [(stores, 1, 0)] * 2, \
                f"{name}: dQ image stores outside dV/dK's window {wins}"
            if at != 1:
                assert [(w["STS"], w["SYNCS"], w["REDG"]) for w in wins[::2]] == [(0, 0, 0)] * 2, wins
            assert "UBLKRED.G.S.ADD.F32" in text, f"{name}: no bulk reduction of the dQ image"
        else:
            if dq_t:   # 40 single-float reductions per step; ptxas leaves two or three of them after dK_j's wait
                assert text.count("REDG") == 2 * stores, f"{name}: dQ reductions"
                assert all(w["REDG"] >= stores - 4 for w in out), f"{name}: dQ atomics outside dV/dK's window {wins}"
            else:
                assert [w["REDG"] for w in out] == [stores] * 2, f"{name}: dQ atomics outside dV/dK's window {wins}"
            assert "UBLKRED" not in text, f"{name}: a bulk reduction without V8B_DQ_BULK"
        assert not any(w["BRA"] for w in wins), f"{name}: a branch between a wgmma and its wait {wins}"
        if fence and at != 1:
            assert [w["EX2"] for w in wins] == [BR // 2, 0] * 2, f"{name}: P^T left dP^T's window {wins}"
        if at == 1:   # every exponential between the wait for S^T and the wait for dP^T, whatever the fence
            assert [sum("MUFU.EX2" in line for line in gaps[i]) for i in (0, 4)] == [BR // 2] * 2, \
                f"{name}: P^T left dP^T's window"
        assert ("SR_CLOCKLO" in text) == fence, f"{name}: clock read"


def test_varlen_build_adds_its_kernels_and_keeps_the_others(tmp_path):
    """FLASHATTN_VARLEN=1 (flashattn.varlen_kernel's backward build) adds flash_bwd_varlen beside every
    flash_bwd_ws instance and leaves those as they were, instruction for instruction (their code is shared,
    flash_bwd_body, with VARLEN a template constant). Each varlen kernel is its fixed-length twin's step: the
    same wgmma, the same waits, the same work between them, the setmaxnreg split, no spill and no local memory;
    its pre-pass and conversion (bwd_prep_varlen, bwd_convert_varlen) spill nothing either."""
    (tmp_path / "fixed").mkdir()
    (tmp_path / "varlen").mkdir()
    _, fixed = compile_v8b(tmp_path / "fixed")
    report, both = compile_v8b(tmp_path / "varlen", ["-DFLASHATTN_VARLEN=1"])
    normalised = lambda text: [" ".join(line.split()) for line in text.splitlines()]   # noqa: E731
    before, after = sass_functions(fixed), sass_functions(both)
    for name, text in before.items():
        assert normalised(after[name]) == normalised(text), f"{name} changed with FLASHATTN_VARLEN"
    args = lambda name: re.search(r"flash_bwd_(?:ws|varlen)(I\w+?E)Ev", name).group(1)   # noqa: E731
    varlen = {name: text for name, text in after.items() if "flash_bwd_varlen" in name}
    twins = {args(name): text for name, text in before.items() if "flash_bwd_ws" in name}
    assert len(varlen) == len(twins) == 4 * len(GRAD_DIMS) + det_kernels()
    tiles = {(D, query_tile(D, (), banded)) for D in GRAD_DIMS for banded in (False, True)}   # one per B_r
    assert sum("bwd_prep_varlen" in n for n in after) == sum("bwd_convert_varlen" in n for n in after) == 2 * len(tiles)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert frames and all(f == ("0", "0", "0") for f in frames), frames
    for name, text in varlen.items():
        twin = twins[args(name)]   # the fixed-length kernel of the same template arguments
        assert not re.search(r"\b(LDL|STL)\b", text), f"{name} uses local memory"
        assert sass_tools.register_moves(text.splitlines()) == {"release": [24], "claim": [240]}, name
        assert max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) < 240, name
        for feature in ("HGMMA", "UTMALDG", "UBLKCP", "UBLKRED", "MUFU.EX2", "STSM"):
            assert text.count(feature) == twin.count(feature), f"{name}: {feature}"
        assert waits(text) == waits(twin) and windows(text) == windows(twin), name


@pytest.mark.parametrize("prefetch", [None, 0, 1, 2, 3, 4])
def test_row_terms_load_before_the_waits(prefetch):
    """V8B_ROW_PREFETCH (None: the default build): in every copy of the step, at both head dims and both query
    tiles of D = 128, the B_r / 8 LDS.64 of lse2_i issue before the step's first wgmma (3, 4), before the wait
    for S^T (1, 2) or after it (0), and D_i's before the wait for dP^T (2, 4) or after it. 3 and 4 spill at
    B_r = 80, which keeps 0."""
    for flags in ((), (BR64,)):
        flags += () if prefetch is None else (f"-DV8B_ROW_PREFETCH={prefetch}",)
        for D in (64, 128):
            L = backward_hopper.layout(D, flags=list(flags))
            rows = 0 if L["V8B_ROW_PREFETCH"] >= 3 and L["DQ_T"] else L["V8B_ROW_PREFETCH"]
            for span in backward_hopper.step_spans(backward_hopper.texts(D, flags=flags), L):
                waits = [i for i, t in enumerate(span) if "DEPBAR.LE gsb0" in t]
                loads = [i for i, t in enumerate(span) if t.startswith("LDS.64")]
                n = L["BR"] // 8   # LDS.64 per row term
                assert len(loads) == 2 * n, (D, flags, loads)
                first_wgmma = next(i for i, t in enumerate(span) if t.startswith("HGMMA"))
                assert sum(i < first_wgmma for i in loads) == (n if rows >= 3 else 0), (D, flags)
                before_s = sum(i < waits[0] for i in loads)
                before_dp = sum(waits[0] < i < waits[1] for i in loads)
                want = {0: (0, n), 1: (n, 0), 2: (n, n), 3: (n, 0), 4: (n, n)}[rows]
                assert (before_s, before_dp) == want, (D, flags, loads)


def test_deterministic_banded_kernel_loads_row_terms_after_the_waits():
    """The deterministic mode's banded kernel at D = 128 (V8B_DET_ROW_PREFETCH=0, an instance of its own) loads
    lse2_i's pairs after the wait for S^T and D_i's after the wait for dP^T, where the default mode's kernel (4)
    loads lse2_i's before the step's first wgmma and D_i's before the wait for dP^T."""
    L = backward_hopper.layout(128, banded=True)
    assert L["V8B_DET_ROW_PREFETCH"] == 0 and L["V8B_ROW_PREFETCH"] == 4
    n = L["BR"] // 8   # LDS.64 per row term
    # (before the first wgmma, before the wait for S^T, between the waits for S^T and dP^T)
    for rows, want in ((0, (0, 0, n)), (4, (n, n, n))):
        name = backward_hopper.kernel_name(128, True, rows=rows)
        spans = backward_hopper.step_spans(sass_tools.texts(sass_tools.function(KERNEL.stem, name)), L)
        assert spans, name
        for span in spans:
            waits = [i for i, t in enumerate(span) if "DEPBAR.LE gsb0" in t]
            loads = [i for i, t in enumerate(span) if t.startswith("LDS.64")]
            first_wgmma = next(i for i, t in enumerate(span) if t.startswith("HGMMA"))
            assert len(loads) == 2 * n, (name, loads)
            got = (sum(i < first_wgmma for i in loads), sum(i < waits[0] for i in loads),
                   sum(waits[0] < i < waits[1] for i in loads))
            assert got == want, (name, got)


def test_binding_takes_v6_backward_parameters():
    """The same names in the same order as v6_backward.cu's binding, whatever that file takes now (it grew
    window_left, window_right while this kernel was written), so that flashattn can use either file."""
    ours = binding_params(source("v8_backward"), "backward")
    assert ours == binding_params(source("v6_backward"), "backward")
    assert ours[:9] == ["q", "k", "v", "o", "lse", "dout", "causal", "deterministic", "scale"]


def test_builds_through_the_loader():
    """Both halves through load_inline (flashattn.loader.build), as flashattn.autograd would build it."""
    from flashattn.loader import build
    mod = build("v8_backward", archs=["9.0a"], functions=("backward",))
    assert mod.backward.__doc__.startswith("backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, "
                                           "o: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor, causal: bool "
                                           "= False, deterministic: bool = False, scale:")


# ================================================================ CPU: operand layouts, byte for byte
def swizzle(addr: np.ndarray) -> np.ndarray:
    """128-byte swizzle of a byte address in a 1024-byte-aligned tile: 16-byte chunk bits 4-6 ^= row bits 7-9."""
    return addr ^ (((addr >> 7) & 7) << 4)


def tma_write(mem: np.ndarray, base: int, mat: np.ndarray) -> None:
    """A [rows][D] tile as the kernel's TMA boxes leave it: D / 64 panels of [rows][128 bytes], swizzled."""
    rows, d = mat.shape
    r, c = np.meshgrid(np.arange(rows), np.arange(d), indexing="ij")
    addr = base + (c // 64) * rows * 128 + r * 128 + (c % 64) * 2
    mem[swizzle(addr) // 2] = mat.view(np.uint16)


def read_k_major(mem, start, mn: int) -> np.ndarray:
    """[mn][16] operand of a K-major descriptor (SBO 1024; LBO unused): element (i, k) at start + (i / 8) SBO +
    (i % 8) 128 + 2k, then the swizzle (the start may sit 32, 64 or 96 bytes into a row: a k16 step)."""
    i, k = np.meshgrid(np.arange(mn), np.arange(16), indexing="ij")
    return mem[swizzle(start + (i // 8) * 1024 + (i % 8) * 128 + 2 * k) // 2].view(np.float16)


def read_mn_major(mem, start, lbo, mn: int) -> np.ndarray:
    """[mn][16] operand of an MN-major descriptor (LBO between 64-wide panels, SBO 1024 between 8-row k
    groups): element (i, k) at start + (i / 64) LBO + (k / 8) 1024 + (k % 8) 128 + 2 (i % 64), swizzled."""
    i, k = np.meshgrid(np.arange(mn), np.arange(16), indexing="ij")
    return mem[swizzle(start + (i // 64) * lbo + (k // 8) * 1024 + (k % 8) * 128 + 2 * (i % 64)) // 2].view(np.float16)


def store_ds_tile(mem, base, dsT: np.ndarray) -> list[list[int]]:
    """Both consumer warpgroups store dS^T [B_c keys][B_r queries] from their accumulator registers as the
    kernel does (its `ds_tile + (t / 8) * (BC * 128) + r * 128 + (((t % 8) ^ g) << 4) + 4 * q`, r = key_row0
    + g + 8h); returns each store instruction's 32 byte addresses."""
    BR = dsT.shape[1]
    bits = dsT.view(np.uint16)
    instructions = []
    for cwg in range(2):
        for wq in range(4):
            key_row0 = 64 * cwg + 16 * wq
            for t in range(BR // 8):
                for h in range(2):
                    addrs = []
                    for lane in range(32):
                        g, q = divmod(lane, 4)
                        r = key_row0 + g + 8 * h
                        byte = base + (t // 8) * (BC * 128) + r * 128 + (((t % 8) ^ g) << 4) + 4 * q
                        # accumulator elements (row r, columns 8t + 2q, +1): the low half is the lower column
                        mem[byte // 2], mem[byte // 2 + 1] = bits[r, 8 * t + 2 * q], bits[r, 8 * t + 2 * q + 1]
                        addrs.append(byte)
                    instructions.append(addrs)
    return instructions


def stmatrix_ds_tile(mem, base, dsT: np.ndarray) -> list[list[int]]:
    """V8B_BR80: both consumer warpgroups store dS [B_r queries][B_c keys] from their dS^T accumulator registers
    with stmatrix .x4 .trans as the kernel does (lane l: row l % 8 of tile l / 8 at `panel + x * 128 + (((2 *
    wq + (i & 1)) ^ x0) << 4)`; tile i of instruction pp is (t, h) = (2 pp + i / 2, i % 2), whose fragment holds
    keys key_row0 + 8h .. + 7 x queries 8t .. 8t + 7; .trans stores its column x0, the 8 keys of query 8t + x0,
    as that row's 16 bytes); returns each tile's 8 row addresses."""
    BR = dsT.shape[1]
    bits = dsT.view(np.uint16)
    tiles = []
    for cwg in range(2):
        for wq in range(4):
            for pp in range(BR // 16):
                rows: dict[int, list[int]] = {}
                for lane in range(32):
                    i, x0 = lane >> 3, lane & 7
                    t, h = 2 * pp + (i >> 1), i & 1
                    x = 8 * t + x0
                    addr = base + cwg * BR * 128 + x * 128 + (((2 * wq + h) ^ x0) << 4)
                    keys = 64 * cwg + 16 * wq + 8 * h + np.arange(8)
                    mem[addr // 2:addr // 2 + 8] = bits[keys, x]
                    rows.setdefault(i, []).append(addr)
                tiles += rows.values()
    return tiles


def make_desc(saddr: int, lbo: int, sbo: int) -> int:
    """The kernel's make_desc: start address, LBO and SBO in 16-byte units, 128-byte swizzle."""
    return ((saddr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62)


@TILES
def test_opdesc_adds_offsets_exactly(D, br80):
    """V8B_DESC_ADD: a tile's descriptor plus off / 16 is the descriptor make_desc builds at tile + off, for every
    tile and k-step offset of the kernel's products, wherever the block's shared memory starts (1024-aligned,
    below the 256 KB that the start-address field's 18 bits reach): no sum carries into the LBO field."""
    BR, L = query_tile(D, tile_flags(br80)), backward_hopper.layout(D, flags=list(tile_flags(br80)))
    assert L["BR"] == BR and L["DYNAMIC"] + 1024 <= 1 << 18
    tiles = [(L["K_OFF"] + cwg * 64 * 128, 16) for cwg in range(2)] + [(L["V_OFF"], 16)]
    tiles += [(L["K_OFF"] + cwg * BC * 128, BC * 128) for cwg in range(2)]
    tiles += [(L["DS_OFF"] + b * L["DS_BYTES"], 16) for b in range(2)]   # dS as dQ_i^T's K-major B (B_r = 80)
    tiles += [(L[f"{t}_OFF"] + s * L["QO_BYTES"], lbo) for t in ("Q", "DO") for s in range(L["STAGES"])
              for lbo in (16, BR * 128)]
    tiles += [(L["DS_OFF"] + b * L["DS_BYTES"] + h * BC * 128, BC * 128) for b in range(2) for h in range(2)]
    offsets = {panel * n * 128 + within for panel in range(D // 64) for n in (BC, BR) for within in (0, 32, 64, 96)}
    offsets |= {kk * 16 * 128 for kk in range(max(BC, BR) // 16)}
    for base in range(0, (1 << 18) - L["DYNAMIC"], 1024 * 37):
        for tile, lbo in tiles:
            for off in offsets:
                if base + tile + off < L["DYNAMIC"] + base:
                    assert make_desc(base + tile, lbo, 1024) + (off >> 4) == make_desc(base + tile + off, lbo, 1024)


@TILES
def test_operand_layouts_emulated(D, br80):
    """Each wgmma operand the kernel describes, read back through its descriptor, is the matrix it means."""
    BR = query_tile(D, tile_flags(br80))
    rng = np.random.default_rng(D)
    K, V = (rng.integers(-8, 9, (BC, D)).astype(np.float16) for _ in range(2))
    Q, dO = (rng.integers(-8, 9, (BR, D)).astype(np.float16) for _ in range(2))
    dsT = rng.integers(-8, 9, (BC, BR)).astype(np.float16)
    # Layout's offsets (1024-byte aligned; the stage and buffer indices only add whole tiles)
    sK, sV, sQ, sdO = 0, BC * D * 2, 2 * BC * D * 2, 2 * BC * D * 2 + BR * D * 2
    sdS = sdO + BR * D * 2
    mem = np.zeros((sdS + BC * BR * 2) // 2, np.uint16)
    for base, mat in ((sK, K), (sV, V), (sQ, Q), (sdO, dO)):
        tma_write(mem, base, mat)
    if br80:
        for rows in stmatrix_ds_tile(mem, sdS, dsT):   # 8 rows of 16 bytes per 8 x 8 tile: 8 distinct chunks
            assert len({(a // 16) % 8 for a in rows}) == 8, "a dS tile's rows share banks"
    else:
        stores = store_ds_tile(mem, sdS, dsT)
        for addrs in stores:   # 4-byte stores of 32 lanes: 32 distinct banks, one wavefront
            assert len({(a // 4) % 32 for a in addrs}) == 32, "dS^T store has a bank conflict"

    split_rows = BR == 128
    for cwg in range(2):
        # S^T = K_j Q_i^T, dP^T = V_j dO_i^T: issue_sdp's make_desc(sK + panel * BC * 128 + cwg * 64 * 128 +
        # within, 16, 1024) and make_desc(sQ(st) + panel * BR * 128 + within, 16, 1024)
        for kk in range(D // 16):
            panel, within = kk // 4, (kk % 4) * 32
            cols = slice(16 * kk, 16 * kk + 16)
            for sA, sB, A, Bm in ((sK, sQ, K, Q), (sV, sdO, V, dO)):
                a = read_k_major(mem, sA + panel * BC * 128 + cwg * 64 * 128 + within, 64)
                b = read_k_major(mem, sB + panel * BR * 128 + within, BR)
                assert np.array_equal(a, A[64 * cwg:64 * cwg + 64, cols]) and np.array_equal(b, Bm[:, cols])
        # dV += P^T dO_i, dK += dS^T Q_i: B = make_desc(sdO(st) + kk * 16 * 128, BR * 128, 1024), [n = D][k]
        for kk in range(BR // 16):
            for s, Bm in ((sdO, dO), (sQ, Q)):
                b = read_mn_major(mem, s + kk * 16 * 128, BR * 128, D)
                assert np.array_equal(b, Bm[16 * kk:16 * kk + 16, :].T)
        if br80:
            # dQ_i^T's half: A = K_j^T [m = my 64 head-dim columns][k = keys] MN-major, B = dS [n = queries][k =
            # keys] K-major from the stmatrix tile (issue_grads' L::DQ_T descriptors)
            for kk in range(BC // 16):
                keys = slice(16 * kk, 16 * kk + 16)
                a = read_mn_major(mem, sK + cwg * BC * 128 + kk * 16 * 128, BC * 128, 64)
                b = read_k_major(mem, sdS + (kk // 4) * BR * 128 + (kk % 4) * 32, BR)
                assert np.array_equal(a, K[keys, 64 * cwg:64 * cwg + 64].T), (cwg, kk)
                assert np.array_equal(b, dsT[keys, :].T), (cwg, kk)
            continue
        # dQ's half: A = dS [queries][keys] from the stored dS^T, B = K_j [n = head-dim columns][k = keys]
        a_base = sdS + (cwg * BC * 128 if split_rows else 0)
        b_base = sK + (0 if split_rows else cwg * BC * 128)
        rows = slice(64 * cwg, 64 * cwg + 64) if split_rows else slice(0, 64)
        cols = slice(0, 64) if split_rows else slice(64 * cwg, 64 * cwg + 64)
        for kk in range(BC // 16):
            keys = slice(16 * kk, 16 * kk + 16)
            a = read_mn_major(mem, a_base + kk * 16 * 128, BC * 128, 64)
            b = read_mn_major(mem, b_base + kk * 16 * 128, BC * 128, 64)
            assert np.array_equal(a, dsT[keys, rows].T), (cwg, kk)
            assert np.array_equal(b, K[keys, cols].T), (cwg, kk)


# ================================================================ CPU: the tile walk in float64
def band(M: int, N: int, causal: bool, window_left: int = -1, window_right: int = -1) -> tuple[bool, int, int]:
    """(banded, lo, hi) as v8_backward() derives them: row i sees key j iff lo <= j - i <= hi."""
    if causal:
        window_right = 0
    left = N if window_left < 0 or window_left > N else window_left
    right = M if window_right < 0 or window_right > M else window_right
    return left < N or right < M, N - M - left, N - M + right


def visible(M: int, N: int, causal: bool, window_left: int = -1, window_right: int = -1) -> torch.Tensor:
    """[M, N] True where row i sees key j (bottom-right aligned; causal is the window (-1, 0))."""
    _, lo, hi = band(M, N, causal, window_left, window_right)
    d = torch.arange(N)[None, :] - torch.arange(M)[:, None]
    return (d >= lo) & (d <= hi)


def walk(n0: int, M: int, N: int, BR: int, banded: bool, lo: int, hi: int) -> tuple[int, int, int, int]:
    """(it_begin, it_end, plain_begin, plain_end) of the block whose key tile starts at n0 (flash_bwd_ws)."""
    m_tiles = -(-M // BR)
    it_begin, it_end = 0, m_tiles
    if banded:
        first, last = n0 - hi, min(n0 + BC, N) - 1 - lo
        it_begin = 0 if first <= 0 else m_tiles if first >= M else first // BR
        it_end = 0 if last < 0 else min(m_tiles, last // BR + 1)
    plain_begin, plain_end = it_begin, it_end
    if n0 + BC > N:
        plain_begin = plain_end = it_end
    elif banded:
        x, y = n0 + BC - 1 - hi, n0 - lo
        plain_begin = 0 if x <= 0 else min(m_tiles, -(-x // BR))
        plain_end = m_tiles if y >= M - 1 else 0 if y + 1 <= 0 else (y + 1) // BR
        plain_begin = min(max(plain_begin, it_begin), it_end)
        plain_end = min(max(plain_end, plain_begin), it_end)
    return it_begin, it_end, plain_begin, plain_end


def masked(n0: int, it: int, M: int, N: int, BR: int, banded: bool, lo: int, hi: int) -> np.ndarray:
    """[B_c keys][B_r queries] True where the kernel's MASKED step sets P = 0: row key, column 8t + 2q + e
    masked iff 8t + e < first[h] or 8t + e > last[h] (the step's limit lines)."""
    M_pad = -(-M // BR) * BR
    key = n0 + np.arange(BC)[:, None]              # the thread's key row
    col = np.arange(BR)[None, :]
    q = (col % 8) // 2                             # the lane's quad index; its first column is it * B_r + 2q
    col0 = it * BR + 2 * q
    first = np.where(key >= N, M_pad + BR, key - hi - col0 if banded else -1).clip(-1, BR + 8)
    last = np.broadcast_to(key - lo - col0 if banded else BR + 8, first.shape).clip(-1, BR + 8)
    return (col - 2 * q < first) | (col - 2 * q > last)   # 8t + e = col - 2q


def emulate(q, k, v, do, causal: bool, scale: float, window_left: int = -1, window_right: int = -1,
            br80: bool = False):
    """(dq, dk, dv) summed step by step as the kernel's blocks do, in float64, from the same lse and D_i."""
    B, H, M, D = q.shape
    H_kv, N = k.shape[1], k.shape[2]
    banded, lo, hi = band(M, N, causal, window_left, window_right)
    group, BR = H // H_kv, query_tile(D, tile_flags(br80), banded)
    M_pad = -(-M // BR) * BR
    s = torch.einsum("bhmd,bhnd->bhmn", q, k.repeat_interleave(group, 1)) * scale
    s = s.masked_fill(~visible(M, N, causal, window_left, window_right), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    o = p @ v.repeat_interleave(group, 1)
    # bwd_prep: padded row terms
    lse2 = torch.full((B, H, M_pad), math.inf, dtype=torch.float64)
    lse2[:, :, :M] = torch.where(lse == -math.inf, math.inf, lse * math.log2(math.e))
    dvec = torch.zeros(B, H, M_pad, dtype=torch.float64)
    dvec[:, :, :M] = (do * o).sum(-1)
    n_blocks = -(-N // BC)
    pad = lambda t, L: torch.cat([t, t.new_zeros(*t.shape[:2], L - t.shape[2], D)], 2)   # TMA's zero fill
    qp, dop, kp, vp = pad(q, M_pad), pad(do, M_pad), pad(k, n_blocks * BC), pad(v, n_blocks * BC)
    dq_acc = torch.zeros(B, H, M_pad, D, dtype=torch.float64)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    scale_log2 = scale * math.log2(math.e)
    for b in range(B):
        for hk in range(H_kv):
            for j in range(n_blocks):
                n0 = j * BC
                it_begin, it_end, plain_begin, plain_end = walk(n0, M, N, BR, banded, lo, hi)
                K_j, V_j = kp[b, hk, n0:n0 + BC], vp[b, hk, n0:n0 + BC]
                dk_j, dv_j = torch.zeros(BC, D, dtype=torch.float64), torch.zeros(BC, D, dtype=torch.float64)
                for h in range(hk * group, hk * group + group):
                    for it in range(it_begin, it_end):
                        rows = slice(it * BR, it * BR + BR)
                        Q_i, dO_i = qp[b, h, rows], dop[b, h, rows]
                        sT = K_j @ Q_i.T
                        if not plain_begin <= it < plain_end:
                            mask = masked(n0, it, M, N, BR, banded, lo, hi)
                            sT = sT.masked_fill(torch.from_numpy(mask), -math.inf)
                        pT = torch.exp2(sT * scale_log2 - lse2[b, h, rows][None, :])
                        dsT = pT * (V_j @ dO_i.T - dvec[b, h, rows][None, :])
                        dv_j += pT @ dO_i
                        dk_j += dsT @ Q_i
                        dq_acc[b, h, rows] += dsT.T @ K_j
                keys = min(BC, N - n0)
                dk[b, hk, n0:n0 + keys], dv[b, hk, n0:n0 + keys] = dk_j[:keys] * scale, dv_j[:keys]
    return dq_acc[:, :, :M] * scale, dk, dv


def band_gradients(q, k, v, do, visible_mask, scale):
    """float64 (dq, dk, dv) of softmax(scale q k^T, masked) v by autograd (rows with no key: P = 0)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    s = leaves[0] @ leaves[1].repeat_interleave(group, 1).transpose(-1, -2) * scale
    p = torch.nan_to_num(torch.softmax(s.masked_fill(~visible_mask, float("-inf")), -1), nan=0.0)
    return torch.autograd.grad(p @ leaves[2].repeat_interleave(group, 1), leaves, do)


WALK_SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (1, 203), (203, 1), (130, 129), (300, 257), (257, 300)]
# (causal, window_left, window_right): none, causal, and windows that cut tiles on one side, both, or every
# row down to one key (0, 0), a key tile no row sees (right = 0 with M < N: keys past the last row's), and
# sides past every key or row (no bound)
BANDS = [(False, -1, -1), (True, -1, -1), (False, 40, 0), (False, 100, 50), (False, 0, 0), (False, 7, -1),
         (False, -1, 7), (True, 150, 9), (False, 1000, 1000)]


@pytest.mark.parametrize("M,N", WALK_SHAPES)
@TILES
@pytest.mark.parametrize("causal,window_left,window_right", BANDS)
def test_tile_walk_sums_to_the_gradients(causal, window_left, window_right, D, br80, M, N):
    """The blocks' steps (the query tiles a key tile visits, the masked / plain split, per-thread limits,
    padded lse2 and D_i, grouped heads) sum to the float64 gradients; no plain step has an element the mask
    would change, no skipped tile one it would keep, and every visited tile one."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((causal, window_left, window_right, D, M, N)).encode()))
    B, H, H_kv = 1, 4, 2
    q, do = (torch.randn(B, H, M, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, H_kv, N, D, generator=g, dtype=torch.float64) for _ in range(2))
    scale = 0.3
    got = emulate(q, k, v, do, causal, scale, window_left, window_right, br80)
    if window_left < 0 and window_right < 0:
        ref = attention_gradients(q, k, v, do, causal, scale=scale)
    else:
        ref = band_gradients(q, k, v, do, visible(M, N, causal, window_left, window_right), scale)
    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
        # float64 sums in another order (the H200 host's BLAS) differ by a few 1e-9 at these magnitudes; a step
        # taken or skipped wrongly changes an entry by O(1)
        tol = 1e-9 * max(1.0, r.abs().max().item())
        assert torch.allclose(a, r, rtol=1e-9, atol=tol), f"{name}: {(a - r).abs().max().item():.3e}"
    banded, lo, hi = band(M, N, causal, window_left, window_right)
    BR = query_tile(D, tile_flags(br80), banded)
    m_tiles = -(-M // BR)
    for n0 in range(0, N, BC):
        it_begin, it_end, plain_begin, plain_end = walk(n0, M, N, BR, banded, lo, hi)
        assert 0 <= it_begin and it_end <= m_tiles
        assert it_begin >= it_end or it_begin <= plain_begin <= plain_end <= it_end
        for it in range(m_tiles):
            mask = masked(n0, it, M, N, BR, banded, lo, hi)[:, :max(0, min(BR, M - it * BR))]   # rows < M
            if not it_begin <= it < it_end:
                assert mask.all(), f"query tile {it} sees a key of tile {n0} but is skipped"
            else:
                assert not mask.all(), f"query tile {it} sees no key of tile {n0} but is visited"
            if plain_begin <= it < plain_end:
                assert not mask.any(), f"query tile {it} of key tile {n0} runs unmasked but needs a mask"


# the kernel's lines that walk(), masked() and band() above write again in Python: if one changes, so must they
MIRRORED = [
    "if (BR == 80) return r * D + (c ^ (((r >> 1) & 3) << 3));",
    "const long long first = (long long)n0 - hi, last = (long long)min(n0 + BC, N) - 1 - lo;",
    "it_begin = first <= 0 ? 0 : first >= M ? m_tiles : (int)(first / BR);",
    "it_end = last < 0 ? 0 : (int)min((long long)m_tiles, last / BR + 1);",
    "const long long x = (long long)n0 + BC - 1 - hi, y = (long long)n0 - lo;",
    "plain_begin = x <= 0 ? 0 : (int)min((long long)m_tiles, (x + BR - 1) / BR);",
    "plain_end = y >= M - 1 ? m_tiles : y + 1 <= 0 ? 0 : (int)((y + 1) / BR);",
    "plain_begin = min(max(plain_begin, it_begin), it_end);",
    "plain_end = min(max(plain_end, plain_begin), it_end);",
    "auto clamp = [](long long x) { return (int)(x < -1 ? -1 : x > BR + 8 ? BR + 8 : x); };",
    "const long long col0 = (long long)it * BR + 2 * q;",
    "first[h] = clamp(key >= N ? (long long)M_pad + BR : BANDED ? (long long)key - hi - col0 : -1);",
    "last[h] = clamp(BANDED ? (long long)key - lo - col0 : (long long)BR + 8);",
    "if constexpr (MASKED) x = 8 * t + e < first[i >> 1] || 8 * t + e > last[i >> 1] ? -INFINITY : x;",
    "const int left = window_left < 0 || window_left > N ? N : (int)window_left;",
    "const int right = window_right < 0 || window_right > M ? M : (int)window_right;",
    "const bool banded = left < N || right < M;",
    "N - M - left, N - M + right, deterministic, stream};",
    # the dQ writer's turn and the dQ image (V8B_DQ_BULK): turn() and image_float() below
    "const long long first_key = BANDED ? (long long)it * BR + lo : 0;",
    "const int mine = j - (first_key <= 0 ? 0 : (int)(first_key / BC));",
    "const int cwg = split_rows ? r / 64 : c / 64, rr = split_rows ? r % 64 : r, cc = split_rows ? c : c % 64;",
    "const int wq = rr / 16, g = rr % 8, h = (rr / 8) % 2, t = cc / 8, q = (cc % 8) / 2;",
    "return (((cwg * 4 + wq) * 16 + 2 * t + h) * 32 + 4 * g + q) * 2 + c % 2;",
    "float2* img = reinterpret_cast<float2*>(gbase + L::DQ_OFF) + (cwg * 4 + wq) * 16 * 32 + lane;",
    "for (int h = 0; h < 2; ++h) img[(2 * t + h) * 32] = make_float2(dq[4 * t + 2 * h], dq[4 * t + 2 * h + 1]);",
    # a descriptor plus an offset (V8B_DESC_ADD): test_opdesc_adds_offsets_exactly
    "return make_desc(tile, lbo, 1024) + (off >> 4);",
    "return make_desc(tile + off, lbo, 1024);",
    "return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |",
    # the order of the blocks (V8B_HEAD_GROUP): flashattn.book.block_order.block_tile
    "const int n_kt = (N + BC - 1) / BC, block = (int)blockIdx.x;",
    "const int HG = head_group <= 0 || head_group > BH_kv ? BH_kv : head_group;",
    # V8B_HEAD_GROUP -1: flashattn.book.block_order.l2_head_group
    "const long long per_head = (long long)group * M_pad * D * (2 * (long long)elem + 4);",
    "const long long heads = l2 / 2 / per_head;",
    "return l2 <= 0 ? 0 : heads < 1 ? 1 : heads > 0x7fffffffLL ? 0x7fffffff : (int)heads;",
    "const int grp = block / (HG * n_kt), rem = block - grp * HG * n_kt, width = min(HG, BH_kv - grp * HG);",
    "const int bh_kv = grp * HG + rem % width; int n0 = (rem / width) * BC;",
]


def turn(j: int, it: int, BR: int, banded: bool, lo: int) -> int:
    """The dQ writer's place in line for query tile `it` in the deterministic mode (flash_bwd_ws: `mine`)."""
    first_key = it * BR + lo if banded else 0
    return j - (0 if first_key <= 0 else first_key // BC)


@pytest.mark.parametrize("M,N", WALK_SHAPES)
@TILES
@pytest.mark.parametrize("causal,window_left,window_right", BANDS)
def test_deterministic_turns_are_0_1_2_in_key_tile_order(causal, window_left, window_right, D, br80, M, N):
    """For every query tile, the key tiles that visit it (walk) wait for turns 0, 1, 2, ... in the order of
    their blockIdx (lowest key tile first): each turn is taken once and none waits for a tile that never
    comes, so the deterministic mode neither deadlocks nor skips."""
    banded, lo, hi = band(M, N, causal, window_left, window_right)
    BR = query_tile(D, tile_flags(br80), banded)
    visitors: dict[int, list[int]] = {}
    for j, n0 in enumerate(range(0, N, BC)):
        it_begin, it_end, _, _ = walk(n0, M, N, BR, banded, lo, hi)
        for it in range(it_begin, it_end):
            visitors.setdefault(it, []).append(j)
    for it, js in visitors.items():
        assert [turn(j, it, BR, banded, lo) for j in js] == list(range(len(js))), (it, js)


@pytest.mark.parametrize("l2_mib,group,M_pad,D,heads", [
    (60, 1, 8192, 128, 3),     # (2, 16, 8192, 128): a kv head's Q, dO and dQ rows take 8 MiB
    (50, 1, 8192, 128, 3),
    (60, 1, 2048, 64, 30),     # (4, 12, 2048, 64): 1 MiB a head
    (60, 4, 8192, 128, 1),     # grouped heads: four query heads' rows per kv head, 32 MiB: still one head
    (60, 1, 1 << 20, 128, 1),  # longer than half the L2 holds: one head at a time, never none
    (0, 1, 8192, 128, 0),      # no L2 size reported: all heads, the first version's order
])
def test_l2_head_group_fits_half_the_l2(l2_mib, group, M_pad, D, heads):
    """The default order takes as many kv heads at a time as keep their Q, dO and dQ rows in half the L2."""
    got = l2_head_group(l2_mib << 20, group, M_pad, D)
    assert got == heads
    if heads > 0:
        per_head = group * M_pad * D * 8
        assert got * per_head <= (l2_mib << 20) // 2 or got == 1
        assert (got + 1) * per_head > (l2_mib << 20) // 2


@pytest.mark.parametrize("head_group", [0, 1, 2, 3, 4, 40])
@pytest.mark.parametrize("BH_kv,N", [(1, 1), (5, 300), (8, 8192), (7, 129)])
def test_every_block_order_covers_each_key_tile_once_in_key_order(head_group, BH_kv, N):
    """Under every V8B_HEAD_GROUP the launch's blocks take each (kv head, key tile) once; within a head the key
    tiles come in increasing blockIdx (the deterministic mode's turns wait only for lower ones); 0 is the
    heads-fastest order the kernel had before the switch, 1 key tiles first."""
    n_kt = (N + BC - 1) // BC
    tiles = [block_tile(b, BH_kv, N, head_group) for b in range(BH_kv * n_kt)]
    assert sorted(tiles) == [(h, j * BC) for h in range(BH_kv) for j in range(n_kt)]
    for h in range(BH_kv):
        assert [n0 for bh, n0 in tiles if bh == h] == [j * BC for j in range(n_kt)]
    if head_group == 0:
        assert tiles == [(b % BH_kv, b // BH_kv * BC) for b in range(BH_kv * n_kt)]
    if head_group == 1:
        assert tiles == [(b // n_kt, b % n_kt * BC) for b in range(BH_kv * n_kt)]


def test_block_order_figure_counts_the_first_waves_heads():
    """The lab notes' figure: under the first order the first 132 blocks touch every head of (2, 16, 8192, 128);
    under the default and key tiles first, the three heads whose rows fit half of a 60 MiB L2."""
    first_heads = {hg: int((waves(32, 8192, hg, 132) == 0).any(axis=1).sum()) for hg in (0, 3, 1)}
    assert first_heads == {0: 32, 3: 3, 1: 3}
    for hg in (0, 3, 1):
        grid = waves(32, 8192, hg, 132)
        assert np.bincount(grid.ravel()).tolist() == [132] * 15 + [32 * 64 - 15 * 132]


def image_float(D: int, r: int, c: int, BR: int | None = None) -> int:
    """dq_image_float<D, BR>(r, c): where element (r, c) of a query tile's dQ sits in the accumulator's tile."""
    if BR == 80:
        return r * D + (c ^ (((r >> 1) & 3) << 3))
    split_rows = D == 64
    cwg, rr, cc = (r // 64, r % 64, c) if split_rows else (c // 64, r, c % 64)
    wq, g, h, t, q = rr // 16, rr % 8, (rr // 8) % 2, cc // 8, (cc % 8) // 2
    return (((cwg * 4 + wq) * 16 + 2 * t + h) * 32 + 4 * g + q) * 2 + c % 2


@pytest.mark.parametrize("D", [64, 128])
def test_dq_image_is_the_consumers_store_order_and_convert_reads_it_back(D):
    """Every consumer thread's 16 float pairs (rows g, g + 8 of its warp's 16, columns 8t + 2q, +1 of its
    half) land where image_float puts those elements; the map is a permutation of the tile, and four
    consecutive columns from a multiple of 4 are four consecutive, 16-byte aligned floats (bwd_convert's
    float4 loads). Each store instruction (fixed t, h) writes 32 lanes x 8 contiguous bytes: no bank
    conflict."""
    BR = query_tile(D, (BR64,))
    split_rows = D == 64
    seen = np.full(BR * D, -1)
    for cwg in range(2):
        for wq in range(4):
            for lane in range(32):
                g, q = divmod(lane, 4)
                for t in range(8):
                    for h in range(2):
                        pair = (cwg * 4 + wq) * 16 * 32 + lane + (2 * t + h) * 32   # float2 index of the store
                        for e in range(2):
                            r = (64 * cwg if split_rows else 0) + 16 * wq + g + 8 * h
                            c = (0 if split_rows else 64 * cwg) + 8 * t + 2 * q + e
                            assert image_float(D, r, c) == 2 * pair + e, (cwg, wq, lane, t, h, e)
                            seen[2 * pair + e] = r * D + c
    assert sorted(seen) == list(range(BR * D)), "the image is not a permutation of the tile"
    for r in range(BR):
        for c in range(0, D, 4):
            at = image_float(D, r, c)
            assert at % 4 == 0 and [image_float(D, r, c + i) for i in range(4)] == [at + i for i in range(4)]


def test_dq_image_br80_is_conflict_free_and_convert_reads_it_back():
    """V8B_BR80: each consumer thread holds dQ_i^T's rows (head-dim columns c = 64 cwg + 16 wq + g + 8h) x
    columns (queries x = 8t + 2q + e) and stores them one float at a time (the kernel's `img[dq_image_float<D,
    BR>(x, c)]`): per store instruction (fixed t, i) its 32 lanes hit 32 distinct banks; the map is a
    permutation of the tile; four columns from a multiple of 4 stay four consecutive, aligned floats."""
    D, BR = 128, 80
    seen = np.full(BR * D, -1)
    for cwg in range(2):
        for wq in range(4):
            for t in range(BR // 8):
                for i in range(4):
                    banks = set()
                    for lane in range(32):
                        g, q = divmod(lane, 4)
                        x, c = 8 * t + 2 * q + (i & 1), 64 * cwg + 16 * wq + g + 8 * (i >> 1)
                        at = image_float(D, x, c, BR)
                        banks.add(at % 32)
                        seen[at] = x * D + c
                    assert len(banks) == 32, (cwg, wq, t, i)
    assert sorted(seen) == list(range(BR * D)), "the image is not a permutation of the tile"
    for r in range(BR):
        for c in range(0, D, 4):
            at = image_float(D, r, c, BR)
            assert at % 4 == 0 and [image_float(D, r, c + i, BR) for i in range(4)] == [at + i for i in range(4)]


def test_mirrored_lines_are_the_kernels():
    text = " ".join(KERNEL.read_text().split())
    for line in MIRRORED:
        assert " ".join(line.split()) in text, f"kernels/v8_backward.cu changed: update the Python mirror of {line!r}"


# ================================================================ GPU
@pytest.fixture(scope="module")
def bwd():
    if not is_hopper():
        pytest.skip("the v8 backward needs a GPU of compute capability 9.0 (an sm_90a build: wgmma, TMA)")
    from flashattn.loader import build
    return build("v8_backward", archs=["9.0a"], functions=("backward",))


def forward_lse(q, k, v, causal, scale, window=(-1, -1)):
    """(o, lse) of v8's forward_lse; with a window, from it where its binding takes one (kernels/v8.cu was
    gaining window_left, window_right as this file was written), else the float64 reference's, rounded."""
    from flashattn.autograd import forward_module
    if window == (-1, -1):
        return forward_module("v8").forward_lse(q, k, v, causal, scale)
    if "window_left" in binding_params(source("v8"), "forward_lse"):
        return forward_module("v8").forward_lse(q, k, v, causal, scale, *window)
    M, N, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    s = s.masked_fill(~visible(M, N, causal, *window).to(q.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0) @ v.double().repeat_interleave(group, 1)
    return o.to(q.dtype), lse.float()


def workspace_like(q, flags: tuple[str, ...] = ()) -> torch.Tensor:
    """A float32 tensor of the binding's workspace size in a build with these -D flags
    (v8_backward_workspace_bytes: dQ accumulator and row terms padded for either instance's query tile, and
    the turns)."""
    B, H, M, D = q.shape
    D = tile_dim(D)   # the accumulator has the tiles' columns
    tiles = {query_tile(D, flags, banded) for banded in (False, True)}
    rows = B * H * max(-(-M // t) * t for t in tiles)
    return q.new_empty(rows * (D + 2) + rows // min(tiles), dtype=torch.float32)


def ours(bwd, q, k, v, do, causal, scale=None, window=(-1, -1), deterministic=False, flags=()):
    """(dq, dk, dv) of v8's forward_lse and the v8 backward (bwd: a build with these -D flags), the memory they
    get poisoned with NaN first."""
    o, lse = forward_lse(q, k, v, causal, scale, window)
    conftest.poison_allocator(q, k, v, workspace_like(q, tuple(flags)))   # dq, dk, dv and the workspace
    if window == (-1, -1):   # the binding's own parameters, as v6's backward has them without a window
        got = bwd.backward(q, k, v, o, lse, do, causal, deterministic, scale)
    else:
        got = bwd.backward(q, k, v, o, lse, do, causal, deterministic, scale, *window)
    torch.cuda.synchronize()
    return got


def check(bwd, B, H, H_kv, M, N, D, dtype, causal, seed, scale=None, q_scale=1.0):
    q, k, v, do = make(B, H, H_kv, M, N, D, dtype, seed, q_scale)
    return compare_grads(ours(bwd, q, k, v, do, causal, scale), q, k, v, do, causal, scale)


DTYPES = conftest.HALF_DTYPES
SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (1, 203), (203, 1), (1023, 1025), (1025, 1023), (128, 128),
          (1, 1025), (1025, 17)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("D", GRAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gradients_match(bwd, dtype, causal, D, M, N):
    seed = zlib.crc32(repr(("v8b", dtype, causal, D, M, N)).encode())
    B, H = ((1, 1), (2, 3), (3, 2))[seed % 3]
    check(bwd, B, H, H, M, N, D, DTYPES[dtype], causal, seed)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("M,N", [(113, 203), (203, 113), (1, 203), (1025, 1023)])
@pytest.mark.parametrize("H,H_kv", [(8, 1), (6, 2), (32, 8)])
@pytest.mark.parametrize("D", GRAD_DIMS)
def test_grouped_query_heads(bwd, D, H, H_kv, M, N, causal, scale):
    """dk, dv shaped like k, v: each kv head's sum over the query heads of its group (one block walks them)."""
    seed = zlib.crc32(repr(("v8b gqa", D, H, H_kv, M, N, causal, scale)).encode())
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    check(bwd, (1, 2)[(seed >> 1) % 2], H, H_kv, M, N, D, dtype, causal, seed, scale)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("q_scale,scale", [(8.0, None), (1.0, 2.5)])   # scores of magnitude ~30 and more
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", GRAD_DIMS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_large_logits(bwd, dtype, D, causal, q_scale, scale):
    check(bwd, 2, 4, 2, 300, 517, D, DTYPES[dtype], causal, seed=11 + D, scale=scale, q_scale=q_scale)


def compare_band_grads(got, q, k, v, do, vis, scale):
    """compare_grads' rule for a sliding window: each relative error against float64 autograd at most twice
    PyTorch's own (SDPA with the band as a boolean mask, or the masked math in the same dtype where SDPA
    gives NaN for rows with no key), plus its slack; finite; rows with no key get dq = 0."""
    import torch.nn.functional as F
    dtype = q.dtype
    ref = band_gradients(q.double(), k.double(), v.double(), do.double(), vis, scale)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, attn_mask=vis, scale=scale, enable_gqa=True)
    torch_grads = torch.autograd.grad(out, leaves, do)
    if not all(torch.isfinite(t).all() for t in torch_grads):
        torch_grads = band_gradients(q, k, v, do, vis, scale)
    floor = 1e-3 * torch.linalg.vector_norm(do.double()).item()
    for name, g, r, t in zip(("dq", "dk", "dv"), got, ref, torch_grads):
        assert g.dtype == dtype and g.shape == r.shape
        assert torch.isfinite(g).all(), f"{name}: non-finite element (unwritten or NaN)"
        e_ours, e_torch = rel_err(g, r, floor), rel_err(t, r, floor)
        slack = 0.5 * torch.finfo(dtype).eps * floor / max(torch.linalg.vector_norm(r).item(), floor)
        assert e_ours <= 2 * e_torch + slack, f"{name}: relative error {e_ours:.3e} > 2 x PyTorch's {e_torch:.3e}"
    assert (got[0][:, :, ~vis.any(-1)] == 0).all(), "rows with no key in their window must get dq = 0"


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal,window", [(False, (40, 0)), (False, (100, 50)), (False, (0, 0)), (False, (7, -1)),
                                           (False, (-1, 7)), (True, (150, -1)), (False, (1000, 1000))])
@pytest.mark.parametrize("M,N", [(113, 203), (203, 113), (1025, 1023), (300, 300)])
@pytest.mark.parametrize("D", GRAD_DIMS)
def test_sliding_window(bwd, D, M, N, causal, window):
    """window_left, window_right (v6_backward's parameters, -1 no bound): masked tiles on both edges of
    the band, tiles no row sees skipped, key tiles no row sees at all get dK = dV = 0."""
    seed = zlib.crc32(repr(("v8b window", D, M, N, causal, window)).encode())
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    q, k, v, do = make(2, 4, 2, M, N, D, dtype, seed)
    scale = 0.2
    got = ours(bwd, q, k, v, do, causal, scale, window)
    compare_band_grads(got, q, k, v, do, visible(M, N, causal, *window).to(q.device), scale)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", GRAD_DIMS)
def test_dk_dv_repeat_bit_for_bit(bwd, D, causal):
    """dK and dV never go through atomics (a block sums its key tile over the group in registers): the same
    bits on every run. dQ's float32 atomics may add in another order: close, not necessarily equal."""
    q, k, v, do = make(2, 6, 2, 1025, 777, D, torch.bfloat16, seed=D + causal)
    first = ours(bwd, q, k, v, do, causal)
    second = ours(bwd, q, k, v, do, causal)
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])
    assert torch.allclose(first[0].float(), second[0].float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@needs_hopper
def test_bad_inputs_refused(bwd):
    """RuntimeError naming the argument, before any launch; a good call still works afterwards."""
    q, k, v, do = make(1, 2, 1, 33, 40, 64, torch.bfloat16, seed=3)
    o, lse = forward_lse(q, k, v, False, None)
    good = dict(q=q, k=k, v=v, o=o, lse=lse, dout=do)
    r80 = lambda L: torch.randn(1, 2, L, 80, device="cuda", dtype=torch.bfloat16)
    bad = [("q", dict(q=q.cpu())), ("k", dict(k=k.cpu())), ("o", dict(o=o.cpu())), ("dout", dict(dout=do.cpu())),
           ("lse", dict(lse=lse.cpu())), ("q", dict(q=q.float())), ("k", dict(k=k.half())), ("v", dict(v=v.half())),
           ("o", dict(o=o.half())), ("dout", dict(dout=do.half())), ("lse", dict(lse=lse.double())),
           ("q", dict(q=r80(33), k=r80(40)[:, :1], v=r80(40)[:, :1], o=r80(33), dout=r80(33))),
           ("dout", dict(dout=do.transpose(2, 3).contiguous().transpose(2, 3))), ("lse", dict(lse=lse[..., :-1]))]
    for name, change in bad:
        args = dict(good, **change)
        with pytest.raises(RuntimeError, match=rf"\b{name}\b"):
            bwd.backward(args["q"], args["k"], args["v"], args["o"], args["lse"], args["dout"], False, False, None)
    dq, dk, dv = bwd.backward(q, k, v, o, lse, do, False, False, None)
    assert torch.isfinite(dq).all() and dk.shape == k.shape and dv.shape == v.shape


# ================================================================ GPU: compute-sanitizer
# B, H, H_kv, M, N: a square one, M > N with rows that see no key (causal), odd tails both ways, grouped heads
SANITIZE_SHAPES = [(1, 2, 2, 64, 64), (1, 1, 1, 300, 20), (2, 4, 2, 200, 333), (1, 3, 1, 129, 257)]


# (causal, window, deterministic): the deterministic mode's turn counters and waits run under the tools too
SANITIZE_MASKS = [(False, (-1, -1), False), (True, (-1, -1), False), (False, (40, 8), False), (True, (-1, -1), True),
                  (False, (40, 8), True)]


def step_build(flag: str | None):
    """The default build (None), or the build with the -D flags of a measured step (one, or several separated
    by spaces) under a module name of its own."""
    from flashattn.loader import build
    if flag is None:
        return build("v8_backward", archs=["9.0a"], functions=("backward",))
    name = "_".join(f.removeprefix("-DV8B_").replace("=", "").lower() for f in flag.split())
    return build("v8_backward", extra_cuda_cflags=flag.split(), archs=["9.0a"], functions=("backward",),
                 module_name=f"flashattn_v8_backward_{name}")


# the step builds the sanitizer runs besides the default, on a small and an odd shape
# (V8B_EARLY_DV=1 spills at B_r = 80: it was measured at 64)
SANITIZE_STEPS = [f"{BR64} -DV8B_EARLY_DV=1", "-DV8B_STAGES=3", BR64, f"{BR64} -DV8B_STAGES=3", "-DV8B_ROW_PREFETCH=2",
                  "-DV8B_ROW_PREFETCH=0", "-DV8B_ROW_PREFETCH=3"]


def sanitize_target(flag: str | None = None) -> None:
    """What the sanitizer runs: every shape at every head dim (a step build: the first and third shapes at 64
    and 128), no mask, causal and a window, bf16, one line per call."""
    mod, flags = step_build(flag), build_flags(flag)
    for B, H, H_kv, M, N in SANITIZE_SHAPES if flag is None else SANITIZE_SHAPES[0:3:2]:
        for D in GRAD_DIMS if flag is None else (64, 128):
            for causal, window, det in SANITIZE_MASKS:
                q, k, v, do = make(B, H, H_kv, M, N, D, torch.bfloat16, seed=M + N + D)
                # refused before any launch where the kernel has no dQ image
                if det and not has_image(D, flags, causal or window != (-1, -1)):
                    with pytest.raises(RuntimeError, match=r"needs the bulk dQ reduction"):
                        ours(mod, q, k, v, do, causal, None, window, det, flags)
                    print(f"ran v8b B={B} M={M} N={N} D={D}: deterministic=True refused", flush=True)
                    continue
                dq, dk, dv = ours(mod, q, k, v, do, causal, None, window, det, flags)
                assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
                print(f"ran v8b B={B} H={H} H_kv={H_kv} M={M} N={N} D={D} causal={causal} window={window} "
                      f"deterministic={det}", flush=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (300, 40))])
@pytest.mark.parametrize("H,H_kv,M,N,D", [(4, 4, 1023, 1025, 128), (6, 2, 2048, 1500, 64), (8, 8, 513, 4096, 128),
                                         (4, 2, 777, 1500, 96)])
def test_deterministic_mode_is_bitwise_repeatable(bwd, H, H_kv, M, N, D, causal, window):
    """deterministic=True: dq, dk, dv identical bit for bit in three runs (many key tiles add into each dQ
    tile, with other work on the GPU between runs), within compare_grads' bound of float64, and close
    to the default mode's."""
    q, k, v, do = make(2, H, H_kv, M, N, D, torch.bfloat16, seed=M + N + D + H)
    runs = []
    for _ in range(3):
        runs.append(ours(bwd, q, k, v, do, causal, 0.2, window, deterministic=True))
        torch.randn(1 << 24, device="cuda").sum()   # shift the timing of the next run
    for again in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], again)), "deterministic runs differ"
    compare_grads(runs[0], q, k, v, do, causal, 0.2, window)
    default = ours(bwd, q, k, v, do, causal, 0.2, window)
    torch.testing.assert_close(runs[0][0], default[0], rtol=2e-2, atol=2e-2)
    assert torch.equal(runs[0][1], default[1]) and torch.equal(runs[0][2], default[2]), \
        "dK and dV do not depend on the mode"


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_dq_atomics_build_matches_float64_and_refuses_deterministic(causal):
    """The first version's dQ path (V8B_DQ_BULK=0: 16 red.global per consumer thread and step), kept as a
    measured step, still computes the same gradients; its binding refuses deterministic=True by name."""
    from flashattn.loader import build
    mod = build("v8_backward", extra_cuda_cflags=["-DV8B_DQ_BULK=0"], archs=["9.0a"], functions=("backward",),
                module_name="flashattn_v8_backward_dq_atomics")
    q, k, v, do = make(2, 4, 2, 203, 1025, 128, torch.float16, seed=7)
    compare_grads(ours(mod, q, k, v, do, causal), q, k, v, do, causal)
    with pytest.raises(RuntimeError, match=r"deterministic=True needs the bulk dQ reduction"):
        ours(mod, q, k, v, do, causal, deterministic=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("flag", ["-DV8B_HEAD_GROUP=0", "-DV8B_HEAD_GROUP=1", "-DV8B_HEAD_GROUP=4",
                                  "-DV8B_DESC_ADD=0", "-DV8B_UNIFORM_WG=1", "-DV8B_EARLY_DV=0",
                                  f"{BR64} -DV8B_EARLY_DV=1", "-DV8B_STAGES=3",
                                  "-DV8B_ROW_PREFETCH=0", "-DV8B_ROW_PREFETCH=1", "-DV8B_ROW_PREFETCH=2",
                                  "-DV8B_ROW_PREFETCH=3", "-DV8B_DET_ROW_PREFETCH=4"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_builds_match_the_default_bit_for_bit(flag, D, causal):
    """Other orders of the blocks (V8B_HEAD_GROUP), descriptors made for every wgmma (V8B_DESC_ADD=0) or in
    uniform registers (V8B_UNIFORM_WG=1), dV_j
    issued elsewhere in the step (V8B_EARLY_DV), a third slot (V8B_STAGES=3) and the row terms loaded early
    (V8B_ROW_PREFETCH; V8B_DET_ROW_PREFETCH=4, the deterministic mode's banded kernel at D = 128 as it was
    before it had its own placement) compute the same gradients: dK
    and dV bit for bit as the default build (each written once, from the same sums in the same order), and in
    the deterministic mode dQ too (the key tiles add in index order whatever order the blocks start in). A step
    measured at B_r = 64 is held against the default build of that tile (V8B_BR80=0)."""
    mod, flags = step_build(flag), build_flags(flag)
    q, k, v, do = make(3, 6, 3, 333, 1025, D, torch.bfloat16, seed=len(flag) + D)
    got = ours(mod, q, k, v, do, causal, flags=flags)
    compare_grads(got, q, k, v, do, causal)
    base = tuple(f for f in flags if f == BR64)
    default = step_build(" ".join(base) or None)
    ref = ours(default, q, k, v, do, causal, flags=base)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    if not has_image(D, flags, causal):   # three slots at D = 64 or B_r = 80: red.global, no turns
        with pytest.raises(RuntimeError, match=r"deterministic=True needs the bulk dQ reduction"):
            ours(mod, q, k, v, do, causal, deterministic=True, flags=flags)
        return
    det = [ours(m, q, k, v, do, causal, deterministic=True, flags=f) for m, f in ((mod, flags), (mod, flags),
                                                                                  (default, base))]
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(*det))


# (B, H, H_kv, M, N) for the query tiles: tiles of 80 cut at both ends, M != N both ways, one row, grouped heads
TILE_SHAPES = [(1, 1, 1, 1, 1), (2, 3, 3, 17, 17), (2, 2, 2, 113, 203), (2, 2, 2, 203, 113), (1, 6, 2, 1023, 1025),
               (1, 4, 4, 1025, 1023), (2, 2, 2, 1, 1025), (1, 8, 1, 333, 1025), (1, 2, 2, 160, 160)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("flag", [None, "-DV8B_STAGES=3", BR64, f"{BR64} -DV8B_STAGES=3"],
                         ids=["br80", "br80_stages3", "br64", "br64_stages3"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", GRAD_DIMS)
@pytest.mark.parametrize("B,H,H_kv,M,N", TILE_SHAPES)
def test_query_tile_builds_match_float64(flag, causal, D, B, H, H_kv, M, N):
    """Both query tiles of the unbanded D = 128 kernel (B_r = 80 with dQ_i^T = K_j^T dS_i^T, the default, and
    the first versions' 64, V8B_BR80=0), each with 2 and 3 slots (at B_r = 80 three leave no room for the image:
    dQ leaves by red.global), against float64 within twice SDPA's error, bf16 and fp16; the kernels V8B_BR80
    does not change (banded, D = 64) give dK and dV bit for bit as the default build; the deterministic mode
    (where the build has the image) repeats bit for bit."""
    mod, flags = step_build(flag), build_flags(flag)
    dtype = list(DTYPES.values())[(M + N + D) % len(DTYPES)]
    q, k, v, do = make(B, H, H_kv, M, N, D, dtype, seed=M * 7 + N + D)
    got = compare_grads(ours(mod, q, k, v, do, causal, flags=flags), q, k, v, do, causal)
    if flag is not None and (causal or D == 64):
        ref = ours(step_build(None), q, k, v, do, causal)
        assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2]), "an unchanged kernel changed"
    if not has_image(D, flags, causal):   # no room for the image beside three slots at D = 64 and at B_r = 80
        with pytest.raises(RuntimeError, match=r"deterministic=True needs the bulk dQ reduction"):
            ours(mod, q, k, v, do, causal, deterministic=True, flags=flags)
        return
    det = [ours(mod, q, k, v, do, causal, deterministic=True, flags=flags) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*det)), "deterministic runs differ"
    compare_grads(det[0], q, k, v, do, causal)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_clean(bwd, tool):
    forward_lse(*make(1, 1, 1, 8, 8, 64, torch.bfloat16, seed=0)[:3], False, None)   # build outside the sanitizer
    out, ran = conftest.run_sanitized(tool, Path(__file__).resolve(), "--sanitize", tag="ran v8b ")
    assert len(ran) == len(SANITIZE_SHAPES) * len(GRAD_DIMS) * len(SANITIZE_MASKS), out[-4000:]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("flag", SANITIZE_STEPS)
def test_step_builds_sanitizer_clean(flag, tool):
    step_build(flag)   # built outside the sanitizer
    forward_lse(*make(1, 1, 1, 8, 8, 64, torch.bfloat16, seed=0)[:3], False, None)
    out, ran = conftest.run_sanitized(tool, Path(__file__).resolve(), "--sanitize", flag, tag="ran v8b ")
    assert len(ran) == 2 * 2 * len(SANITIZE_MASKS), out[-4000:]


if __name__ == "__main__" and "--sanitize" in sys.argv:
    rest = sys.argv[sys.argv.index("--sanitize") + 1:]
    sanitize_target(rest[0] if rest else None)
