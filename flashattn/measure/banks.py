"""Shared-memory banks: how many wavefronts one warp instruction of each access of kernels/v6.cu needs, per
tile layout (V6_SMEM_LAYOUT: plain rows, rows padded by 16 bytes, or XOR-swizzled chunks), from the kernel's
lane -> address formulas; no GPU needed. The V6 chapter's prediction for its layout step, which the recorded
Nsight Compute counters of `python -m flashattn.measure.sweep v6-steps --metrics` then confirm.
"""
from __future__ import annotations

from flashattn.measure.geometry import swizzle

LAYOUTS = {0: "plain", 1: "padded", 2: "swizzled"}


def smem_address(layout: int, row: int, chunk: int, byte: int, row_bytes: int) -> int:
    """Byte address of `byte` of 16-byte chunk `chunk` of row `row` in a kernels/v6.cu tile
    (V6_SMEM_LAYOUT): plain row-major, rows padded by one chunk, or chunk c stored at c ^ (row % 8)."""
    if layout == 1:
        return row * (row_bytes + 16) + chunk * 16 + byte
    return row * row_bytes + (swizzle(row, chunk) if layout == 2 else chunk) * 16 + byte


def wavefronts(addresses: list[int]) -> int:
    """Passes one group of accesses needs through the 32 four-byte banks: the most distinct 4-byte words
    that fall into one bank (threads reading the same word share it)."""
    per_bank: dict[int, set] = {}
    for a in addresses:
        per_bank.setdefault((a // 4) % 32, set()).add(a // 4)
    return max(len(words) for words in per_bank.values())


def bank_model(D: int = 64, elem: int = 2) -> list[dict]:
    """Shared-memory wavefronts per warp instruction of each access kernels/v6.cu makes in the steps,
    per layout, from the lane -> address formulas of the kernel (lane l: g = l // 4, q = l % 4; first
    chunk of the tile). 32- and 16-bit accesses are one group of 32 lanes; 16-byte accesses (cp.async,
    ldmatrix's row addresses) go in phases of 8 lanes. `ideal` is the count without a conflict."""
    row_bytes, lanes = D * elem, range(32)

    def a(layout, row, chunk, byte):
        return smem_address(layout, row, chunk, byte, row_bytes)

    accesses = {
        "Q_i or K_j fragment, 32-bit load (LDS, V6_LDMATRIX=0)":
            (1, [lambda L, l: a(L, l // 4, 0, 4 * (l % 4))]),
        "V_j fragment, 16-bit loads (LDS.U16, V6_LDMATRIX=0)":
            (1, [lambda L, l: a(L, 2 * (l % 4), 0, 2 * (l // 4))]),
        "P_ij store, 32-bit (STS, V6_P_SMEM=1)":
            (1, [lambda L, l: a(L, l // 4, 0, 4 * (l % 4))]),
        "ldmatrix.x4 of Q_i or V_j (four 8x8 matrices)":
            (4, [lambda L, l, i=i: a(L, l % 8 + 8 * (i % 2), i // 2, 0) for i in range(4)]),
        "cp.async 16-byte copy into the tile":
            (4, [lambda L, l, p=p: a(L, (8 * p + l % 8) // (row_bytes // 16), (8 * p + l % 8) % (row_bytes // 16), 0)
                 for p in range(4)]),
    }
    rows = []
    for name, (ideal, groups) in accesses.items():
        row = {"access": name, "ideal": ideal}
        for layout, label in LAYOUTS.items():
            if len(groups) == 1:
                row[label] = wavefronts([groups[0](layout, l) for l in lanes])
            else:   # phases of 8 lanes (the 16-byte accesses), one group per phase
                row[label] = sum(wavefronts([g(layout, l) for l in range(8)]) for g in groups)
        rows.append(row)
    return rows


def bank_table(D: int = 64) -> str:
    """bank_model as Markdown: wavefronts per warp instruction in each layout (ideal: no conflict)."""
    lines = [f"| access (D = {D}, 16-bit) | no conflict | plain | padded | swizzled |", "|---|--:|--:|--:|--:|"]
    for r in bank_model(D):
        lines.append(f"| {r['access']} | {r['ideal']} | {r['plain']} | {r['padded']} | {r['swizzled']} |")
    return "\n".join(lines)
