"""The chapters' step sets of `python -m flashattn.sweep KEY-steps`: which macros make each step, the SASS
counts of each step's hot loop (no GPU), and the Nsight Compute counters of `--metrics`.

A step set is a chain: step k is step k-1 with one compile-time switch flipped (Variant.change names it),
and the last step is the kernel file as committed. flashattn.records.step_table reads the result.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
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


_LOCK = threading.Lock()
_IN_FLIGHT: dict = {}


def sass_counts(version: str, variant) -> dict:
    """Instruction classes of the hot loop (flashattn.sass) of the variant's timed kernel (KERNEL_OF: the
    instance of the timed dtype, head dim D, non-causal, forward only; the largest kernel whose name
    carries D for a version without an entry). No GPU needed. Remembered next to the builds
    (TORCH_EXTENSIONS_DIR) under a hash of the kernel text and flags, and computed once per set of
    macros, so the head dims of one build and a later timed run share the compile."""
    from . import loader, sweep
    flags = tuple(sweep.flags(variant))
    key = hashlib.sha256(f"{version}|{list(flags)}|{loader.source(version)}".encode()).hexdigest()
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or tempfile.gettempdir()) / "flashattn_steps_sass.json"
    with _LOCK:
        lock = _IN_FLIGHT.setdefault(key, threading.Lock())
    with lock:                                          # one compile per set of macros, the others wait
        with _LOCK:
            cache = json.loads(path.read_text()) if path.exists() else {}
        if f"{key}|{variant.D}" not in cache:
            rows = _hot_loops(version, flags, sorted({v.D for vs in sweep.VARIANTS.values() for v in vs.values()}))
            with _LOCK:
                cache = json.loads(path.read_text()) if path.exists() else {}
                cache.update({f"{key}|{D}": row for D, row in rows.items()})
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(cache))
    return cache.get(f"{key}|{variant.D}") or {"error": f"no kernel of {version} at D={variant.D}"}


def _hot_loops(version: str, flags: tuple, head_dims) -> dict:
    from . import sass
    try:
        kernels = sass.disassemble(version, flags)
    except (RuntimeError, ValueError) as err:
        return {D: {"error": f"{type(err).__name__}: {str(err)[-300:]}"} for D in head_dims}
    pick = KERNEL_OF.get(version, lambda name, D: f"{D}" in name[name.find("<"):])
    out = {}
    for D in head_dims:
        mine = [f for f in kernels if pick(f.pretty, D)]
        if mine:
            fn = max(mine, key=lambda f: len(f.instructions))
            row = sass.loop_row(fn.hot_loop())
            out[D] = {"kernel": fn.pretty, **{k: v for k, v in row.items() if k != "FFMA share"}}
    return out


def target(key: str, names: list[str], warmup: int = 1) -> int:
    """What ncu runs for --metrics: for each variant in `names`, its build (from the extension cache),
    `warmup` calls and one more at sweep.METRICS_SHAPE, in the version's timed dtype (its first),
    non-causal. ncu profiles every launch; attach_metrics keeps each variant's last."""
    import torch

    from . import sweep
    from .versions import INFO
    B, H, M, N = sweep.METRICS_SHAPE
    dtype = INFO[sweep.kernel_version(key)].dtypes[0]
    finite = True
    for name in names:
        variant = sweep.VARIANTS[key][name]
        module = sweep._build(sweep.kernel_version(key), variant)
        g = torch.Generator(device="cuda").manual_seed(11)
        q, k, v = (torch.randn(B, H, L, variant.D, device="cuda", generator=g).to(dtype) for L in (M, N, N))
        for _ in range(warmup + 1):
            out = module.forward(q, k, v, False)
        torch.cuda.synchronize()
        finite &= bool(torch.isfinite(out).all().item())
    return 0 if finite else 1


def attach_metrics(doc: dict, key: str, out_dir: Path, warmup: int = 1) -> None:
    """--metrics: every correct variant under Nsight Compute in one process
    (flashattn.profile.collect_metrics); the counters of each variant's last launch land in its row's
    "metrics". The report and its raw page stay in out_dir/<version>_steps_ncu.*."""
    from . import profile, sweep
    rows = [r for r in doc["variants"] if r.get("correct")]
    ncu = profile.find_ncu()
    if ncu is None or not rows:
        for r in rows:
            r["metrics"] = {"error": profile.MISSING_NCU}
        return
    target = [sys.executable, "-m", "flashattn.sweep", key, "--warmup", str(warmup),
              "--target", *[r["name"] for r in rows]]
    got = profile.collect_metrics(ncu, target, profile.kernel_filter(sweep.kernel_version(key)),
                                  len(rows) * (warmup + 1), out_dir / f"{sweep.kernel_version(key)}_steps_ncu")
    launches = got.get("launches", [])
    for i, r in enumerate(rows):
        one = launches[i * (warmup + 1) + warmup] if len(launches) == len(rows) * (warmup + 1) else \
            {"error": got.get("error") or f"ncu profiled {len(launches)} launches, expected {len(rows) * (warmup + 1)}"}
        r["metrics"] = {"shape": [*sweep.METRICS_SHAPE, r["D"]], "dtype": doc["dtype"], "causal": False, **one}
        print(f"metrics {r['name']}: {'ok' if 'counters' in one else one['error'][:300]}", flush=True)
