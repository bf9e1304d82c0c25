"""The book's figures of measured performance: rooflines, latency and throughput against sequence length, and
the bytes and intensities that explain them. Each reads results/h200/ through flashattn.book.records, so every
run draws the same picture; the diagrams of how the kernels divide their work are in flashattn.book.diagrams.

`show_or_return` and `log_ticks` are the helpers every figure module of the book shares.
"""
from __future__ import annotations

# matplotlib at module level: `python -X importtime -c "import flashattn.book.figures"` spends 1.5 s in torch
# (which `flashattn` imports anyway) and 0.35 s in matplotlib.pyplot, and every function here draws.
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

from flashattn.book import plots
from flashattn.book.records import RESULTS, ceilings, primary_rows, profile_summary, report_path
from flashattn.measure import results
from flashattn.measure.table import label
from flashattn.versions import VERSIONS


def show_or_return(fig, show: bool):
    """The end of every figure function: with `show`, draw `fig` in the notebook and return None (a returned
    figure would be drawn a second time as the cell's value); without, return `fig` for a test to inspect."""
    if show:
        plt.show()
        return None
    return fig


def log_ticks(ax, values, axis: str = "x") -> None:
    """Label a log axis exactly at `values` (the recorded sequence lengths), in plain numbers, and drop
    matplotlib's minor labels, which would print 5×10² beside 512."""
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(FixedLocator(sorted(values)))
    a.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def datasheet_roofs() -> dict:
    """The datasheet numbers results/h200/ceilings.json keeps beside each measured ceiling, in base units."""
    doc = {row["name"]: row for row in results.read(RESULTS / "ceilings.json", "ceilings")["rows"]}
    return {"fp32": doc["fp32_cuda_core_tflops"]["datasheet"] * 1e12,
            "tf32": doc["tf32_tensor_tflops"]["datasheet"] * 1e12,
            "bf16": doc["bf16_tensor_tflops"]["datasheet"] * 1e12,
            "dram": doc["dram_copy_tbps"]["datasheet"] * 1e12}


# One color per precision; the line style says where a roof comes from.
ROOF_COLORS = {"fp32": "tab:green", "tf32": "tab:orange", "bf16": "tab:purple"}
ROOF_NAMES = {"fp32": "FP32 CUDA cores", "tf32": "TF32 tensor cores", "bf16": "BF16 tensor cores"}
ROOF_STYLES = {"measured": "-", "datasheet": "--", "report": ":"}


def roofline(versions=None, highlight: str | None = None, title: str | None = None, show: bool = True):
    """Roofline of the recorded reports of `versions` (default: every one that has a report).

    Three kinds of roof, in three line styles: the ceilings measured on the H200 with PyTorch's GEMMs and
    a copy (solid), the datasheet's numbers (dashed), and the peaks Nsight Compute computes from a kernel's
    own clock (dotted): the FP32 peak (the "FP32 roofline peak" of the profile tables) of `highlight`'s
    report (else the first), and with tensor cores the peak of each tensor path the reports used, at the
    clock of the first report that used it (`op_hmma`: mma.sync; `op_hgmma`: wgmma). The CUDA-core chapters
    show the FP32 roofs only."""
    c, sheet = ceilings(), datasheet_roofs()
    versions = [v for v in (versions or VERSIONS) if report_path(v).exists()]
    points, summaries = [], {}
    for v in versions:
        s = profile_summary(v)
        if s is not None:
            points.append(plots.point_from_summary(label(v), s))
            summaries[v] = s
    fig, ax = plt.subplots(figsize=(9, 5.6), constrained_layout=True)
    own = highlight if highlight in summaries else next(iter(summaries), None)   # whose clock the dotted roofs use
    report_peak = summaries[own]["fp32_peak_flops_per_s"] if own else None
    report_dram = summaries[own]["dram_peak_bytes_per_s"] if own else None
    if points:   # markers and labels only: the roofs are drawn below, in one legend
        bare = [{**p, "fp32_peak": None, "dram_peak": None, "tensor_peak": None} for p in points]
        plots.roofline(bare, title=title or "Roofline from the recorded Nsight Compute reports", ax=ax)
        if highlight:
            for p in points:
                if p["label"] == label(highlight):
                    ax.plot(p["intensity"], p["flops_per_s"], "o", ms=16, mfc="none", mec="crimson", mew=2)
    x = np.logspace(-1, 4.3, 200)
    tensor = highlight == "v6" or any(p.get("tensor_peak") for p in points)
    for key in ("fp32", "tf32", "bf16") if tensor else ("fp32",):
        col = ROOF_COLORS[key]
        ax.plot(x, np.minimum(c[key], c["dram"] * x), ROOF_STYLES["measured"], color=col, lw=1.8,
                label=f"measured {ROOF_NAMES[key]}: {c[key] / 1e12:,.1f} TFLOP/s, copy {c['dram'] / 1e12:.2f} TB/s")
        ax.plot(x, np.minimum(sheet[key], sheet["dram"] * x), ROOF_STYLES["datasheet"], color=col, lw=1.2,
                label=f"datasheet {ROOF_NAMES[key]}: {sheet[key] / 1e12:,.0f} TFLOP/s, {sheet['dram'] / 1e12:.1f} TB/s")
    if report_peak and report_dram:
        mhz = summaries[own]["sm_frequency_hz"] / 1e6
        ax.plot(x, np.minimum(report_peak, report_dram * x), ROOF_STYLES["report"], color="0.2", lw=1.4,
                label=f"Nsight Compute FP32 peak at {label(own)}'s clock ({mhz:,.0f} MHz): "
                      f"{report_peak / 1e12:,.1f} TFLOP/s")
    paths = {}                     # tensor path -> the first version whose report used it
    for v, s in summaries.items():
        if tensor and s.get("tensor_path") and s.get("tensor_peak_ops_per_s"):
            paths.setdefault(s["tensor_path"], v)
    for k, (path, v) in enumerate(paths.items()):
        s, instr = summaries[v], "wgmma" if "hgmma" in path else "mma.sync" if "hmma" in path else path
        ax.plot(x, np.minimum(s["tensor_peak_ops_per_s"], s["dram_peak_bytes_per_s"] * x), ROOF_STYLES["report"],
                color=ROOF_COLORS["bf16"], lw=1.4 + 0.6 * k, alpha=0.55 + 0.45 * k,
                label=f"Nsight Compute peak of {instr} (`{path.split('_src')[0]}`) at {label(v)}'s clock "
                      f"({s['sm_frequency_hz'] / 1e6:,.0f} MHz): {s['tensor_peak_ops_per_s'] / 1e12:,.0f} TOP/s")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP / DRAM byte]",
           ylabel="performance [FLOP/s]")
    if not points:
        ax.set_title(title or "Measured H200 ceilings (no report recorded yet)")
        ax.text(0.5, 0.08, "no Nsight Compute report recorded yet", transform=ax.transAxes, ha="center",
                color="0.4")
    top = max([sheet["fp32"]] + [p["flops_per_s"] for p in points if p.get("flops_per_s")]
              + ([sheet["bf16"]] if tensor else []))
    ax.set_ylim(top=top * 3)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.25)
    return show_or_return(fig, show)


def fig_scaling(versions=VERSIONS, file="bench.json", dtype="float32", show: bool = True):
    """Latency and TFLOP/s against sequence length for every version, from the recorded benchmark."""
    rows = primary_rows(dtype=dtype, file=file)
    if not rows:
        print(f"No recorded benchmark yet (results/h200/{file}): the H200 run fills these plots in.")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for i, v in enumerate(versions):
        pts = sorted((r["seq_len_q"], r["median_us"], r["tflops"]) for r in rows if r["version"] == v)
        if not pts:
            continue
        L, us, tf = zip(*pts)
        style = dict(marker="o", color=f"C{i % 10}", label=label(v), ls="--" if v in ("baseline", "sdpa") else "-")
        a.plot(L, us, **style)
        b.plot(L, tf, **style)
    c = ceilings()
    b.axhline(c["fp32"] / 1e12, color=ROOF_COLORS["fp32"], ls=ROOF_STYLES["measured"], lw=1)
    b.text(min(r["seq_len_q"] for r in rows), c["fp32"] / 1e12 * 1.08,
           f"measured FP32 SGEMM ceiling, {c['fp32'] / 1e12:.1f} TFLOP/s", color=ROOF_COLORS["fp32"], fontsize=8)
    a.set(xscale="log", yscale="log", xlabel="sequence length M = N", ylabel="latency [µs]",
          title="Latency (B=4, H=12, D=64)")
    b.set(xscale="log", yscale="log", xlabel="sequence length M = N", ylabel="TFLOP/s",
          title="Throughput, 4·B·H·M·N·D FLOP per call")
    for ax in (a, b):
        log_ticks(ax, {r["seq_len_q"] for r in rows})
        ax.grid(True, which="both", alpha=0.25)
    a.legend(fontsize=8, ncol=2)
    return show_or_return(fig, show)


def fig_attention_bytes(D: int = 64, B: int = 4, H: int = 12, show: bool = True):
    """Bytes a naive float32 forward moves (S written, read, P written, read) against the bytes of Q, K,
    V and O alone, and the arithmetic intensity each implies, against sequence length."""
    c = ceilings()
    L = np.array([256, 512, 1024, 2048, 4096, 8192, 16384])
    flops = 4.0 * B * H * L * L * D
    io = 4.0 * B * H * 4 * L * D                   # Q, K, V read once, O written once
    naive = io + 4.0 * B * H * L * L * 4            # S written, S read, P written, P read
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    a.plot(L, naive / 1e9, "o-", label="naive: Q, K, V, O + S and P through DRAM")
    a.plot(L, io / 1e9, "s-", label="fused: Q, K, V, O only")
    a.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="DRAM traffic per forward [GB]",
          title=f"Bytes moved (B={B}, H={H}, D={D}, float32)")
    b.plot(L, flops / naive, "o-", label="naive")
    b.plot(L, flops / io, "s-", label="fused (ideal)")
    b.axhline(c["fp32"] / c["dram"], color="tab:green", ls="-.", lw=1)
    b.text(L[0], c["fp32"] / c["dram"] * 0.6, f"FP32 ridge of the H200: {c['fp32'] / c['dram']:.0f} FLOP/byte",
           color="tab:green", fontsize=8)
    b.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="FLOP per DRAM byte",
          title="Arithmetic intensity")
    for ax in (a, b):
        log_ticks(ax, L)
        ax.tick_params(axis="x", labelrotation=45)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=8)
    return show_or_return(fig, show)


def fig_roofline_model():
    """The roofline model drawn from the measured H200 ceilings, with the two attention intensities."""
    c = ceilings()
    x = np.logspace(-1, 4, 300)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), constrained_layout=True)
    for peak, name, col in ((c["bf16"], "BF16 tensor cores", "C3"), (c["tf32"], "TF32 tensor cores", "C1"),
                            (c["fp32"], "FP32 CUDA cores", "C0")):
        ax.plot(x, np.minimum(peak, c["dram"] * x) / 1e12, color=col, lw=2,
                label=f"{name}: {peak / 1e12:,.1f} TFLOP/s, ridge {peak / c['dram']:.0f} FLOP/B")
        ax.plot([peak / c["dram"]] * 2, [0.05, peak / 1e12], ":", color=col, lw=1)
    for xi, name in ((16, "naive attention\nD=64: D/4 = 16"), (512, "fused, N=2048:\nN/4 = 512")):
        ax.axvline(xi, color="0.5", ls="--", lw=1)
        ax.text(xi * 1.1, 0.12, name, fontsize=8, color="0.3")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP / DRAM byte]",
           ylabel="attainable TFLOP/s", ylim=(0.05, 2000),
           title=f"Roofline of the H200 from measured ceilings (DRAM copy {c['dram'] / 1e12:.2f} TB/s)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize=8)
    plt.show()


