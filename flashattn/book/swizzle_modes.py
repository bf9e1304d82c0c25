"""The four shared-memory swizzle modes of Hopper's copy engine and tensor cores (none, 32B, 64B, 128B):
where each 16-byte chunk of a row is stored, a table of the modes, and a picture of the four patterns.

Every mode is CUTLASS's Swizzle<B, M, S> on byte addresses with M = 4 (16-byte chunks) and S = 3: bits
[M + S, M + S + B) of the address are XORed into bits [M, M + B), so 128B = Swizzle<3,4,3>,
64B = Swizzle<2,4,3>, 32B = Swizzle<1,4,3> and none = Swizzle<0,4,3>. An atom is 8 rows of the mode's
width (8 x 16 bytes, one core matrix, without swizzle). Sources used:
- the swizzle functions of the GMMA layout atoms, CUTLASS include/cute/atom/mma_traits_sm90_gmma.hpp
  (Layout_K_SW128_Atom ... Layout_K_SW32_Atom), and Swizzle<B, M, S> in include/cute/swizzle.hpp;
- the 2-bit swizzle field of wgmma's matrix descriptor, bits 62-63: 0 none, 1 128B, 2 64B, 3 32B (PTX ISA,
  "Matrix Descriptor Format" of the warpgroup-level matrix shared-memory layout);
- TMA's CUtensorMapSwizzle, CU_TENSOR_MAP_SWIZZLE_NONE = 0, _32B, _64B, _128B (CUDA driver API, cuda.h,
  "swizzles 16-byte chunks within a 32/64/128-byte span"; the box's inner dimension must not exceed the span).
kernels/v7.cu uses 128B only; the test checks that mode against the kernel's own cp.async address formula.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from flashattn.book.figures import show_or_return
from flashattn.measure.banks import wavefronts

CHUNK = 16            # bytes: the unit every mode permutes (M = 4)
ROWS_PER_ATOM = 8     # every atom is 8 rows (S = 3)
MODES = {             # B of Swizzle<B, 4, 3>, wgmma's descriptor field, TMA's enum name
    "none": {"bits": 0, "wgmma": 0, "tma": "CU_TENSOR_MAP_SWIZZLE_NONE"},
    "32B": {"bits": 1, "wgmma": 3, "tma": "CU_TENSOR_MAP_SWIZZLE_32B"},
    "64B": {"bits": 2, "wgmma": 2, "tma": "CU_TENSOR_MAP_SWIZZLE_64B"},
    "128B": {"bits": 3, "wgmma": 1, "tma": "CU_TENSOR_MAP_SWIZZLE_128B"},
}


def width(mode: str) -> int:
    """Bytes of one atom row: the span inside which the mode moves chunks (16 for none: one core matrix)."""
    return CHUNK << MODES[mode]["bits"]


def cutlass_name(mode: str) -> str:
    return f"Swizzle<{MODES[mode]['bits']},4,3>"


def swizzle_address(mode: str, addr: int) -> int:
    """Swizzle<B, 4, 3> of a byte address (relative to a base aligned to the atom): the B bits above bit 7
    are XORed into the chunk bits 4.. ."""
    b = MODES[mode]["bits"]
    mask = ((1 << b) - 1) << (4 + 3)
    return addr ^ ((addr & mask) >> 3)


def stored_chunk(mode: str, row: int, chunk: int) -> int:
    """The 16-byte slot where chunk `chunk` of row `row` of a tile with rows of width(mode) bytes lands."""
    w = width(mode)
    if not 0 <= chunk < w // CHUNK:
        raise ValueError(f"chunk {chunk} is outside a {w}-byte row")
    return (swizzle_address(mode, row * w + chunk * CHUNK) - row * w) // CHUNK


def xor_pattern(mode: str) -> str:
    """stored_chunk as a formula: the XOR term is (row * width) >> 7, masked to B bits."""
    b = MODES[mode]["bits"]
    if b == 0:
        return "c"
    shift = 3 - b
    row = "r" if shift == 0 else f"(r >> {shift})"
    return f"c ⊕ ({row} mod {1 << b})"


def column_read_wavefronts(mode: str, chunk: int = 0, swizzled: bool = True) -> int:
    """Shared-memory wavefronts of 8 threads reading 16 bytes each: chunk `chunk` of rows 0-7 (one phase of
    a 16-byte-per-thread warp access, as ldmatrix and wgmma read a core matrix's rows)."""
    w = width(mode)
    words = []
    for r in range(ROWS_PER_ATOM):
        slot = stored_chunk(mode, r, chunk) if swizzled else chunk
        words += [r * w + slot * CHUNK + 4 * i for i in range(CHUNK // 4)]
    return wavefronts(words)


def modes_table() -> str:
    """The four modes as Markdown: their names in CUTLASS, wgmma and TMA, the atom, the permutation and the
    wavefronts of an 8-row column read with and without the swizzle (1 is conflict-free)."""
    lines = ["| mode | CUTLASS | wgmma descriptor (bits 62-63) | TMA | atom | chunk c of row r goes to | "
             "8-row column read, wavefronts | same rows unswizzled |",
             "|---|---|--:|---|---|---|--:|--:|"]
    for m, spec in MODES.items():
        atom = f"{ROWS_PER_ATOM} × {width(m)} B"
        lines.append(f"| {m} | `{cutlass_name(m)}` | {spec['wgmma']} | `{spec['tma']}` | {atom} | {xor_pattern(m)} | "
                     f"{column_read_wavefronts(m)} | {column_read_wavefronts(m, swizzled=False)} |")
    return "\n".join(lines)


def fig_swizzle_modes(show: bool = True):
    """The four patterns side by side: each atom's 8 rows, the cell at (row, stored slot) coloured and
    numbered by the logical chunk it holds."""
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(11, 5), constrained_layout=True)
    x0 = 0.0
    for m, spec in MODES.items():
        n = width(m) // CHUNK
        for r in range(ROWS_PER_ATOM):
            for c in range(n):
                s = stored_chunk(m, r, c)
                ax.add_patch(Rectangle((x0 + s, r), 1, 1, fc=cmap(c), ec="white", lw=1.5, alpha=0.85))
                ax.text(x0 + s + 0.5, r + 0.5, str(c), ha="center", va="center", fontsize=10, color="white",
                        fontweight="bold")
        for s in range(n):
            ax.text(x0 + s + 0.5, ROWS_PER_ATOM + 0.35, str(s), ha="center", va="top", fontsize=9)
        ax.text(x0 + n / 2, ROWS_PER_ATOM + 1.1, "stored slot", ha="center", va="top", fontsize=9)
        ax.text(x0 + n / 2, -0.3, f"{m}\n{cutlass_name(m)}\nwgmma mode {spec['wgmma']}\n{xor_pattern(m)}\n"
                f"8-row column: {column_read_wavefronts(m)} wavefront\n"
                f"(unswizzled: {column_read_wavefronts(m, swizzled=False)})", ha="center", va="bottom",
                fontsize=9.5)
        x0 += max(n, 2) + 3.4
    for r in range(ROWS_PER_ATOM):
        ax.text(-0.3, r + 0.5, str(r), ha="right", va="center", fontsize=9)
    ax.text(-1.3, ROWS_PER_ATOM / 2, "row r of the atom", rotation=90, ha="right", va="center", fontsize=9.5)
    ax.set_xlim(-2.2, x0 - 3.2)
    ax.set_ylim(ROWS_PER_ATOM + 1.6, -4.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("Where 16-byte chunk c (colour and number) of each row of an 8-row atom is stored, per swizzle "
                 "mode", fontsize=10.5)
    return show_or_return(fig, show)


FIGURES = {"swizzle_modes": lambda: fig_swizzle_modes(show=False)}
