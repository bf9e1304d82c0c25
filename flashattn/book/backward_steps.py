"""The backward chapter's experiment: the steps of the key-tile kernel timed at the four target shapes
(`python -m flashattn.book.backward_steps --set STEP`, main), and the chapter's live backward timing
(time_backward)."""
from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from flashattn.autograd import forward_module
from flashattn.loader import build, check_device
from flashattn.measure import ncu_pages, results, variants
from flashattn.measure.backward import backward_call, backward_flops
from flashattn.measure.bench import bench_shape
from flashattn.measure.timing import time_interleaved
from flashattn.measure.variants import SETS
from flashattn.versions import INFO

# The four target configurations the backward was tuned for: (B, H, M = N, D, causal).
TARGETS = ((4, 12, 2048, 64, False), (2, 16, 8192, 128, False), (4, 12, 2048, 64, True),
           (2, 16, 8192, 128, True))


# The steps main records (flashattn.measure.variants: "backward-<step>"): the dK/dV layouts; layout 2's dQ sum
# and pipeline depth; the query tile at D=64; the deterministic mode's dK/dV kernel.
STEP_SETS = {step: SETS[f"backward-{step}"] for step in ("layouts", "dq", "tile", "det")}


def variant_module(name: str):
    """v6's backward built with the macros of the backward variant `name` (flashattn.measure.variants.backward),
    under a module name of its own so that all of them load into one process."""
    check_device("v6")
    return build(INFO["v6"].backward, extra_cuda_cflags=variants.backward(name).flags, functions=("backward",),
                 module_name=f"flashattn_v6_backward_{name}")


def time_backward(B: int, H: int, M: int, N: int, D: int, causal: bool, names=("v6", "v6_deterministic",
                  "sdpa_flash", "sdpa_cudnn", "fa4"), dtype=torch.bfloat16, warmup: int = 10, repetitions: int = 50,
                  rounds: int = 10, max_seconds: float = 1.5, host_slack_us: float = 1000.0) -> list[dict]:
    """Backward times of `names` at one shape on fresh random inputs, by the benchmark's own path
    (`flashattn.measure.bench.bench_shape` with dO: interleaved, L2 flushed, median): one row per name, in the
    benchmark's format with "direction": "backward" and TFLOP/s by `backward_flops`. The command line for
    the same is `python -m flashattn.measure.bench --backward NAME ...`; every name goes through
    torch.autograd.grad, with the same host slack (flashattn.measure.timing). FlashAttention-4's row says
    "unsupported" where it does not import."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(B, H, M, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    args = SimpleNamespace(warmup=warmup, repetitions=repetitions, rounds=rounds, max_seconds=max_seconds,
                           host_slack_us=host_slack_us)
    return bench_shape(list(names), q, k, v, causal, args, do=do)


def compare_layouts(configs=TARGETS, names=tuple(STEP_SETS["layouts"]), dtype=torch.bfloat16, warmup: int = 25,
                    repetitions: int = 100, rounds: int = 10, max_seconds: float = 3.0,
                    deterministic: bool = False) -> list[dict]:
    """The backward builds `names` (default: the layout step's, atomic dQ) beside SDPA's flash and cuDNN backward,
    one interleaved run per configuration (flashattn.measure.timing.time_interleaved), rows in the benchmark's
    backward format; each v6 row also says whether its dK, dV are bit-identical to the first build's on the same
    inputs. deterministic=True times the builds' deterministic mode instead, and the last build's atomic mode
    beside them (row "atomic"), for what determinism costs in the same run."""
    modules = {name: variant_module(name) for name in names}
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
            last = modules[names[-1]]
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


# Nsight Compute's builds per step, and for the dQ step its source page too (warp stall samples per SASS
# instruction, which name the instruction a stall sits on)
PROFILED = {"layouts": tuple(STEP_SETS["layouts"]), "dq": ("v6_layout2", "v6_layout2_bulk"),
            "tile": tuple(STEP_SETS["tile"])}
RECORD_NAMES = {"layouts": "backward_layouts", "dq": "backward_dq", "tile": "backward_tile", "det": "backward_det"}
SOURCE_PAGES = ("dq",)   # steps whose record keeps the per-instruction stall samples


def profile_target(step: str = "layouts") -> None:
    """One backward of each of PROFILED[step]'s builds at PROFILE_SHAPES[step], in order: the program
    Nsight Compute runs (main's --profile)."""
    names = PROFILED[step]
    B, H, L, D = PROFILE_SHAPES[step]
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = forward_module("v6").forward_lse(q, k, v, False)
    modules = [variant_module(name) for name in names]   # built before the first profiled launch
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
    profile_target (the report goes to a temporary folder) and writes <record>_ncu.raw.csv and <record>_ncu.json
    (which kernel is which) into the folder, <record> being RECORD_NAMES[set]; for the steps of SOURCE_PAGES
    also <record>_ncu.source.csv, the stall samples per SASS instruction."""
    parser = argparse.ArgumentParser(prog="python -m flashattn.book.backward_steps",
                                     description=inspect.cleandoc(main.__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=tuple(STEP_SETS), default="layouts", help="which step's builds")
    parser.add_argument("--json", type=Path, default=None,
                        help="add a run to this record (flashattn.measure.results, kind backward_steps)")
    parser.add_argument("--profile", type=Path, default=None, help="folder for the Nsight Compute record")
    parser.add_argument("--profile-target", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    profiled = PROFILED.get(args.set, ())
    if (args.profile or args.profile_target) and not profiled:
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
               str(len(profiled)), *sections, "--metrics", NCU_METRICS, "--export", str(rep), "--force-overwrite",
               sys.executable, "-m", "flashattn.book.backward_steps", "--set", args.set, "--profile-target"]
        subprocess.run(cmd, check=True)
        raw = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv"], check=True,
                             capture_output=True, text=True).stdout
        (args.profile / f"{name}_ncu.raw.csv").write_text(raw)
        B, H, L, D = PROFILE_SHAPES[args.set]
        info = {"shape": f"B={B}, H={H}, M=N={L}, D={D}, non-causal", "raw_csv": f"{name}_ncu.raw.csv",
                "command": " ".join(cmd), "git_commit": results.git_commit().get("commit")}
        if args.set in SOURCE_PAGES:
            page = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "source", "--csv",
                                   "--print-source", "sass"], check=True, capture_output=True, text=True).stdout
            ncu_pages.write_source_rows(ncu_pages.split_source_page(page), args.profile / f"{name}_ncu.source.csv",
                                        labels=profiled)
            info["source_csv"] = f"{name}_ncu.source.csv"
        results.write(args.profile / f"{name}_ncu.json", "ncu", [{"kernel": k} for k in profiled], meta=info)
        shutil.rmtree(rep.parent, ignore_errors=True)
        print(f"wrote {args.profile / f'{name}_ncu.json'}")
        return 0
    if args.set != "layouts":   # these steps are a few percent apart: twice the layouts' repetitions
        rows = compare_layouts(names=tuple(STEP_SETS[args.set]), repetitions=200, rounds=20,
                               deterministic=args.set == "det")
    else:
        rows = compare_layouts()
    if args.json:
        meta = results.environment(argv, prog="python -m flashattn.book.backward_steps")
        results.append(args.json, "backward_steps", rows, meta=meta)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
