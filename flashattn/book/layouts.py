"""Where the tensor-core instructions keep their operands, as arithmetic and figures for the V6 and V7
chapters.

V6 (mma.sync): the m16n8k16 accumulator fragment, whose placement is also the A operand of the next
product, and the shared-memory swizzle (16-byte chunk c of row r at c ^ (r mod 8)) that keeps ldmatrix
free of bank conflicts. The arithmetic of both lives in flashattn.measure.geometry; the figures are here.

V7 (Hopper's own instructions): two layouts decide how it is written:

* **the wgmma accumulator.** `wgmma.mma_async.m64nNk16` is issued by a *warpgroup* (four consecutive warps)
  and leaves a 64 x N fp32 tile spread over its 128 threads. Warp w holds rows 16w..16w+15, and inside
  those rows each warp repeats the m16n8 accumulator layout of `mma.sync` once per 8 columns. That is
  why V6's softmax (a row lives in the 4 lanes of a quad) and its trick of feeding P back as the A
  operand carry over unchanged.
* **the 128-byte swizzle.** The tensor memory accelerator (TMA) writes a tile into shared memory in the
  pattern that wgmma's matrix descriptors read: inside every 8-row x 128-byte atom, 16-byte chunk c of
  row r is stored at chunk c ^ (r mod 8), which is V6's swizzle. A row wider than 128 bytes (D = 128 in
  bf16 is 256 bytes) is cut into 64-element column panels, each a stack of such atoms.

Everything here is plain arithmetic from the PTX ISA's description of those layouts; nothing needs a GPU.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from flashattn.measure.geometry import mma_accumulator_owner, swizzle

WARPGROUP_WARPS = 4
SWIZZLE_BYTES = 128        # CU_TENSOR_MAP_SWIZZLE_128B / wgmma swizzle mode 1
CHUNK_BYTES = 16


def wgmma_accumulator_owner(n: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the 64 x n fp32 accumulator of one wgmma: (warp, lane, register index) of every element.

    Element (row, col) sits in warp row // 16, lane 4 * (row % 8) + (col % 8) // 2, and register
    4 * (col // 8) + 2 * ((row % 16) >= 8) + col % 2 of that thread.
    """
    if n % 8:
        raise ValueError(f"n must be a multiple of 8 (wgmma's N step); got {n}")
    rows, cols = np.meshgrid(np.arange(64), np.arange(n), indexing="ij")
    warp = rows // 16
    lane = 4 * (rows % 8) + (cols % 8) // 2
    reg = 4 * (cols // 8) + 2 * ((rows % 16) >= 8) + cols % 2
    return warp, lane, reg


def swizzle_128b(row: int, chunk: int) -> int:
    """Chunk slot where TMA's 128-byte swizzle stores 16-byte chunk `chunk` (0..7) of tile row `row`."""
    if not 0 <= chunk < SWIZZLE_BYTES // CHUNK_BYTES:
        raise ValueError(f"chunk must be in 0..7 (a 128-byte swizzle atom has 8 chunks); got {chunk}")
    return chunk ^ (row % 8)


def fig_warpgroup_accumulator(n: int = 16):
    """Which warp and lane of a warpgroup hold each element of a wgmma accumulator (first n columns): the
    whole 64-row tile by warp (left), and warp 0's 16 rows with each element's lane and register (right),
    the other warps repeating it 16 rows further down."""
    warp, lane, reg = wgmma_accumulator_owner(n)
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(11, 6.2), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [1, 2.6]})
    shade = warp + 0.25 * (lane % 4) / 3
    whole.imshow(shade, cmap="Pastel2", aspect="auto", vmin=0, vmax=4.5)
    for w in range(1, WARPGROUP_WARPS):
        whole.axhline(16 * w - 0.5, color="k", lw=1.5)
    whole.add_patch(plt.Rectangle((-0.5, -0.5), n, 16, fill=False, ec="crimson", lw=2))
    whole.set_yticks([8 + 16 * w for w in range(4)], [f"warp {w}\nrows {16 * w}-{16 * w + 15}" for w in range(4)])
    whole.set_xticks(range(0, n, 4))
    whole.set(xlabel="column", title="the 64 rows of the tile:\none warp per 16 rows")
    zoom.imshow(shade[:16], cmap="Pastel2", aspect="auto", vmin=0, vmax=4.5)
    for r in range(16):
        for c in range(n):
            zoom.text(c, r, f"{lane[r, c]}·{reg[r, c]}", ha="center", va="center", fontsize=8)
    zoom.axvline(7.5, color="0.3", lw=1, ls="--")
    zoom.axhline(7.5, color="0.3", lw=1, ls=":")
    zoom.set_yticks(range(16))
    zoom.set_xticks(range(n))
    zoom.set(xlabel="accumulator column (key j for S, head-dim d for O)", ylabel="row",
             title="warp 0 (red box): lane·register of each fp32 element; warps 1-3 repeat it on rows 16-63")
    for ax in (whole, zoom):
        ax.title.set_fontsize(10)
    fig.suptitle(f"wgmma m64n{n}: the m16n8 layout of mma.sync, repeated every 8 columns and once per warp",
                 fontsize=11)
    plt.show()


def fig_tma_swizzle(rows: int = 8, d: int = 128, elem_bytes: int = 2):
    """Where TMA puts each 16-byte chunk of a [rows, d] tile with the 128-byte swizzle."""
    panels = d * elem_bytes // SWIZZLE_BYTES
    chunks = SWIZZLE_BYTES // CHUNK_BYTES
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.6), constrained_layout=True, squeeze=False)
    for p, ax in enumerate(axes[0]):
        grid = np.zeros((rows, chunks))
        for r in range(rows):
            for c in range(chunks):
                grid[r, swizzle_128b(r, c)] = c
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
        per_chunk = CHUNK_BYTES // elem_bytes
        for r in range(rows):
            for c in range(chunks):
                first = p * chunks * per_chunk + c * per_chunk
                ax.text(swizzle_128b(r, c), r, f"{first}-\n{first + per_chunk - 1}", ha="center", va="center",
                        fontsize=6.5)
        ax.set_xticks(range(chunks), [f"{4 * s}-{4 * s + 3}" for s in range(chunks)], fontsize=7)
        ax.set(xlabel="16-byte slot of the 128-byte row (its 4 banks)", ylabel="tile row",
               title=f"panel {p}: columns {p * chunks * per_chunk}-{(p + 1) * chunks * per_chunk - 1}")
        ax.title.set_fontsize(9)
    fig.suptitle(f"128-byte swizzle of a [{rows}, {d}] {8 * elem_bytes}-bit tile: chunk c of row r lands in "
                 "slot c XOR (r mod 8); the numbers are the tile's columns", fontsize=9)
    plt.show()


def fig_mma_fragment():
    """m16n8k16: which lane of the warp holds which element of the 16 x 8 accumulator tile C (and
    hence of P), and how two neighbouring n8 tiles form one k16 slice of the A operand."""
    own = mma_accumulator_owner(16, 16)
    fig, ax = plt.subplots(figsize=(8.5, 5.2), constrained_layout=True)
    ax.imshow(own % 4, cmap="Pastel1", vmin=0, vmax=8)
    for r in range(16):
        for c in range(16):
            reg = (c % 2) + 2 * (r >= 8)
            ax.text(c, r, f"{own[r, c]}\nc{reg}", ha="center", va="center", fontsize=6.5)
    ax.axvline(7.5, color="k", lw=2)
    ax.set_xticks(range(16))
    ax.set_yticks(range(16))
    ax.set(xlabel="key column (two n8 accumulator tiles = one k16 slice of P)", ylabel="query row",
           title="S/P accumulator fragment of m16n8k16: lane (top) and its register c0..c3 (bottom)\n"
                 "lane = 4·(row mod 8) + ⌊(column mod 8)/2⌋ : the same placement the A operand of the next mma expects")
    ax.title.set_fontsize(9)
    plt.show()


def fig_swizzle():
    """ldmatrix reads one 16-byte chunk from each of 8 rows: without the swizzle all 8 chunks sit in the
    same 4 banks; with chunk ^ (row % 8) they cover all 32 banks."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for ax, swz in zip(axes, (False, True)):
        grid = np.full((8, 8), np.nan)
        for r in range(8):
            grid[r, swizzle(r, 0) if swz else 0] = r
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
        for r in range(8):
            c = swizzle(r, 0) if swz else 0
            ax.text(c, r, f"row {r}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(8), [f"{4 * c}-{4 * c + 3}" for c in range(8)], fontsize=7)
        ax.set(xlabel="banks of the 16-byte chunk (128-byte row)", ylabel="row of the tile",
               title=("swizzled: chunk 0 of row r at chunk r: 8 rows, 32 banks, 1 wavefront" if swz else
                      "plain row-major: chunk 0 of 8 rows, 4 banks, 8 wavefronts"))
        ax.title.set_fontsize(9)
    plt.show()
