"""The chapters' step sets of `python -m flashattn.sweep KEY-steps`: which macros make each step, the SASS
counts of each step's hot loop (no GPU), and the Nsight Compute counters of `--metrics`.

A step set is a chain: step k is step k-1 with one compile-time switch flipped (Variant.change names it),
and the last step is the kernel file as committed. flashattn.records.step_table reads the result.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import geometry


def v6_chain(Variant) -> dict:
    """kernels/v6.cu from the first tensor-core version to the committed one, one macro per step (the
    issue-12 order): every switch starts at its simplest setting and the steps turn them on one by one.
    Both head dims share each build, so the pipeline depth is set for both."""
    chain = [
        ("P via shared memory", {"V6_P_SMEM": 1, "V6_SMEM_LAYOUT": 0, "V6_LDMATRIX": 0, "STAGES": 1,
                                 "V6_BARRIERS": 2}, "mma.sync; P stored to shared memory and reloaded as A"),
        ("P in registers", {"V6_P_SMEM": 0}, "P kept in registers (accumulator layout reused as A)"),
        ("padded rows", {"V6_SMEM_LAYOUT": 1}, "shared-memory rows padded by 16 bytes"),
        ("swizzled rows", {"V6_SMEM_LAYOUT": 2}, "XOR swizzle instead of padding"),
        ("ldmatrix", {"V6_LDMATRIX": 1}, "ldmatrix instead of per-thread 32-bit shared loads"),
        ("2 stages", {"STAGES": 2}, "two-stage cp.async pipeline (load tile j+1 during tile j)"),
        ("1 barrier (default)", {"V6_BARRIERS": 1}, "one barrier per tile instead of two"),
    ]
    out, macros = {}, {}
    for D in (64, 128):
        macros = {}
        for name, flip, change in chain:
            macros.update(flip)
            m = {k: v for k, v in macros.items() if k != "STAGES"}
            m.update({f"V6_D{d}_STAGES": macros["STAGES"] for d in (64, 128)})
            out[f"d{D} {name}"] = Variant(D, m, change)
    # the last step is the file as committed: every macro at its default
    defaults = dict(V6_P_SMEM=0, V6_SMEM_LAYOUT=2, V6_LDMATRIX=1, V6_BARRIERS=1, V6_D64_STAGES=2, V6_D128_STAGES=2)
    for D in (64, 128):
        assert out[f"d{D} 1 barrier (default)"].macros == defaults
    return out


def _v6_kernel(name: str, D: int) -> bool:
    """v6::flash_fwd_mma<T, D, WM, BC, QKS, CAUSAL, STAGES, LAZY, WITH_LSE>: bf16, non-causal, no lse."""
    a = geometry.template_args(name) if "<" in name else []
    return len(a) == 9 and a[0] == "__nv_bfloat16" and a[1] == str(D) and a[5] == "false" and a[8] == "false"


KERNEL_OF = {"v6": _v6_kernel}   # version -> which disassembled kernel is the timed one at head dim D


def sass_counts(version: str, variant) -> dict:
    """Instruction classes of the hot loop (flashattn.sass) of the variant's timed kernel (KERNEL_OF: the
    instance of the timed dtype, head dim D, non-causal, forward only; the largest kernel whose name
    carries D for a version without an entry). No GPU needed."""
    from . import sass, sweep
    try:
        kernels = sass.disassemble(version, tuple(sweep.flags(variant)))
        pick = KERNEL_OF.get(version, lambda name, D: f"{D}" in name[name.find("<"):])
        fn = max([f for f in kernels if pick(f.pretty, variant.D)], key=lambda f: len(f.instructions))
        row = sass.loop_row(fn.hot_loop())
    except (RuntimeError, ValueError, IndexError) as err:
        return {"error": f"{type(err).__name__}: {str(err)[-300:]}"}
    return {"kernel": fn.pretty, **{k: v for k, v in row.items() if k != "FFMA share"}}


def target(key: str, name: str, warmup: int) -> int:
    """What ncu runs for --metrics: the variant's build (from the extension cache), `warmup` calls and
    one more at sweep.METRICS_SHAPE, in the version's timed dtype (its first), non-causal."""
    import torch

    from . import sweep
    from .versions import INFO
    variant = sweep.VARIANTS[key][name]
    module = sweep._build(sweep.kernel_version(key), variant)
    B, H, M, N = sweep.METRICS_SHAPE
    g = torch.Generator(device="cuda").manual_seed(11)
    dtype = INFO[sweep.kernel_version(key)].dtypes[0]
    q, k, v = (torch.randn(B, H, L, variant.D, device="cuda", generator=g).to(dtype) for L in (M, N, N))
    for _ in range(warmup + 1):
        out = module.forward(q, k, v, False)
    torch.cuda.synchronize()
    return 0 if torch.isfinite(out).all().item() else 1


def attach_metrics(doc: dict, key: str, out_dir: Path, warmup: int = 1) -> None:
    """--metrics: every correct variant once under Nsight Compute (flashattn.profile.collect_metrics);
    the counters land in each row's "metrics". Reports are kept in out_dir/<key>_ncu/."""
    from . import profile, sweep
    ncu = profile.find_ncu()
    folder = out_dir / f"{sweep.kernel_version(key)}_steps_ncu"
    folder.mkdir(parents=True, exist_ok=True)
    regex = profile.kernel_filter(sweep.kernel_version(key))
    for r in doc["variants"]:
        if not r.get("correct"):
            continue
        if ncu is None:
            r["metrics"] = {"error": profile.MISSING_NCU}
            continue
        stem = "".join(ch if ch.isalnum() else "_" for ch in r["name"])
        target = [sys.executable, "-m", "flashattn.sweep", key, "--target", r["name"], "--warmup", str(warmup)]
        got = profile.collect_metrics(ncu, target, regex, warmup, folder / stem)
        r["metrics"] = {"shape": [*sweep.METRICS_SHAPE, r["D"]], "dtype": doc["dtype"], "causal": False, **got}
        print(f"metrics {r['name']}: {'ok' if 'counters' in got else got['error'][:200]}", flush=True)
