"""Nsight Compute reports of the decode kernel: `python -m flashattn.measure.decode_bench --profile` records them.

* decode_batch8_16k_profile.ncu-rep and decode_rows16_32k_profile.ncu-rep: the split kernel at the first two
  shapes of decode_bench (the chapter's roofline);
* decode_batch8_16k_contiguous_lines.ncu-rep and decode_batch8_16k_paged64_lines.ncu-rep: the same shape read
  from the contiguous cache and from pages of 64 rows, with the source and instruction counters; their
  summary, decode_paged_profile.json, holds each build's duration, DRAM throughput, warp instructions in all,
  per opcode and per source line of kernels/decode.cu (with the line's text), which is how the paged
  build's extra instructions were found and what the chapter shows.

`python -m flashattn.measure.decode_profile --summarize DIR...` writes that summary from reports already
recorded (no GPU needed; Nsight Compute's ncu_report module is).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from flashattn.measure import ncu, results

KERNEL_FILE = Path(__file__).resolve().parents[2] / "kernels" / "decode.cu"
# (report name, decode_bench --target): B, H_q, H_kv, M, N, D[, page_size]
ROOFLINE = {"batch8_16k": "8,32,32,1,16384,128", "rows16_32k": "1,32,32,16,32768,128"}
LINES = {"contiguous": "8,32,32,1,16384,128", "paged64": "8,32,32,1,16384,128,64"}
ROOFLINE_SECTIONS = ("SpeedOfLight", "SpeedOfLight_RooflineChart", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
                     "SpeedOfLight_HierarchicalTensorRooflineChart")
LINE_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "WarpStateStats", "SourceCounters", "InstructionStats",
                 "LaunchStats", "Occupancy")


def record(base: Path, target: str, sections, ncu_bin: str = "ncu") -> Path:
    """One report of the split kernel of `decode_bench --target` (its third call: two warm-ups first)."""
    cmd = [ncu_bin, "--clock-control", "none", "-k", "regex:split_kernel", "--launch-skip", "2", "--launch-count", "1",
           *[a for s in sections for a in ("--section", s)], "-f", "-o", str(base),
           sys.executable, "-m", "flashattn.measure.decode_bench", "--target", target]
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout[-2000:], res.stderr[-2000:])
    return base.with_suffix(".ncu-rep")


def profile(out: Path, ncu_bin: str = "ncu") -> list[Path]:
    """Every report above, and the summary of the source-counter pair when ncu_report imports."""
    reports = [record(out / f"decode_{name}_profile", t, ROOFLINE_SECTIONS, ncu_bin) for name, t in ROOFLINE.items()]
    lines = [record(out / f"decode_batch8_16k_{name}_lines", t, LINE_SECTIONS, ncu_bin) for name, t in LINES.items()]
    try:
        summarize(lines, out / "decode_paged_profile.json")
    except ImportError as err:
        print(f"no summary of {[p.name for p in lines]}: {err}")
    return reports + lines


def build_row(report: Path, source: list[str], top: int = 12) -> dict:
    action = ncu.load_action(report, "split_kernel")
    per_line = ncu.instructions_by_line(action)
    return dict(part="instructions", build=report.stem.removeprefix("decode_batch8_16k_").removesuffix("_lines"),
                report=report.name, status="ok", kernel=action.name(),
                device=ncu.metric(action, "device__attribute_display_name"),
                duration_us=ncu.metric(action, "gpu__time_duration.sum") * 1e6,
                dram_pct=ncu.metric(action, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
                inst_executed=sum(per_line.values()),
                opcodes=dict(list(ncu.instructions_by_opcode(action).items())[:top]),
                lines=[dict(line=n, inst_executed=c, text=source[n - 1].strip() if 0 < n <= len(source) else "")
                       for n, c in list(per_line.items())[:top]])


def summarize(reports, path: Path, source: Path = KERNEL_FILE, note: str = "") -> Path:
    """decode_paged_profile.json from line-counter reports, read against `source` (the kernel file the
    reports were built from: its line numbers are theirs)."""
    text = source.read_text().splitlines()
    rows = [build_row(Path(r), text) for r in reports]
    settings = {"source": str(source.name), **({"note": note} if note else {})}
    results.write(path, "decode", rows, results.environment(None), settings)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.decode_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summarize", nargs="+", type=Path, metavar="REPORT", required=True)
    p.add_argument("--out", type=Path, default=Path("decode_paged_profile.json"))
    p.add_argument("--source", type=Path, default=KERNEL_FILE, help="the kernel file the reports were built from")
    p.add_argument("--note", default="", help="where the reports and the source come from")
    args = p.parse_args(argv)
    print(summarize(args.summarize, args.out, args.source, args.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
