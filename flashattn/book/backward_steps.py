"""The backward chapter's experiment: the steps of the key-tile kernel timed at the four target shapes."""
from __future__ import annotations

import functools

import torch

from flashattn.autograd import forward_module
from flashattn.measure.backward import backward_call, backward_flops
from flashattn.versions import INFO

# The four target configurations of issue 14: (B, H, M = N, D, causal).
TARGETS = ((4, 12, 2048, 64, False), (2, 16, 8192, 128, False), (4, 12, 2048, 64, True),
           (2, 16, 8192, 128, True))


# Builds of kernels/v6_backward.cu compared by compare_layouts: the atomic mode's dK/dV kernel per head dim
# (V6B_D*_LAYOUT; 0: bwd_dkdv, a warp per 16 keys x the whole head dim; 1: bwd_dkdv_split, FlashAttention-2's
# warp split; 2: the same with stmatrix stores of P^T, dS^T and a 2 x 4 warp split of dQ) and, for layout
# 2, V6B_SPLIT_FUSE (1: S^T and dP^T in one k loop; 3: also dV_j and dK_j) and V6B_SPLIT_HEADS_FIRST
# (non-causal blocks ordered head-fastest, as the causal ones are).
def _macros(layout: int, fuse: int = 0, heads_first: int = 0, stages: int = 2, bulk: int = 0, br: int = 64,
            det_split: int = 0) -> dict:
    return {"V6B_D64_LAYOUT": layout, "V6B_D128_LAYOUT": layout, "V6B_SPLIT_FUSE": fuse,
            "V6B_SPLIT_HEADS_FIRST": heads_first, "V6B_SPLIT_STAGES": stages, "V6B_DQ_BULK": bulk,
            "V6B_D64_BR": br, "V6B_DET_SPLIT": det_split}


# every entry spells out all the macros, so that a change of the file's defaults changes no entry
LAYOUT_VARIANTS = {"v6_layout0": _macros(0), "v6_layout1": _macros(1), "v6_layout2": _macros(2),
                   "v6_layout2_fuse1": _macros(2, fuse=1), "v6_layout2_fuse3": _macros(2, fuse=3),
                   "v6_layout2_heads": _macros(2, heads_first=1)}
# The next step on layout 2: where dQ_i's sum goes (V6B_DQ_BULK: red.global per element pair, or one bulk
# reduction per tile from shared memory) and how far ahead Q_i, dO_i are loaded (V6B_SPLIT_STAGES).
DQ_VARIANTS = {"v6_layout2": _macros(2), "v6_layout2_stages3": _macros(2, stages=3),
               "v6_layout2_bulk": _macros(2, bulk=1), "v6_layout2_bulk_stages3": _macros(2, stages=3, bulk=1)}
# The step after it, at D=64 only: 128 query rows per tile (B_r) instead of 64, FlashAttention-2's tile at this
# head dim. At D=128 both builds are the same kernel, so their D=128 rows measure the run's own spread.
TILE_VARIANTS = {"v6_layout2_bulk": _macros(2, bulk=1), "v6_layout2_bulk_br128": _macros(2, bulk=1, br=128)}
# The deterministic mode's dK/dV kernel (V6B_DET_SPLIT): the 4-warp bwd_dkdv it started with, or the atomic
# mode's bwd_dkdv_split without its dQ step; timed in deterministic mode (compare_layouts(deterministic=True)).
DET_VARIANTS = {"v6_layout2_bulk_br128": _macros(2, bulk=1, br=128),
                "v6_det_split": _macros(2, bulk=1, br=128, det_split=1)}
VARIANTS = {**LAYOUT_VARIANTS, **DQ_VARIANTS, **TILE_VARIANTS, **DET_VARIANTS}


def variant_module(name: str):
    """v6's backward built with the macros of VARIANTS[name], under a module name of its own so
    that all of them load into one process."""
    from flashattn.loader import build, check_device
    check_device("v6")
    flags = [f"-D{k}={v}" for k, v in VARIANTS[name].items()]
    return build(INFO["v6"].backward, extra_cuda_cflags=flags, functions=("backward",),
                 module_name=f"flashattn_v6_backward_{name}")


def compare_layouts(configs=TARGETS, variants=tuple(LAYOUT_VARIANTS), dtype=torch.bfloat16, warmup: int = 25,
                    repetitions: int = 100, rounds: int = 10, max_seconds: float = 3.0,
                    deterministic: bool = False) -> list[dict]:
    """The builds of LAYOUT_VARIANTS (atomic dQ) beside SDPA's flash and cuDNN backward, one interleaved run per
    configuration (flashattn.measure.timing.time_interleaved), rows in the benchmark's backward format; each v6
    row also says whether its dK, dV are bit-identical to the first variant's on the same inputs.
    deterministic=True times the builds' deterministic mode instead, and the last build's atomic mode
    beside them (row "atomic"), for what determinism costs in the same run."""
    import contextlib

    from flashattn.measure.timing import time_interleaved
    modules = {name: variant_module(name) for name in variants}
    rows = []
    for B, H, L, D, causal in configs:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, do = (torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype) for _ in range(2))
        o, lse = forward_module("v6").forward_lse(q, k, v, causal)
        calls, same = {}, {}
        for name, module in modules.items():
            fn = functools.partial(module.backward, q, k, v, o, lse, do, causal, deterministic)
            grads = fn()
            first = same.setdefault("grads", grads)
            same[name] = bool(torch.equal(grads[1], first[1]) and torch.equal(grads[2], first[2]))
            calls[name] = (fn, contextlib.nullcontext)
        del same["grads"]
        if deterministic:
            last = modules[variants[-1]]
            calls["atomic"] = (functools.partial(last.backward, q, k, v, o, lse, do, causal, False),
                               contextlib.nullcontext)
        for name in ("sdpa_flash", "sdpa_cudnn"):
            calls[name] = (backward_call(name, q, k, v, do, causal), contextlib.nullcontext)
        timings = time_interleaved(calls, warmup=warmup, repetitions=repetitions, rounds=rounds,
                                   max_seconds=max_seconds)
        for name, timing in timings.items():
            row = dict(version=name, batch_size=B, num_heads=H, seq_len_q=L, seq_len_kv=L, head_dim=D,
                       dtype=str(dtype).replace("torch.", ""), causal=causal, direction="backward",
                       flops=backward_flops(B, H, L, L, D, causal), dkdv_same_as_first=same.get(name))
            if isinstance(timing, Exception):
                row.update(status="failed", message=str(timing).strip().splitlines()[0][:300])
            else:
                row.update(status="ok", **timing.summary())
                row["tflops"] = row["flops"] / (row["median_us"] * 1e-6) / 1e12
            rows.append(row)
            print(f"{name:>12} B={B} H={H} L={L} D={D} causal={causal}: "
                  f"{row.get('median_us', float('nan')):,.1f} us", flush=True)
    return rows


# B, H, M = N, D of each step's Nsight Compute record (non-causal): the tile step changes only D=64
PROFILE_SHAPES = {"layouts": (2, 16, 8192, 128), "dq": (2, 16, 8192, 128), "tile": (4, 12, 2048, 64)}
NCU_METRICS = ("smsp__inst_executed_op_ldsm.sum,smsp__inst_executed.sum,"
               "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,"
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,"
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,"
               "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")


# The steps main records: the dK/dV layouts; layout 2's dQ sum and pipeline depth; the query tile at D=64;
# the deterministic mode's dK/dV kernel.
STEP_SETS = {"layouts": LAYOUT_VARIANTS, "dq": DQ_VARIANTS, "tile": TILE_VARIANTS, "det": DET_VARIANTS}
# Nsight Compute's builds per step, and for the dQ step its source page too (warp stall samples per SASS
# instruction, which name the instruction a stall sits on)
PROFILED = {"layouts": tuple(LAYOUT_VARIANTS), "dq": ("v6_layout2", "v6_layout2_bulk"), "tile": tuple(TILE_VARIANTS)}
RECORD_NAMES = {"layouts": "backward_layouts", "dq": "backward_dq", "tile": "backward_tile", "det": "backward_det"}
SOURCE_PAGES = ("dq",)   # steps whose record keeps the per-instruction stall samples


def profile_target(step: str = "layouts") -> None:
    """One backward of each of PROFILED[step]'s builds at PROFILE_SHAPES[step], in order: the program
    Nsight Compute runs (main's --profile)."""
    variants = PROFILED[step]
    B, H, L, D = PROFILE_SHAPES[step]
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = forward_module("v6").forward_lse(q, k, v, False)
    modules = [variant_module(name) for name in variants]   # built before the first profiled launch
    for module in modules:
        module.backward(q, k, v, o, lse, do, False, False)
    torch.cuda.synchronize()


def main(argv=None) -> int:
    """A step of the key-tile kernel at the four targets (compare_layouts), or with --profile its Nsight
    Compute record (not for "det"); --set picks the step (STEP_SETS: "layouts", the default, "dq", "tile" or
    "det", whose builds are timed in deterministic mode):

        python -m flashattn.book.backward_steps --json results/h200/backward_layouts.json
        python -m flashattn.book.backward_steps --profile results/h200
        python -m flashattn.book.backward_steps --set dq --json results/h200/backward_dq.json
        python -m flashattn.book.backward_steps --set dq --profile results/h200

    (RECORD_NAMES[set] + '.json' for the book's record of the other steps). --profile runs ncu on
    profile_target (the report goes to a
    temporary folder) and writes <record>_ncu.raw.csv and <record>_ncu.json (which kernel is which) into
    the folder, <record> being RECORD_NAMES[set]; for the steps of SOURCE_PAGES also
    <record>_ncu.source.csv, the stall samples per SASS instruction."""
    import argparse
    import json
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from flashattn.measure import ncu as ncu_pages
    from flashattn.measure.bench import environment, write_json
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--set", choices=tuple(STEP_SETS), default="layouts", help="which step's builds")
    parser.add_argument("--json", type=Path, default=None, help="write {schema, runs: [{meta, rows}]} here")
    parser.add_argument("--profile", type=Path, default=None, help="folder for the Nsight Compute record")
    parser.add_argument("--profile-target", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    variants = PROFILED.get(args.set, ())
    if (args.profile or args.profile_target) and not variants:
        raise SystemExit(f"the {args.set!r} step has no Nsight Compute record (PROFILED)")
    if args.profile_target:
        profile_target(args.set)
        return 0
    if args.profile:
        ncu = shutil.which("ncu")
        if ncu is None:
            raise SystemExit("ncu (Nsight Compute) is not on PATH")
        args.profile.mkdir(parents=True, exist_ok=True)
        name = RECORD_NAMES[args.set]
        # the report itself (megabytes with the source counters) stays out of the folder: the pages written
        # below are what the book reads
        rep = Path(tempfile.mkdtemp()) / f"{name}_ncu"
        sections = ["--section", "SpeedOfLight", "--section", "WarpStateStats"]
        if args.set in SOURCE_PAGES:
            sections += ["--section", "SourceCounters"]
        cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:bwd_dkdv", "--launch-count",
               str(len(variants)), *sections, "--metrics", NCU_METRICS, "--export", str(rep), "--force-overwrite",
               sys.executable, "-m", "flashattn.book.backward_steps", "--set", args.set, "--profile-target"]
        subprocess.run(cmd, check=True)
        raw = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv"], check=True,
                             capture_output=True, text=True).stdout
        (args.profile / f"{name}_ncu.raw.csv").write_text(raw)
        B, H, L, D = PROFILE_SHAPES[args.set]
        info = {"shape": f"B={B}, H={H}, M=N={L}, D={D}, non-causal", "raw_csv": f"{name}_ncu.raw.csv",
                "kernels": list(variants), "command": " ".join(cmd),
                "git_commit": environment([])["git"].get("commit")}
        if args.set in SOURCE_PAGES:
            page = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "source", "--csv",
                                   "--print-source", "sass"], check=True, capture_output=True, text=True).stdout
            ncu_pages.write_source_rows(ncu_pages.split_source_page(page), args.profile / f"{name}_ncu.source.csv",
                                        labels=variants)
            info["source_csv"] = f"{name}_ncu.source.csv"
        (args.profile / f"{name}_ncu.json").write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(rep.parent, ignore_errors=True)
        print(f"wrote {args.profile / f'{name}_ncu.json'}")
        return 0
    if args.set != "layouts":   # these steps are a few percent apart: twice the layouts' repetitions
        rows = compare_layouts(variants=tuple(STEP_SETS[args.set]), repetitions=200, rounds=20,
                               deterministic=args.set == "det")
    else:
        rows = compare_layouts()
    if args.json:
        meta = environment(argv)
        meta["command"] = "python -m flashattn.book.backward_steps " + " ".join(argv or sys.argv[1:])
        write_json({"meta": meta, "rows": rows}, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
