"""The chapter "Attention in real models" (book/real_models.ipynb): its concept figures and the arithmetic
they draw, and the tables of its records.

- `window_tiles`, `tile_counts`: which (query tile, key tile) pairs a sliding window skips, runs unmasked or
  masks, by the bounds the kernels use (tests/test_real_models_notes.py checks them against the
  element-wise mask of flashattn.reference);
- `fig_gqa`, `fig_window`, `fig_varlen`, `fig_varlen_order`: grouped heads, the window's band over the tile grid,
  a packed batch against the same batch padded, the persistent blocks' loads before and after the varlen
  forward's pre-pass; `fig_padding` (D = 96 on 128-wide tiles) is a concept figure, FIGURES;
- `prefill_table`, `varlen_table`: results/h200/prefill.json (and prefill_wide.json) and varlen.json, every
  column of one run; `log_table`: a step's table as its tool printed it on the H200 (the varlen forward's
  order, the causal order's head groups), from its log.
"""
from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import FancyArrowPatch, Rectangle

from flashattn.book.figures import show_or_return
from flashattn.book.notebook import md
from flashattn.measure import results, varlen_order
from flashattn.measure.results import H200

SKIP, FULL, MASKED = 0, 1, 2
PREFILL = H200 / "prefill.json"
PREFILL_FORWARD = H200 / "prefill_forward.json"
PREFILL_WIDE = H200 / "prefill_wide.json"
VARLEN = H200 / "varlen.json"


def key_range(i: int, M: int, N: int, left: int, right: int) -> tuple[int, int]:
    """Keys [lo, hi] that query row i sees under window (left, right), bottom-right aligned (-1: unbounded)."""
    diag = i + N - M
    lo = 0 if left < 0 else max(0, diag - left)
    hi = N - 1 if right < 0 else min(N - 1, diag + right)
    return lo, hi


def window_tiles(M: int, N: int, B_r: int, B_c: int, left: int, right: int) -> np.ndarray:
    """[query tiles, key tiles] of SKIP (no row sees any key of the tile), FULL (every row sees every key:
    no mask needed) or MASKED. A row's range only moves right as the row grows, so the first and last rows
    of a tile bound it."""
    grid = np.zeros((-(-M // B_r), -(-N // B_c)), dtype=int)
    for ti, tj in itertools.product(range(grid.shape[0]), range(grid.shape[1])):
        r0, r1 = ti * B_r, min(M, (ti + 1) * B_r) - 1
        c0, c1 = tj * B_c, min(N, (tj + 1) * B_c) - 1
        lo0, hi0 = key_range(r0, M, N, left, right)
        lo1, hi1 = key_range(r1, M, N, left, right)
        if c1 < lo0 or c0 > hi1:
            grid[ti, tj] = SKIP
        elif c0 >= lo1 and c1 <= hi0 and (tj + 1) * B_c <= N:
            grid[ti, tj] = FULL
        else:
            grid[ti, tj] = MASKED
    return grid


def tile_counts(grid: np.ndarray) -> dict[str, int]:
    return {"skipped": int((grid == SKIP).sum()), "unmasked": int((grid == FULL).sum()),
            "masked": int((grid == MASKED).sum())}


def _arrow(ax, a, b, color="0.35"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, color=color, lw=1))


def fig_gqa(H_q: int = 8, H_kv: int = 2, show: bool = False):
    """Query heads h (top) reading kv head h // G (bottom), G = H_q / H_kv: K and V are stored and read once
    per group."""
    G = H_q // H_kv
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    for h in range(H_q):
        ax.add_patch(Rectangle((h, 2), 0.8, 0.6, fc=f"C{h // G}", alpha=0.35, ec="0.3"))
        ax.text(h + 0.4, 2.3, f"Q{h}", ha="center", va="center", fontsize=9)
    width = H_q / H_kv
    for g in range(H_kv):
        x = g * width + width / 2 - 0.6
        ax.add_patch(Rectangle((x, 0), 1.2, 0.6, fc=f"C{g}", alpha=0.7, ec="0.3"))
        ax.text(x + 0.6, 0.3, f"K{g}, V{g}", ha="center", va="center", fontsize=9)
        for h in range(g * G, (g + 1) * G):
            _arrow(ax, (h + 0.4, 2), (x + 0.6, 0.62))
    ax.text(H_q + 0.2, 2.3, f"H_q = {H_q} query heads", va="center", fontsize=9)
    ax.text(H_q + 0.2, 0.3, f"H_kv = {H_kv} kv heads, G = {G}", va="center", fontsize=9)
    ax.set(xlim=(-0.3, H_q + 3.2), ylim=(-0.2, 2.8))
    ax.axis("off")
    ax.set_title("Grouped-query attention: query head h reads kv head h // G", fontsize=10)
    return show_or_return(fig, show)


def fig_padding(D: int = 96, show: bool = False):
    """A head dim that is not whole 64-column panels (D = 96) on the next panel's tiles: the tensor in memory
    has D columns; each TMA box brings 64 of them into a panel of the tile, and the second box's columns past
    D come out as zeros, made by the copy engine, not read."""
    tile = -(-D // 64) * 64
    rows = 6
    fig, ax = plt.subplots(figsize=(8.4, 2.9))
    # memory: rows of D columns, one after another (a row of the tile at each)
    for r in range(rows):
        ax.add_patch(Rectangle((0, rows - 1 - r), D / 32, 0.8, fc="#9ecae1", ec="0.4", lw=0.6))
    ax.text(D / 64, rows + 0.2, f"Q, K, V in memory\nrows of D = {D} columns", ha="center", fontsize=9)
    # the tile: panels of 64 columns; columns D .. tile - 1 zero
    x0 = D / 32 + 2.5
    for r in range(rows):
        y = rows - 1 - r
        ax.add_patch(Rectangle((x0, y), 2, 0.8, fc="#9ecae1", ec="0.4", lw=0.6))
        ax.add_patch(Rectangle((x0 + 2.7, y), (D - 64) / 32, 0.8, fc="#9ecae1", ec="0.4", lw=0.6))
        ax.add_patch(Rectangle((x0 + 2.7 + (D - 64) / 32, y), (tile - D) / 32, 0.8, fc="0.92", ec="0.4", lw=0.6,
                               hatch="///"))
    ax.text(x0 + 1, rows + 0.2, "panel 0\ncolumns 0-63", ha="center", fontsize=9)
    ax.text(x0 + 3.7, rows + 0.2, f"panel 1\ncolumns 64-{tile - 1}", ha="center", fontsize=9)
    ax.text(x0 + 2.7 + (D - 64) / 32 + (tile - D) / 64, -0.55, f"{D}-{tile - 1}: zeros\n(out of bounds)",
            ha="center", va="top", fontsize=8)
    _arrow(ax, (D / 32 + 0.2, rows / 2), (x0 - 0.2, rows / 2))
    ax.text((D / 32 + x0) / 2, rows / 2 + 0.35, "TMA boxes\nof 64 columns", ha="center", fontsize=8)
    ax.text(x0 + 5.4, rows / 2 + 0.4, f"S = Q K^T: the zero columns add 0\nO = P V: columns {D}-{tile - 1} are 0,\n"
            "not stored", va="center", fontsize=9)
    ax.set(xlim=(-0.3, x0 + 9.5), ylim=(-1.6, rows + 1.3))
    ax.axis("off")
    ax.set_title(f"D = {D} on D = {tile}'s tiles: the tile is wider than the tensor", fontsize=10)
    return show_or_return(fig, show)


FIGURES = {"padded_head_dim": fig_padding}   # kept as a PNG (flashattn.book.concept_figures), shown from markdown


def fig_window(M: int = 2048, N: int = 2048, B_r: int = 128, B_c: int = 128, left: int = 300, show: bool = False):
    """The causal tile grid beside a sliding window of `left` keys: skipped, unmasked and masked tiles."""
    cmap = ListedColormap(["white", "#9ecae1", "#fdae6b"])
    cases = [("causal", -1, 0), (f"window ({left}, 0)", left, 0)]
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 4.0), constrained_layout=True)
    for ax, (title, lo, hi) in zip(axes, cases):
        grid = window_tiles(M, N, B_r, B_c, lo, hi)
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=2)
        ax.set_xticks(np.arange(-0.5, grid.shape[1], 1), minor=True)
        ax.set_yticks(np.arange(-0.5, grid.shape[0], 1), minor=True)
        ax.grid(which="minor", color="0.75", lw=0.5)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        c = tile_counts(grid)
        ax.set_title(f"{title}: {c['unmasked'] + c['masked']} of {grid.size} tiles run", fontsize=10)
        ax.set(xlabel=f"key tiles K_j ({B_c} keys)", ylabel=f"query tiles Q_i ({B_r} rows)")
    handles = [Rectangle((0, 0), 1, 1, fc=cmap(i), ec="0.5") for i in (FULL, MASKED, SKIP)]
    fig.legend(handles, ["runs unmasked", "runs with the mask", "skipped: never loaded"], loc="lower center",
               ncol=3, fontsize=9, bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(f"M = N = {N}: the loop over j starts and ends at the window's first and last tile", fontsize=10)
    return show_or_return(fig, show)


def fig_varlen(lengths=(8192, 4096, 1000, 513, 17, 1, 2048, 300), show: bool = False):
    """The batch padded to its longest sequence (each row a sequence) above the same batch packed into one run of
    tokens, cu_seqlens marking where each sequence starts."""
    longest, total = max(lengths), sum(lengths)
    cu = [0, *itertools.accumulate(lengths)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.4, 3.8), gridspec_kw={"height_ratios": [2.2, 1]},
                                      constrained_layout=True)
    for i, n in enumerate(lengths):
        top.add_patch(Rectangle((0, i), n, 0.8, fc=f"C{i % 10}", alpha=0.75))
        top.add_patch(Rectangle((n, i), longest - n, 0.8, fc="0.92", ec="0.8", lw=0.3))
    top.set(xlim=(0, longest), ylim=(len(lengths), -0.2), yticks=[], xlabel="position in the padded batch")
    top.set_title(f"padded: {len(lengths)} × {longest} = {len(lengths) * longest:,} token slots for {total:,} "
                  f"tokens (grey: padding)", fontsize=10)
    for i, n in enumerate(lengths):
        bottom.add_patch(Rectangle((cu[i], 0), n, 0.8, fc=f"C{i % 10}", alpha=0.75))
    bottom.set_xticks(cu[:3] + [cu[-1]])
    bottom.set(xlim=(0, total), ylim=(0, 1), yticks=[], xlabel="cu_seqlens (int32): where each sequence starts")
    bottom.set_title(f"packed: [total = {total:,}, H, D], cu_seqlens = {cu}", fontsize=9)
    return show_or_return(fig, show)


def fig_varlen_order(lengths=(8192, 4096, 1000, 513, 17, 1, 2048, 300), show: bool = False):
    """Each of the H200's 132 persistent blocks' sum of key tiles on the packed batch (32 query heads, D = 128,
    causal), as the blocks took the items before the pre-pass (B x H x the longest sequence's row blocks) and
    after it (the batch's row blocks, the highest first): flashattn.measure.varlen_order's model."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.0), sharey=True, constrained_layout=True)
    for ax, ordered, title in zip(axes, (False, True), ("every (sequence, head) × the longest's row blocks",
                                                         "the pre-pass's list, the highest row blocks first")):
        tiles = varlen_order.items(lengths, True, ordered)
        load = varlen_order.block_loads(tiles, True)
        mean = sum(load) / len(load)
        ax.bar(range(len(load)), load, width=1.0, color="C1" if not ordered else "C0")
        ax.axhline(mean, color="0.2", lw=1, ls="--")
        real = sum(1 for t in tiles if t)
        ax.set_title(f"{title}\n{len(tiles):,} items, {real:,} real; busiest block {max(load) / mean:.2f}× the mean",
                     fontsize=9)
        ax.set(xlabel="persistent block (one per SM)", xlim=(-1, len(load)))
    axes[0].set_ylabel("key tiles the block computes")
    return show_or_return(fig, show)


def _cell(r: dict | None) -> str:
    """A row's median µs; "not run" when its library did not import in that run, "refused" when the column
    could not take the shape."""
    if r is None:
        return "—"
    if r["status"] == "ok":
        return f"{r['median_us']:,.1f}"
    return "not run" if "does not import" in r.get("message", "") else "refused"


def _lines(doc: dict, columns, peer: str, part: str = "forward") -> list[str]:
    """A record's rows of one part ("forward" or "backward") as table lines, a shape per line, with the peer's
    time over ours; no lines when the record has none of that part."""
    rows = [r for r in doc["rows"] if r["part"] == part]
    if not rows:
        return []
    shapes = list(dict.fromkeys((r["B"], r["H_q"], r["H_kv"], r["N"], r["D"], r["causal"]) for r in rows))
    by = {((r["B"], r["H_q"], r["H_kv"], r["N"], r["D"], r["causal"]), r["column"]): r for r in rows}
    lines = ["| B, H_q / H_kv, N, D | causal | " + " | ".join(columns) + f" | v8 / {peer} |",
             "|---|---|" + "--:|" * (len(columns) + 1)]
    for s in shapes:
        ours, other = by.get((s, "v8")), by.get((s, peer))
        ratio = (f"{other['median_us'] / ours['median_us']:.2f}×" if ours and other and ours["status"] == "ok"
                 and other["status"] == "ok" else "—")
        lines.append(f"| {s[0]}, {s[1]} / {s[2]}, {s[3]}, {s[4]} | {'yes' if s[5] else 'no'} | "
                     + " | ".join(_cell(by.get((s, c))) for c in columns) + f" | {ratio} |")
    return lines


def _backward_lines(doc: dict, columns, peer: str) -> list[str]:
    lines = _lines(doc, columns, peer, "backward")
    return ["", "Backward, every column through `torch.autograd.grad` on its own forward's output (ours: "
            "kernels/v8_backward.cu):", "", *lines] if lines else []


def prefill_table(path=PREFILL, wide=PREFILL_WIDE, forward=PREFILL_FORWARD,
                  columns=("v8", "fa4", "sdpa_cudnn", "sdpa_flash")):
    """The prefill record's forward rows (from prefill_forward.json, the forward part run alone, when recorded) and
    its backward rows, and below them the head dims beyond 64 and 128 (prefill_wide.json: 192 and 256 forward, 96
    forward and backward) when recorded."""
    doc = results.read_if_exists(path, "prefill")
    if doc is None:
        return md("*Not recorded yet: `python -m flashattn.measure.prefill_bench --out results/h200`.*")
    fwd = results.read_if_exists(forward, "prefill") or doc
    runs = ""
    if fwd is not doc:
        runs = (f"\n\nForward rows: {fwd['meta']['command']} at commit {fwd['meta']['git']['commit']}; backward rows: "
                f"{doc['meta']['command']} at commit {doc['meta']['git']['commit']}.")
    text = ("\n".join(_lines(fwd, columns, "fa4") + _backward_lines(doc, columns, "fa4"))
            + "\n\nMedian µs of one interleaved run per shape (bf16); v8 / fa4: FlashAttention-4's time over ours, "
            "above 1 when ours is faster. Refused: the column cannot take the shape; not run: its library did not "
            "import in that run." + runs)
    wide_doc = results.read_if_exists(wide, "prefill")
    if wide_doc is not None:
        text += ("\n\nHead dims 96, 192 and 256 (`python -m flashattn.measure.prefill_bench --parts wide`), another "
                 "run:\n\n" + "\n".join(_lines(wide_doc, columns, "fa4") + _backward_lines(wide_doc, columns, "fa4"))
                 + "\n\nv8 / fa4 as above.")
    return md(text)


def log_table(name: str):
    """A step's table as its tool (flashattn.measure.varlen_order, forward_candidates) printed it on the H200, from
    results/h200/logs/NAME: the table, and the line naming the run."""
    text = (H200 / "logs" / name).read_text()
    head = [ln.removeprefix("# ") for ln in text.splitlines() if ln.startswith("# ")]
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    return md("\n".join(rows) + "\n\n" + " ".join(head))


def varlen_table(path=VARLEN):
    doc = results.read_if_exists(path, "prefill")
    if doc is None:
        return md("*Not recorded yet: `python -m flashattn.measure.varlen_bench --out results/h200`.*")
    lines = ["| part | column | µs | TFLOP/s (the packed batch's work) |", "|---|---|--:|--:|"]
    for r in doc["rows"]:
        tf = f"{r['tflops']:.0f}" if r["status"] == "ok" else r.get("message", "")[:60]
        lines.append(f"| {r['part'].removeprefix('varlen_')} | {r['column']} | {_cell(r)} | {tf} |")
    lengths = doc["rows"][0]["lengths"]
    return md("\n".join(lines) + f"\n\nLengths {lengths}, {doc['rows'][0]['H_q']} / {doc['rows'][0]['H_kv']} heads, "
              f"D = {doc['rows'][0]['D']}, causal, bf16; backward through autograd for every column.")
