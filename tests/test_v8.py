"""v8 (warp specialization, setmaxnreg, ping-pong, intra-warpgroup overlap; sm_90a): what the compiler made
of every step variant, and what each computes on a Hopper GPU.

CPU tests (nvcc, no GPU): every step variant compiles for sm_90a; ptxas reports no spills, no stack frame
and no warning (C7508 would mean setmaxnreg was ignored); the SASS of every kernel has HGMMA with both
operand kinds and UTMALDG, no local memory; setmaxnreg shows up (USETMAXREG, the producer's release and
the consumers' claim of the values the header gives) exactly where V8_SETMAXNREG is on; the consumer code
fits the registers it claimed; the overlapped loop waits for one wgmma group of two (WARPGROUP.DEPBAR.LE
gsb0, 0x1) and the others do not; the varlen build (FLASHATTN_VARLEN) adds its kernels, fitting the same
way, and leaves the others' SASS as it was; and the file, copied alone, builds with load_inline.

GPU tests (compute capability 9.0 only): the default build against a float64 reference, error at most
twice what PyTorch's SDPA makes in the same dtype (odd shapes, M != N both ways, several B and H, large
logits, poisoned outputs, rows with no key equal to 0), every step variant on fewer shapes, and
compute-sanitizer (memcheck, racecheck, synccheck) per variant, running this file as its own driver
(`python tests/test_v8.py --sanitize VARIANT`). The shared checks come from test_v7.
"""
from __future__ import annotations

import re
import sys
import zlib
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "v8.cu"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_v7  # noqa: E402
from test_v7 import is_hopper, sass_functions  # noqa: E402

from flashattn.book.block_order import causal_balance, causal_item, forward_head_group  # noqa: E402
from flashattn.measure import sass as sass_tools  # noqa: E402
from flashattn.measure.variants import SETS  # noqa: E402
from flashattn.versions import INFO  # noqa: E402

# The chapter's steps, one change each ("default" is the last), and the candidates that did not become the
# default (docs/v8_notes.md, results/h200/v8_candidates*.json): built, checked and sanitized alike.
BUILDS = {name: v.flags for name, v in {**SETS["v8-builds"], **SETS["v8-candidates"]}.items()}


# The kernel's own defaults ("#ifndef V8_X" / "#define V8_X value"), so that a new head dim or a changed
# default reaches the checks below without a second copy of the numbers here.
DEFAULTS = dict(re.findall(r"#ifndef (V8_\w+)\n#define \1 (.+)", KERNEL.read_text()))


def uniform_wg(flags: list[str], D: int, causal: bool) -> bool:
    """Whether the kernel of head dim D reads its warpgroup index from lane 0 (kernels/v8.cu's UNIFORM_WG)."""
    mode = macro(flags, "V8_UNIFORM_WG")
    return mode == 2 or (mode == 1 and causal and D == 128)


def macro(flags: list[str], name: str) -> int:
    """The value a V8_* macro takes under `flags`: its -D there, else the kernel's default, whose other
    macros take their values under `flags` too (the only operator the defaults use is C's `c ? a : b`)."""
    values = dict(f[2:].split("=") for f in flags)
    if name in values:
        return int(values[name])
    expr = re.sub(r"V8_\w+", lambda m: str(macro(flags, m.group())), DEFAULTS[name])
    choice = re.fullmatch(r"\((\d+) \? (\d+) : (\d+)\)", expr)
    return int(choice.group(2) if int(choice.group(1)) else choice.group(3)) if choice else int(expr)


def compile_v8(tmp_path: Path, flags: list[str]) -> tuple[str, str]:
    """test_v7's nvcc + cuobjdump run, on kernels/v8.cu."""
    with mock.patch.object(test_v7, "KERNEL", KERNEL):
        return test_v7.compile_v7(tmp_path, flags)


# (producer, consumer) registers after setmaxnreg per consumer-warpgroup count, as the header gives them
REGISTER_SPLIT = {2: (24, 240), 3: (32, 160)}


HEAD_DIMS = INFO["v8"].head_dims
KERNELS = test_v7.kernel_count("v8")   # the default build's entry functions: dtypes x head dims x masks


def instance(kernel: str) -> tuple[int, int, int, bool, int]:
    """(D, NWG, B_c, CAUSAL, STAGES), the template arguments after the element type of a mangled
    flash_fwd_ws or flash_fwd_varlen name."""
    m = re.search(r"flash_fwd_(?:ws|varlen)I\w+?Li(\d+)ELi(\d+)ELi(\d+)ELb([01])ELi(\d+)E", kernel)
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4) == "1", int(m.group(5))


def head_dim(kernel: str) -> int:
    return instance(kernel)[0]


def tile_dim(d: int) -> int:
    """The head dim of the tiles for tensors of head dim d (whole 64-column panels: 96 runs on 128's tiles,
    with D = 128's macros)."""
    return -(-d // 64) * 64


def is_causal(kernel: str) -> bool:
    return instance(kernel)[3]


def consumers(flags: list[str], d: int, causal: bool = False) -> int:
    """Consumer (computing) warpgroups per block at head dim d under `flags` (V8_D{d}_WG; the causal D=64
    kernel takes V8_D64_CAUSAL_WG)."""
    return macro(flags, "V8_D64_CAUSAL_WG" if causal and d == 64 else f"V8_D{tile_dim(d)}_WG")


def key_tile(flags: list[str], d: int, causal: bool = False) -> int:
    """B_c at head dim d under `flags` (V8_D96_BC: D = 96's unmasked kernel; V8_D128_CAUSAL_BC: the banded kernel
    at D = 96 and 128)."""
    if causal and tile_dim(d) == 128:
        return macro(flags, "V8_D128_CAUSAL_BC")
    return macro(flags, f"V8_D{d if d == 96 else tile_dim(d)}_BC")


def stages(flags: list[str], d: int) -> int:
    """K/V slots at head dim d under `flags`: V8_D{d}_STAGES where the kernel has one (the wide dims, whose
    shared memory has no room for a third), else V8_STAGES."""
    return macro(flags, f"V8_D{d}_STAGES" if f"V8_D{d}_STAGES" in DEFAULTS else "V8_STAGES")


def entry_cap(flags: list[str], d: int, causal: bool = False) -> int:
    """Registers per thread at launch: 65,536 shared by the threads of the blocks that __launch_bounds__
    asks to fit on one SM (1 with a producer; without, 2 where their shared memory fits, as the kernel's
    Layout::MIN_BLOCKS decides), a multiple of 8, at most 255 -- what ptxas may use before any setmaxnreg."""
    spec, wgs = macro(flags, "V8_SPECIALIZE"), consumers(flags, d, causal)
    threads = 128 * (wgs + spec)
    bc, slots, d = key_tile(flags, d, causal), stages(flags, d), tile_dim(d)
    # Q_i, the K/V ring, the barriers (Q full, 4 per slot, Q empty), the 1024 bytes to align the base
    smem = 64 * wgs * d * 2 + slots * 2 * bc * d * 2 + 8 * (2 + 4 * slots) + 1024
    blocks = 2 if not spec and threads <= 256 and 2 * (smem + 1024) <= 228 * 1024 else 1
    return min(255, 65536 // (blocks * threads) // 8 * 8)


def spills_by_design(flags: list[str], kernel: str) -> bool:
    """Whether a kernel's consumers lack the registers for what the header says is live at once per thread
    (O_i D/2, S_ij B_c/2 fp32, P_ij B_c/4 packed): they have their setmaxnreg claim, or without it the
    launch allotment. Only the wide head dims of a build with a producer and no setmaxnreg (the "spec" step,
    168 registers) fall short; the step builds run at D = 64 and 128 only, so their spills never run."""
    d, nwg, bc, causal, _ = instance(kernel)
    live = tile_dim(d) // 2 + bc // 2 + bc // 4
    budget = REGISTER_SPLIT[nwg][1] if macro(flags, "V8_SETMAXNREG") else entry_cap(flags, d, causal)
    return live > budget


@pytest.mark.parametrize("variant", list(BUILDS))
def test_compiles_for_sm90a_without_spills(variant, tmp_path):
    flags = BUILDS[variant]
    report, sass = compile_v8(tmp_path, flags)
    # no stack, no spills (but where the registers fall short by design), no warning (C7508 ...)
    entries = test_v7.ptxas_entries(report, "v8", spills_allowed=lambda name: spills_by_design(flags, name))
    # every head dim, once per dtype and mask
    assert Counter(head_dim(name) for name, _ in entries) == dict.fromkeys(HEAD_DIMS, len(test_v7.DTYPES) * 2)

    setmaxnreg, overlap = macro(flags, "V8_SETMAXNREG"), macro(flags, "V8_OVERLAP")
    for name, regs in entries:
        d, nwg, bc, causal, slots = instance(name)
        # the instance the flags ask for (the wide dims keep their block and stages under any step's flags)
        assert (nwg, bc, slots) == (consumers(flags, d, causal), key_tile(flags, d, causal), stages(flags, d)), name
        cap = entry_cap(flags, d, causal)
        # with setmaxnreg ptxas reports the launch allotment itself; without, what the code needs within it
        assert int(regs) == cap if setmaxnreg else int(regs) <= cap, (name, regs, cap)

    funcs = {name: text for name, text in sass_functions(sass).items() if "flash_fwd_ws" in name}
    assert sorted(funcs) == sorted(name for name, _ in entries)
    for name, text in funcs.items():
        assert re.search(r"HGMMA\.\S+ R\d+, R\d+, gdesc", text), f"{name}: no register-A HGMMA (P V)"
        assert re.search(r"HGMMA\.\S+ R\d+, gdesc", text), f"{name}: no shared-memory HGMMA (Q K^T)"
        assert "UTMALDG" in text, f"{name}: no TMA load"
        spills = bool(re.search(r"\b(LDL|STL)\b", text))
        assert spills == spills_by_design(flags, name), f"{name}: local memory {spills}"
        assert "HMMA" not in text.replace("HGMMA", ""), f"{name} still has mma.sync"
        moves = sass_tools.register_moves(text.splitlines())
        claims, releases = moves["claim"], moves["release"]
        if setmaxnreg:
            producer, consumer = REGISTER_SPLIT[consumers(flags, head_dim(name), is_causal(name))]
            assert releases == [producer], f"{name}: producer release {releases}"
            assert claims == [consumer], f"{name}: consumer claim {claims}"
            # the consumers' code must fit what they claimed: no register index at or past the claim
            top = max(int(r) for r in re.findall(r"\bR(\d+)\b", text))
            assert top < consumer, f"{name}: register R{top} past the {consumer} claimed"
        else:
            assert not claims and not releases, f"{name}: setmaxnreg in a variant without it"
        # overlap: S_{j+1} and P_j V_j in flight, wait until one group is left before the softmax
        assert ("WARPGROUP.DEPBAR.LE gsb0, 0x1" in text) == bool(overlap), f"{name}: wait depth"
        if overlap:
            windows = overlap_windows(text)
            assert windows, f"{name}: no wait for one group of two"
            for _, _, clobbered in windows:
                assert not clobbered, f"{name}: writes a register the P V product in flight uses: {clobbered[:3]}"
            # the last two template bools: PERSISTENT, WITH_LSE
            persistent_d64 = head_dim(name) == 64 and re.search(r"Lb1ELb[01]EEEv", name) is not None
            # so does the unmasked persistent kernel at D = 128 since its descriptors are made once per tile
            # (V8_DESC_ADD), which measured faster all the same (kernels/v8.cu, "Descriptors")
            persistent_d128 = (head_dim(name) == 128 and not is_causal(name) and macro(flags, "V8_DESC_ADD") >= 1
                               and re.search(r"Lb1ELb[01]EEEv", name) is not None)
            # the wide head dims keep few exponentials in the window in ptxas 13.0's schedule (0 to 16 of the
            # B_c / 8 asked, the kernel's header says so); they were timed as they are
            # (results/h200/prefill_wide.json): not asserted until a fence (V8_CLOCK_FENCE) is timed there
            wide = head_dim(name) > 128
            # and so do the key tiles wider than 128 (at B_c = 176, 3 of the 88 exponentials per thread in
            # ptxas 13.0), D = 96's unmasked default among them, timed as they are (forward_candidates key_tile)
            wide_tile = instance(name)[2] > 128
            if variant in ("overlap", "default") and not (persistent_d64 or persistent_d128 or wide or wide_tile):
                # ptxas schedules part of the softmax after the wait (it starts packing P as soon as it
                # can); the unmasked loop must still run a good share of its exponentials in the window
                # (before the fix in the kernel's comments, none did). The persistent D=64 kernel keeps
                # almost none there and was still measured faster (docs/v8_notes.md): not asserted.
                tile = instance(name)[2]
                assert max(n for _, n, _ in windows) >= tile // 8, f"{name}: softmax not overlapped: {windows}"
            if "-DV8_CLOCK_FENCE=1" in flags:
                # the clock read keeps every exponential of a tile (B_c / 2 per thread) inside both loops'
                # windows, the masked one too (what the trace build's stamps did to the schedule)
                tile = instance(name)[2]
                assert min(n for _, n, _ in windows) >= tile // 2, f"{name}: softmax left the window: {windows}"
        # V8_UNIFORM_WG: Q_i's descriptors in uniform registers, so few copies (R2UR) from ordinary ones: at most
        # one per two wgmmas at D <= 128 (7 to 19 for 36 to 76 in ptxas 13.0), where a kernel without it makes
        # one or more per wgmma (31 to 103). The wide dims, and the builds without the producer (spec0, tile:
        # 20 for 32), run short of uniform registers and copy more.
        copies, wgmmas = text.count("R2UR"), text.count("HGMMA")
        if not uniform_wg(flags, head_dim(name), is_causal(name)):
            assert copies >= wgmmas // 2, f"{name}: {copies} R2UR for {wgmmas} wgmma"
        elif head_dim(name) <= 128 and macro(flags, "V8_SPECIALIZE"):
            assert 2 * copies < wgmmas, f"{name}: {copies} R2UR for {wgmmas} wgmma"
        # the fence's clock read and the trace's stamps are the only clock reads: none in other builds
        assert ("SR_CLOCKLO" in text) == ("-DV8_CLOCK_FENCE=1" in flags), f"{name}: clock read"
    # D = 96 runs D = 128's tiles: the same tensor-core work as its D = 128 twin (the chapter "Attention in real
    # models" says the padding costs D = 128's arithmetic), fewer stores of O
    padded = [name for name in funcs if head_dim(name) == 96]
    assert padded
    for name in padded:
        twin = funcs.get(name.replace("Li96E", "Li128E", 1))
        if twin is None:       # another key tile than D = 128's (V8_D96_BC): no twin to compare with
            assert key_tile(flags, 96, is_causal(name)) != key_tile(flags, 128, is_causal(name)), name
            continue
        assert funcs[name].count("HGMMA") == twin.count("HGMMA"), f"{name}: another wgmma count than D = 128's"
        assert funcs[name].count("STG") < twin.count("STG"), f"{name}: stores the padding"


def test_trace_build_stamps_only_where_asked(tmp_path):
    """V8_TRACE=1 (flashattn/book/trace.py's build) adds clock reads, predicated 64-bit stores and the trace
    parameters; the default build has none of them (its SASS is the untraced kernel's: tests above). The
    stamps' indices in flashattn.book.trace agree with the kernel's enums."""
    from flashattn.book import trace
    report, sass = compile_v8(tmp_path, ["-DV8_TRACE=1"])
    names = re.findall(r"Compiling entry function '(\S+)'", report)
    # (..., scale_log2, LSE, the window's band lo, hi, the causal order's head group, then the trace buffer,
    # items, tiles)
    assert len(names) == KERNELS and all(n.endswith("ifPfiiiPyii") for n in names), names
    for name, text in sass_functions(sass).items():
        assert text.count("SR_CLOCKLO") >= 10, f"{name}: stamps missing"
        assert re.search(r"@P\d+ STG\.E\.64", text), f"{name}: no predicated stamp store"
    src = KERNEL.read_text()
    for enum, names_py in (("TraceHeader", trace.HEADER), ("TraceConsumer", trace.CONSUMER),
                           ("TraceProducer", trace.PRODUCER)):
        body = re.search(r"enum " + enum + r" \{([^}]*)\}", src).group(1)
        assert [n.strip().split("_", 1)[1].lower() for n in body.split(",")] == names_py, enum
    shape = re.search(r"enum TraceShape \{ TRACE_ROLES = (\d+), TRACE_WORDS = (\d+) \}", src)
    assert (int(shape.group(1)), int(shape.group(2))) == (trace.ROLES, trace.WORDS)


def test_varlen_build_adds_its_kernels_and_keeps_the_others(tmp_path):
    """FLASHATTN_VARLEN=1 (flashattn.varlen_kernel's build, with FLASHATTN_LSE=1) adds its flash_fwd_varlen
    kernels (with and without lse, as many as the training build's) and their pre-pass (fwd_order_varlen), and
    leaves the flash_fwd_ws kernels of the training build (forward and forward_lse at every dtype, head dim and
    mask) as they were, instruction for
    instruction (their code is shared, flash_fwd_body, with VARLEN a template constant); the varlen kernels
    fit their registers as the others do: no spill, no stack, no local memory, the setmaxnreg split, no
    register past the consumers' claim, the overlapped loop's wait for one group of two."""
    (tmp_path / "lse").mkdir()
    (tmp_path / "varlen").mkdir()
    _, lse = compile_v8(tmp_path / "lse", ["-DFLASHATTN_LSE=1"])
    report, both = compile_v8(tmp_path / "varlen", ["-DFLASHATTN_LSE=1", "-DFLASHATTN_VARLEN=1"])
    normalised = lambda text: [" ".join(line.split()) for line in text.splitlines()]   # noqa: E731
    before, after = sass_functions(lse), sass_functions(both)
    training = 2 * KERNELS   # forward and forward_lse
    assert len(before) == training and all("flash_fwd_ws" in name for name in before)
    varlen = {name: text for name, text in after.items() if "flash_fwd_varlen" in name}
    order = [name for name in after if "fwd_order_varlen" in name]          # the pre-pass, V8_VARLEN_ORDER
    assert len(varlen) == training and len(order) == 1 and len(after) == 2 * training + 1
    assert Counter(head_dim(name) for name in varlen) == dict.fromkeys(HEAD_DIMS, training // len(HEAD_DIMS))
    for name, text in before.items():
        assert normalised(after[name]) == normalised(text), f"{name} changed with FLASHATTN_VARLEN"
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(frames) == 2 * training + 1 and all(f == ("0", "0", "0") for f in frames), frames
    assert not [line for line in report.splitlines() if "warning" in line.lower()]
    for name, text in varlen.items():
        assert not re.search(r"\b(LDL|STL)\b", text), f"{name} uses local memory"
        assert "UTMALDG" in text and "WARPGROUP.DEPBAR.LE gsb0, 0x1" in text, name
        d, _, _, causal, _ = instance(name)
        producer, consumer = REGISTER_SPLIT[consumers([], d, causal)]
        moves = sass_tools.register_moves(text.splitlines())
        assert moves == {"release": [producer], "claim": [consumer]}, (name, moves)
        assert max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) < consumer, name
        assert not any(clobbered for _, _, clobbered in overlap_windows(text)), name


def overlap_windows(sass: str) -> list[tuple[int, int, list[str]]]:
    """flashattn.measure.sass.overlap_windows on cuobjdump's SASS of one kernel (offsets and ';' stripped)."""
    return sass_tools.overlap_windows([re.sub(r"^\s*/\*[0-9a-f]{4,5}\*/\s*", "", line).split(";")[0]
                                       for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,5}\*/", line)])


def test_copied_file_builds_alone(tmp_path):
    """test_v7's copy-alone build (load_inline on the file alone, sm_90a named by the reader) on v8.cu."""
    with mock.patch.object(test_v7, "KERNEL", KERNEL):
        test_v7.test_copied_file_builds_alone(tmp_path)


# ================================================================ GPU tests
needs_hopper = pytest.mark.skipif(not is_hopper(), reason="v8 needs a GPU of compute capability 9.0")


def build_v8(variant: str = "default"):
    from flashattn.loader import build
    return build("v8", archs=["9.0a"], module_name=f"flashattn_v8_{variant}", extra_cuda_cflags=BUILDS[variant])


@pytest.fixture(scope="module")
def v8():
    return build_v8()


# the default build at every shape, large logits, and every step: test_v7's checks, seeds of their own.
# (300, 20) causal has a block whose rows see no key at all (the early exit); 1 and 3 key tiles exercise
# the loop's first and last iterations.
test_matches_float64, test_large_logits, test_variants_match_float64 = test_v7.correctness_tests(
    "v8", "v8", build_v8, BUILDS, [(113, 203), (1025, 1023), (17, 1), (300, 20), (64, 384)], logit_seed=23,
    tag=("v8",))


@pytest.mark.gpu
@needs_hopper
def test_bad_inputs_refused_then_good_call_works(v8):
    # v7's cases but for the head dims: v7's refused 256 is one of v8's, so the refused ones are every other
    # multiple of 32 up to a panel past its widest (160 would be 192's tiles with 32 columns of zeros, not built;
    # 320 has no instance)
    refused = sorted(set(range(32, max(HEAD_DIMS) + 96, 32)) - set(HEAD_DIMS))
    test_v7.refuses_bad_inputs_then_runs(v8, refused_dims=refused)


@pytest.mark.gpu
@needs_hopper
def test_many_heads_tail_tiles_stay_in_their_head(v8):
    test_v7.test_many_heads_tail_tiles_stay_in_their_head(v8)


@pytest.mark.parametrize("B,H,H_kv,M,head_group", [(16, 16, 16, 1024, 60), (2, 16, 16, 8192, 7), (1, 140, 140, 65, 3),
                                                    (4, 20, 5, 300, 8), (3, 7, 7, 1000, 1), (2, 5, 1, 129, 10)])
def test_causal_order_takes_each_row_block_once_longest_first_per_group(B, H, H_kv, M, head_group):
    """flashattn.book.block_order.causal_item, set_item's causal order (V8_HEAD_GROUP): every (head, row block)
    once, groups of head_group heads one after another (the last one smaller where they do not divide B * H), the
    row blocks of a group by descending index, its heads in turn; a group's query heads read whole kv heads."""
    BH, m_blocks = B * H, -(-M // 128)
    seen = [causal_item(i, BH, m_blocks, head_group) for i in range(BH * m_blocks)]
    assert sorted(seen) == [(bh, x) for bh in range(BH) for x in range(m_blocks)]
    for i, ((bh, x), (bh2, x2)) in enumerate(zip(seen, seen[1:])):
        if bh // head_group == bh2 // head_group:   # inside a group: the same row block, or the one below
            assert x2 == x and bh2 == bh + 1 or x2 == x - 1 and bh2 % head_group == 0, (i, seen[i:i + 2])
        else:                                         # the next group starts at its last row block
            assert bh2 == bh + 1 and x == 0 and x2 == m_blocks - 1, (i, seen[i:i + 2])
    group = H // H_kv
    assert head_group % group == 0 or head_group >= BH


def test_causal_head_group_reads_from_the_l2_and_keeps_the_balance():
    """forward_head_group, the launcher's rule, at the causal rows of the FlashAttention-4 table on the H200 (60 MiB
    of L2, 132 SMs): all heads where their K and V fit half the L2; else the smallest group of kv heads whose
    blocks are within BALANCE_SLACK of all heads' balance; all heads where none is (grouped-query heads at 8192,
    whose one-kv-head groups alias with the grid); V8_HEAD_GROUP 0 is all heads, G > 0 G kv heads."""
    l2 = 60 << 20
    assert forward_head_group(l2, 4, 12, 12, 2048, 128, br=192) == 48      # all fit: the first version's order
    assert forward_head_group(l2, 2, 16, 16, 8192, 256) == 1               # 4 MiB per head
    assert forward_head_group(l2, 1, 32, 32, 4096, 256) == 1
    assert forward_head_group(l2, 16, 16, 16, 1024, 256) == 1              # 132 heads' K and V: 66 MiB
    assert forward_head_group(l2, 1, 32, 8, 8192, 256) == 32               # 1 kv head: balance 1.70
    assert forward_head_group(l2, 4, 32, 8, 4096, 256) == 4
    assert forward_head_group(l2, 2, 16, 16, 8192, 256, setting=0) == 32
    assert forward_head_group(l2, 2, 16, 4, 8192, 256, setting=3) == 12
    assert forward_head_group(0, 2, 16, 16, 8192, 256) == 32
    # the balances behind those choices (one kv head's group against all heads)
    assert round(causal_balance(32, 64, 32, 132), 3) == 1.002 and round(causal_balance(32, 64, 1, 132), 3) == 1.031
    assert round(causal_balance(32, 64, 4, 132), 3) == 1.696   # (1, 32 / 8, 8192): a kv head's 4 query heads


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("variant", ["default", "nosnake", "clockfence", "heads3"])
def test_persistent_blocks_take_several_items(variant):
    """More work items than SMs, so that blocks loop: the K/V ring, Q_i's reuse and the ping-pong turns carry
    over from one item to the next; causal with M > N puts items without any key among them."""
    mod = build_v8(variant)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, H, M, N in [(4, 20, 300, 517), (4, 20, 700, 150), (2, 70, 129, 1000)]:
        for D in (64, 128):
            assert B * H * -(-M // 128) > sms   # the loop runs (B_r is 192 or 128)
            for causal in (False, True):
                for dtype in test_v7.DTYPES.values():
                    seed = zlib.crc32(repr((variant, B, M, D, causal, dtype)).encode())
                    test_v7.check(mod, B, H, M, N, D, dtype, causal, seed)


# ---------------------------------------------------------------- compute-sanitizer
# B, H, M, N: a small square one; M > N with a block of rows that see no key (causal); odd tails both ways;
# more heads than SMs (a persistent block takes two items or more)
SANITIZE_SHAPES = [(1, 2, 64, 64), (1, 1, 300, 20), (2, 1, 200, 333), (1, 140, 65, 130)]


sanitize_target, test_sanitizer_clean = test_v7.sanitizer_tests("v8", build_v8, BUILDS, SANITIZE_SHAPES,
                                                                Path(__file__).resolve())


if __name__ == "__main__" and "--sanitize" in sys.argv:
    sanitize_target(sys.argv[sys.argv.index("--sanitize") + 1])
