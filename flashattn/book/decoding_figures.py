"""The Decoding chapter's figures (book/decoding.ipynb).

- `merge_example`, `fig_split_merge`, `packed_rows`, `page_of`, `fig_gqa_paging`: the two concept figures
  (FIGURES, kept as PNGs in book/_static/concepts/ by flashattn.book.concept_figures, saved with
  savefig(path, dpi=110, bbox_inches="tight")) and the worked examples they draw, which mirror the arithmetic of
  kernels/decode.cu (tests/test_decoding_notes.py checks both against the kernel's text and the unsplit softmax);
- `splits_figure`, `bandwidth_figure`: the split sweep and the bandwidth of every column, from
  results/h200/decode.json.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from flashattn import decode
from flashattn.book.decoding import (
    COLUMNS,
    DATASHEET_BYTES_PER_S,
    ROWS,
    blocks_per_split,
    dims_by_shape,
    not_recorded,
    ok,
    part_rows,
    record,
    rule_now,
    slots,
    sm_count,
    split_points,
)
from flashattn.book.decoding_results import ceiling_tb_per_s
from flashattn.book.figures import show_or_return


def merge_example(n_keys: int = 32, splits: int = 4, D: int = 4, seed: int = 3) -> dict:
    """One query row's scores over `n_keys` keys cut into `splits` equal splits: each split's normalised output
    O_s and lse_s, the merge's weights exp(lse_s - lse), and the largest difference from the unsplit softmax,
    computed both the way the figure writes the merge and the way merge_kernel does it (max-subtracted)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(0.0, 2.0, n_keys)
    v = rng.normal(size=(n_keys, D))
    parts = np.array_split(np.arange(n_keys), splits)
    lse_s = np.array([np.log(np.exp(s[p]).sum()) for p in parts])
    o_s = np.stack([np.exp(s[p] - lse_s[i]) @ v[p] for i, p in enumerate(parts)])
    lse = np.log(np.exp(lse_s).sum())
    weights = np.exp(lse_s - lse)
    merged = weights @ o_s
    w_kernel = np.exp(lse_s - lse_s.max())                   # merge_kernel: weights against the largest lse_s
    merged_kernel = (w_kernel @ o_s) / w_kernel.sum()
    exact = np.exp(s - s.max()) / np.exp(s - s.max()).sum() @ v
    return dict(lse_parts=lse_s, weights=weights, lse=lse, lse_all=float(np.log(np.exp(s).sum())),
                max_error=float(np.abs(merged - exact).max()),
                max_error_kernel=float(np.abs(merged_kernel - exact).max()),
                keys_per_split=[len(p) for p in parts])


def _box(ax, x, y, w, h, text, color, fontsize=9, **kw):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.4", fc=color, ec="0.3", lw=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **kw)


def _arrow(ax, a, b, color="0.3"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color=color, lw=1.1))


SPLIT_COLORS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc")


def fig_split_merge(show: bool = False):
    """One sequence's keys cut into four splits, a block per split writing (O_s, lse_s), and the exact merge;
    the numbers under the blocks are merge_example's."""
    ex = merge_example()
    fig, ax = plt.subplots(figsize=(12, 5.6))
    ax.set(xlim=(0, 120), ylim=(0, 56))
    ax.axis("off")
    n_split, tiles = len(ex["lse_parts"]), 4
    x0, width = 6, 108
    tile_w = width / (n_split * tiles)
    ax.text(x0, 53, "the keys of one (sequence, kv head), in tiles of 64: one split = a contiguous range of tiles",
            fontsize=10, va="center")
    for s in range(n_split):
        for t in range(tiles):
            ax.add_patch(Rectangle((x0 + (s * tiles + t) * tile_w, 45), tile_w, 5, fc=SPLIT_COLORS[s], ec="0.35"))
        ax.text(x0 + (s + 0.5) * tiles * tile_w, 43, f"split {s}: tiles {s * tiles}–{s * tiles + tiles - 1}",
                ha="center", va="top", fontsize=9)
    box_w = 20
    centers = [x0 + (s + 0.5) * tiles * tile_w for s in range(n_split)]
    for s, cx in enumerate(centers):
        _arrow(ax, (cx, 39), (cx, 34.5))
        _box(ax, cx - box_w / 2, 24, box_w, 9.5,
             f"block (b, h, s = {s})\nstreams its tiles through\nthe cp.async ring, writes\n"
             f"O$_{s}$ (fp32) and lse$_{s}$",
             SPLIT_COLORS[s], fontsize=8.5)
        ax.text(cx, 21.3, f"lse$_{s}$ = {ex['lse_parts'][s]:.2f}   weight {ex['weights'][s]:.2f}", ha="center",
                fontsize=8.5, color="0.2")
        _arrow(ax, (cx, 19.8), (60 + (cx - 60) * 0.35, 13.2))
    _box(ax, 20, 3, 80, 9.5,
         r"merge kernel (one warp per output row)" "\n"
         r"$\mathrm{lse} = \log \sum_s e^{\mathrm{lse}_s}$,   "
         r"$O = \sum_s e^{\mathrm{lse}_s - \mathrm{lse}}\, O_s$" "\n"
         f"example (one row, {sum(ex['keys_per_split'])} keys): lse = {ex['lse']:.2f}, weights sum to "
         f"{ex['weights'].sum():.2f}, max |O − softmax(s) V| = {ex['max_error']:.0e}", "#eeeeee", fontsize=9.5)
    ax.set_title("Split-KV decoding: each block streams one slice of the cache; the merge is exact", fontsize=11)
    return show_or_return(fig, show)


def packed_rows(M: int, G: int) -> list[tuple[int, int, int]]:
    """(packed row p, new token m, query head g of the group) for every real row of the tiles: p = m * G + g,
    as row_offset in kernels/decode.cu; the tiles have ceil(M * G / 16) blocks of 16 rows."""
    return [(p, p // G, p % G) for p in range(M * G)]


def page_of(j: int, table: list[int], page_size: int) -> tuple[int, int]:
    """Where key j of a sequence lives in a paged cache: (physical page table[j // page_size], row j % page_size),
    as row_of in kernels/decode.cu."""
    return table[j // page_size], j % page_size


GQA_EXAMPLE = dict(M=2, G=4)


PAGE_EXAMPLE = dict(table=[5, 2, 7, 0], page_size=4, pool=8, key=9)


def fig_gqa_paging(show: bool = False):
    """Left: M * G packed rows of one 16-row tile sharing one K/V stream. Right: a block table mapping a
    sequence's logical pages to pages of the pool, and one key's lookup."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw=dict(width_ratios=[1, 1.25]))
    M, G = GQA_EXAMPLE["M"], GQA_EXAMPLE["G"]
    rows = packed_rows(M, G)
    a.set(xlim=(0, 60), ylim=(-1, 19))
    a.axis("off")
    for p in range(ROWS):
        y = 16 - p
        real = p < len(rows)
        a.add_patch(Rectangle((2, y), 24, 0.9, fc=SPLIT_COLORS[rows[p][1]] if real else "white", ec="0.5",
                              hatch=None if real else "///"))
        if real:
            a.text(14, y + 0.45, f"row {p}: token m={rows[p][1]}, head h·{G}+{rows[p][2]}", ha="center", va="center",
                   fontsize=7.5)
    pad_mid = 16 - (len(rows) + ROWS - 1) / 2 + 0.45
    a.text(14, pad_mid, f"rows {len(rows)}–{ROWS - 1}: zeros", ha="center", va="center", fontsize=8.5,
           bbox=dict(fc="white", ec="0.5", boxstyle="round,pad=0.3"))
    a.text(14, 18.2, f"one 16-row tile of Q (M = {M} new tokens, G = {G})", ha="center", fontsize=9.5)
    _box(a, 34, 9, 22, 5, "K$_j$, V$_j$ of kv head h\nread once per tile,\nshared by all 16 rows", "#eeeeee",
         fontsize=9)
    _arrow(a, (33.2, 11.5), (27, 11.5))
    a.text(45, 6.5, f"row p = m·G + g\n{len(rows)} real rows, {ROWS - len(rows)} padding:\n"
           "the mma pays for 16 rows either way", ha="center", va="top", fontsize=9)
    a.set_title("Grouped-query heads packed as rows of one tile", fontsize=11)

    table, size, pool, key = (PAGE_EXAMPLE[k] for k in ("table", "page_size", "pool", "key"))
    page, row = page_of(key, table, size)
    b.set(xlim=(0, 70), ylim=(0, 30))
    b.axis("off")
    pw = 7.5
    for i, phys in enumerate(table):
        x = 4 + i * (pw + 2)
        b.add_patch(Rectangle((x, 21), pw, 3.2, fc=SPLIT_COLORS[i], ec="0.35"))
        b.text(x + pw / 2, 22.6, f"keys {i * size}–{i * size + size - 1}", ha="center", va="center", fontsize=8)
        b.text(x + pw / 2, 19.6, f"table[{i}] = {phys}", ha="center", fontsize=8)
        _arrow(b, (x + pw / 2, 19.2), (3 + phys * 8.2 + 3.6, 9.4), color="0.45")
    b.text(4, 26.5, "sequence b's logical pages; block_table[b] lists where each one is", fontsize=9.5)
    owner = {phys: i for i, phys in enumerate(table)}
    for k in range(pool):
        x = 3 + k * 8.2
        mine = k in owner
        b.add_patch(Rectangle((x, 5), 7.2, 4.2, fc=SPLIT_COLORS[owner[k]] if mine else "#e6e6e6", ec="0.35"))
        for r in range(size):
            b.add_patch(Rectangle((x + 0.5, 5.4 + r * 0.9), 6.2, 0.75, fc="none", ec="0.6", lw=0.5))
        b.text(x + 3.6, 3.6, f"page {k}", ha="center", fontsize=8)
        if k == page:
            b.add_patch(Rectangle((x + 0.5, 5.4 + (size - 1 - row) * 0.9), 6.2, 0.75, fc="#cc0000", ec="none"))
    b.text(3, 11, "the pool of pages (grey: other sequences')", fontsize=9)
    b.text(35, 1.2, f"key j = {key}:  page block_table[b][{key} / {size}] = {page},  row {key} % {size} = {row}",
           ha="center", fontsize=9.5, color="#cc0000")
    b.set_title("A paged cache: one lookup per key row, at copy time", fontsize=11)
    fig.tight_layout()
    return show_or_return(fig, show)


FIGURES = {"decode_split_merge": fig_split_merge, "decode_gqa_paging": fig_gqa_paging}


def splits_figure(doc: dict | None = None, show: bool = True):
    """µs against num_splits per shape of the splits part, each point labelled with its blocks over the GPU's
    block slots (waves); the rule's choice as recorded (star) and as flashattn.decode computes it now (line)."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "splits")
    if not rows:
        print(not_recorded("splits").strip("*"))
        return None
    dims = dims_by_shape(rows)
    shapes = list(dims)
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), constrained_layout=True, squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        fixed, rule = split_points(doc, shape)
        per = blocks_per_split(dims[shape])
        ax.plot([s for s, _ in fixed], [u for _, u in fixed], "o-", color="C0", ms=4)
        if rule:
            ax.plot(rule["num_splits"], rule["median_us"], "*", ms=13, color="C3",
                    label=f"rule as recorded: {rule['num_splits']}")
        now = rule_now(dims[shape], doc)
        ax.axvline(now, ls=":", color="C2", label=f"rule now: {now}")
        ax.set_xscale("log", base=2)
        ax.set_xticks([s for s, _ in fixed], [str(s) for s, _ in fixed], fontsize=7)
        ax.minorticks_off()
        top = ax.secondary_xaxis("top")
        top.set_xticks([s for s, _ in fixed], [f"{per * s / slots(doc):.2f}" for s, _ in fixed], fontsize=7,
                       rotation=90)
        top.minorticks_off()
        top.set_xlabel("waves: blocks / block slots", fontsize=8)
        ax.set(xlabel="num_splits", ylabel="µs (median)", title=f"{shape}: {per} blocks per split")
        ax.margins(y=0.12)
        ax.grid(alpha=0.25)
        ax.legend(fontsize=8, loc="upper center")
    fig.suptitle(f"Block slots: {slots(doc)} = {sm_count(doc)} SMs × {decode.BLOCKS_PER_SM} resident blocks",
                 fontsize=9)
    return show_or_return(fig, show)


def bandwidth_figure(doc: dict | None = None, show: bool = True):
    """Achieved TB/s of every peers shape and column, against the datasheet and the ceiling part's plain read."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "peers")
    if not rows:
        print(not_recorded("peers").strip("*"))
        return None
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    cols = [c for c in COLUMNS if any(r["column"] == c for r in rows)]
    cols += [c for c in dict.fromkeys(r["column"] for r in rows) if c not in cols]
    got = {(r["shape"], r["column"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(10, 4.2), constrained_layout=True)
    w = 0.8 / len(cols)
    for i, c in enumerate(cols):
        xs = np.arange(len(shapes)) + (i - (len(cols) - 1) / 2) * w
        for x, s in zip(xs, shapes):
            r = got.get((s, c))
            if ok(r):
                ax.bar(x, r["tb_per_s"], w * 0.92, color=f"C{i}", label=COLUMNS.get(c, c) if s == shapes[0] else None)
            else:
                ax.text(x, 0.08, "not run", rotation=90, ha="center", va="bottom", fontsize=7, color=f"C{i}")
                ax.bar(x, 0, w * 0.92, color=f"C{i}", label=COLUMNS.get(c, c) if s == shapes[0] else None)
    ax.axhline(DATASHEET_BYTES_PER_S / 1e12, ls="--", color="k", lw=1, label="datasheet 4.8 TB/s")
    top = ceiling_tb_per_s(doc)
    if top:
        ax.axhline(top, color="0.45", lw=1.2, label=f"torch.sum read: {top:.2f} TB/s")
    ax.set_xticks(np.arange(len(shapes)), shapes)
    ax.set(ylabel="TB/s (bytes the call must read / time)", ylim=(0, 5.9),
           title="Decoding against the memory roofline (bf16, D = 128)")
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    ax.grid(axis="y", alpha=0.25)
    return show_or_return(fig, show)
