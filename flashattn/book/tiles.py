"""Tile and occupancy arithmetic as the book's tables: what a tile shape costs in shared memory and
registers, how many blocks that lets an H200 SM hold, and what the unfused computation would move.

Kernel geometry comes from flashattn.measure.geometry (read from the kernel files), compiler facts from the ptxas
record (flashattn.book.records.kernel_resources) and the occupancy rule from flashattn.measure.resources.
"""
from __future__ import annotations

import math

from flashattn.book.notebook import PRIMARY, md
from flashattn.book.records import ceilings, kernel_resources
from flashattn.measure import geometry
from flashattn.measure.resources import occupancy


def score_bytes_table(lengths=(512, 1024, 2048, 4096, 8192, 16384), B=PRIMARY["B"], H=PRIMARY["H"],
                      D=PRIMARY["D"]):
    """Size of the score matrix S next to Q, K, V and O together, float32, for several lengths."""
    lines = ["| N | Q, K, V, O | S = QKᵀ (B·H·N² floats) | S / (Q, K, V, O) |", "|--:|--:|--:|--:|"]
    for N in lengths:
        io, s = 4 * 4 * B * H * N * D, 4 * B * H * N * N
        lines.append(f"| {N:,} | {io / 1e6:,.0f} MB | {s / 1e6:,.0f} MB | {s / io:,.0f}× |")
    return md("\n".join(lines) + f"\n\nB={B}, H={H}, D={D}, float32: the ratio is N / (4D).")


def _short(kernel: str) -> str:
    """A kernel's name as the tables print it: without `void` and namespaces, template arguments kept."""
    name = kernel.removeprefix("void ")
    head, _, tail = name.partition("<")
    return head.split("::")[-1] + (("<" + tail) if tail else "")


def resources_table(version: str, only: str | None = None):
    """Registers, shared memory and the occupancy they allow on an H200 SM, per kernel of `version`
    (`only`: a substring the kernel name must contain, e.g. a dtype of a templated kernel)."""
    lines = ["| kernel | threads | registers | spills | shared memory | blocks/SM by regs · smem · warps | "
             "blocks/SM | occupancy |", "|---|--:|--:|--:|--:|---|--:|--:|"]
    for k in sorted(kernel_resources(version), key=lambda k: k["name"]):
        facts = geometry.launch_of(version, k["name"])
        if facts is None or (only and only not in k["name"]):
            continue
        threads, dyn = facts
        smem = k.get("static_smem_bytes", 0) + dyn
        o = occupancy(k["registers"], smem, threads)
        b = o["by"]
        lines.append(f"| `{_short(k['name'])}` | {threads} | {k['registers']} | {k.get('spill_store_bytes', 0)} B | "
                     f"{smem:,} B | {b['registers']} · {b['shared memory']} · {b['warps']} | {o['blocks']} | "
                     f"{o['occupancy_pct']:.1f}% |")
    return md("\n".join(lines) + "\n\nOccupancy = resident warps / 64 on sm_90 (65,536 registers and "
               "228 KB of shared memory per SM, 1 KB reserved per block).")


def smem_traffic_table():
    """Shared-memory wavefronts against FFMA issue for V4's inner loop and V5's register tiles: an H200
    SM starts 4 warp-wide FFMA per clock but serves 1 shared-memory wavefront (128 bytes) per clock."""
    # V4 as compiled (book/v4.ipynb, "What limits it"): per step d, one scalar K load, and the 8 Q
    # broadcasts of four steps merged into 8 LDS.128, i.e. 2 per step
    rows = [("V4: lane owns 8 rows × 1 column, one d per step", 3, 8, "1 K float + 2 Q float4 broadcasts")]
    for TM, TN in ((4, 4), (4, 8), (8, 4), (8, 8)):
        rows.append((f"V5 with a {TM} × {TN} register tile, 4 d per step", TM + TN, 4 * TM * TN,
                     f"{TN} K + {TM} Q float4 loads"))
    lines = ["| inner loop of S = Q Kᵀ (one warp, one step) | shared loads | FFMA | wavefront clocks : FFMA "
             "clocks | FFMA pipe ceiling |", "|---|---|--:|--:|--:|"]
    for name, waves, ffma, loads in rows:
        ffma_clocks = ffma / 4
        lines.append(f"| {name} | {loads} ({waves} wavefronts) | {ffma} | {waves} : {ffma_clocks:g} | "
                     f"{min(1.0, ffma_clocks / waves) * 100:.0f}% |")
    return md("\n".join(lines) + "\n\nWith 8 column groups (B_c / T_N = 8) every listed load is one "
               "wavefront: a broadcast, or 8 distinct 16-byte words on distinct banks; with 16 column groups "
               "the K loads take two. The ceiling ignores everything but these two pipes.")


def v5_tiles_table():
    """The register-tile shapes kernels/v5.cu compiles for each head dim, and what they cost in threads and
    shared memory (read from the kernel file by flashattn.measure.geometry)."""
    lines = ["| D | B_r × B_c | TM × TN | row groups × column groups | threads | shared memory | "
             "blocks/SM by shared memory |",
             "|--:|---|---|---|--:|--:|--:|"]
    for D, t in geometry.v5_default_tiles().items():
        o = occupancy(0, t["smem"], t["threads"])
        lines.append(f"| {D} | {t['B_r']} × {t['B_c']} | {t['TM']} × {t['TN']} | {t['NRG']} × {t['WC']} | "
                     f"{t['threads']} | {t['smem']:,} B | {o['by']['shared memory']} |")
    return md("\n".join(lines) + "\n\nThe defaults compiled into `kernels/v5.cu` (its `V5_D64_*` and "
               "`V5_D128_*` macros).")


def smem_layout(parts: str | list[tuple[str, int, int]], title: str = "", D: int = 64):
    """Shared-memory budget of one block: `parts` is a version (v1 ... v4: its arrays at head dim D, read
    from the kernel file by flashattn.measure.geometry) or a list of (name, rows, cols) float32 arrays."""
    if isinstance(parts, str):
        title = title or f"{parts.upper()} at D = {D}:"
        parts = geometry.smem_parts(parts, D)
    lines = ["| array | shape | floats | bytes |", "|---|---|--:|--:|"]
    total = 0
    for name, r, c in parts:
        lines.append(f"| {name} | {r} × {c} | {r * c:,} | {4 * r * c:,} |")
        total += r * c
    lines.append(f"| **total** | | **{total:,}** | **{4 * total:,}** ({4 * total / 1024:.2f} KiB) |")
    return md((f"{title}\n\n" if title else "") + "\n".join(lines))


def tile_options(options, D: int = 64, regs: int | None = None, rows_per_warp: int = 8, M: int = 2048,
                 BH: int = PRIMARY["B"] * PRIMARY["H"], kv_tile_floats=lambda B_c, D: B_c * D):
    """The arithmetic behind a v3-style tile choice, for each (B_r, B_c): threads (one warp per
    `rows_per_warp` query rows), shared memory Q_i + one K/V tile + P_ij, blocks per SM by shared memory
    and warps (and registers, with the given count per thread), the grid, and how often each K/V byte is
    fetched per (batch, head)."""
    sms = ceilings()["sm_count"]
    lines = ["| B_r | B_c | threads | shared memory | blocks/SM | warps/SM | grid | waves | K/V passes |",
             "|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for B_r, B_c in options:
        threads = 32 * (B_r // rows_per_warp)
        smem = 4 * (B_r * D + kv_tile_floats(B_c, D) + B_r * B_c)
        o = occupancy(regs or 0, smem, threads)
        grid = math.ceil(M / B_r) * BH
        lines.append(f"| {B_r} | {B_c} | {threads} | {smem:,} B | {o['blocks']} | {o['warps']} | {grid:,} | "
                     f"{grid / (sms * o['blocks']):.1f} | {math.ceil(M / B_r)}× |")
    note = f"registers assumed {regs}/thread (ptxas, B_r = 64)" if regs else "registers not counted"
    return md("\n".join(lines) + f"\n\nAt M = N = {M}, D = {D}, B·H = {BH}; {note}. Waves: grid / (blocks "
               f"per SM × {sms} SMs). K/V passes: how often each (batch, head) streams its K and V.")


def naive_cost(B: int = PRIMARY["B"], H: int = PRIMARY["H"], N: int = PRIMARY["L"], D: int = PRIMARY["D"],
               elem: int = 4):
    """Work and DRAM traffic of the three steps of unfused attention (M = N), with the time each would
    need at the measured FP32 and copy ceilings: which roof bounds which step."""
    c = ceilings()
    bh, tensor = B * H, B * H * N * D * elem              # one of Q, K, V, O
    s_bytes = bh * N * N * elem
    steps = [("S = Q Kᵀ / √D", 2.0 * bh * N * N * D, 2 * tensor + s_bytes),      # read Q, K; write S
             ("P = softmax(S)", 5.0 * bh * N * N, 2 * s_bytes),                  # read S, write P
             ("O = P V", 2.0 * bh * N * N * D, s_bytes + 2 * tensor)]            # read P, V; write O
    lines = [f"| step | GFLOP | DRAM GB | FLOP/byte | µs at {c['fp32'] / 1e12:,.1f} TFLOP/s | "
             f"µs at {c['dram'] / 1e12:.2f} TB/s | bound by |", "|---|--:|--:|--:|--:|--:|---|"]
    tot_f = tot_b = 0.0
    for name, f, b in steps + [("fused (ideal): Q, K, V in, O out", 4.0 * bh * N * N * D + 5.0 * bh * N * N,
                                 4 * tensor)]:
        tf, tb = f / c["fp32"] * 1e6, b / c["dram"] * 1e6
        if not name.startswith("fused"):
            tot_f, tot_b = tot_f + f, tot_b + b
        lines.append(f"| {name} | {f / 1e9:,.1f} | {b / 1e9:,.3f} | {f / b:,.1f} | {tf:,.0f} | {tb:,.0f} | "
                     f"{'compute' if tf > tb else 'memory'} |")
    lines.insert(5, f"| **unfused total** | **{tot_f / 1e9:,.1f}** | **{tot_b / 1e9:,.3f}** | "
                    f"**{tot_f / tot_b:,.1f}** | **{tot_f / c['fp32'] * 1e6:,.0f}** | "
                    f"**{tot_b / c['dram'] * 1e6:,.0f}** | |")
    return md("\n".join(lines) + f"\n\nB={B}, H={H}, M=N={N}, D={D}, {elem}-byte elements; the softmax is "
               "counted as 5 FLOP per score (max, subtract, exponential, sum, scale).")
