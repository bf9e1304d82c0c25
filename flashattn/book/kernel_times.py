"""Kernel by kernel: how long each launch of the unfused versions (baseline, v0) takes, and what it moves.

`python -m flashattn.book.kernel_times --out results/h200 [--ncu]` writes kernel_times.json (and .txt).

The baseline and V0 run several kernels per forward, so one end-to-end time hides which step costs what.
Each forward is run under `torch.profiler` (CUPTI records every kernel's start and end on the GPU) with
L2 flushed before every call, exactly as `flashattn.measure.timing` does it; the flush's own kernels (found by
profiling the flush alone first) separate one call's kernels from the next. The median over calls is
taken per kernel position. The same forward is also timed end to end with `flashattn.measure.timing.time_cuda`,
so the record shows what lies between the kernels (launch gaps, an allocation).

Per kernel the record carries a minimum-traffic model: the bytes each step must move at least (read each
operand once, write its result once) and the FLOPs of its products. `--ncu` adds what the hardware did
for V0's three kernels: Nsight Compute's global-load sectors per request and the DRAM and L2 bytes
(results/h200/v0_memory.raw.csv), the evidence for the uncoalesced key reads of `scores_kernel`.

Importable without a GPU; the readers at the bottom (`table`, `kernel_names`) only read committed files, and
flashattn.book.v0_memory reads what `--ncu` recorded.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

from flashattn.book.notebook import md
from flashattn.book.records import ceilings
from flashattn.book.v0_memory import NCU_FILE, run_ncu
from flashattn.measure import results
from flashattn.measure.bench import make_call
from flashattn.measure.kernel_trace import profile_call
from flashattn.measure.timing import time_cuda

KIND = "kernel_times"              # the record's kind (flashattn.measure.results)
VERSIONS = ("baseline", "v0")
SHAPE = dict(B=4, H=12, D=64)                 # the primary shape's batch, heads and head dim
SEQ_LENS = (1024, 2048, 4096)


# ------------------------------------------------------------------------------ what each kernel does
def role(version: str, name: str) -> str:
    """What a kernel of `version` computes, from its name: scores, scale, softmax, PV, or 'other'."""
    low = name.lower()
    if version == "v0":
        for key, what in (("scores_kernel", "scores"), ("softmax_kernel", "softmax"), ("pv_kernel", "PV")):
            if key in low:
                return what
        return "other"
    if "softmax" in low:
        return "softmax"
    if any(t in low for t in ("gemm", "cutlass", "xmma", "cublas", "nvjet")):   # nvjet: cuBLAS on Hopper
        return "GEMM"
    if "elementwise" in low or "div" in low or "mul" in low:
        return "scale"
    return "other"


def label_roles(version: str, names: list[str]) -> list[str]:
    """Roles of one call's kernels in launch order; the baseline's first product is QK^T, its last PV."""
    roles = [role(version, n) for n in names]
    gemms = [i for i, r in enumerate(roles) if r == "GEMM"]
    for i in gemms:
        roles[i] = "QK^T" if i == gemms[0] else "PV" if i == gemms[-1] else "GEMM"
    return roles


def add_model(run: dict) -> dict:
    """Put the traffic model on each kernel of a run: bytes and FLOPs of its step. A step that PyTorch
    splits over several launches (the scaling of a score matrix over 2^31 bytes runs as two) gives each
    launch an equal share, so the launches of one step add up to the step's model."""
    launches = Counter(k["role"] for k in run["kernels"])
    for k in run["kernels"]:
        b, f = traffic(k["role"], run["B"], run["H"], run["M"], run["N"], run["D"])
        n = launches[k["role"]]
        k["bytes"], k["flops"], k["launches_in_step"] = (None if b is None else b / n,
                                                         None if f is None else f / n, n)
    return run


def traffic(what: str, B: int, H: int, M: int, N: int, D: int, itemsize: int = 4) -> tuple[int | None, int | None]:
    """(bytes, FLOPs) a kernel doing `what` must at least move and compute: every operand read once, every
    result written once (None where the step has no model). V0's scores kernel scales as it stores, so it
    moves what the baseline's QK^T moves."""
    bh, s, io = B * H, B * H * M * N * itemsize, B * H * (M + N) * D * itemsize
    if what in ("QK^T", "scores"):
        return io + s, 2 * bh * M * N * D
    if what == "scale":
        return 2 * s, bh * M * N
    if what == "softmax":
        return 2 * s, None
    if what == "PV":
        return s + io, 2 * bh * M * N * D
    return None, None


def measure(version: str, L: int, calls: int, B=SHAPE["B"], H=SHAPE["H"], D=SHAPE["D"]) -> dict:
    """One record row: the per-kernel times of `version` at B, H, M = N = L, D (float32) with the traffic
    model, and the end-to-end median of the same call through flashattn.measure.timing."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g) for _ in range(3))
    fn, _, runs_as = make_call(version, q, k, v, False)
    kernels = profile_call(fn, calls)
    for kern, what in zip(kernels, label_roles(version, [k["name"] for k in kernels])):
        kern["role"] = what
    whole = time_cuda(fn, warmup=3, repetitions=calls, max_seconds=10)
    return add_model(dict(version=version, runs_as=runs_as, B=B, H=H, M=L, N=L, D=D, dtype="float32", calls=calls,
                          kernels=kernels, kernel_sum_us=sum(k["median_us"] for k in kernels),
                          end_to_end=whole.summary()))


# ----------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashattn.book.kernel_times", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("results/h200"), help="folder for kernel_times.json")
    p.add_argument("--versions", nargs="+", default=list(VERSIONS), choices=VERSIONS)
    p.add_argument("--seq-lens", nargs="+", type=int, default=list(SEQ_LENS), metavar="L", help="M = N")
    p.add_argument("--calls", type=int, default=10, help="profiled calls per version and length")
    p.add_argument("--ncu", action="store_true", help=f"also collect V0's memory metrics into {NCU_FILE}")
    return p


def format_rows(runs: list[dict]) -> str:
    lines = []
    for r in runs:
        lines.append(f"{r['version']} B={r['B']} H={r['H']} M=N={r['M']} D={r['D']}: kernels "
                     f"{r['kernel_sum_us']:,.1f} us, end to end {r['end_to_end']['median_us']:,.1f} us")
        lines += [f"  {k['role']:8s} {k['median_us']:12,.1f} us  {k['name'][:90]}" for k in r["kernels"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m flashattn.book.kernel_times needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    meta = results.environment(argv, prog="python -m flashattn.book.kernel_times")
    settings = {"calls": args.calls, "l2_flush": True}
    path, rows = args.out / "kernel_times.json", []
    for version in args.versions:
        for L in args.seq_lens:
            rows.append(measure(version, L, args.calls))
            results.write(path, KIND, rows, meta, settings)   # after every row: a killed run keeps what it has
            print(format_rows(rows[-1:]), flush=True)
    (args.out / "kernel_times.txt").write_text(format_rows(rows) + "\n")
    if args.ncu:
        print(f"wrote {run_ncu(args.out)}")
    return 0


# ------------------------------------------------------------------------ readers of the record (no GPU)
RECORD = results.H200
MISSING = ("*Not recorded yet: `python -m flashattn.book.kernel_times --out results/h200 --ncu` on the H200 writes "
           "`results/h200/kernel_times.json`, and this cell shows it once that run is committed.*")


def recorded_run(version: str, L: int = 2048, path: Path | None = None) -> dict | None:
    """The row of `version` at M = N = L in kernel_times.json, None when there is none."""
    doc = results.read_if_exists(path or RECORD / "kernel_times.json", KIND)
    if doc is None:
        return None
    return next((r for r in doc["rows"] if r["version"] == version and r["M"] == L), None)


ROLE_TEXT = {"QK^T": "S = Q K^T", "scale": "S / sqrt(D), elementwise", "softmax": "P = softmax(S)",
             "PV": "O = P V", "scores": "S = Q K^T / sqrt(D)", "other": "other"}


def short_name(name: str, width: int = 32) -> str:
    """A kernel's function name without 'void', namespaces, template arguments and parameters, cut to
    `width` characters (cuBLAS's names spell out the whole tile configuration)."""
    base = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    base = base.split("<")[0].split("(")[0].split("::")[-1]
    return base if len(base) <= width else base[:width - 1] + "…"


def kernel_names(version: str, L: int = 2048) -> str:
    """The full names of the recorded kernels of `version`, one a line, in launch order."""
    run = recorded_run(version, L)
    if run is None:
        return "Not recorded yet (results/h200/kernel_times.json)."
    return "\n".join(f"{k['role']:8s} {k['name']}" for k in run["kernels"])


def steps_of(run: dict) -> list[dict]:
    """The run's kernels with the consecutive launches of one step (same role) merged: times, bytes and
    FLOPs added, `launches` counting them."""
    out = []
    for k in run["kernels"]:
        if out and out[-1]["role"] == k["role"] and k.get("launches_in_step", 1) > 1:
            last = out[-1]
            last["median_us"] += k["median_us"]
            last["launches"] += 1
            for key in ("bytes", "flops"):
                last[key] = None if last[key] is None else last[key] + k[key]
        else:
            out.append(dict(k, launches=1))
    return out


def table_lines(run: dict, dram: float, fp32: float) -> list[str]:
    """Markdown rows of one recorded run: each kernel's median, share of the kernels' sum, minimum bytes,
    the bandwidth and FLOP rate they imply and their share of the measured roofs (bytes/s and FLOP/s)."""
    lines = ["| kernel | computes | median µs | share | min. bytes | GB/s | of DRAM roof | TFLOP/s | "
             "of FP32 roof |", "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    total = run["kernel_sum_us"]
    for k in steps_of(run):
        sec = k["median_us"] * 1e-6
        short = short_name(k["name"]) + (f" (× {k['launches']})" if k["launches"] > 1 else "")
        bw = "—" if k["bytes"] is None else f"{k['bytes'] / sec / 1e9:,.0f}"
        bw_share = "—" if k["bytes"] is None else f"{100 * k['bytes'] / sec / dram:.0f}%"
        rate = "—" if k["flops"] is None else f"{k['flops'] / sec / 1e12:.2f}"
        rate_share = "—" if k["flops"] is None else f"{100 * k['flops'] / sec / fp32:.0f}%"
        mb = "—" if k["bytes"] is None else f"{k['bytes'] / 1e6:,.0f} MB"
        lines.append(f"| `{short}` | {ROLE_TEXT.get(k['role'], k['role'])} | {k['median_us']:,.1f} | "
                     f"{100 * k['median_us'] / total:.0f}% | {mb} | {bw} | {bw_share} | {rate} | {rate_share} |")
    return lines


def table(version: str, L: int = 2048):
    """The recorded kernel-by-kernel table of `version` at B=4, H=12, M = N = L, D=64 (Markdown)."""
    run = recorded_run(version, L)
    if run is None:
        return md(MISSING)
    c = ceilings()
    e2e = run["end_to_end"]["median_us"]
    return md("\n".join(table_lines(run, c["dram"], c["fp32"])) + "\n\n"
              f"Median of {run['calls']} profiled calls per kernel (torch.profiler, L2 flushed before each call); "
              f"the kernels add up to {run['kernel_sum_us']:,.1f} µs, and the whole call timed end to end with "
              f"CUDA events takes {e2e:,.1f} µs. Minimum bytes: each operand read once and each result written "
              "once; roofs: `results/h200/ceilings.json`. Record: `results/h200/kernel_times.json`.")



if __name__ == "__main__":
    sys.exit(main())
