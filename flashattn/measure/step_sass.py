"""The SASS counts of a step's hot loop (flashattn.measure.sass), for the step sets of the sweep; no GPU needed.

`python -m flashattn.measure.sweep v6-steps` stores them per step as "sass_hot_loop", and tests/test_v6.py checks
that the recorded counts still hold for the kernel file as it is.
"""
from __future__ import annotations

from flashattn import loader
from flashattn.measure import build_cache, geometry, sass
from flashattn.measure.variants import SETS, Variant

HEAD_DIMS = sorted({v.D for vs in SETS.values() for v in vs.values() if v.D})   # every head dim a set times


def v6_kernel(name: str, D: int) -> bool:
    """v6::flash_fwd_mma<T, D, WM, BC, QKS, CAUSAL, STAGES, LAZY, WITH_LSE>: bf16, non-causal, no lse."""
    a = geometry.template_args(name) if "<" in name else []
    return len(a) == 9 and a[0] == "__nv_bfloat16" and a[1] == str(D) and a[5] == "false" and a[8] == "false"


def v5_kernel(name: str, D: int) -> bool:
    """v5::flash_v5_kernel<v5::Tiles<D, B_r, B_c, TM, TN>, UNROLL>: the head-dim-D tile that the timed shape
    runs (at D=64 the 128-row one; the 64-row short-sequence tile is for small grids)."""
    return f"Tiles<{D}, " in name and not (D == 64 and "Tiles<64, 64, " in name)


KERNEL_OF = {"v6": v6_kernel, "v5": v5_kernel}   # version -> the disassembled kernel timed at head dim D


def hot_loop_counts(variant: Variant) -> dict:
    """Instruction classes of the hot loop of the variant's timed kernel (KERNEL_OF: the instance of the timed
    dtype, head dim D, non-causal, forward only; the largest kernel whose name carries D for a version without
    an entry). Remembered next to the builds (flashattn.measure.build_cache) once per set of macros, so the
    head dims of one build and a later timed run share the compile."""
    key = build_cache.key_of(variant.kernel, variant.flags, loader.source(variant.kernel))
    rows = build_cache.remembered("flashattn_steps_sass.json", key,
                                  lambda: hot_loops(variant.kernel, tuple(variant.flags), HEAD_DIMS),
                                  keep=lambda rows: all("error" not in r for r in rows.values()))
    return rows.get(str(variant.D)) or {"error": f"no kernel of {variant.kernel} at D={variant.D}"}


def hot_loops(version: str, flags: tuple, head_dims) -> dict[str, dict]:
    """{str(D): the hot loop's counts (sass.loop_row) and its kernel's name} for each head dim with a kernel."""
    try:
        kernels = sass.disassemble(version, flags)
    except (RuntimeError, ValueError) as err:
        return {str(D): {"error": f"{type(err).__name__}: {str(err)[-300:]}"} for D in head_dims}
    pick = KERNEL_OF.get(version, lambda name, D: f"{D}" in name[name.find("<"):])
    out = {}
    for D in head_dims:
        mine = [f for f in kernels if pick(f.pretty, D)]
        if mine:
            fn = max(mine, key=lambda f: len(f.instructions))
            row = sass.loop_row(fn.hot_loop())
            out[str(D)] = {"kernel": fn.pretty, **{k: v for k, v in row.items() if k != "FFMA share"}}
    return out
