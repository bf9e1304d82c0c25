"""The tables and listings of the V6 chapter and its lab notes, read from the committed records.

* ``step_summary``: the step chain in one short table, a row per step (what it changed, the median time at
  D = 64 and D = 128 with the ratio to the step before, and the one counter that says why it moved);
* ``refusals``: what ``flashattn.forward`` answers for head dimensions V6 was not built for (CPU tensors);
* ``tf32_errors``: the recorded relative errors of V6's TF32 mode and of SDPA's float32 path;
* ``clock_table``: the FP32 roofline peak and the SM clock of every recorded profile the chapter cites;
* ``a_operand_owner``, ``accumulator_owner``: the PTX ISA's fragment layouts of ``mma.m16n8k16`` (bf16 A operand,
  float32 accumulator), written from the ISA's formulas, so that the fragment figure can be checked against them;
* ``HOT_LOOP_KERNELS``: the three template instances whose hot loops the lab notes disassemble.
"""
from __future__ import annotations

import numpy as np
import torch

import flashattn
from flashattn.book import notebook, records
from flashattn.measure import results
from flashattn.versions import INFO

# step -> the counter (a records.STEP_COLUMNS name) that carries the reason the step changed the time
KEY_COUNTER = {2: "STS", 3: "bank conflicts ld", 4: "bank conflicts ld", 5: "instructions",
               6: "stall long scoreboard", 7: "BAR/sync"}
STEPS_FILE = "v6_steps.json"

# label -> template arguments of flash_fwd_mma (dtype, D, slices per warp, B_c, Q k steps in registers,
# causal, stages, lazy rescale, P through shared memory) as the launcher instantiates them
HOT_LOOP_KERNELS = {"bf16, D = 64": "<__nv_bfloat16, 64, 2, 64, 4, false, 2, false, false>",
                    "bf16, D = 128": "<__nv_bfloat16, 128, 2, 64, 0, false, 2, true, false>",
                    "TF32 (float32 inputs), D = 64": "<float, 64, 1, 64, 8, false, 2, true, false>"}


def _fmt(value, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def step_summary_rows(file: str = STEPS_FILE) -> list[dict]:
    """One dict per step of the recorded chain: step, change, us64/us128 (median µs), x64/x128 (speed over the
    step before), counter (its name) and before/after (its value at D = 64 in the step before and in this one)."""
    rows = records.step_rows("v6", file)
    by = {(r["D"], r["step"]): r for r in rows}
    out = []
    for step in sorted({r["step"] for r in rows}):
        r64, r128 = by.get((64, step)), by.get((128, step))
        first = r64 or r128
        counter = KEY_COUNTER.get(step)
        prev = by.get((64, step - 1))
        out.append(dict(step=step, change=first["change"],
                        us64=r64 and r64["us"], x64=r64 and r64["vs_previous"],
                        us128=r128 and r128["us"], x128=r128 and r128["vs_previous"],
                        counter=counter, before=prev.get(counter) if counter and prev else None,
                        after=r64.get(counter) if counter and r64 else None))
    return out


def step_summary(file: str = STEPS_FILE):
    """The step chain as one short Markdown table (see step_summary_rows)."""
    rows = step_summary_rows(file)
    if not rows:
        return notebook.md(f"*No recorded step chain yet (`results/h200/{file}`, from "
                           "`python -m flashattn.measure.sweep v6-steps --metrics`).*")
    lines = ["| step | change | D = 64: µs | × | D = 128: µs | × | why, at D = 64 (before → after) |",
             "|--:|---|--:|--:|--:|--:|---|"]
    for r in rows:
        fmt = records.STEP_COLUMNS.get(r["counter"], ((), "{:,}"))[1]
        why = (f"{r['counter']} {_fmt(r['before'], fmt)} → {_fmt(r['after'], fmt)}" if r["counter"] else "—")
        lines.append(f"| {r['step']} | {r['change']} | {_fmt(r['us64'], '{:,.1f}')} | {_fmt(r['x64'], '{:.2f}')} | "
                     f"{_fmt(r['us128'], '{:,.1f}')} | {_fmt(r['x128'], '{:.2f}')} | {why} |")
    doc = results.read(records.RESULTS / file, "sweep")
    shapes = sorted({(r["D"], tuple(r.get("shape") or ())[:4]) for r in doc["rows"] if r.get("shape")})
    note = ("× is the speed over the step before (above 1: faster). Times: "
            + "; ".join(f"D = {d}: B, H, M, N = {', '.join(map(str, s))}" for d, s in shapes)
            + f", {doc['meta']['dtype']}, non-causal; {doc['settings']['timing']}. "
            f"Counters: one launch under Nsight Compute; instruction counts (`STS`, `BAR/sync`) per hot loop, from "
            f"the SASS. Record: `results/h200/{file}`.")
    return notebook.md("\n".join(lines) + "\n\n" + note)


def refusals() -> str:
    """What flashattn.forward says to head dimensions outside V6's, on CPU tensors (the checks run before any
    build or launch, so the answers are the same without a GPU), and which D each of V3-V6 specialises."""
    lines = []
    for version, D in (("v6", 80), ("v6", 96), ("v6", 256), ("v5", 96)):
        dtype = torch.bfloat16 if version == "v6" else torch.float32
        q = torch.randn(1, 2, 17, D, dtype=dtype)     # a CPU tensor: nothing reaches a GPU
        try:
            flashattn.forward(q, q, q, version=version)
            lines.append(f"{version}, D = {D}: accepted")
        except (ValueError, TypeError) as e:
            lines.append(f"{version}, D = {D}: {type(e).__name__}: {e}")
    lines.append("")
    for version in ("v3", "v4", "v5", "v6"):
        i = INFO[version]
        other = f"runs on {i.fallback}" if i.fallback else "is refused"
        lines.append(f"{version} is specialised for D in {i.head_dims}; any other D {other}")
    return "\n".join(lines)


def tf32_errors(file: str = "bench_v6.json") -> dict:
    """{version: relative error against float64} of the recorded float32 runs at the primary shape
    (B=4, H=12, M=N=2048, D=64, non-causal) of `file`."""
    return {r["version"]: r["rel_error"] for r in records.bench_rows(records.RESULTS / file)
            if r["dtype"] == "float32" and r.get("rel_error") is not None and r["seq_len_q"] == 2048
            and r["head_dim"] == 64 and not r["causal"]}


def tf32_error_line(file: str = "bench_v6.json") -> str:
    errors = tf32_errors(file)
    found = ", ".join(f"{records.label(v)} {errors[v]:.1e}" for v in ("v6", "sdpa") if v in errors)
    return "relative error against float64, float32 inputs, B=4, H=12, M=N=2048, D=64: " + (
        found or "not recorded yet")


def clock_rows(profiles=(("v4", 2048), ("v5", 2048), ("v6", 2048), ("v6", 8192))) -> list[tuple]:
    """(version, M = N, FP32 roofline peak in TFLOP/s, SM clock in GHz) of each recorded profile."""
    out = []
    for version, L in profiles:
        s = records.profile_summary(version, L)
        if s:
            out.append((version, L, s["fp32_peak_flops_per_s"] / 1e12, s["sm_frequency_hz"] / 1e9))
    return out


def clock_table():
    rows = clock_rows()
    if not rows:
        return notebook.md("*No Nsight Compute report recorded yet.*")
    lines = ["| profile | FP32 roofline peak | SM clock while profiled |", "|---|--:|--:|"]
    lines += [f"| {v}, M = N = {L} | {peak:.2f} TFLOP/s | {ghz:.3f} GHz |" for v, L, peak, ghz in rows]
    return notebook.md("\n".join(lines))


def a_operand_owner() -> tuple[np.ndarray, np.ndarray]:
    """(lane, element index i of a0..a7) of each element of the 16 x 16 bf16 A operand of mma.m16n8k16, from
    the PTX ISA's formulas: row = groupID (+8 for a2, a3, a6, a7), col = 2 * threadID_in_group + (i & 1)
    (+8 for a4..a7), with groupID = lane >> 2 and threadID_in_group = lane % 4."""
    lane, elem = np.full((16, 16), -1), np.full((16, 16), -1)
    for ln in range(32):
        g, q = ln >> 2, ln % 4
        for i in range(8):
            row = g + 8 * (i in (2, 3, 6, 7))
            col = 2 * q + (i & 1) + 8 * (i >= 4)
            lane[row, col], elem[row, col] = ln, i
    return lane, elem


def accumulator_owner(n_tiles: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(lane, element index c0..c3) of each element of `n_tiles` neighbouring 16 x 8 float32 accumulators of
    mma.m16n8k16, side by side, from the PTX ISA: row = groupID (+8 for c2, c3), col = 2 * threadID_in_group
    + (i & 1)."""
    lane, elem = np.full((16, 8 * n_tiles), -1), np.full((16, 8 * n_tiles), -1)
    for t in range(n_tiles):
        for ln in range(32):
            g, q = ln >> 2, ln % 4
            for i in range(4):
                row, col = g + 8 * (i >= 2), 8 * t + 2 * q + (i & 1)
                lane[row, col], elem[row, col] = ln, i
    return lane, elem
