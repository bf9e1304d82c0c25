"""The book's Nsight Compute tables, from a summary of flashattn.measure.ncu.summarize: the per-version profile
table (metric, value, what it means) and the warp-stall breakdown, as rows and as Markdown.
"""
from __future__ import annotations

import math

STALL_MEANING = {   # what a warp in each state is waiting for (Kernel Profiling Guide, in our words)
    "wait": "a fixed-latency dependency: the result of a recent math instruction (mma, FFMA) is not ready",
    "short_scoreboard": "an MIO result: a shared-memory load (ldmatrix, ld.shared), a shuffle or an exp2",
    "long_scoreboard": "a global- or local-memory load",
    "math_pipe_throttle": "its math pipe (tensor or FMA) is still busy with earlier instructions",
    "not_selected": "nothing: it was ready, but the scheduler issued another warp's instruction",
    "selected": "nothing: this is the cycle it issues (one per instruction)",
    "dispatch_stall": "chosen, but the dispatch stage could not send the instruction on this cycle",
    "barrier": "the block's other warps at a CTA barrier (bar.sync: __syncthreads or a named barrier)",
    "mio_throttle": "room in the queue to shared memory, shuffles and special functions",
    "lg_throttle": "room in the queue for global- and local-memory instructions",
    "no_instruction": "its next instruction to be fetched (instruction-cache miss, or just after a branch)",
    "branch_resolving": "a branch target to be computed",
    "drain": "its memory stores to drain before it exits",
    "membar": "a memory fence",
    "imc_miss": "a constant-cache miss",
}


def _si(x, unit, digits=2):
    if x is None:
        return "—"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"), (1, "")):
        if abs(x) >= scale or scale == 1:
            return f"{x / scale:,.{digits}f} {prefix}{unit}"


def table_rows(s: dict) -> list[tuple[str, str, str]]:
    """(metric, value, interpretation) rows of the book's profile tables."""
    rows = [("Profiled duration", f"{s['duration_s'] * 1e3:,.3f} ms" if s["duration_s"] else "—",
             "under Nsight Compute; distinct from the benchmark's timing")]
    rows.append(("FP32 throughput", _si(s["fp32_flops_per_s"], "FLOP/s"),
                 f"{s['fp32_pct_of_peak']:.1f}% of the FP32 roofline peak ({_si(s['fp32_peak_flops_per_s'], 'FLOP/s')})"
                 if s["fp32_pct_of_peak"] is not None else "—"))
    if s["tensor_ops_per_s"]:
        rows.append(("Tensor-core throughput", _si(s["tensor_ops_per_s"], "OP/s"),
                     f"{s['tensor_pct_of_peak']:.1f}% of the {s['tensor_path']} peak "
                     f"({_si(s['tensor_peak_ops_per_s'], 'OP/s')})"))
    if s["tensor_pipe_pct"] and s["tensor_pipe_pct"] >= 1:   # CUDA-core kernels read ~0.3%: noise
        rows.append(("Tensor pipe", f"{s['tensor_pipe_pct']:.1f}%", "active cycles of the tensor pipe"))
    ai, ridge = s["arithmetic_intensity"], s["fp32_ridge"]
    if ai is not None and ridge:
        side = ("about at" if abs(math.log(ai / ridge)) < 0.1 else
                "on the memory-bound side of" if ai < ridge else "on the compute-bound side of")
        rows.append(("Arithmetic intensity", f"{ai:,.2f} FLOP/byte", f"{side} the FP32 ridge ({ridge:,.1f} FLOP/byte)"))
    rows.append(("DRAM bandwidth", _si(s["dram_bytes_per_s"], "B/s"),
                 f"{100 * s['dram_bytes_per_s'] / s['dram_peak_bytes_per_s']:.1f}% of the DRAM peak"
                 if s["dram_bytes_per_s"] is not None and s["dram_peak_bytes_per_s"] else "—"))
    achieved, theoretical = s["achieved_occupancy_pct"], s["theoretical_occupancy_pct"]
    rows.append(("Occupancy", f"{achieved:.2f}% achieved" if achieved is not None else "—",
                 f"{theoretical:.2f}% theoretical" if theoretical is not None else "—"))
    lim = s["limited_by"]
    rows.append(("Theoretical blocks/SM", f"{s['blocks_per_sm']:.0f}" if s["blocks_per_sm"] is not None else "—",
                 "limited " + ("jointly " if len(lim) > 1 else "") + "by " + " and ".join(lim) if lim else "—"))
    launch = f"{s['block_size']:.0f} threads/block, {s['grid_size']:.0f} blocks" \
        if s["block_size"] and s["grid_size"] else "—"
    rows.append(("Registers", f"{s['registers_per_thread']:.0f}/thread" if s["registers_per_thread"] else "—", launch))
    if s.get("shared_wavefronts_ld") is not None:
        rows.append(("Shared-memory bank conflicts",
                     f"{s['bank_conflicts_ld']:,.0f} load, {s['bank_conflicts_st']:,.0f} store",
                     f"extra wavefronts, out of {s['shared_wavefronts_ld']:,.0f} load and "
                     f"{s['shared_wavefronts_st']:,.0f} store wavefronts"))
    dyn, drv = s["shared_dynamic_bytes"], s["shared_driver_bytes"]
    total = s["shared_total_bytes"]
    rows.append(("Shared memory", f"{total / 1e3:.2f} KB/block" if total is not None else "—",
                 f"{dyn / 1e3:.2f} KB dynamic + {(s['shared_static_bytes'] or 0) / 1e3:.2f} KB static + "
                 f"{drv / 1e3:.2f} KB driver reservation" if dyn is not None and drv is not None else "—"))
    return rows


def markdown_table(s: dict) -> str:
    lines = ["| Metric | Value | Interpretation |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in table_rows(s)]
    return "\n".join(lines)


def stall_rows(s: dict, top: int = 6) -> list[tuple[str, float, float, str]]:
    """(reason, cycles per issued instruction, share of all warp cycles in %, what it waits for) for the
    `top` largest stall reasons of a summary; [] when the report has none."""
    total = s.get("warp_cycles_per_issue") or sum(s.get("stalls", {}).values())
    return [(r, v, 100 * v / total, STALL_MEANING.get(r, "")) for r, v in list(s.get("stalls", {}).items())[:top]]


def stall_table(s: dict, top: int = 6) -> str:
    rows = stall_rows(s, top)
    if not rows:
        return "*This report has no warp-state statistics (ncu section WarpStateStats).*"
    lines = ["| Warp state | Cycles per issued instruction | Share | Waiting for |", "|---|--:|--:|---|"]
    lines += [f"| {r.replace('_', ' ')} | {v:.2f} | {pct:.0f}% | {why} |" for r, v, pct, why in rows]
    ipc = (f"; the SM issued {s['issued_ipc']:.2f} instructions per active cycle (at most 4)"
           if s.get("issued_ipc") else "")
    lines.append(f"\nA warp took {s['warp_cycles_per_issue']:.2f} cycles per issued instruction{ipc}."
                 if s.get("warp_cycles_per_issue") else "")
    return "\n".join(lines).rstrip()
