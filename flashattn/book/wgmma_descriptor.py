"""wgmma's shared-memory matrix descriptor as kernels/v7.cu builds it (make_desc), and the address of one
element of a K-major, 128-byte-swizzled bf16 tile worked out the way the tensor core walks it: the start
address of a k16 step, SBO to the element's 8-row atom, 128 bytes per row, 16 bytes per core matrix, then
the swizzle. The V7 chapter's descriptor figure draws it; tests/test_wgmma_descriptor.py compiles the
kernel's make_desc, its descriptor arguments and its cp.async address on the host and compares.

Descriptor fields (PTX ISA, "Matrix Descriptor Format"): start address bits 0-13, leading byte offset (LBO)
bits 16-29, stride byte offset (SBO) bits 32-45, each in 16-byte units; base offset bits 49-51 (0 for
atom-aligned tiles, which v7's are); swizzle mode bits 62-63 (flashattn.book.swizzle_modes).
"""
from __future__ import annotations

import re

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from flashattn.book.figures import show_or_return
from flashattn.book.swizzle_modes import MODES, swizzle_address

ROW_BYTES = 128     # one row of a 128B-swizzled panel: 64 bf16 values
ATOM_ROWS = 8
CORE_BYTES = 16     # a core matrix is 8 rows x 16 bytes
SBO = ATOM_ROWS * ROW_BYTES   # next 8-row atom: what v7 passes for every operand
K_STEP_BYTES = 32   # one k16 step of bf16


def host_program(kernel_text: str) -> str:
    """A C++ program made of kernels/v7.cu's own make_desc, its cp.async tile offset (copy_tile) and its
    descriptor arguments for S_ij and P_ij V_j, cut from the source text and compiled for the CPU. It reads
    lines "d saddr lbo sbo", "o rows r c", "k base rows kk", "v base rows kk" and prints one number each."""
    make_desc = re.search(r"__device__ __forceinline__ (uint64_t make_desc\(.*?\n})", kernel_text, re.S).group(1)
    off = re.search(r"const uint32_t off = (.*?);", kernel_text).group(1)
    panel = re.search(r"const uint32_t panel = kk / 4, within = .*?;", kernel_text).group(0)
    k_arg = re.search(r"make_desc\((k_base \+ [^;]*?, 16, 1024)\)", kernel_text).group(1)
    v_arg = re.search(r"make_desc\((v_base \+ [^;]*?, 1024)\)", kernel_text).group(1)
    return f"""#include <cstdint>
#include <cstdio>
inline {make_desc}
uint32_t tile_off(int ROWS, int r, int c) {{ return {off}; }}
uint64_t k_desc(uint32_t k_base, int BC, uint32_t kk) {{ {panel} return make_desc({k_arg}); }}
uint64_t v_desc(uint32_t v_base, int BC, uint32_t kk) {{ return make_desc({v_arg}); }}
int main() {{
  char op;
  unsigned long long a, b, c;
  while (std::scanf(" %c %llu %llu %llu", &op, &a, &b, &c) == 4) {{
    unsigned long long x = op == 'd' ? make_desc(a, b, c) : op == 'o' ? tile_off(a, b, c)
                         : op == 'k' ? k_desc(a, b, c) : v_desc(a, b, c);
    std::printf("%llu\\n", x);
  }}
}}
"""


def encode(saddr: int, lbo_bytes: int, sbo_bytes: int, swizzle: str = "128B") -> int:
    """The 64-bit descriptor, bit for bit as v7's make_desc (which fixes swizzle to 128B)."""
    return (((saddr & 0x3FFFF) >> 4) | (((lbo_bytes >> 4) & 0x3FFF) << 16) | (((sbo_bytes >> 4) & 0x3FFF) << 32)
            | (MODES[swizzle]["wgmma"] << 62))


def decode(desc: int) -> dict:
    """The fields of a descriptor, addresses and offsets back in bytes."""
    mode = (desc >> 62) & 3
    return {"start_address": (desc & 0x3FFF) << 4, "lbo_bytes": ((desc >> 16) & 0x3FFF) << 4,
            "sbo_bytes": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": next(m for m, spec in MODES.items() if spec["wgmma"] == mode)}


def k_major_start(base: int, rows: int, kk: int) -> int:
    """Start address of k16 step `kk` of a K-major tile of `rows` rows (v7's Q_i and K_j): 64-column
    panels of rows * 128 bytes, 32 bytes per step inside a panel."""
    return base + (kk // 4) * rows * ROW_BYTES + (kk % 4) * K_STEP_BYTES


def kernel_descriptors(base: int, rows: int, d: int) -> dict:
    """The descriptors v7 issues for one tile: the D / 16 K-major ones of S_ij (LBO 16, unused) and the
    rows / 16 MN-major ones of P_ij V_j (LBO = rows * 128, the next 64 columns of d)."""
    return {"K": [encode(k_major_start(base, rows, kk), 16, SBO) for kk in range(d // 16)],
            "V": [encode(base + kk * 16 * ROW_BYTES, rows * ROW_BYTES, SBO) for kk in range(rows // 16)]}


def element_address(row: int, k: int, rows: int, base: int = 0, elem_bytes: int = 2) -> dict:
    """Byte address of element (row, k) of a K-major bf16 tile of `rows` rows in v7's layout, step by step,
    and the core matrix it sits in (logical: 8-row group, 16-byte column of the tile)."""
    if base % SBO or rows % ATOM_ROWS:
        raise ValueError("the tile must start on a 1024-byte atom and hold whole atoms")
    kb = k * elem_bytes
    step = {"panel": kb // ROW_BYTES, "kk": (kb % ROW_BYTES) // K_STEP_BYTES, "atom": row // ATOM_ROWS,
            "row_in_atom": row % ATOM_ROWS, "core_in_step": (kb % K_STEP_BYTES) // CORE_BYTES,
            "byte_in_core": kb % CORE_BYTES}
    start = k_major_start(base, rows, step["panel"] * 4 + step["kk"])
    linear = (start + step["atom"] * SBO + step["row_in_atom"] * ROW_BYTES + step["core_in_step"] * CORE_BYTES
              + step["byte_in_core"])
    address = swizzle_address("128B", linear - base) + base
    return {**step, "start": start, "descriptor": encode(start, 16, SBO), "linear": linear,
            "chunk": ((linear - base) % ROW_BYTES) // CORE_BYTES, "stored_chunk": ((address - base) % ROW_BYTES)
            // CORE_BYTES, "address": address, "core_matrix": (row // ATOM_ROWS, kb // CORE_BYTES)}


def worked_text(row: int, k: int, rows: int) -> str:
    """element_address as the figure's lines of arithmetic."""
    e = element_address(row, k, rows)
    d = decode(e["descriptor"])
    kb = 2 * k
    steps = [
        (f"1. panel = {kb} B // 128 = {e['panel']}", f"{e['panel']}·{rows}·128"),
        (f"   k16 step = ({kb} mod 128) // 32 = {e['kk']}", f"+ {e['kk']}·32"),
        ("   descriptor start", f"= {e['start']}"),
        (f"2. atom = {row} // 8 = {e['atom']}", f"+ {e['atom']}·SBO = {e['atom'] * SBO}"),
        (f"3. row in atom = {row} mod 8 = {e['row_in_atom']}", f"+ {e['row_in_atom']}·128 = "
         f"{e['row_in_atom'] * ROW_BYTES}"),
        (f"4. core matrix in the k16 step = {e['core_in_step']}", f"+ {e['core_in_step']}·16 = "
         f"{e['core_in_step'] * CORE_BYTES}"),
        (f"5. byte in its 16-byte row = {e['byte_in_core']}", f"+ {e['byte_in_core']}"),
        ("   unswizzled", f"= {e['linear']}  (chunk {e['chunk']})"),
        (f"6. 128B swizzle: slot {e['chunk']} ⊕ {e['row_in_atom']} = {e['stored_chunk']}",
         f"+ ({e['stored_chunk']} - {e['chunk']})·16"),
        ("   address", f"= {e['address']}"),
    ]
    return "\n".join([f"element (row {row}, k {k}) of a K-major bf16 tile of {rows} rows,",
                      "bytes from the tile's 1024-byte-aligned base:", ""]
                     + [f"{left:<40}{right}" for left, right in steps]
                     + ["", f"descriptor = encode({e['start']}, 16, {SBO}) = {e['descriptor']:#018x}",
                        f"decode: start {d['start_address']}, LBO {d['lbo_bytes']}, SBO {d['sbo_bytes']}, "
                        f"swizzle {d['swizzle']}"])


def fig_wgmma_descriptor(row: int = 11, k: int = 83, rows: int = 128, d: int = 128, show: bool = True):
    """A K-major tile's core matrices (first two atoms of each panel), the atoms outlined, SBO and the panel
    distance (V's LBO) as arrows, one element highlighted and its address worked out beside it."""
    e = element_address(row, k, rows)
    cores = ROW_BYTES // CORE_BYTES
    panels = d * 2 // ROW_BYTES
    gap = 2.0
    fig = plt.figure(figsize=(13, 6), constrained_layout=True)
    grid = fig.add_gridspec(2, 2, width_ratios=[1.2, 1], height_ratios=[1, 1.15])
    ax = fig.add_subplot(grid[:, 0])
    shown = 2 * ATOM_ROWS
    for p in range(panels):
        x0 = p * (cores + gap)
        for a in range(shown // ATOM_ROWS):
            for c in range(cores):
                hit = e["core_matrix"] == (a, p * cores + c)
                ax.add_patch(Rectangle((x0 + c, a * ATOM_ROWS), 1, ATOM_ROWS, fc="gold" if hit else "0.93",
                                       ec="0.55", lw=0.8))
                ax.text(x0 + c + 0.5, a * ATOM_ROWS + 6, f"{a},{p * cores + c}", ha="center", va="center",
                        fontsize=7.5, color="0.35", rotation=90)
            ax.add_patch(Rectangle((x0, a * ATOM_ROWS), cores, ATOM_ROWS, fc="none", ec="k", lw=2.2))
        ax.text(x0 + cores / 2, -1.3, f"panel {p}: k {p * 64}-{p * 64 + 63} (128 B per row)", ha="center",
                fontsize=9)
        ax.text(x0 + cores / 2, shown + 1.2, f"rows {shown}-{rows - 1} of the panel not drawn", ha="center",
                fontsize=8.5, color="0.4")
    px = e["panel"] * (cores + gap) + (2 * k % ROW_BYTES) / CORE_BYTES
    ax.add_patch(Rectangle((px, row), 2 / CORE_BYTES, 1, fc="crimson", ec="crimson"))
    right = panels * cores + (panels - 1) * gap
    ax.annotate(f"element\n(row {row}, k {k})", xy=(px + 0.15, row + 0.5), xytext=(right + 0.4, row + 3),
                fontsize=9, color="crimson", arrowprops=dict(arrowstyle="->", color="crimson"))
    sx = e["panel"] * (cores + gap) + e["kk"] * 2
    ax.plot([sx], [0], marker="v", color="tab:blue", ms=9, clip_on=False)
    ax.text(sx + 0.1, -0.4, "descriptor start", color="tab:blue", fontsize=8.5, va="bottom")
    ax.annotate("", xy=(-0.5, ATOM_ROWS), xytext=(-0.5, 0), arrowprops=dict(arrowstyle="->", lw=1.8,
                                                                              color="tab:green"))
    ax.text(-0.8, ATOM_ROWS / 2, f"SBO = {SBO} B\nnext 8-row atom", ha="right", va="center", fontsize=9,
            color="tab:green")
    if panels > 1:
        y = shown + 2.6
        ax.annotate("", xy=(cores + gap, y), xytext=(0, y), arrowprops=dict(arrowstyle="->", lw=1.8,
                                                                           color="tab:purple"))
        ax.text(0, y + 0.6, f"next panel: {rows}·128 = {rows * ROW_BYTES} B = V's LBO (next 64 "
                "columns);\nQ/K's descriptors move the start address instead (their LBO is unused)",
                ha="left", va="top", fontsize=8.5, color="tab:purple")
    ax.set_xlim(-4.5, right + 4.5)
    ax.set_ylim(shown + 6, -2.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("a K-major tile's core matrices (8 rows × 16 B; label: atom, 16-byte column)\n"
                 "bold frames: the 1024-byte swizzle atoms", fontsize=10)

    atom_ax = fig.add_subplot(grid[0, 1])
    cmap = plt.get_cmap("tab10")
    for r in range(ATOM_ROWS):
        for c in range(cores):
            s = swizzle_address("128B", r * ROW_BYTES + c * CORE_BYTES) % ROW_BYTES // CORE_BYTES
            hit = r == e["row_in_atom"] and c == e["chunk"]
            atom_ax.add_patch(Rectangle((s, r), 1, 1, fc=cmap(c), alpha=0.85, ec="white", lw=1))
            if hit:
                atom_ax.add_patch(Rectangle((s, r), 1, 1, fc="none", ec="k", lw=3, zorder=3))
            atom_ax.text(s + 0.5, r + 0.5, str(c), ha="center", va="center", fontsize=9, color="white")
    atom_ax.set_xlim(0, cores)
    atom_ax.set_ylim(ATOM_ROWS, 0)
    atom_ax.set_aspect("equal")
    atom_ax.set_xticks([c + 0.5 for c in range(cores)], [str(c) for c in range(cores)], fontsize=8)
    atom_ax.set_yticks([r + 0.5 for r in range(ATOM_ROWS)], [str(r) for r in range(ATOM_ROWS)], fontsize=8)
    atom_ax.set_xlabel("stored 16-byte slot", fontsize=9)
    atom_ax.set_ylabel("row in atom", fontsize=9)
    atom_ax.set_title("the element's atom as stored\n(number: logical chunk; black frame: the element's)",
                      fontsize=10)

    text_ax = fig.add_subplot(grid[1, 1])
    text_ax.axis("off")
    text_ax.text(0, 1, worked_text(row, k, rows), family="monospace", fontsize=9, va="top", ha="left",
                 transform=text_ax.transAxes)
    return show_or_return(fig, show)


FIGURES = {"wgmma_descriptor": lambda: fig_wgmma_descriptor(show=False)}
