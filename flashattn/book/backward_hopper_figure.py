"""The concept figure of "The backward on Hopper" (book/backward_hopper.ipynb): one block of flash_bwd_ws, its
dataflow and, below, its shared memory to scale (the kernel's Layout struct evaluated from the file by
flashattn.book.backward_hopper), kept as a PNG beside the book.

    python -m flashattn.book.backward_hopper_figure           # redraw into book/_static/backward_hopper/
    python -m flashattn.book.backward_hopper_figure --check   # compare the committed PNG with a fresh drawing
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from flashattn.book import figure_files
from flashattn.book.backward_hopper import layout, regions, registers
from flashattn.book.figures import show_or_return
from flashattn.loader import REPO_ROOT

FOLDER = REPO_ROOT / "book" / "_static" / "backward_hopper"
COLORS = {"global": "#e8eef7", "shared": "#eef6e8", "registers": "#fbefe3", "once": "#1f5fa8",
          "per step": "#d2691e", "end": "#2e8b57", "sync": "#7a3e9d", "dq": "#b8860b"}
REGION_COLORS = {"K_j": "#9ec5e8", "V_j": "#b8d4ee", "Q_i": "#f6c28b", "dO_i": "#f9d7ad", "dSᵀ": "#c7a3d9",
                 "lse2_i": "#e07b39", "D_i": "#b85c1e", "dQ image": "#f2d16b", "barriers": "#555555"}
STEPS = ("1  wait full[s]", "2  Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ   (wgmma, both operands in shared)",
         "3  Pᵀ = exp2(Sᵀ · scale · log₂e − lse2_i)   while dPᵀ runs",
         "4  dSᵀ = Pᵀ ∘ (dPᵀ − D_i): kept as A operands, and stored",
         "5  dV_j += Pᵀ dO_i   (A in registers)",
         "6  fence.proxy.async; bar.sync 1, 256; wait dq_empty (step u − 1's image read)",
         "7  dQ half += dS K_j   (A = the stored dSᵀ, read transposed);  dK_j += dSᵀ Q_i",
         "8  dQ half → the image (16 st.shared.v2.f32), arrive dq_full: while dK_j runs",
         "9  mbarrier.arrive on empty[s]")


def box(ax, x, y, w, h, title, sub="", color="white", edge="0.35", fs=10.5):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03,rounding_size=0.1", fc=color, ec=edge, lw=1.2))
    ax.text(x + w / 2, y + h * (0.7 if sub else 0.5), title, ha="center", va="center", fontsize=fs, fontweight="bold")
    if sub:
        ax.text(x + w / 2, y + h * 0.32, sub, ha="center", va="center", fontsize=fs - 2.5, color="0.2")


def arrow(ax, start, end, kind, text="", at=None, rad=0.0, style="-|>", ls="-"):
    """An arrow colored by when it happens; its label at `at` (default: its middle)."""
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle=style, color=COLORS[kind], lw=1.8, ls=ls,
                                                          mutation_scale=14, connectionstyle=f"arc3,rad={rad}"))
    if text:
        x, y = at or ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        ax.text(x, y, text, ha="center", va="center", fontsize=8, color=COLORS[kind],
                bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.9))


def smem_strip(ax, D: int, y: float, width: float = 15.6, x0: float = 0.4):
    """Layout<D, default stages, banded> to scale: one rectangle per region (gid 'smem:D<D>:<name>'). The banded
    kernel's: at D = 128 it keeps B_r = 64 and the queries as dQ's M, the step this figure draws (without a mask
    the default takes B_r = 80 and turns dQ round, V8B_BR80)."""
    L = layout(D, banded=True)
    scale = width / L["BYTES"]
    for name, off, size in regions(L):
        label = name.replace("^T", "ᵀ")
        r = Rectangle((x0 + off * scale, y), size * scale, 0.5, fc=REGION_COLORS[label.split("[")[0]], ec="white",
                      lw=0.6, gid=f"smem:D{D}:{name}")
        ax.add_patch(r)
        if size * scale > 0.9:
            ax.text(x0 + (off + size / 2) * scale, y + 0.25, label, ha="center", va="center", fontsize=8)
    mask = " with a mask" if D == 128 else ""
    ax.text(x0, y + 0.62, f"D = {D}{mask}: B_r = {L['BR']}, B_c = {L['BC']}, {L['STAGES']} stages, "
            f"{L['BYTES']:,} bytes to scale (lse2_i, D_i: the sliver before dQ's image; the mbarriers: at the right)",
            fontsize=8.5, va="bottom")


def fig_dataflow(show: bool = False):
    """One block of flash_bwd_ws: what each warpgroup does per step, the ring of Q_i / dO_i / lse2_i / D_i slots
    with their full and empty barriers, dSᵀ through shared memory for dQ, and dQ leaving through a shared-memory
    image that the producer warpgroup's second thread hands to the copy engine (dq_full, dq_empty); below, the
    shared memory of both head dims to scale (Layout evaluated from the file)."""
    L, R = layout(128, banded=True), registers()
    fig, ax = plt.subplots(figsize=(16, 10.8))
    ax.set(xlim=(0, 16.4), ylim=(-1.9, 10.2))
    ax.axis("off")
    for key, x, w, title in (("global", 0.0, 3.3, "global memory"), ("shared", 3.6, 4.8, "shared memory (one block)"),
                             ("registers", 9.5, 6.9, "three warpgroups (registers)")):
        ax.add_patch(FancyBboxPatch((x, 0.6), w, 9.4, boxstyle="round,pad=0.02,rounding_size=0.2", fc=COLORS[key],
                                    ec="none"))
        ax.text(x + w / 2, 9.7, title, ha="center", fontsize=12, fontweight="bold")
    box(ax, 0.2, 8.3, 2.9, 0.9, "K_j, V_j", f"B_c = {L['BC']} keys of one kv head")
    box(ax, 0.2, 6.7, 2.9, 1.1, "Q_i, dO_i", "B_r query rows; every query\nhead of the group in turn")
    box(ax, 0.2, 5.1, 2.9, 1.1, "lse2_i, D_i", "float32, padded to whole\ntiles by the pre-pass")
    box(ax, 0.2, 2.3, 2.9, 0.75, "dK_j, dV_j", "written once, at the end")
    box(ax, 0.2, 0.8, 2.9, 1.2, "dQ accumulator", "float32, tiles in the image's order;\nthen dQ = scale · acc "
        "(bwd_convert)", color="#fff6d6")
    box(ax, 3.8, 8.3, 4.4, 0.9, "K_j, V_j", "loaded once, on the K/V barrier")
    for s in range(L["STAGES"]):
        box(ax, 3.8, 6.45 - 1.6 * s, 4.4, 1.35, f"slot {s}: Q_i | dO_i | lse2_i | D_i",
            f"full[{s}]: {L['STAGE_TX']:,} bytes at D = 128\nempty[{s}]: 256 arrivals, every consumer thread",
            color="#fdf3e7", edge=COLORS["per step"])
    box(ax, 3.8, 3.35, 4.4, 1.2, "dSᵀ[u mod 2]", f"[{L['BC']} keys][B_r queries], 128-byte swizzle;\ntwo "
        "buffers: one barrier per step", color="#efe3f5", edge=COLORS["sync"])
    box(ax, 3.8, 0.8, 4.4, 1.2, "dQ_i image", f"{L['DQ_IMAGE'] // 1024} KB float32, in fragment order\ndq_full: "
        "256 arrivals; dq_empty: the writer's 1", color="#fff6d6", edge=COLORS["dq"])
    box(ax, 9.7, 8.45, 6.5, 0.95, f"warpgroup 0: producer (setmaxnreg → {R['PRODUCER']})", "thread 0, step u: wait "
        "empty[s], expect bytes on full[s],\nTMA Q_i, dO_i; bulk-copy lse2_i, D_i (s = u mod stages)")
    box(ax, 9.7, 0.8, 6.5, 1.2, "warpgroup 0, thread 32: the dQ writer", "per step: wait dq_full (deterministic: "
        "and the tile's turn), issue one\ncp.reduce.async.bulk .add.f32, wait until it has read the image "
        "(deterministic:\nuntil the addition has landed, then bump the turn), arrive dq_empty", color="#fffaf0",
        edge=COLORS["dq"])
    ax.add_patch(FancyBboxPatch((9.7, 2.3), 6.5, 5.85, boxstyle="round,pad=0.03,rounding_size=0.1", fc="white",
                                ec="0.35", lw=1.2))
    ax.text(12.95, 7.85, f"warpgroups 1, 2: consumers (setmaxnreg → {R['CONSUMER']})", ha="center", fontsize=10.5,
            fontweight="bold")
    ax.text(12.95, 7.5, "keys 0–63 and 64–127 of the tile; one step per (query head, query tile):", ha="center",
            fontsize=8.5, color="0.25")
    for n, line in enumerate(STEPS):
        ax.text(9.85, 7.1 - 0.48 * n, line, fontsize=8.8, va="center")
    ax.text(12.95, 2.55, "dK_j, dV_j: accumulators in registers across all steps", ha="center", fontsize=9,
            color=COLORS["end"], fontweight="bold")
    arrow(ax, (3.1, 8.75), (3.8, 8.75), "once", "TMA")
    arrow(ax, (3.1, 7.25), (3.8, 7.0), "per step", "TMA", at=(3.45, 7.45))
    arrow(ax, (3.1, 5.65), (3.8, 5.5), "per step", "bulk", at=(3.45, 5.9))
    arrow(ax, (9.7, 8.7), (8.2, 7.6), "per step", "issues", at=(8.95, 8.4))
    arrow(ax, (8.2, 8.6), (9.7, 6.9), "per step", "operands by\ndescriptor", at=(8.95, 7.55))
    arrow(ax, (8.2, 6.9), (9.7, 6.75), "per step")
    arrow(ax, (9.7, 3.2), (8.2, 5.0), "sync", "9: arrive", at=(9.4, 3.56), ls="--")
    arrow(ax, (9.7, 5.4), (8.2, 4.35), "sync", "4: store", at=(9.35, 5.15))
    arrow(ax, (8.2, 3.65), (9.7, 4.65), "sync", "7: read", at=(8.8, 4.05))
    arrow(ax, (9.7, 3.74), (8.2, 1.75), "dq", "8: store,\narrive dq_full", at=(9.05, 2.87))
    arrow(ax, (9.7, 1.1), (8.2, 1.1), "dq", "issues", at=(8.95, 0.95))
    arrow(ax, (3.8, 1.4), (3.1, 1.4), "dq", "bulk\n.add.f32", at=(3.45, 1.8))
    arrow(ax, (9.7, 2.45), (3.1, 2.45), "end", "after the last step", at=(6.0, 2.45))
    smem_strip(ax, 64, -0.45)
    smem_strip(ax, 128, -1.75)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in REGION_COLORS.items()], loc="lower center",
              bbox_to_anchor=(0.5, -0.06), ncol=9, fontsize=8.5, frameon=False)
    ax.set_title("The backward on Hopper, one key tile per block (kernels/v8_backward.cu, flash_bwd_ws); below: "
                 "its shared memory to scale", fontsize=12.5, loc="left")
    return show_or_return(fig, show)


FIGURES = {"hopper_backward_dataflow": fig_dataflow}


if __name__ == "__main__":
    raise SystemExit(figure_files.main("python -m flashattn.book.backward_hopper_figure", __doc__, FIGURES, FOLDER))
