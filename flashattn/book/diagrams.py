"""The book's diagrams: how the online softmax and each kernel divide the work (launches, loop order, warps,
lanes, banks, register tiles, the copy pipeline). They are drawn from fixed inputs, a seeded generator, or
the kernels' own tile sizes and shared-memory arrays (flashattn.measure.geometry), never from a timing; the
figures of measured performance are in flashattn.book.figures.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from flashattn.book.figures import show_or_return
from flashattn.book.records import ceilings
from flashattn.measure.geometry import bank_map, conflict_degree, smem_bytes, smem_parts, v5_default_tiles
from flashattn.measure.table import label


def _box(ax, x, y, w, h, text, color, fs=9, **kw):
    """A rounded box with centred text (a launch or an array of fig_v0_dataflow)."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="0.3", **kw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs)


def _arrow(ax, a, b, text="", color="0.3"):
    ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="->", color=color, lw=1.4))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12, text, ha="center", fontsize=8, color=color)


def online_softmax_trace(scores, tile: int):
    """(tile index, m, l) after each tile of one row of scores: the running max and the running sum of
    exp(s_j - m), so that the last l * exp(m) is the full softmax denominator (the chapter's derivation)."""
    m, l, out = -np.inf, 0.0, []
    for t in range(0, len(scores), tile):
        s = scores[t:t + tile]
        m_new = max(m, s.max())
        l = l * np.exp(m - m_new) + np.exp(s - m_new).sum()
        m = m_new
        out.append((t // tile, m, l))
    return out


def fig_online_softmax(n: int = 32, tile: int = 8, seed: int = 3):
    """One row of scores processed tile by tile: the running max m and the running sum l, whose last
    value times exp(m) equals the full sum."""
    rng = np.random.default_rng(seed)
    s = np.clip(rng.normal(0, 1.0, n), -3.0, 1.8)
    s[3], s[12], s[19] = 2.2, 3.2, 5.0               # the max grows in tiles 2 and 3, not in tile 4
    trace = online_softmax_trace(s, tile)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    cols = [f"C{(i // tile) % 10}" for i in range(n)]
    a.bar(range(n), s, color=cols)
    last = None
    for t, m, _ in trace:
        if m != last:                                 # label the running max where it changes
            a.hlines(m, t * tile - 0.4, n - 0.6, color="k", lw=1, ls="--")
            a.text(t * tile, m + 0.2, f"m from tile {t + 1} on", fontsize=8)
            last = m
    a.set(xlabel="key index j", ylabel="score $s_j$", title=f"One row of S in tiles of {tile} keys")
    steps = [t + 1 for t, _, _ in trace]
    b.plot(steps, [l for *_, l in trace], "o-", label="running $\\ell$ (relative to the running max)")
    b.plot(steps, [np.exp(s[:(t + 1) * tile] - s.max()).sum() * np.exp(s.max() - m) for t, m, _ in trace],
           "x", ms=10, color="k", label="$\\sum_{j<\\mathrm{seen}} e^{s_j - m}$ recomputed from scratch")
    b.set(xlabel="tiles seen", ylabel="$\\ell$", xticks=steps,
          title="$\\ell$ drops when m grows: old terms are rescaled, not recomputed")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    plt.show()


def fig_v0_dataflow():
    """v0's three launches and where the score matrix lives between them."""
    fig, ax = plt.subplots(figsize=(10, 2.8), constrained_layout=True)
    ax.set(xlim=(0, 10), ylim=(0, 3))
    ax.axis("off")
    _box(ax, 0.1, 1.9, 1.5, 0.8, "Q, K\n(DRAM)", "#dbe9f6")
    _box(ax, 2.2, 1.9, 1.9, 0.8, "scores_kernel\nS = QKᵀ/√D", "#fde0c5")
    _box(ax, 4.7, 0.9, 1.9, 1.0, "S / P\n[B, H, N, N] floats\nin DRAM", "#f7c6c7")
    _box(ax, 2.2, 0.1, 1.9, 0.8, "softmax_kernel\nP = softmax(S)", "#fde0c5")
    _box(ax, 7.2, 1.9, 1.9, 0.8, "pv_kernel\nO = PV", "#fde0c5")
    _box(ax, 7.2, 0.1, 1.9, 0.8, "V (DRAM) → O", "#dbe9f6")
    _arrow(ax, (1.6, 2.3), (2.2, 2.3))
    _arrow(ax, (4.1, 2.3), (4.9, 1.9))
    ax.text(4.6, 2.35, "write N² floats", fontsize=8, color="crimson")
    _arrow(ax, (4.7, 1.1), (4.1, 0.6))
    ax.text(4.45, 0.55, "read + write N²", fontsize=8, color="crimson")
    _arrow(ax, (6.6, 1.6), (7.2, 2.2))
    ax.text(6.25, 2.05, "read N²", fontsize=8, color="crimson")
    _arrow(ax, (8.15, 0.9), (8.15, 1.9))
    plt.show()


def fig_grid_fill(blocks_v1: int = 48, blocks_v2: int = 1536, blocks_per_sm_v2: int = 3):
    """How many of the H200's SMs each grid keeps busy: v1 launches one block per (batch, head)."""
    sms = ceilings()["sm_count"]
    fig, axes = plt.subplots(2, 1, figsize=(11, 2.6), constrained_layout=True)
    for ax, blocks, per, name in ((axes[0], blocks_v1, 1, "v1: one block per (batch, head)"),
                                  (axes[1], blocks_v2, blocks_per_sm_v2, "v2: one block per query tile")):
        first_wave = np.minimum(blocks, sms * per)
        busy = np.zeros(sms)
        busy[: min(sms, blocks)] = 1
        ax.imshow(busy[None, :], cmap="Greens", vmin=0, vmax=1.4, aspect="auto")
        ax.set_yticks([])
        ax.set_xticks([0, 47, sms - 1])
        ax.set_xticklabels(["SM 0", "SM 47", f"SM {sms - 1}"])
        waves = blocks / (sms * per)
        ax.set_title(f"{name}: {blocks:,} blocks; {int(first_wave):,} run at once "
                     f"({min(blocks, sms)} of {sms} SMs busy, {waves:.1f} waves)", fontsize=9, loc="left")
    plt.show()


def fig_smem_stack(versions=("v1", "v2", "v3"), D: int = 64):
    """Stacked bars of each version's shared memory per block (KiB), by array (flashattn.measure.geometry)."""
    budgets = {v: [(name, smem_bytes([(name, r, c)])) for name, r, c in smem_parts(v, D)] for v in versions}
    fig, ax = plt.subplots(figsize=(8, 0.7 + 0.55 * len(budgets)), constrained_layout=True)
    names = list(budgets)
    colors = {}
    for y, v in enumerate(names):
        left = 0.0
        for part, nbytes in budgets[v]:
            col = colors.setdefault(part, f"C{len(colors) % 10}")
            ax.barh(y, nbytes / 1024, left=left, color=col, ec="white")
            if nbytes / 1024 > 2.5:
                ax.text(left + nbytes / 2048, y, part, ha="center", va="center", fontsize=8, color="white")
            left += nbytes / 1024
        ax.text(left + 0.5, y, f"{left:.1f} KiB", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), [label(n) for n in names])
    ax.invert_yaxis()
    widest = max(sum(b for _, b in parts) for parts in budgets.values()) / 1024
    ax.set(xlabel=f"shared memory per block [KiB] at D = {D}", xlim=(0, widest * 1.18))
    plt.show()


def fig_loop_order():
    """v1 walks K/V tiles outside and all query tiles inside; v2 gives each block one query tile."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.7), constrained_layout=True)
    n = 6
    for ax, name in zip(axes, ("v1 (FlashAttention-1 order)", "v2 (FlashAttention-2 order)")):
        ax.set(xlim=(-0.2, n + 0.2), ylim=(n + 0.2, -0.9), aspect="equal")
        ax.axis("off")
        for i in range(n):
            for j in range(n):
                if name.startswith("v1"):
                    col = plt.cm.Blues(0.25 + 0.6 * j / n)    # one block, visiting column by column
                else:
                    col = plt.cm.tab10(i % 10)                # block i owns row i
                ax.add_patch(Rectangle((j, i), 1, 1, fc=col, ec="white", alpha=0.85))
        ax.text(n / 2, -0.45, "key tiles j (K_j, V_j) →", ha="center", fontsize=9)
        ax.text(-0.15, n / 2, "query tiles i ↓", rotation=90, va="center", ha="right", fontsize=9)
        ax.set_title(name, fontsize=10)
    axes[0].text(n / 2, n + 0.1, "one block: for j: load K_j, V_j; for i: update O_i, m_i, l_i in DRAM",
                 ha="center", va="top", fontsize=8)
    axes[1].text(n / 2, n + 0.1, "block i (colour): keeps O_i, m_i, l_i on chip; streams every K_j, V_j",
                 ha="center", va="top", fontsize=8)
    plt.show()


def fig_warp_ownership(B_r=64, B_c=32, D=64, warps=8):
    """v3/v4: which warp owns which query rows, and which lane owns which score / output columns."""
    rows = B_r // warps
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), constrained_layout=True,
                             gridspec_kw={"width_ratios": [D, B_c, D]})
    warp_of_row = np.repeat(np.arange(warps), rows)
    q = np.tile(warp_of_row[:, None], (1, D))
    axes[0].imshow(q, cmap="tab10", vmin=0, vmax=9, aspect="auto")
    axes[0].set_title(f"Q_i ({B_r} × {D}): row → warp\n(warp w owns rows 8w … 8w+7)", fontsize=9)
    lane = np.tile(np.arange(B_c)[None, :], (B_r, 1))
    shade = warp_of_row[:, None] * 0 + (lane % 32) / 31
    axes[1].imshow(np.where(warp_of_row[:, None] == 0, shade, np.nan), cmap="viridis", aspect="auto")
    axes[1].imshow(np.where(warp_of_row[:, None] == 0, np.nan, warp_of_row[:, None] + 0 * lane), cmap="tab10",
                   vmin=0, vmax=9, alpha=0.35, aspect="auto")
    axes[1].set_title(f"S_ij ({B_r} × {B_c}): lane c computes column c\n(warp 0 shaded by lane)", fontsize=9)
    out_lane = np.tile((np.arange(D) % 32)[None, :], (B_r, 1)) / 31
    axes[2].imshow(np.where(warp_of_row[:, None] == 0, out_lane, np.nan), cmap="viridis", aspect="auto")
    axes[2].imshow(np.where(warp_of_row[:, None] == 0, np.nan, warp_of_row[:, None] + 0 * out_lane), cmap="tab10",
                   vmin=0, vmax=9, alpha=0.35, aspect="auto")
    axes[2].set_title(f"O_i ({B_r} × {D}) in registers: lane c owns\ncolumns c and c+32 of its warp's rows", fontsize=9)
    for ax in axes:
        ax.set_xlabel("column")
        ax.set_ylabel("row")
    plt.show()


def fig_bank_mapping(strides=(64, 65), d: int = 0):
    """Lane c reads K_j[c][d]: which of the 32 banks it hits, for each row stride."""
    fig, axes = plt.subplots(1, len(strides), figsize=(5.2 * len(strides), 3.6), constrained_layout=True)
    for ax, stride in zip(np.atleast_1d(axes), strides):
        grid = np.zeros((32, 32))
        for c, b in enumerate(bank_map(stride, d)):
            grid[b, c] = 1
        ax.imshow(grid, cmap="Reds" if conflict_degree(stride, d) > 1 else "Greens", origin="lower", vmin=0, vmax=1.2)
        ax.set(xlabel="lane c (reads row c of K_j)", ylabel="shared-memory bank",
               title=f"row stride {stride} floats: {conflict_degree(stride, d)}-way "
                     f"{'conflict' if conflict_degree(stride, d) > 1 else '(conflict-free)'}")
        ax.set_xticks(range(0, 32, 4))
        ax.set_yticks(range(0, 32, 4))
    plt.show()


def fig_register_tile(B_r=None, B_c=None, TM=None, TN=None, highlight=(0, 1, 8, 9), show: bool = True):
    """v5: the threads of a block tile S_ij; thread (rg, cg) owns rows rg + i*NRG and columns cg + j*WC.
    The shape defaults to the one kernels/v5.cu compiles for D = 64.

    Left (or top): the whole score tile, with the cells of four threads marked; the grid marks the
    NRG x WC blocks, and each block holds one cell of every thread. Right: one such block, enlarged, with
    the number of the thread that owns each cell."""
    compiled = v5_default_tiles()[64]
    B_r, B_c = B_r or compiled["B_r"], B_c or compiled["B_c"]
    TM, TN = TM or compiled["TM"], TN or compiled["TN"]
    WC, NRG = B_c // TN, B_r // TM
    owner = np.full((B_r, B_c), -1.0)
    for k, t in enumerate(highlight):
        rg, cg = t // WC, t % WC
        for i in range(TM):
            for j in range(TN):
                owner[rg + i * NRG, cg + j * WC] = k
    colors = ["#f2f2f2"] + [plt.cm.tab10(k) for k in range(len(highlight))]
    cmap = ListedColormap(colors)
    tall = B_r >= B_c
    # side by side for a tall tile, stacked for a wide one; the enlarged block gets as much room as the tile
    fig, (top, zoom) = plt.subplots(*((1, 2) if tall else (2, 1)), figsize=(11, 10) if tall else (10, 10),
                                    constrained_layout=True)
    top.pcolormesh(np.arange(B_c + 1), np.arange(B_r + 1), np.zeros((B_r, B_c)), cmap=cmap, vmin=0,
                   vmax=len(highlight), edgecolors="white", linewidth=0.2)
    for k in range(len(highlight)):   # markers larger than a cell: one element of 8192 is a speck
        rows, cols = np.nonzero(owner == k)
        top.scatter(cols + 0.5, rows + 0.5, s=22, color=colors[k + 1], marker="s", linewidths=0)
    top.set_xticks(range(0, B_c + 1, WC))
    top.set_yticks(range(0, B_r + 1, NRG))
    top.set_xlim(0, B_c)
    top.set_ylim(B_r, 0)
    top.set_aspect("equal")
    top.grid(color="0.35", lw=1.0)
    top.add_patch(plt.Rectangle((0, 0), WC, NRG, fill=False, ec="black", lw=2.5))
    top.set(xlabel=f"key column of S_ij (one block = {WC} columns, j = block column)",
            ylabel=f"query row of S_ij (one block = {NRG} rows, i = block row)")
    top.set_title(f"The {B_r} × {B_c} score tile of one block:\n{NRG * WC} threads, each owning a {TM} × {TN} "
                  f"register tile:\nrows rg + {NRG}·i (i < {TM}), columns cg + {WC}·j (j < {TN})", fontsize=11)
    top.legend(handles=[Patch(color=colors[k + 1], label=f"thread {t} (rg = {t // WC}, cg = {t % WC})")
                        for k, t in enumerate(highlight)], loc="upper center", bbox_to_anchor=(0.5, -0.07),
               ncol=2, fontsize=10)
    ids = np.arange(NRG * WC).reshape(NRG, WC)
    block = np.array([[1 + highlight.index(v) if v in highlight else 0 for v in row] for row in ids])
    zoom.pcolormesh(np.arange(WC + 1), np.arange(NRG + 1), block, cmap=cmap, vmin=0, vmax=len(highlight),
                    edgecolors="0.5", linewidth=0.8)
    for r in range(NRG):
        for col in range(WC):
            zoom.text(col + 0.5, r + 0.5, str(ids[r, col]), ha="center", va="center", fontsize=10)
    zoom.set_xticks(np.arange(WC) + 0.5, [str(v) for v in range(WC)])
    zoom.set_yticks(np.arange(NRG) + 0.5, [str(v) for v in range(NRG)])
    zoom.set_xlim(0, WC)
    zoom.set_ylim(NRG, 0)
    zoom.set_aspect("equal")
    zoom.set(xlabel="cg = column within the block", ylabel="rg = row within the block")
    zoom.set_title(f"The black {NRG} × {WC} block, enlarged:\ncell (rg, cg) belongs to thread {WC}·rg + cg;\n"
                   f"the other {TM * TN - 1} blocks repeat it", fontsize=11)
    return show_or_return(fig, show)


def fig_pipeline(tiles: int = 3):
    """v5's two-stage cp.async pipeline: each copy hides behind half a tile of arithmetic."""
    fig, ax = plt.subplots(figsize=(11, 2.2), constrained_layout=True)
    t = 0.0
    for j in range(tiles):
        ax.barh(1, 1.0, left=t, color="C0", ec="white")
        ax.text(t + 0.5, 1, f"S = Q K_{j}ᵀ, softmax", ha="center", va="center", color="white", fontsize=8)
        ax.barh(0, 0.8, left=t + 0.05, color="C1", ec="white")
        ax.text(t + 0.45, 0, f"cp.async V_{j}", ha="center", va="center", fontsize=8)
        ax.barh(1, 1.0, left=t + 1, color="C2", ec="white")
        ax.text(t + 1.5, 1, f"O += P V_{j}", ha="center", va="center", color="white", fontsize=8)
        if j < tiles - 1:
            ax.barh(0, 0.8, left=t + 1.05, color="C4", ec="white")
            ax.text(t + 1.45, 0, f"cp.async K_{j + 1}", ha="center", va="center", color="white", fontsize=8)
        t += 2
    ax.set_yticks([0, 1], ["copy engine\n(cp.async)", "FFMA pipes"])
    ax.set(xlabel="time →", xticks=[])
    ax.set_xlim(0, t)
    plt.show()
