"""Nsight Compute profile of one fused kernel: `python -m flashattn.measure.profile VERSION [options]`.

VERSION is a fused version (one kernel launch per forward: v1 and later), `all` for every one of them, a
backward kernel file (`v6_backward`, `v8_backward`: its main kernel, the one that accumulates dK and dV,
profiled in a gradient call given dO, after the forward ran once), or `fa4_backward`: FlashAttention-4's
main backward kernel in its own gradient call, to set beside ours. baseline and v0 launch several kernels, so one
roofline point or occupancy figure would be ambiguous, and sdpa is PyTorch's kernel rather than this
project's: passing them is an error that says so.

ncu runs this same module in an internal `--target` mode, which builds the inputs at the primary shape
(B=4, H=12, M=N=2048, D=64; float32, bfloat16 for the tensor-core versions), makes warm-up calls and then
one more call. The
kernel-name filter (the `__global__` names read from kernels/<version>.cu) together with `--launch-skip`
(one skipped launch per warm-up; the count applies to filtered launches only) and `--launch-count 1`
selects exactly the last call's kernel. Clocks are left alone (`--clock-control none`). Only the sections
the tables, the roofline and the stall breakdown need are collected, which keeps each report small:

    SpeedOfLight, SpeedOfLight_RooflineChart, Occupancy, LaunchStats, ComputeWorkloadAnalysis,
    WarpStateStats (+ SpeedOfLight_HierarchicalTensorRooflineChart for tensor-core versions, when this
    ncu has it)

The report is written to OUT/flash_<version>_s<M>_profile.ncu-rep (OUT defaults to /tmp) together with what
`ncu --import` prints for it: the details page as CSV in base units (.details.csv) and as text
(.details.txt), and the raw page as CSV in base units (.raw.csv). `tests/test_ncu.py` checks
`flashattn.measure.ncu`'s parsed values against those files.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import torch

import flashattn
from flashattn.loader import KERNELS_DIR, REPO_ROOT
from flashattn.measure.backward import BACKWARD_NAMES, backward_call
from flashattn.measure.ncu import OPTIONAL_METRICS, SHARED, STEP_METRICS
from flashattn.measure.ncu_pages import raw_values, read_raw_rows
from flashattn.measure.variants import kernel_of
from flashattn.versions import INFO, VERSIONS

PROFILED = tuple(n for n in VERSIONS if INFO[n].kernel and INFO[n].fused)
BASE_SECTIONS = ("SpeedOfLight", "SpeedOfLight_RooflineChart", "Occupancy", "LaunchStats",
                 "ComputeWorkloadAnalysis", "WarpStateStats")
TENSOR_SECTION = "SpeedOfLight_HierarchicalTensorRooflineChart"
PRIMARY = dict(batch_size=4, num_heads=12, seq_len=2048, head_dim=64)
class Backward(NamedTuple):
    """A backward that can be profiled: the version whose dtype and tensor-core choice it takes, its main
    kernel (the one that accumulates dK and dV: ncu's filter) and its gradient call (flashattn.measure.backward)."""
    version: str
    kernel: str
    call: str


# Backward kernel files, and a peer's backward to set beside ours. A file that serves several versions
# (v6_backward: v6, v7, v8) belongs to the first, whose forward it was written for, and trains it; one a
# version trains on only when asked (Version.backwards: v8_backward) belongs to the first that can ask and is
# called by its own name. FlashAttention-4's backward is profiled beside v8's (its sm90 backward class is
# compiled into the name of its main kernel).
DKDV_KERNEL = {"v6_backward": "bwd_dkdv", "v8_backward": "flash_bwd_ws"}
BACKWARD: dict[str, Backward] = {}
for _name, _v in INFO.items():
    for _file in (_v.backward, *_v.backwards) if _v.backward else ():
        BACKWARD.setdefault(_file, Backward(_name, DKDV_KERNEL[_file], _file if _file in BACKWARD_NAMES else _name))
BACKWARD["fa4_backward"] = Backward("v8", "FlashAttentionBackwardSm90", "fa4")


def owner(version: str) -> str:
    """The version whose kernels these are: itself, or the version a backward kernel file belongs to."""
    return BACKWARD[version].version if version in BACKWARD else version


def uses_tensor_cores(version: str) -> bool:
    """v6 (mma.sync) and the versions versions.py flags with extra={'tensor_cores': True} (v7)."""
    version = owner(version)
    return bool(INFO[version].extra.get("tensor_cores", version == "v6"))


def default_dtype(version: str) -> str:
    """bfloat16 for tensor-core kernels (and any version without float32), float32 otherwise."""
    info = INFO[owner(version)]
    fp32 = any(str(d) == "torch.float32" for d in info.dtypes)
    return "float32" if fp32 and not uses_tensor_cores(version) else "bfloat16"


def refusal(version: str) -> str | None:
    """Why `version` cannot be profiled here, or None when it can."""
    if version in BACKWARD:
        return None
    if version not in INFO:
        return f"unknown VERSION {version!r}; choose all or one of {', '.join(PROFILED + tuple(BACKWARD))}"
    if version == "sdpa" or not INFO[version].kernel and version != "baseline":
        return (f"{version} is PyTorch's own attention kernel, not one of this project's, so it is not profiled "
                f"here; the fused versions are {', '.join(PROFILED)}")
    if version == "baseline":
        return (f"baseline runs several PyTorch kernels (matmul, softmax, matmul), so a single roofline point "
                f"or occupancy figure would be ambiguous; profile one of {', '.join(PROFILED)}")
    if not INFO[version].fused:
        return (f"{version} launches several kernels per forward with different register counts and occupancy, "
                f"so a single roofline point would be ambiguous; profile one of {', '.join(PROFILED)}")
    return None


def report_stem(version: str, seq_len: int) -> str:
    return f"flash_{version}_s{seq_len}_profile"


def kernel_names(version: str, kernel_dir: Path = KERNELS_DIR) -> list[str]:
    """The `__global__` function names declared in kernels/<version>.cu."""
    path = kernel_dir / f"{version}.cu"
    return kernel_names_in(path.read_text()) if path.exists() else []


def kernel_names_in(source: str) -> list[str]:
    source = re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.S)
    # (its arguments may hold a call: __launch_bounds__(Layout<tile_dim(D), ...>::THREADS, 1))
    source = re.sub(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)", "", source)
    return list(dict.fromkeys(re.findall(r"__global__\s+(?:static\s+)?void\s+(\w+)\s*\(", source)))


def kernel_filter(version: str) -> str:
    """ncu --kernel-name value matching the version's kernels (and its fallback's: v3-v5 hand head dims
    they are not written for to v2; a backward file: its dK/dV kernel only)."""
    if version in BACKWARD:
        return "regex:" + BACKWARD[version].kernel
    names = kernel_names(version) + (kernel_names(INFO[version].fallback) if INFO[version].fallback else [])
    if not names:
        raise SystemExit(f"no __global__ kernel found in {KERNELS_DIR / (version + '.cu')}; pass --kernel-regex")
    return "regex:" + "|".join(names)


# ------------------------------------------------------------------------------------------- ncu
def find_ncu(explicit: str | None = None) -> str | None:
    """ncu from --ncu, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin (None when absent)."""
    candidates = [explicit] if explicit else []
    candidates.append(shutil.which("ncu"))
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(str(Path(root) / "bin" / "ncu"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


MISSING_NCU = ("Nsight Compute (ncu) was not found in PATH, $CUDA_HOME/bin or /usr/local/cuda/bin. Install "
               "it with the CUDA toolkit (or the nsight-compute package) or pass --ncu /path/to/ncu.")
NO_PERMISSION = ("ncu could not read the GPU performance counters (ERR_NVGPUCTRPERM): this machine lets only "
                 "administrators profile. Run with sudo (using this venv's python by absolute path), or ask "
                 "for NVreg_RestrictProfilingToAdminUsers=0; see "
                 "https://developer.nvidia.com/ERR_NVGPUCTRPERM")


def diagnose(output: str) -> str | None:
    """A readable reason for a failed ncu run, from its output."""
    if "ERR_NVGPUCTRPERM" in output:
        return NO_PERMISSION
    if "No kernels were profiled" in output:
        return ("ncu profiled no kernel: the kernel-name filter matched nothing that ran. Check the "
                "__global__ names in kernels/<version>.cu or pass --kernel-regex.")
    return None


def available_sections(ncu: str) -> set[str] | None:
    try:
        text = subprocess.run([ncu, "--list-sections"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = {line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("-")}
    return found if found & set(BASE_SECTIONS) else None      # an unexpected listing: don't filter on it


def sections_for(version: str, available: set[str] | None) -> list[str]:
    wanted = list(BASE_SECTIONS) + ([TENSOR_SECTION] if uses_tensor_cores(version) else [])
    if available is None:
        return [s for s in wanted if s != TENSOR_SECTION]
    missing = [s for s in wanted if s not in available]
    for s in missing:
        print(f"note: this ncu has no section {s}; collecting without it", file=sys.stderr)
    return [s for s in wanted if s in available]


def export_pages(ncu: str, report: Path) -> list[Path]:
    """Save what `ncu --import` prints for `report` next to it (the tests compare against these)."""
    base = str(report)[: -len(".ncu-rep")]
    pages = {
        base + ".details.csv": ["--page", "details", "--csv", "--print-units", "base"],
        base + ".details.txt": ["--page", "details", "--print-details", "all"],
        base + ".raw.csv": ["--page", "raw", "--csv", "--print-units", "base"],
    }
    written = []
    for path, opts in pages.items():
        proc = subprocess.run([ncu, "--import", str(report), *opts], capture_output=True, text=True)
        if proc.returncode == 0:
            Path(path).write_text(proc.stdout)
            written.append(Path(path))
        else:
            print(f"warning: ncu --import {' '.join(opts)} failed:\n{proc.stderr.strip()}", file=sys.stderr)
    return written


def ncu_command(ncu: str, version: str, args, out_base: Path, sections: list[str]) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--kernel-name", args.kernel_regex or kernel_filter(version),
           "--launch-skip", str(args.warmup), "--launch-count", "1", "--force-overwrite", "-o", str(out_base)]
    for s in sections:
        cmd += ["--section", s]
    cmd += ["--metrics", ",".join(SHARED.values())]           # bank conflicts: flashattn.measure.ncu.SHARED
    cmd += [sys.executable, "-m", "flashattn.measure.profile", "--target", version,
            "--dtype", args.dtype or default_dtype(version),
            "--batch-size", str(args.batch_size), "--num-heads", str(args.num_heads), "--seq-len",
            str(args.seq_len), "--head-dim", str(args.head_dim), "--warmup", str(args.warmup)]
    return cmd + (["--causal"] if args.causal else [])


def profile_one(ncu: str, version: str, args, available: set[str] | None) -> Path:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_base = out_dir / report_stem(version, args.seq_len)
    cmd = ncu_command(ncu, version, args, out_base, sections_for(version, available))
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    output = proc.stdout + proc.stderr
    report = out_base.with_name(out_base.name + ".ncu-rep")
    reason = diagnose(output)
    if reason or proc.returncode != 0 or not report.exists():
        tail = "\n".join(output.strip().splitlines()[-25:])
        raise RuntimeError(f"profiling {version} failed: {reason or 'ncu exit status ' + str(proc.returncode)}\n{tail}")
    export_pages(ncu, report)
    print(f"wrote {report}", flush=True)
    return report


def collect_metrics(ncu: str, target: list[str], kernel_regex: str, count: int, out_base: Path) -> dict:
    """Run `target` (a command line) under ncu, profile its first `count` launches of the kernels matching
    `kernel_regex`, and return {"launches": [{"counters": {...}, "stalls": {...}}, ...]} in launch order
    (flashattn.measure.ncu.STEP_METRICS and the warp-stall ratios, base units), or {"error": why}. One process
    for many launches: starting Python and CUDA under ncu costs far more than the replays of a small
    kernel. Used by `flashattn.measure.sweep --metrics`."""
    names = dict(STEP_METRICS)
    for attempt in range(2):
        cmd = [ncu, "--clock-control", "none", "--kernel-name", kernel_regex, "--launch-count", str(count),
               "--force-overwrite", "-o", str(out_base), "--section", "WarpStateStats",
               "--metrics", ",".join(names.values()), *target]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
        output = proc.stdout + proc.stderr
        report = out_base.with_name(out_base.name + ".ncu-rep")
        if proc.returncode == 0 and report.exists():
            break
        if attempt == 0 and "metric" in output.lower():       # an unknown optional counter: once without
            names = {k: v for k, v in names.items() if k not in OPTIONAL_METRICS}
            continue
        tail = "\n".join(output.strip().splitlines()[-8:])
        return {"error": f"{diagnose(output) or 'ncu exit status ' + str(proc.returncode)}: {tail}"}
    page = subprocess.run([ncu, "--import", str(report), "--page", "raw", "--csv", "--print-units", "base"],
                          capture_output=True, text=True)
    if page.returncode != 0:
        return {"error": f"ncu --import failed: {page.stderr.strip()[-500:]}"}
    raw_path = out_base.with_name(out_base.name + ".raw.csv")
    raw_path.write_text(page.stdout)
    launches = []
    for raw in read_raw_rows(raw_path):
        counters, stall = raw_values(raw, names)
        launches.append({"counters": counters, "stalls": stall})
    return {"launches": launches}


def attach_metrics(doc: dict, key: str, out_dir: Path, shape: tuple, warmup: int = 1) -> None:
    """`python -m flashattn.measure.sweep KEY --metrics`: every correct variant under Nsight Compute in one
    process (collect_metrics on the sweep's `--target` mode, `warmup` calls and one more per variant at
    `shape` = (B, H, M, N)); the counters of each variant's last launch land in its row's "metrics". The raw
    page of the report (every launch, in order) stays as out_dir/<version>_steps_ncu.raw.csv; the report
    itself is deleted (tens of MB)."""
    rows = [r for r in doc["rows"] if r.get("correct")]
    ncu = find_ncu()
    if ncu is None or not rows:
        for r in rows:
            r["metrics"] = {"error": MISSING_NCU}
        return
    version = kernel_of(key)
    target = [sys.executable, "-m", "flashattn.measure.sweep", key, "--warmup", str(warmup),
              "--target", *[r["name"] for r in rows]]
    got = collect_metrics(ncu, target, kernel_filter(version), len(rows) * (warmup + 1),
                          out_dir / f"{version}_steps_ncu")
    (out_dir / f"{version}_steps_ncu.ncu-rep").unlink(missing_ok=True)
    launches = got.get("launches", [])
    for i, r in enumerate(rows):
        one = launches[i * (warmup + 1) + warmup] if len(launches) == len(rows) * (warmup + 1) else \
            {"error": got.get("error") or f"ncu profiled {len(launches)} launches, expected {len(rows) * (warmup + 1)}"}
        r["metrics"] = {"shape": [*shape, r["D"]], "dtype": doc["meta"]["dtype"], "causal": False, **one}
        print(f"metrics {r['name']}: {'ok' if 'counters' in one else one['error'][:300]}", flush=True)


# ----------------------------------------------------------------------------------------- target
def run_target(args) -> int:
    """What ncu launches: warm-up calls, then the one call that the filter selects."""
    dtype = getattr(torch, args.dtype or default_dtype(args.target))
    shape = (args.batch_size, args.num_heads, args.seq_len, args.head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    if args.target in BACKWARD:                    # one dK/dV launch per gradient call
        do = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
        grads = backward_call(BACKWARD[args.target].call, q, k, v, do, args.causal)
        for _ in range(args.warmup + 1):
            out = grads()
        torch.cuda.synchronize()
        return 0 if all(torch.isfinite(g).all().item() for g in out) else 1
    flashattn.load(args.target)                    # build before anything is launched
    for _ in range(args.warmup + 1):               # ncu skips the warm-ups and profiles the last call
        out = flashattn.forward(q, k, v, version=args.target, causal=args.causal)
    torch.cuda.synchronize()
    return 0 if torch.isfinite(out).all().item() else 1


# -------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.profile", description=__doc__.split("\n\n")[0],
                                epilog=f"profiled versions: {', '.join(PROFILED)} (all = every one of them); "
                                       f"backward kernels: {', '.join(BACKWARD)}")
    p.add_argument("version", nargs="?", metavar="VERSION",
                   help="all or one of " + ", ".join(PROFILED + tuple(BACKWARD)))
    p.add_argument("--out", default="/tmp", help="folder for the reports (default: %(default)s)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="input dtype (default: float32; bfloat16 for the tensor-core versions "
                        f"{', '.join(n for n in PROFILED if uses_tensor_cores(n))} and {', '.join(BACKWARD)})")
    p.add_argument("--causal", action="store_true",
                   help="causal masking (versions that have it: "
                        f"{', '.join(n for n in PROFILED if INFO[n].causal)}; default: off)")
    p.add_argument("-B", "--batch-size", type=int, default=PRIMARY["batch_size"],
                   help="batch size B (default: %(default)s)")
    p.add_argument("-H", "--num-heads", type=int, default=PRIMARY["num_heads"],
                   help="attention heads H (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=PRIMARY["seq_len"], help="M = N (default: %(default)s)")
    p.add_argument("-D", "--head-dim", type=int, default=PRIMARY["head_dim"],
                   help="head dimension D (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1,
                   help="unprofiled calls before the profiled one (default: %(default)s)")
    p.add_argument("--ncu", help="path to ncu (default: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    p.add_argument("--kernel-regex", help="ncu --kernel-name filter (default: regex of kernels/<version>.cu names)")
    p.add_argument("--target", metavar="VERSION", help=argparse.SUPPRESS)   # internal: the profiled program
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.target:
        return run_target(args)
    if not args.version:
        parser.error("VERSION is required: all or one of " + ", ".join(PROFILED))
    names = list(PROFILED) if args.version == "all" else [args.version]
    reason = refusal(args.version) if args.version != "all" else None
    if reason:
        parser.error(reason)
    ncu = find_ncu(args.ncu)
    if ncu is None:
        print(f"error: {MISSING_NCU}", file=sys.stderr)
        return 2
    available = available_sections(ncu)
    failed = []
    for version in names:
        try:
            profile_one(ncu, version, args, available)
        except (RuntimeError, SystemExit) as err:
            print(f"error: {err}", file=sys.stderr)
            failed.append(version)
            if NO_PERMISSION in str(err):
                break                              # every other version would fail the same way
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
