"""Combined roofline figure: one labelled point per profiled version.

Each point sits at the kernel's arithmetic intensity (FLOP per DRAM byte) and achieved throughput, as
`flashattn.measure.ncu.summarize` reads them from the report (FP32 FLOP/s the way Nsight Compute's
SpeedOfLight_RooflineChart counts them, plus tensor-core operations when the report has them). The
roofs come from the report's own peak metrics: the FP32 roof (2 x FFMA peak x SM clock), the DRAM slope
(peak bytes per cycle x DRAM clock), and, when a tensor-core report carries one, the tensor roof.

CLI: `python -m flashattn.book.plots REPORT.ncu-rep ... -o roofline.png`
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from flashattn.measure.ncu import summarize, version_of


def point_from_summary(label: str, s: dict) -> dict:
    """The plotting record of one report (see `roofline` for the keys)."""
    return {"label": label, "intensity": s["arithmetic_intensity"], "flops_per_s": s["work_per_s"],
            "fp32_peak": s["fp32_peak_flops_per_s"], "dram_peak": s["dram_peak_bytes_per_s"],
            "tensor_peak": s.get("tensor_peak_ops_per_s")}


def points_from_reports(paths) -> list[dict]:
    """One plotting record per Nsight Compute report, labelled with the version its file name names."""
    return [point_from_summary(version_of(p), summarize(p)) for p in paths]


def roofline(points: list[dict], title: str | None = None, ax=None):
    """Draw a log-log roofline; returns (figure, axes).

    points: dicts with label, intensity (FLOP/byte), flops_per_s, and the roofs fp32_peak (FLOP/s),
    dram_peak (byte/s), optional tensor_peak (OP/s). The roofs are drawn from the first point that has
    them (every report of one run comes from the same GPU); one marker and one text label per point.
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 5), constrained_layout=True)
    else:
        fig = ax.figure
    fp32 = next((p["fp32_peak"] for p in points if p.get("fp32_peak")), None)
    dram = next((p["dram_peak"] for p in points if p.get("dram_peak")), None)
    tensor = max((p["tensor_peak"] for p in points if p.get("tensor_peak")), default=None)
    xs = [p["intensity"] for p in points if p.get("intensity")]
    ridges = [peak / dram for peak in (fp32, tensor) if peak and dram]
    lo = min(xs + ridges + [1.0]) / 4
    hi = max(xs + ridges + [1.0]) * 4
    x = np.logspace(np.log10(lo), np.log10(hi), 256)

    if dram:
        for peak, name, style in ((fp32, "FP32", "-"), (tensor, "tensor cores", "--")):
            if peak:
                ax.plot(x, np.minimum(peak, dram * x), style, color="0.25", lw=1.5,
                        label=f"{name} roof {peak / 1e12:,.1f} TFLOP/s, DRAM {dram / 1e12:,.2f} TB/s")
                ax.axvline(peak / dram, color="0.7", lw=0.8, ls=":")
    placed = []                       # (log10 x, log10 y, side) of the labels drawn so far, highest first
    for i, p in sorted(enumerate(points), key=lambda ip: -(ip[1].get("flops_per_s") or 0)):
        if not p.get("intensity") or not p.get("flops_per_s"):
            continue
        ax.plot(p["intensity"], p["flops_per_s"], "o", ms=8, color=f"C{i % 10}")
        lx, ly = np.log10(p["intensity"]), np.log10(p["flops_per_s"])
        # points within a few label heights of each other (V6-V8 sit together) take turns right and left
        taken = {side for qx, qy, side in placed if abs(qx - lx) < 0.12 and abs(qy - ly) < 0.15}
        side = next(s for s in ("right", "left", "above") if s not in taken) if len(taken) < 3 else "right"
        placed.append((lx, ly, side))
        offset, ha = {"right": ((6, -12), "left"), "left": ((-8, -12), "right"), "above": ((6, 6), "left")}[side]
        ax.annotate(p["label"], (p["intensity"], p["flops_per_s"]), textcoords="offset points",
                    xytext=offset, ha=ha, fontsize=10)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP / DRAM byte]",
           ylabel="performance [FLOP/s]", title=title or "Roofline (Nsight Compute metrics)")
    ax.grid(True, which="both", alpha=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8)
    return fig, ax


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.book.plots", description="Combined roofline of ncu reports")
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("-o", "--out", type=Path, default=Path("roofline.png"))
    p.add_argument("--title")
    args = p.parse_args(argv)
    fig, _ = roofline(points_from_reports(args.reports), title=args.title)
    fig.savefig(args.out, dpi=150)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
