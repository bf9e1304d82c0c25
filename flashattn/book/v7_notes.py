"""The V7 chapter's tables and listings (book/v7.ipynb and its lab notes, book/v7_lab.ipynb), each one call.

Lines of kernels/v7.cu cut out by text (`excerpt`), the `mma.sync` path's peak beside the GEMM and cuDNN
(`mma_path_ceilings`), the accumulator layout check, the refusals and the failing plain-sm_90 build, the machine
code of the tile loop (flashattn.measure.sass), the correctness check (live with a GPU, the recorded errors
without), the variant sweep as steps (results/h200/v7_sweep.json), and the tensor path of two profiles.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections import Counter

import numpy as np
import torch

from flashattn import loader
from flashattn.book import clocks, layouts, records
from flashattn.book.notebook import NO_GPU, gpu, md
from flashattn.measure import geometry, resources, results, sass
from flashattn.measure.table import comparison_table, load
from flashattn.measure.variants import V7_TILES
from flashattn.reference import attention_reference, relative_error, sdpa
from flashattn.validate import check_inputs, plan

SWEEP = records.RESULTS / "v7_sweep.json"


# ------------------------------------------------------------------------------------------- the source
def excerpt_text(first: str, last: str | None = None, kernel: str = "v7") -> str:
    """kernels/<kernel>.cu from the line containing `first` to the next containing `last` (flashattn.loader)."""
    return loader.excerpt(kernel, first, last)


def excerpt(first: str, last: str | None = None, kernel: str = "v7") -> None:
    """Print `excerpt_text`."""
    print(excerpt_text(first, last, kernel))


# ------------------------------------------------------------------------------------ the mma.sync path
def mma_path_ceilings():
    """V6's `op_hmma` peaks (from its two profiles) beside the bf16 GEMM ceiling, cuDNN's fastest non-causal
    attention and V6 of the recorded comparison, and each against the peak at the highest logged SM clock."""
    c = records.ceilings()
    clock = clocks.clock_log()
    lines = ["| what | TFLOP/s | recorded in |", "|---|--:|---|"]
    at_max = []       # each op_hmma peak scaled to the highest SM clock of the recorded runs
    for L, B, H, D in ((2048, 4, 12, 64), (8192, 2, 16, 128)):
        s = records.profile_summary("v6", L)
        if s is None:
            continue
        mhz = s["sm_frequency_hz"] / 1e6
        at_max.append(s["tensor_peak_ops_per_s"] / 1e12 * clock["max_mhz"] / mhz if clock else None)
        lines.append(f"| ncu: peak of `{s['tensor_path']}` while V6 ran at B={B}, H={H}, M=N={L}, D={D} "
                     f"(SM clock {mhz:,.0f} MHz) | {s['tensor_peak_ops_per_s'] / 1e12:,.0f} | `{s['report']}` |")
    lines.append(f"| bf16 GEMM, PyTorch's `matmul` (clock not recorded) | {c['bf16'] / 1e12:,.0f} | `ceilings.json` |")
    rows = [r for r in records.bench_rows(records.RESULTS / "bench_v6.json") if r["dtype"] == "bfloat16"
            and not r["causal"] and r["status"] == "ok" and r["version"] in ("sdpa_cudnn", "v6")]
    cudnn = max((r for r in rows if r["version"] == "sdpa_cudnn"), key=lambda r: r["tflops"])
    v6 = next(r for r in rows if r["version"] == "v6" and r["head_dim"] == cudnn["head_dim"])
    for r, name in ((cudnn, "SDPA cuDNN attention"), (v6, "V6")):
        lines.append(f"| {name}, B={r['batch_size']}, H={r['num_heads']}, M=N={r['seq_len_q']}, D={r['head_dim']} | "
                     f"{r['tflops']:,.0f} | `bench_v6.json` |")
    note = ""
    if at_max and None not in at_max:
        top = max(at_max)
        note = (f"\n\nScaled to the highest SM clock `nvidia-smi` saw during the recorded runs ({clock['max_mhz']} "
                f"MHz, `gpu_clocks.csv`), the larger `op_hmma` peak would be {top:,.0f} TOP/s. Against it: the bf16 "
                f"GEMM {100 * c['bf16'] / 1e12 / top:.0f}%, cuDNN's attention {100 * cudnn['tflops'] / top:.0f}%, V6 "
                f"{100 * v6['tflops'] / top:.0f}%.")
        if c["bf16"] / 1e12 > top:
            note += (" The GEMM ran faster than the `mma.sync` path could at the highest clock of the log: unless it "
                     "ran at a clock above every sample there, it does not run on that path.")
    return md("\n".join(lines) + note)


def accumulator_check(N: int = 128) -> str:
    """Whether every warp and 8-column group of the m64nN accumulator repeats mma.sync's m16n8 layout."""
    warp, lane, reg = layouts.wgmma_accumulator_owner(N)
    mma_lane = geometry.mma_accumulator_owner(16, 8)
    rows, cols = np.meshgrid(np.arange(16), np.arange(8), indexing="ij")
    mma_reg = 2 * (rows >= 8) + cols % 2            # c0..c3 of the m16n8 accumulator
    same_lane = same_reg = True
    for w in range(4):
        for t in range(N // 8):
            block = np.s_[16 * w:16 * w + 16, 8 * t:8 * t + 8]
            same_lane &= bool((warp[block] == w).all() and (lane[block] == mma_lane).all())
            same_reg &= bool((reg[block] == 4 * t + mma_reg).all())
    return (f"m64n{N} accumulator, every warp and every 8-column group:\n"
            f"  lane of each element as in mma.sync's m16n8 accumulator: {same_lane}\n"
            f"  register index = 4 x (column group) + mma.sync's c0..c3: {same_reg}")


# ------------------------------------------------------------------------------------------- the build
def refusals(cases=((torch.float32, 64), (torch.bfloat16, 96))) -> str:
    """What flashattn.validate says to inputs V7 does not take, one line per (dtype, D)."""
    out = []
    for dtype, D in cases:
        q = torch.zeros(1, 1, 8, D, dtype=dtype)
        try:
            check_inputs(q, q, q, "v7")
            out.append(f"{str(dtype).replace('torch.', '')}, D={D}: accepted")
        except (TypeError, ValueError) as err:
            out.append(f"{str(dtype).replace('torch.', '')}, D={D}: {type(err).__name__}: {err}")
    return "\n".join(out)


def plain_sm90_build() -> str:
    """nvcc on kernels/v7.cu for plain sm_90 (no GPU needed): whether it built and ptxas's distinct errors."""
    res = subprocess.run([resources.nvcc(), *loader.NVCC_FLAGS, "-gencode=arch=compute_90,code=sm_90", "-c", "-x",
                          "cu", str(loader.KERNELS_DIR / "v7.cu"), "-o", os.devnull], capture_output=True, text=True)
    messages = sorted({line.split("error   : ")[1] for line in res.stderr.splitlines() if "error   : " in line})
    head = "nvcc for plain sm_90: " + ("failed" if res.returncode else "built")
    return "\n".join([head] + ["  " + m for m in messages])


# ------------------------------------------------------------------------------------ the machine code
def kernel_label(name: str) -> str:
    T, D, NWG, BC, causal = geometry.template_args(name)[:5]
    return f"{'bf16' if 'bfloat16' in T else 'fp16'}, D={D}{', causal' if causal == 'true' else ''}"


def a_in_registers(i) -> bool:
    # HGMMA's operands are D, A, B: A is a register when a second register comes before B's descriptor
    return bool(re.search(r"R\d+, R\d+, gdesc", i.operands))


SASS_COLUMNS = {
    "HGMMA, A in smem": lambda i: i.opcode == "HGMMA" and not a_in_registers(i),
    "HGMMA, A in regs": lambda i: i.opcode == "HGMMA" and a_in_registers(i),
    "HMMA": lambda i: i.opcode == "HMMA",
    "LDSM": lambda i: i.opcode == "LDSM",
    "UTMALDG": lambda i: i.opcode == "UTMALDG",
    "LDGSTS": lambda i: i.opcode == "LDGSTS",
    "SYNCS (mbarrier)": lambda i: i.opcode == "SYNCS",
    "BAR": lambda i: i.opcode == "BAR",
    "MUFU.EX2": lambda i: i.opcode == "MUFU" and i.suffix.startswith(".EX2"),
    "FFMA": lambda i: i.opcode == "FFMA",
    "FMUL": lambda i: i.opcode == "FMUL",
    "SHFL": lambda i: i.opcode == "SHFL",
    "LDL/STL": lambda i: i.opcode in ("LDL", "STL"),
}
V6_BF16_D64 = "<__nv_bfloat16, 64, 2, 64, 4, false, 2, false, false>"     # the V6 chapter's instance


def v7_tile_loops() -> dict:
    """The tile loop (sass `hot_loop`) of every bf16 kernel of kernels/v7.cu, by demangled name."""
    return {f.pretty: f.hot_loop() for f in sass.disassemble("v7") if "bfloat16" in f.pretty}


def sass_row(label: str, loop) -> str:
    counts = Counter(col for i in loop.instructions for col, test in SASS_COLUMNS.items() if test(i))
    return f"| {label} | {len(loop.instructions)} | " + " | ".join(str(counts[c]) for c in SASS_COLUMNS) + " |"


def sass_table(loops: dict | None = None):
    """Static counts of the instructions that matter, in the tile loop of V6's bf16 D=64 kernel and V7's."""
    loops = v7_tile_loops() if loops is None else loops
    v6 = sass.function("v6", V6_BF16_D64)
    lines = ["| tile loop of | instructions | " + " | ".join(SASS_COLUMNS) + " |",
             "|---|--:|" + "--:|" * len(SASS_COLUMNS),
             sass_row(f"V6 `{v6.pretty.split('(')[0].removeprefix('void ')}`", v6.hot_loop())]
    lines += [sass_row(f"V7 {kernel_label(name)}", loops[name]) for name in sorted(loops, key=kernel_label)]
    return md("\n".join(lines))


def s_product_listing(loops: dict | None = None) -> str:
    """The S_ij product of the D=64 bf16 kernel: its ordering, HGMMA, mbarrier and TMA instructions from
    WARPGROUP.ARRIVE to WARPGROUP.DEPBAR."""
    loops = v7_tile_loops() if loops is None else loops
    name = next(n for n in loops if "<__nv_bfloat16, 64," in n and ", false," in n)
    body = loops[name].instructions
    first = next(k for k, i in enumerate(body) if i.opcode == "WARPGROUP" and i.suffix == ".ARRIVE")
    last = next(k for k in range(first, len(body))
                if body[k].opcode == "WARPGROUP" and body[k].suffix.startswith(".DEPBAR"))
    # flashattn.measure.sass ends an opcode's suffixes at HGMMA's lowercase shape ("64x128x16"): join them again
    out = ["  " + re.sub(r"^(HGMMA\.\d+) x", r"\1x", i.text) for i in body[first:last + 1]
           if i.opcode in ("WARPGROUP", "HGMMA", "SYNCS", "UTMALDG")]
    n_hgmma = sum(1 for i in body[first:last + 1] if i.opcode == "HGMMA")
    out.append(f"({last - first + 1} instructions in all, {n_hgmma} of them HGMMA; the others compute addresses "
               "and descriptors, and run the refill)")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ correctness
ODD = [(1, 1, 1, 1), (2, 3, 17, 17), (2, 3, 113, 203), (2, 3, 203, 113), (1, 2, 1023, 1025), (1, 2, 1025, 1023)]


def recorded_errors(dtype: str, causal: bool):
    """The errors of the recorded benchmark's own check (results/h200/bench_v7.json), V7 and SDPA."""
    rows = [r for r in records.bench_rows(records.RESULTS / "bench_v7.json") if r["version"] in ("v7", "sdpa")
            and r["dtype"] == dtype and bool(r["causal"]) == causal and r.get("rel_error") is not None]
    if not rows:
        return md("*Not recorded yet: `results/h200/bench_v7.json` (`scripts/record_h200.sh OUT v7`) holds "
                  "the errors of the benchmark's own check once the H200 run is committed.*")
    lines = ["| version | B, H, M, N, D | dtype | causal | relative error |", "|---|---|---|---|--:|"]
    lines += [f"| {r['version']} | {r['batch_size']}, {r['num_heads']}, {r['seq_len_q']}, {r['seq_len_kv']}, "
              f"{r['head_dim']} | {r['dtype']} | {r['causal']} | {r['rel_error']:.1e} |" for r in rows]
    return md("\n".join(lines))


def check(dtype, causal=False, scale=1.0, shapes=ODD, dims=(64, 128)):
    """V7 against float64 on odd shapes, beside SDPA's error on the same inputs (with a GPU); the recorded
    errors without one."""
    if not gpu():
        print(NO_GPU.format(what="the errors"))
        return recorded_errors(str(dtype).replace("torch.", ""), causal)
    g = torch.Generator(device="cuda").manual_seed(0)
    lines = ["| B, H, M, N, D | V7 error | SDPA error | V7 ≤ 2 × SDPA | finite |", "|---|--:|--:|---|---|"]
    for D in dims:
        for B, H, M, N in shapes:
            q = (torch.randn(B, H, M, D, device="cuda", generator=g) * scale).to(dtype)
            k, v = (torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype) for _ in range(2))
            ref = attention_reference(q, k, v, causal=causal)
            out = plan(q, k, v, "v7", causal).run(q, k, v)
            ours = relative_error(out, ref)
            theirs = relative_error(torch.nan_to_num(sdpa(q, k, v, causal), nan=0.0), ref)
            lines.append(f"| {B}, {H}, {M}, {N}, {D} | {ours:.1e} | {theirs:.1e} | {ours <= 2 * theirs} | "
                         f"{bool(torch.isfinite(out).all())} |")
    return md("\n".join(lines))


# -------------------------------------------------------------------------------------------- the steps
def sweep_rows() -> dict[str, dict] | None:
    """The rows of results/h200/v7_sweep.json by variant name; None when it is not recorded."""
    doc = results.read_if_exists(SWEEP, "sweep")
    return None if doc is None else {r["name"]: r for r in doc["rows"]}


def facts(r: dict) -> tuple:
    """(median µs, registers, blocks per SM, spilled bytes) of one sweep row; None where not recorded."""
    t, px, occ = (r.get(k) or {} for k in ("timing", "ptxas", "occupancy"))
    return t.get("median_us"), px.get("registers"), occ.get("blocks_per_sm"), px.get("spill_store_bytes")


def steps_table():
    """Every variant of the sweep, in the order of flashattn.measure.variants.V7_TILES (then any other the
    record holds): its registers, blocks per SM, median time and its ratio to cuDNN timed in the same run."""
    got = sweep_rows()
    if got is None:
        return md("*Not recorded yet: `results/h200/v7_sweep.json` (`python -m flashattn.measure.sweep v7`).*")
    names = [v.name for v in V7_TILES] + [n for n in got if n not in {v.name for v in V7_TILES}]
    lines = ["| variant | registers | blocks/SM | median µs | vs. cuDNN |", "|---|--:|--:|--:|--:|"]
    for name in names:
        if name not in got:
            lines.append(f"| {name} | not in the record | | | |")
            continue
        t, regs, blocks, _ = facts(got[name])
        cudnn = (got[name].get("vs") or {}).get("sdpa_cudnn")
        lines.append(f"| {name} | {'—' if regs is None else regs} | {'—' if blocks is None else blocks} | "
                     f"{'—' if t is None else f'{t:,.1f}'} | {'—' if cudnn is None else f'{cudnn:.2f}×'} |")
    return md("\n".join(lines) + "\n\nbfloat16, non-causal; D=64 at B=4, H=12, M=N=2048, D=128 at B=2, H=16, "
              "M=N=8192. Above 1 the variant was faster than cuDNN.")


STEPS = [   # (D, from, to, the one choice that differs); tests/test_v7_chapter.py checks each is one change
    (64, "d64 plain loads, 1 stage", "d64 plain loads, 2 stages", "plain loads: 1 → 2 stages"),
    (64, "d64 plain loads, 1 stage", "d64 TMA, 1 stage", "1 stage: plain loads → TMA"),
    (64, "d64 plain loads, 2 stages", "d64 TMA, 2 stages (default)",
     "2 stages: plain loads → TMA (and 1 → 2 blocks per SM)"),
    # the TMA step taken apart: the same step at one and at two blocks per SM, and each occupancy step alone
    (64, "d64 plain loads, 2 stages", "d64 TMA, 2 stages, 1 block/SM", "2 stages, 1 block per SM: plain loads → TMA"),
    (64, "d64 plain loads, 2 stages, 2 blocks/SM", "d64 TMA, 2 stages (default)",
     "2 stages, 2 blocks per SM: plain loads → TMA"),
    (64, "d64 plain loads, 2 stages", "d64 plain loads, 2 stages, 2 blocks/SM",
     "plain loads: 1 → 2 blocks per SM (128 registers asked)"),
    (64, "d64 TMA, 2 stages, 1 block/SM", "d64 TMA, 2 stages (default)", "TMA: 1 → 2 blocks per SM"),
    (64, "d64 TMA, 1 stage", "d64 TMA, 2 stages (default)", "TMA: 1 → 2 stages"),
    (64, "d64 TMA, 2 stages (default)", "d64 TMA, 3 stages", "TMA: 2 → 3 stages"),
    (64, "d64 TMA, 2 stages (default)", "d64 3 WG", "2 → 3 warpgroups"),
    (64, "d64 TMA, 2 stages (default)", "d64 B_c=64", "B_c 128 → 64, two blocks per SM asked"),
    (128, "d128 plain loads, 1 stage", "d128 plain loads, 2 stages", "plain loads: 1 → 2 stages (2 WG)"),
    (128, "d128 plain loads, 2 stages", "d128 TMA, 2 stages, 2 WG", "2 stages, 2 WG: plain loads → TMA"),
    (128, "d128 TMA, 1 stage", "d128 TMA, 2 stages, 3 WG (default)", "TMA, 3 WG: 1 → 2 stages"),
    (128, "d128 TMA, 2 stages, 2 WG", "d128 TMA, 2 stages, 3 WG (default)", "2 → 3 warpgroups"),
    (128, "d128 TMA, 2 stages, 2 WG", "d128 TMA, 3 stages, 2 WG", "TMA, 2 WG: 2 → 3 stages"),
    (128, "d128 TMA, 2 stages, 2 WG", "d128 B_c=64", "2 WG: B_c 128 → 64, two blocks per SM asked"),
]


def tma_step() -> str:
    """The TMA step at D=64 taken apart by its two controls (plain loads held to 128 registers, so two
    blocks per SM; TMA held to one block per SM by unused shared memory): each build's time, registers,
    spills and blocks per SM, then the factor of each change at fixed occupancy and at fixed loads."""
    got = sweep_rows()
    names = {"plain, 1 block/SM": "d64 plain loads, 2 stages",
             "plain, 2 blocks/SM": "d64 plain loads, 2 stages, 2 blocks/SM",
             "TMA, 1 block/SM": "d64 TMA, 2 stages, 1 block/SM", "TMA, 2 blocks/SM": "d64 TMA, 2 stages (default)"}
    if got is None or any(n not in got for n in names.values()):
        return "Not recorded yet: the TMA step's controls (python -m flashattn.measure.sweep v7)."
    t = {k: facts(got[n])[0] for k, n in names.items()}
    lines = []
    for k, n in names.items():
        ptxas = got[n].get("ptxas") or {}
        lines.append(f"{k:19} {t[k]:7.1f} µs  {ptxas.get('registers')} registers, "
                     f"{ptxas.get('spill_store_bytes', 0)} bytes spilled, {facts(got[n])[2]} block(s) per SM")
    lines += ["", "whole step (plain, 1 block -> TMA, 2 blocks)  "
              f"{t['plain, 1 block/SM'] / t['TMA, 2 blocks/SM']:.2f}x"]
    for what, a, b in (("TMA at 1 block per SM     ", "plain, 1 block/SM", "TMA, 1 block/SM"),
                       ("TMA at 2 blocks per SM    ", "plain, 2 blocks/SM", "TMA, 2 blocks/SM"),
                       ("2nd block with plain loads", "plain, 1 block/SM", "plain, 2 blocks/SM"),
                       ("2nd block with TMA        ", "TMA, 1 block/SM", "TMA, 2 blocks/SM")):
        lines.append(f"{what}  {t[a]:7.1f} -> {t[b]:7.1f} µs  {t[a] / t[b]:.2f}x")
    return "\n".join(lines)


def step_pairs_table(steps=STEPS):
    """The sweep read as steps: each row two variants that differ in one choice, with the time, registers and
    blocks per SM of both, and which single change gained most at each head dim."""
    got = sweep_rows()
    if got is None:
        return md("*Not recorded yet: `results/h200/v7_sweep.json` (`python -m flashattn.measure.sweep v7` on the "
                  "H200).*")
    lines = ["| D | change | µs before → after | time | registers | blocks/SM | spills after |",
             "|--:|---|--:|--:|--:|--:|--:|"]
    best = {}
    for D, a, b, what in steps:
        if a not in got or b not in got:
            lines.append(f"| {D} | {what} | not in the record | | | | |")
            continue
        (ta, ra, ba, _), (tb, rb, bb, sb) = facts(got[a]), facts(got[b])
        if ta is None or tb is None:
            lines.append(f"| {D} | {what} | not timed | | {ra} → {rb} | {ba} → {bb} | {sb} B |")
            continue
        gain = 100 * (ta - tb) / ta
        best[D] = max(best.get(D, (None, -1e9)), (what, gain), key=lambda x: x[1])
        lines.append(f"| {D} | {what} | {ta:,.1f} → {tb:,.1f} | {-gain:+.1f}% | {ra} → {rb} | {ba} → {bb} | {sb} B |")
    summary = " ".join(f"At D={D} the largest gain of one change is *{w}* ({g:.0f}% less time)." if g > 0 else
                       f"At D={D} no single change made the kernel faster." for D, (w, g) in sorted(best.items()))
    return md("\n".join(lines) + "\n\nA negative change is a gain. " + summary)


def recorded_comparison():
    """The recorded run of the chapter (results/h200/bench_v7.json) as V7's ratios to V6 and SDPA's backends."""
    path = records.RESULTS / "bench_v7.json"
    if not path.exists():
        return md("*Not recorded yet: `results/h200/bench_v7.json` (`scripts/record_h200.sh OUT v7`).*")
    return md(comparison_table(load(path), "v7", ["v6", "sdpa", "sdpa_flash"]))


# ------------------------------------------------------------------------------------------ the profile
def tensor_line(version: str, s: dict) -> str:
    """One report's tensor path, its peak per SM per cycle, what was achieved, the pipe, issue and occupancy."""
    peak, pipe, ops = s["tensor_peak_ops_per_s"], s["tensor_pipe_pct"], s["tensor_ops_per_s"]
    per_cycle = peak / s["sm_frequency_hz"] / records.ceilings()["sm_count"] if peak else None
    return (f"{version}: tensor path {s['tensor_path'] or 'not found in the report'}"
            + (f", peak {per_cycle:,.0f} ops per SM per cycle, achieved {ops / 1e12:,.0f} TOP/s" if peak else "")
            + (f"; tensor pipe active {pipe:.1f}% of cycles" if pipe is not None else "")
            + f"; {s['warp_cycles_per_issue']:.2f} warp cycles per issued instruction, occupancy achieved "
            f"{s['achieved_occupancy_pct']:.1f}%.")


def tensor_paths() -> str:
    """V6's and V7's tensor paths at the primary shape, from their committed Nsight Compute reports."""
    s6, s7 = records.profile_summary("v6"), records.profile_summary("v7")
    if s7 is None or s6 is None:
        return ("Not recorded yet: the comparison with V6's report appears once flash_v7_s2048_profile.ncu-rep is "
                "committed.")
    return tensor_line("V6", s6) + "\n" + tensor_line("V7", s7)
