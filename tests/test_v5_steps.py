"""The V5 chapter's steps (flashattn.measure.variants.SETS["v5-steps"]): macros of kernels/v5.cu, each step the one
before with one more macro switched on, the last one the committed build.

CPU tests (nvcc, no GPU): the committed build is the same machine code as the build with every step macro
spelled out at its default; every step compiles without spills; the SASS shows what each step claims to
change (scalar P stores once ownership is interleaved, cp.async copies, fewer softmax instructions with
exp2, the rescale of O_i folded into FFMA) and leaves the two product loops alone.

GPU tests: every step at both head dims against a float64 reference on odd shapes (1, 17, 113, 203,
1023, 1025; M != N both ways; logits scaled by 25), poisoned outputs, error at most twice SDPA's; and a
compute-sanitizer memcheck and racecheck run per step of this file as its own small driver
(`python tests/test_v5_steps.py --sanitize STEP`).
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import poison_allocator, run_sanitized  # noqa: E402

from flashattn.measure import sass, sweep  # noqa: E402
from flashattn.measure.resources import compile_report  # noqa: E402
from flashattn.measure.variants import SETS, V5_STEPS  # noqa: E402
from flashattn.reference import attention_reference, relative_error, sdpa  # noqa: E402

STEPS = [name for name, _, _ in V5_STEPS]                  # chapter order
MACROS = {name: SETS["v5-steps"][f"d64 {name}"].macros for name in STEPS}
HEAD_DIMS = (64, 128)


def step_flags(step: str) -> tuple[str, ...]:
    return tuple(SETS["v5-steps"][f"d64 {step}"].flags)


def kernel(step: str, D: int) -> sass.Function:
    """The head-dim-D instance (v5::flash_v5_kernel<v5::Tiles<D, ...>, UNROLL>) of the step's build."""
    return sass.function("v5", f"Tiles<{D},", step_flags(step))


def outside_products(fn: sass.Function) -> Counter:
    """Opcodes (with suffix) of the kernel outside its two product loops: copies, softmax, rescale, epilogue."""
    inner = {i.offset for lp in fn.innermost_loops() for i in lp.instructions}
    return Counter(i.opcode + i.suffix for i in fn.instructions if i.offset not in inner)


needs_tools = pytest.mark.skipif(sass.tool_missing_reason() is not None, reason=str(sass.tool_missing_reason()))


def test_chain_is_one_macro_per_step_ending_at_the_committed_build():
    previous = None
    for step in STEPS:
        macros = MACROS[step]
        if previous is not None:
            flipped = [m for m in macros if macros[m] != previous[m]]
            assert len(flipped) == 1, f"{step}: flips {flipped}"
        previous = macros
    assert all(v == 1 for v in MACROS[STEPS[-1]].values()) and set(MACROS[STEPS[0]].values()) == {0}


@needs_tools
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_committed_build_is_the_last_step(D):
    """The macros only add code paths: with every one at its default the SASS is instruction for instruction
    the file as committed (so the chapter's last step is what flashattn.load("v5") runs)."""
    plain = [i.text for i in sass.function("v5", f"Tiles<{D},").instructions]
    spelled = [i.text for i in kernel(STEPS[-1], D).instructions]
    assert plain == spelled


@needs_tools
@pytest.mark.parametrize("step", STEPS)
def test_step_compiles_without_spills(step):
    report = compile_report("v5", "90", step_flags(step))
    assert len(report) == 3, report        # D=128, D=64 and D=64's short-sequence tile (V5_D64_SMALL)
    for k in report:
        assert k.get("spill_store_bytes", 0) == 0 and k.get("stack_bytes", 0) == 0, k
        assert k["registers"] <= 255


@needs_tools
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_sass_shows_each_steps_change(D):
    fns = {step: kernel(step, D) for step in STEPS}
    out = {step: outside_products(fn) for step, fn in fns.items()}
    # the product loops issue the same FFMA and shared loads in every step (their bookkeeping may differ
    # by an instruction or two)
    loops = {step: [(lp.counts()["FFMA"], lp.counts()["LDS"]) for lp in fn.innermost_loops()]
             for step, fn in fns.items()}
    assert len({str(v) for v in loops.values()}) == 1, loops
    for before, step in zip(STEPS, STEPS[1:]):
        flipped = next(m for m in MACROS[step] if MACROS[step][m] != MACROS[before][m])
        count = lambda s, prefix: sum(n for op, n in out[s].items() if op.startswith(prefix))
        if flipped == "V5_CP_ASYNC":      # no copy through registers is left, every copy is an LDGSTS
            assert count(before, "LDGSTS") == 0 and count(before, "LDG.") > 0
            assert count(step, "LDGSTS") > 0 and count(step, "LDG.") == 0
        elif flipped == "V5_EXP2":        # as many MUFU.EX2, fewer instructions around them
            assert count(step, "MUFU.EX2") == count(before, "MUFU.EX2") > 0
            assert sum(out[step].values()) < sum(out[before].values())
        elif flipped == "V5_BLOCKED_PV":  # the FMUL rescale of O_i becomes FFMA (O = fma(O, alpha, PV))
            assert count(step, "FMUL") < count(before, "FMUL") and count(step, "FFMA") > count(before, "FFMA")
            assert count(step, "FMUL") + count(step, "FFMA") == count(before, "FMUL") + count(before, "FFMA")
        elif flipped == "V5_INTERLEAVE":  # a thread's P columns are no longer adjacent: scalar P stores
            assert count(step, "STS.128") < count(before, "STS.128")
            assert count(step, "STS") > count(before, "STS")
        else:
            pytest.fail(f"no SASS check for {flipped}")


# ================================================================ GPU tests
# (B, H, M, N, logit scale): single row and key, tails of every tile, M != N both ways, N < B_c, logits
# scaled by 25 (exp overflows without the running max).
# At D=64 these grids are small enough for the launcher to pick the 64-row tile (V5_D64_SMALL); the last
# one (2,048 blocks of 128 rows on 132 SMs) makes it pick the 128-row tile.
SHAPES = [(1, 1, 1, 1, 1.0), (2, 3, 17, 203, 1.0), (2, 3, 203, 17, 1.0), (1, 2, 113, 113, 1.0),
          (2, 3, 203, 113, 25.0), (1, 2, 1025, 1023, 1.0), (3, 1, 1023, 1025, 25.0), (16, 16, 1023, 65, 25.0)]
_BUILT: dict = {}


def build(step: str):
    """The step's extension, under the module name `python -m flashattn.measure.sweep v5-steps` builds it as (one
    build serves both)."""
    if step not in _BUILT:
        _BUILT[step] = sweep.build(SETS["v5-steps"][f"d64 {step}"])
    return _BUILT[step]


@pytest.mark.gpu
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("step", STEPS)
def test_step_matches_float64(step, D):
    module = build(step)
    for B, H, M, N, scale in SHAPES:
        q, k, v = (torch.randn(B, H, L, D, device="cuda") for L in (M, N, N))
        q = q * scale
        poison_allocator(q)   # an element the kernel forgets to write stays NaN
        out = module.forward(q, k, v, False)
        torch.cuda.synchronize()
        assert out.shape == q.shape and torch.isfinite(out).all(), (step, D, B, H, M, N, scale)
        ref = attention_reference(q, k, v)
        ours, theirs = relative_error(out, ref), relative_error(sdpa(q, k, v), ref)
        # at most twice SDPA's float32 error; one float32 rounding (2^-24) where SDPA happens to be exact
        assert ours <= max(2 * theirs, 2.0 ** -24), \
            f"{step} D={D} {(B, H, M, N, scale)}: {ours:.2e} against SDPA's {theirs:.2e}"


SANITIZE_SHAPES = [(2, 1, 17, 113), (1, 2, 130, 67)]   # B, H, M, N: tails of both tiles, M != N both ways


def sanitize_target(step: str) -> None:
    module = build(step)
    for B, H, M, N in SANITIZE_SHAPES:
        for D in HEAD_DIMS:
            q, k, v = (torch.randn(B, H, L, D, device="cuda") for L in (M, N, N))
            out = module.forward(q, k, v, False)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all()
            print(f"ran v5 step={step!r} B={B} H={H} M={M} N={N} D={D}", flush=True)


@pytest.mark.gpu
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_sanitizer_clean(tool, step):
    build(step)   # outside the sanitizer: nvcc under it is slow
    out, ran = run_sanitized(tool, Path(__file__).resolve(), "--sanitize", step, tag="ran v5 ")
    assert len(ran) == len(SANITIZE_SHAPES) * len(HEAD_DIMS), out[-4000:]


if __name__ == "__main__" and "--sanitize" in sys.argv:
    sanitize_target(sys.argv[sys.argv.index("--sanitize") + 1])
