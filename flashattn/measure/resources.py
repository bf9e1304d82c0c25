"""What the compiler says each kernel costs: registers, shared memory, stack, spills.

Runs nvcc on the kernel half of a file (nvcc alone, no PyTorch headers) with `-Xptxas -v` and parses
ptxas's report, so it needs no GPU; `occupancy` turns registers and shared memory into blocks per SM.
`python -m flashattn.measure.resources --json PATH` records the report for every kernel and architecture, with the
nvcc version that produced it; tests/test_compile.py compares a fresh report with the record exactly under
the same nvcc, and checks the properties that matter (no spills, no stack, occupancy) under any other.
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flashattn.loader import KERNELS_DIR, NVCC_FLAGS, find_cuda_home, version_archs
from flashattn.measure import results
from flashattn.versions import KERNEL_VERSIONS

ARCHS = ("80", "89", "90")
_FUNC = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


SM90 = dict(regs_per_sm=65536, max_regs_per_thread=255, reg_unit=256, max_warps=64, max_blocks=32,
            smem_per_sm=233472, smem_per_block_max=232448, smem_reserved=1024)


def occupancy(regs: int, smem_bytes: int, threads: int, limits: dict = SM90) -> dict:
    """Blocks per SM allowed by each resource on sm_90, the CUDA occupancy calculator's way: registers
    are handed out per warp in units of 256, every block also costs 1 KB of shared memory that the
    driver reserves."""
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(regs * 32 / limits["reg_unit"]) * limits["reg_unit"]
    by = {"registers": limits["regs_per_sm"] // (regs_per_warp * warps) if regs else limits["max_blocks"],
          "shared memory": min(limits["max_blocks"], limits["smem_per_sm"] // (smem_bytes + limits["smem_reserved"])),
          "warps": limits["max_warps"] // warps, "blocks per SM": limits["max_blocks"]}
    blocks = min(by.values())
    return {"by": by, "blocks": blocks, "warps": blocks * warps,
            "occupancy_pct": 100 * blocks * warps / limits["max_warps"],
            "limited_by": [k for k, v in by.items() if v == blocks]}


def nvcc() -> str:
    home = find_cuda_home()
    return str(Path(home) / "bin" / "nvcc") if home else "nvcc"


def demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return dict(zip(names, out.stdout.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def parse_ptxas(text: str) -> list[dict]:
    """One dict per compiled entry function in ptxas -v output."""
    kernels, current = [], None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            current = {"function": m.group(1), "arch": m.group(2)}
            kernels.append(current)
        elif current is not None and (m := _PROPS.search(line)):
            current.update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                           spill_load_bytes=int(m.group(3)))
        elif current is not None and (m := _USED.search(line)):
            current.update(registers=int(m.group(1)), static_smem_bytes=int(m.group(2) or 0))
    names = demangle([k["function"] for k in kernels])
    for k in kernels:
        k["name"] = names[k["function"]].split("(")[0]
    return kernels


def compile_report(kernel: str, arch: str = "90", extra_flags=(), src: Path | None = None) -> list[dict]:
    """Compile kernels/<kernel>.cu (or `src`) for sm_<arch>, with `extra_flags` such as a sweep's -D tile
    macros, and return ptxas's per-kernel report."""
    src = src or KERNELS_DIR / f"{kernel}.cu"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc(), *NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}", *extra_flags, "-Xptxas",
               "-v", "-c", str(src), "-o", str(Path(tmp) / f"{kernel}.o")]
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {kernel} (sm_{arch}):\n{res.stderr}")
    return parse_ptxas(res.stderr)


def nvcc_version() -> str | None:
    """'13.0.88' from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88"), None without nvcc."""
    try:
        out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else None


def load_record(path: Path) -> tuple[str | None, dict]:
    """(nvcc version, {version: {"sm_90": [kernel, ...]}}) of a recorded report (a flashattn.measure.results
    record of kind resources: one row per kernel, with its version and arch)."""
    doc = results.read(path, "resources")
    report: dict = {}
    for row in doc["rows"]:
        kernel = {k: v for k, v in row.items() if k != "version"}
        report.setdefault(row["version"], {}).setdefault(row["arch"], []).append(kernel)
    return doc["meta"].get("nvcc"), report


def report_all(names=KERNEL_VERSIONS, archs=ARCHS, jobs: int = 2) -> dict:
    def archs_of(n):     # a version built for exact architectures ("9.0a") is reported for those only
        exact = version_archs(n)
        return [x.replace(".", "") for x in exact] if exact else archs
    pairs = [(n, a) for n in names for a in archs_of(n) if (KERNELS_DIR / f"{n}.cu").exists()]
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda p: compile_report(*p), pairs))
    report: dict = {}
    for (n, a), kernels in zip(pairs, results):
        report.setdefault(n, {})[f"sm_{a}"] = kernels
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=list(KERNEL_VERSIONS))
    parser.add_argument("--arch", action="append", help="sm number such as 90 (repeatable; default 80 89 90)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    report = report_all(args.names, tuple(args.arch or ARCHS))
    for name, per_arch in report.items():
        for arch, kernels in per_arch.items():
            for k in kernels:
                print(f"{name:3} {arch:6} {k['name'][:48]:48} regs {k.get('registers', '?'):>3}  "
                      f"smem {k.get('static_smem_bytes', 0):>6} B  stack {k.get('stack_bytes', 0):>4} B  "
                      f"spills {k.get('spill_store_bytes', 0)}/{k.get('spill_load_bytes', 0)} B")
    if args.json:
        rows = [{"version": name, **k} for name, per_arch in report.items() for kernels in per_arch.values()
                for k in kernels]
        results.write(args.json, "resources", rows, meta={"nvcc": nvcc_version()}, settings={"flags": NVCC_FLAGS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
