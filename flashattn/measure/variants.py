"""Every step and variant of every chapter, defined once: which kernel file, which -D macros, what it changes.

A Variant is one build of a file in kernels/: the macros that make it (none: the file as committed), the head
dim it is timed at (None: every head dim the build holds) and, for a step of a chapter's chain, the one change
from the step before. SETS holds them by set, each set a dict name -> Variant in the chapter's order:

- "v5", "v6", "v7", "v8": the tile and step variants `python -m flashattn.measure.sweep VERSION` times;
- "v5-steps", "v6-steps": the V5 and V6 chapters' chains (`python -m flashattn.measure.sweep v6-steps`),
  step k being step k-1 with one switch flipped, the last step the file as committed;
- "v7-builds", "v8-builds", "v8-candidates": the builds tests/test_v7.py and tests/test_v8.py compile, check
  and sanitize (both head dims per build; "default" is the file as committed);
- "backward-layouts", "backward-dq", "backward-tile", "backward-det": the backward chapter's steps
  (`python -m flashattn.book.backward_steps --set layouts|dq|tile|det`);
- "v8-backward": the Hopper backward's builds (flashattn.book.backward_hopper_live).

Why each variant is there: docs/v5_design.md, docs/v6_notes.md, docs/v8_notes.md, docs/backward_notes.md.
tests/test_variants.py checks that every macro named here is one its kernel file tests (`#ifndef NAME`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flashattn.loader import KERNELS_DIR


@dataclass(frozen=True)
class Variant:
    name: str                                         # unique within its set; records and chapters use it
    kernel: str                                       # the file kernels/<kernel>.cu
    D: int | None                                     # the head dim it is timed at; None: every one it holds
    macros: dict = field(default_factory=dict)        # -D NAME=VALUE; {} builds the file as committed
    change: str = ""                                  # steps: the one change from the step before

    @property
    def flags(self) -> list[str]:
        """The macros as nvcc flags, in the order they are given."""
        return [f"-D{k}={v}" for k, v in self.macros.items()]

    @property
    def path(self) -> Path:
        return KERNELS_DIR / f"{self.kernel}.cu"


def _by_name(variants) -> dict[str, Variant]:
    return {v.name: v for v in variants}


# ---------------------------------------------------------------------------------------------- V5
def _v5(D, B_r, B_c, TM, TN, **extra) -> Variant:
    """A V5 tile candidate, named d<D>_<B_r>x<B_c>_<TM>x<TN> (+ what else it sets)."""
    tile = {f"V5_D{D}_BR": B_r, f"V5_D{D}_BC": B_c, f"V5_D{D}_TM": TM, f"V5_D{D}_TN": TN}
    # the candidate tile alone: with V5_D64_SMALL the launcher would run its own 64-row tile on the small
    # grids of the correctness check, and the candidate would go unchecked there
    alone = {"V5_D64_SMALL": 0} if D == 64 else {}
    suffix = {"V5_UNROLL": lambda u: f"_u{u}", "V5_BLOCKED_PV": lambda _: "_flat", "V5_MIN_BLOCKS": lambda _: ""}
    name = f"d{D}_{B_r}x{B_c}_{TM}x{TN}" + "".join(suffix[k](v) for k, v in extra.items())
    return Variant(name, "v5", D, {"V5_ONLY_D": D, **tile, **alone, **extra})


V5_TILES = (
    _v5(64, 64, 64, 4, 8),                       # 3 blocks/SM by the arithmetic
    _v5(64, 64, 64, 8, 4),                       # same tile, transposed thread grid
    _v5(64, 64, 64, 4, 8, V5_UNROLL=2),          # shorter loop bodies
    _v5(64, 64, 64, 4, 8, V5_UNROLL=8),          # longer loop bodies
    _v5(64, 64, 64, 4, 8, V5_BLOCKED_PV=0),      # P V summed straight into O_i
    _v5(64, 128, 64, 8, 8),                      # SGEMM's 8x8 tile, 2 blocks/SM
    _v5(64, 96, 64, 6, 8),
    _v5(64, 64, 32, 4, 4),                       # small tiles, 4 blocks/SM
    _v5(64, 128, 32, 4, 4, V5_MIN_BLOCKS=2),     # 256 threads, 16 warps/SM
    _v5(128, 64, 32, 4, 4),
    _v5(128, 96, 32, 6, 4, V5_BLOCKED_PV=0),
    _v5(128, 128, 64, 8, 4),                     # one 256-thread block per SM
)

# kernels/v5.cu's steps: (name, macros set by the step, the one change from the step before). Interleaving
# comes second: in the order first planned (last) the bank conflicts of compact ownership hid the three steps
# before it (results/h200/v5_steps_issue_order.json).
V5_STEPS = (
    ("register tiles", {"V5_CP_ASYNC": 0, "V5_EXP2": 0, "V5_BLOCKED_PV": 0, "V5_INTERLEAVE": 0},
     "T_M x T_N register tiles for both products, plain loads, expf, one running sum, compact ownership"),
    ("interleaved", {"V5_INTERLEAVE": 1}, "rows and columns owned with stride B_r/T_M and B_c/T_N"),
    ("cp.async", {"V5_CP_ASYNC": 1}, "K/V copies with cp.async behind half a tile of arithmetic"),
    ("exp2", {"V5_EXP2": 1}, "p = 2^((s - m) log2(e)/sqrt(D)) with ex2.approx instead of expf"),
    ("blocked PV sum (default)", {"V5_BLOCKED_PV": 1}, "P_ij V_j summed per tile, then added to O_i"),
)


def chain(kernel: str, steps, head_dims=(64, 128)) -> dict[str, Variant]:
    """A chapter's chain, per head dim "d<D> <step>": step k sets every macro of steps 1..k (a later step's
    value wins), so each step is the one before with one change."""
    out = {}
    for D in head_dims:
        macros: dict = {}
        for name, flips, change in steps:
            macros = {**macros, **flips}
            out[f"d{D} {name}"] = Variant(f"d{D} {name}", kernel, D, macros, change)
    return out


# ---------------------------------------------------------------------------------------------- V6
# kernels/v6.cu from the first tensor-core version to the committed one, one macro per step (in the order
# first planned): every switch starts at its simplest setting and the steps turn them on one by one. Both
# head dims share each build, so the pipeline depth is set for both.
V6_STEPS = (
    ("P via shared memory", {"V6_P_SMEM": 1, "V6_SMEM_LAYOUT": 0, "V6_LDMATRIX": 0, "V6_BARRIERS": 2,
                             "V6_D64_STAGES": 1, "V6_D128_STAGES": 1},
     "mma.sync; P stored to shared memory and reloaded as A"),
    ("P in registers", {"V6_P_SMEM": 0}, "P kept in registers (accumulator layout reused as A)"),
    ("padded rows", {"V6_SMEM_LAYOUT": 1}, "shared-memory rows padded by 16 bytes"),
    ("swizzled rows", {"V6_SMEM_LAYOUT": 2}, "XOR swizzle instead of padding"),
    ("ldmatrix", {"V6_LDMATRIX": 1}, "ldmatrix instead of per-thread 32-bit shared loads"),
    ("2 stages", {"V6_D64_STAGES": 2, "V6_D128_STAGES": 2},
     "two-stage cp.async pipeline (tile j+1 loads during tile j)"),
    ("1 barrier (default)", {"V6_BARRIERS": 1}, "one barrier per tile instead of two"),
)
V6_TILES = (
    Variant("d64 (default)", "v6", 64),
    Variant("d64-stages3", "v6", 64, {"V6_D64_STAGES": 3}),
    Variant("d128 (default)", "v6", 128),
    Variant("d128-bc32", "v6", 128, {"V6_D128_BC": 32}),
    Variant("d128-bc48", "v6", 128, {"V6_D128_BC": 48}),
)

# ---------------------------------------------------------------------------------------------- V7
# The steps of the V7 chapter, one interleaved run per head dim. At D=128 the plain-load and extra-stage steps
# need 2 warpgroups (their registers or shared memory leave no room for 3).
V7_TILES = tuple(Variant(name, "v7", int(name[1:name.index(" ")]), macros) for name, macros in (
    ("d64 plain loads, 1 stage", {"V7_TMA": 0, "V7_STAGES": 1}),
    ("d64 plain loads, 2 stages", {"V7_TMA": 0}),
    # the TMA step's two controls, for the blocks per SM that come with it (1 -> 2 at D=64): plain loads held
    # to 128 registers (two blocks per SM, but ptxas spills), and TMA held to one block per SM by 40 KB of
    # shared memory asked for and never used (the same instructions as the default)
    ("d64 plain loads, 2 stages, 2 blocks/SM", {"V7_TMA": 0, "V7_D64_MINB": 2}),
    ("d64 TMA, 2 stages, 1 block/SM", {"V7_SMEM_PAD": 40960}),
    ("d64 TMA, 1 stage", {"V7_STAGES": 1}),
    ("d64 TMA, 2 stages (default)", {}),
    ("d64 TMA, 3 stages", {"V7_STAGES": 3}),
    ("d64 3 WG", {"V7_D64_WG": 3}),
    ("d64 B_c=64", {"V7_D64_BC": 64, "V7_D64_MINB": 2}),
    ("d128 plain loads, 1 stage", {"V7_TMA": 0, "V7_STAGES": 1, "V7_D128_WG": 2}),
    ("d128 plain loads, 2 stages", {"V7_TMA": 0, "V7_D128_WG": 2}),
    ("d128 TMA, 1 stage", {"V7_STAGES": 1}),
    ("d128 TMA, 2 stages, 2 WG", {"V7_D128_WG": 2}),
    ("d128 TMA, 2 stages, 3 WG (default)", {}),
    ("d128 TMA, 3 stages, 2 WG", {"V7_STAGES": 3, "V7_D128_WG": 2}),
    ("d128 B_c=64", {"V7_D128_BC": 64, "V7_D128_WG": 2, "V7_D128_MINB": 2}),
))
# The builds tests/test_v7.py compiles and checks: the default and one build per kind of step, both head dims.
V7_BUILDS = tuple(Variant(name, "v7", None, macros, change) for name, macros, change in (
    ("default", {}, "the file as committed"),
    ("tma0", {"V7_TMA": 0, "V7_D128_WG": 2}, "wgmma fed by plain cp.async loads"),
    ("tma0_stages1", {"V7_TMA": 0, "V7_STAGES": 1, "V7_D128_WG": 2}, "plain loads, one stage"),
    ("tma0_minb2", {"V7_TMA": 0, "V7_D128_WG": 2, "V7_D64_MINB": 2}, "plain loads in 128 registers at D=64"),
    ("smem_pad", {"V7_SMEM_PAD": 40960}, "40 KB of shared memory asked for and never used"),
    ("stages1", {"V7_STAGES": 1}, "one K/V stage"),
    ("stages3", {"V7_STAGES": 3, "V7_D128_WG": 2}, "3 x 64 KB of K/V at D=128 leaves room for 2 WG"),
    ("wg", {"V7_D64_WG": 3, "V7_D128_WG": 2}, "the other warpgroup count per block"),
    ("bc64", {"V7_D64_BC": 64, "V7_D128_BC": 64, "V7_D128_WG": 2, "V7_D64_MINB": 2, "V7_D128_MINB": 2},
     "B_c = 64, two blocks per SM asked"),
))

# ---------------------------------------------------------------------------------------------- V8
# The V8 chapter's steps, one change each, then the extras: a third stage, FlashAttention-3's B_c = 176 (D=128
# only), 2 consumers at D=64 (D=64 only), overlap without ping-pong. "spec0" is v7's loop on v8's barriers (no
# producer, v7's tiles); "tile" gives it v8's computing warpgroups (B_r = 192 at D=64, 128 at D=128), so that
# "spec" adds the producer and nothing else; the last step adds persistent blocks.
# (name, macros, change, the one head dim or None)
V8_STEPS = (
    ("spec0", {"V8_SPECIALIZE": 0}, "v7's loop on v8's barriers", None),
    ("tile", {"V8_SPECIALIZE": 0, "V8_D64_WG": 3, "V8_D128_WG": 2}, "V8's tiles, still no producer", None),
    ("spec", {"V8_SETMAXNREG": 0, "V8_PINGPONG": 0, "V8_OVERLAP": 0, "V8_PERSISTENT": 0},
     "+ producer warpgroup", None),
    ("setmaxnreg", {"V8_PINGPONG": 0, "V8_OVERLAP": 0, "V8_PERSISTENT": 0}, "+ register split", None),
    ("pingpong", {"V8_OVERLAP": 0, "V8_PERSISTENT": 0}, "+ ping-pong", None),
    ("overlap", {"V8_PERSISTENT": 0}, "+ intra-warpgroup overlap", None),
    ("persistent (default)", {}, "+ persistent blocks", None),
    ("stages3", {"V8_STAGES": 3}, "a third K/V slot", None),
    ("bc176", {"V8_D128_BC": 176}, "FlashAttention-3's B_c", 128),
    ("d64wg2", {"V8_D64_WG": 2}, "B_r = 128, 2 consumers", 64),
    ("overlap_nopp", {"V8_PINGPONG": 0, "V8_PERSISTENT": 0}, "overlap without ping-pong", None),
)
# Candidates that did not become the default (docs/v8_notes.md, results/h200/v8_candidates*.json): built,
# checked and sanitized like the steps, timed by the candidate runs rather than the chapter's sweep.
V8_CANDIDATES = tuple(Variant(name, "v8", None, macros, change) for name, macros, change in (
    ("clockfence", {"V8_CLOCK_FENCE": 1}, "the whole softmax in the overlap"),
    ("causal_wg2", {"V8_D64_CAUSAL_WG": 2}, "causal D=64: B_r = 128"),
    ("causal_per_item", {"V8_D64_CAUSAL_PERSISTENT": 0}, "causal D=64: a block per item"),
    ("nosnake", {"V8_SNAKE": 0}, "causal items in plain bands"),
    ("heads3", {"V8_HEAD_GROUP": 3}, "causal items in groups of 3 kv heads (the default: the launcher's head_group)"),
    ("desc_make", {"V8_DESC_ADD": 0, "V8_UNIFORM_WG": 0},
     "every wgmma's descriptors made from its address, the warpgroup index from threadIdx (the first version)"),
))

# ---------------------------------------------------------------------------------------- backward
# Builds of kernels/v6_backward.cu: the atomic mode's dK/dV kernel per head dim (V6B_D*_LAYOUT; 0: bwd_dkdv, a
# warp per 16 keys x the whole head dim; 1: bwd_dkdv_split, FlashAttention-2's warp split; 2: the same with
# stmatrix stores of P^T, dS^T and a 2 x 4 warp split of dQ) and, for layout 2, V6B_SPLIT_FUSE (1: S^T and dP^T
# in one k loop; 3: also dV_j and dK_j), V6B_SPLIT_HEADS_FIRST (non-causal blocks ordered head-fastest, as the
# causal ones are), V6B_SPLIT_STAGES, V6B_DQ_BULK, V6B_D64_BR and V6B_DET_SPLIT. Every entry spells out all the
# macros, so that a change of the file's defaults changes no entry.
def _backward(name: str, change: str, layout: int, fuse: int = 0, heads_first: int = 0, stages: int = 2,
              bulk: int = 0, br: int = 64, det_split: int = 0) -> Variant:
    return Variant(name, "v6_backward", None, {
        "V6B_D64_LAYOUT": layout, "V6B_D128_LAYOUT": layout, "V6B_SPLIT_FUSE": fuse,
        "V6B_SPLIT_HEADS_FIRST": heads_first, "V6B_SPLIT_STAGES": stages, "V6B_DQ_BULK": bulk,
        "V6B_D64_BR": br, "V6B_DET_SPLIT": det_split}, change)


_BULK = "dQ_i summed by one bulk reduction per tile instead of red.global per element pair"
BACKWARD_LAYOUTS = (
    _backward("v6_layout0", "bwd_dkdv: a warp per 16 keys x the whole head dim", 0),
    _backward("v6_layout1", "bwd_dkdv_split: FlashAttention-2's warp split", 1),
    _backward("v6_layout2", "stmatrix stores of P^T, dS^T; a 2 x 4 warp split of dQ", 2),
    _backward("v6_layout2_fuse1", "S^T and dP^T in one k loop", 2, fuse=1),
    _backward("v6_layout2_fuse3", "S^T, dP^T, dV_j and dK_j in one k loop", 2, fuse=3),
    _backward("v6_layout2_heads", "non-causal blocks ordered head-fastest", 2, heads_first=1),
)
# The next step on layout 2: where dQ_i's sum goes and how far ahead Q_i, dO_i are loaded.
BACKWARD_DQ = (
    BACKWARD_LAYOUTS[2],
    _backward("v6_layout2_stages3", "Q_i, dO_i loaded 3 stages ahead", 2, stages=3),
    _backward("v6_layout2_bulk", _BULK, 2, bulk=1),
    _backward("v6_layout2_bulk_stages3", _BULK + ", 3 stages", 2, stages=3, bulk=1),
)
# The step after it, at D=64 only: 128 query rows per tile (B_r) instead of 64, FlashAttention-2's tile at this
# head dim. At D=128 both builds are the same kernel, so their D=128 rows measure the run's own spread.
BACKWARD_TILE = (BACKWARD_DQ[2], _backward("v6_layout2_bulk_br128", "B_r = 128 at D=64", 2, bulk=1, br=128))
# The deterministic mode's dK/dV kernel (V6B_DET_SPLIT): the 4-warp bwd_dkdv it started with, or the atomic
# mode's bwd_dkdv_split without its dQ step; timed in deterministic mode.
BACKWARD_DET = (BACKWARD_TILE[1], _backward("v6_det_split", "deterministic mode on bwd_dkdv_split", 2, bulk=1,
                                            br=128, det_split=1))

# The Hopper backward's builds ("The backward on Hopper": flashattn.book.backward_hopper_live): its first dQ path,
# the order of its blocks, its first way of making descriptors, where dV_j is issued, a third slot, B_r = 80.
V8_BACKWARD = (
    Variant("default", "v8_backward", None),
    Variant("dq_atomics", "v8_backward", None, {"V8B_DQ_BULK": 0}, "dQ by 16 red.global per consumer thread and step"),
    Variant("heads_all", "v8_backward", None, {"V8B_HEAD_GROUP": 0},
            "the blocks ordered all heads first (the first version's order)"),
    Variant("keys_first", "v8_backward", None, {"V8B_HEAD_GROUP": 1}, "the blocks ordered key tiles first"),
    Variant("heads2", "v8_backward", None, {"V8B_HEAD_GROUP": 2}, "the blocks ordered two kv heads at a time"),
    Variant("heads4", "v8_backward", None, {"V8B_HEAD_GROUP": 4}, "the blocks ordered four kv heads at a time"),
    Variant("heads8", "v8_backward", None, {"V8B_HEAD_GROUP": 8}, "the blocks ordered eight kv heads at a time"),
    Variant("desc_make", "v8_backward", None, {"V8B_DESC_ADD": 0}, "make_desc for every wgmma (the first version)"),
    Variant("wg_uniform", "v8_backward", None, {"V8B_UNIFORM_WG": 1},
            "the warpgroup index read from lane 0 (a shuffle), the descriptors in uniform registers (a candidate: "
            "faster at two of the four shapes, slower at the other two)"),
    Variant("wg_lanes", "v8_backward", None, {"V8B_UNIFORM_WG": 0},
            "the warpgroup index from threadIdx in every lane, the descriptors in ordinary registers (the default)"),
    Variant("dv_late", "v8_backward", None, {"V8B_EARLY_DV": 0, "V8B_BR80": 0},
            "dV_j issued with dK_j, after dQ_i (the first version), at B_r = 64 as measured"),
    Variant("dv_before_dp", "v8_backward", None, {"V8B_EARLY_DV": 1, "V8B_BR80": 0},
            "dV_j issued before the wait for dP^T (D=128 at B_r = 64: it spills at 80; D=64 issues it with dK_j)"),
    Variant("stages3", "v8_backward", None, {"V8B_STAGES": 3}, "Q_i, dO_i and the row terms in three slots"),
    Variant("rows1", "v8_backward", None, {"V8B_ROW_PREFETCH": 1},
            "lse2_i's pairs loaded into registers while S^T runs, not after its wait"),
    Variant("rows2", "v8_backward", None, {"V8B_ROW_PREFETCH": 2},
            "lse2_i's pairs while S^T runs and D_i's while dP^T runs"),
    Variant("rows3", "v8_backward", None, {"V8B_ROW_PREFETCH": 3},
            "lse2_i's pairs before the step's wgmmas, D_i's after the wait for dP^T (the default loads D_i's "
            "after P^T's exponentials too)"),
    Variant("rows0", "v8_backward", None, {"V8B_ROW_PREFETCH": 0},
            "lse2_i's and D_i's pairs loaded after the waits for S^T and dP^T (the default loads lse2_i's before "
            "the step's wgmmas are issued and D_i's after P^T's exponentials, where the tile leaves room)"),
    Variant("det_rows3", "v8_backward", None, {"V8B_DET_ROW_PREFETCH": 3},
            "the deterministic mode's banded kernel at D=128 with the row terms of V8B_ROW_PREFETCH=3 (its default "
            "is 0)"),
    Variant("det_rows4", "v8_backward", None, {"V8B_DET_ROW_PREFETCH": 4},
            "the deterministic mode's banded kernel at D=128 with the default mode's row terms (4), one kernel for "
            "both modes as before 0 became its own"),
    Variant("br64", "v8_backward", None, {"V8B_BR80": 0},
            "B_r = 64 at D=128 without a band, dQ_i = dS K_j (the first versions; the default takes 80, "
            "FlashAttention-3's and -4's tile there, with dQ_i^T = K_j^T dS_i^T)"),
)

# ---------------------------------------------------------------------------------------------- sets
SETS: dict[str, dict[str, Variant]] = {
    "v5": _by_name(V5_TILES),
    "v6": _by_name(V6_TILES),
    "v7": _by_name(V7_TILES),
    "v8": {f"d{D} {name}": Variant(f"d{D} {name}", "v8", D, macros, change)
           for D in (64, 128) for name, macros, change, only in V8_STEPS if only in (None, D)},
    "v6-steps": chain("v6", V6_STEPS),
    "v5-steps": chain("v5", V5_STEPS),
    "v7-builds": _by_name(V7_BUILDS),
    "v8-builds": {v.name: v for v in (Variant(name if macros else "default", "v8", None, macros, change)
                                      for name, macros, change, _ in V8_STEPS)},
    "v8-candidates": _by_name(V8_CANDIDATES),
    "backward-layouts": _by_name(BACKWARD_LAYOUTS),
    "backward-dq": _by_name(BACKWARD_DQ),
    "backward-tile": _by_name(BACKWARD_TILE),
    "backward-det": _by_name(BACKWARD_DET),
    "v8-backward": _by_name(V8_BACKWARD),
}
SWEEPS = ("v5", "v6", "v7", "v8", "v6-steps", "v5-steps")   # the sets `python -m flashattn.measure.sweep` runs


def kernel_of(key: str) -> str:
    """The kernel file a set builds: "v6-steps" -> "v6", "backward-dq" -> "v6_backward"."""
    return next(iter(SETS[key].values())).kernel


def is_chain(key: str) -> bool:
    """Whether a set is a chapter's chain of steps (recorded with its order and each step's change)."""
    return key.endswith("-steps")


def backward(name: str) -> Variant:
    """A build of kernels/v6_backward.cu by name, from whichever backward set holds it (a name means the same
    macros in every set)."""
    for key, variants in SETS.items():
        if key.startswith("backward-") and name in variants:
            return variants[name]
    raise KeyError(f"no backward variant named {name!r}")
