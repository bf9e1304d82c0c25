"""The Hopper backward's Nsight Compute report beside FlashAttention-4's, for "The backward on Hopper":
`python -m flashattn.measure.profile v8_backward -B 2 -H 16 -D 128 --seq-len 8192 --out results/h200` and the
same with `fa4_backward` record each main kernel (the one that accumulates dK and dV) in its own gradient call
at the shape where the two are furthest apart. Every table reads the committed reports only.

For the lab notes, the steps the profile asked for: `order_table` adds the report of the order that is now the
default (V8B_HEAD_GROUP -1, profiled by the same command and saved as flash_v8_backward_l2order_s8192_profile),
and `step_log` reads the tables `python -m flashattn.book.backward_hopper_live order|descriptors` printed on the
H200 (results/h200/logs); `log_lines` what the committed test and sanitizer logs record.
"""
from __future__ import annotations

import csv
import functools
import re
from collections import Counter

from flashattn.book import records
from flashattn.book.backward_hopper import opcode
from flashattn.book.notebook import md
from flashattn.loader import REPO_ROOT
from flashattn.measure import ncu, ncu_tables

LOGS_DIR = REPO_ROOT / "results" / "h200" / "logs"
# the H200 runs of the first version (now V8B_DQ_BULK=0), in the order they ran: before and after the empty fix
LOGS = tuple(LOGS_DIR / name for name in (
    "sanitizer_pending_gpu_rest_f50ce76.log", "pytest_pending_gpu_rest_f50ce76.log",
    "v8_backward_arrive_all_threads.log"))
# the bulk dQ path and the deterministic mode on the H200: the first run (four tests failed, each in the test),
# the sanitizer run, and the fixed tests
BULK_LOGS = tuple(LOGS_DIR / name for name in (
    "pytest_v8_backward_77b169c.log", "sanitizer_v8_backward_77b169c.log", "pytest_backward_fixes_506e705.log"))
SHAPE = dict(batch_size=2, num_heads=16, seq_len=8192, head_dim=128)
PAIR = {"v8_backward": "V8 backward (`flash_bwd_ws`)", "fa4_backward": "FlashAttention-4"}
# the rows of ncu_tables.table_rows that differ between two tensor-core kernels at one shape
ROWS = ("Profiled duration", "Tensor-core throughput", "Tensor pipe", "DRAM bandwidth", "Occupancy", "Registers",
        "Shared memory")
# ncu's instruction pipes (sm__inst_executed_pipe_<name>) and what runs on each (Nsight Compute's Kernel
# Profiling Guide, in our words)
PIPES = {"tensor_op_gmma": "wgmma", "fma": "FP32 add, multiply, FMA; IMAD",
         "alu": "integer and logic, compare and select, some conversions", "xu": "exp2 and other special functions",
         "lsu": "loads and stores: shared, global", "uniform": "warp-uniform instructions (one value per warp)",
         "adu": "branches, barriers, constant loads"}
COMMAND = ("`python -m flashattn.measure.profile {name} -B 2 -H 16 -D 128 --seq-len 8192 --out results/h200`")
# reports kept under another name than the one `profile` writes: the name it was profiled as
PROFILED = {"v8_backward_l2order": "v8_backward", "v8_backward_early_dv": "v8_backward",
            "v8_backward_tile64": "v8_backward", "v8_backward_tile80": "v8_backward"}


def summaries(names=PAIR) -> tuple[dict | None, str | None]:
    """({name: flashattn.measure.ncu summary} of the reports of `names`, None) or (None, the sentence to show
    instead)."""
    got = {}
    for name in names:
        path = records.report_path(name, SHAPE["seq_len"])
        if not path.exists():
            command = COMMAND.format(name=PROFILED.get(name, name))
            return None, f"*Not recorded yet: `results/h200/{path.name}` ({command}).*"
        got[name] = records.profile_summary(name, SHAPE["seq_len"])
        if got[name] is None:
            return None, "*The reports are there but `ncu_report` is not installed (`pip install ncu-report`).*"
    return got, None


def _cell(value: str, note: str) -> str:
    """The value, with the part of ncu_tables' interpretation that is a number about it (a share of a peak, a
    theoretical occupancy, the launch), without the peak's own name."""
    if "%" not in note and "threads" not in note:
        return value
    return f"{value} ({note.split(' (')[0].replace(' the op_hgmma_src_bf16_dst_fp32_sparsity_off', '')})"


def pair_table():
    """Metric by metric, ours beside FlashAttention-4's, each value with what ncu_tables says it means."""
    got, missing = summaries()
    if got is None:
        return md(missing)
    rows = {name: {a: (b, c) for a, b, c in ncu_tables.table_rows(s)} for name, s in got.items()}
    lines = ["| Metric | " + " | ".join(PAIR.values()) + " |", "|---|---|---|"]
    for metric in ROWS:
        if all(metric in r for r in rows.values()):
            lines.append(f"| {metric} | " + " | ".join(_cell(*rows[n][metric]) for n in PAIR) + " |")
    ipc = [f"{got[n]['issued_ipc']:.2f}" if got[n].get("issued_ipc") else "—" for n in PAIR]
    lines.append("| Issued instructions per active cycle (at most 4) | " + " | ".join(ipc) + " |")
    return md("\n".join(lines) + f"\n\nbf16, B = 2, H = 16, M = N = 8192, D = 128, non-causal, on "
              f"{got['v8_backward']['device']}; durations under Nsight Compute, not the benchmark's.")


def stall_pair(top: int = 6):
    """The warp states that take the most cycles in either kernel, cycles per issued instruction in each (what
    each state waits for: the stall tables of the V6 chapter, flashattn.measure.ncu_tables.STALL_MEANING)."""
    got, missing = summaries()
    if got is None:
        return md(missing)
    reasons = list(dict.fromkeys(r for s in got.values() for r, *_ in ncu_tables.stall_rows(s, top)))
    lines = ["| Warp state | " + " | ".join(PAIR.values()) + " |", "|---|--:|--:|"]
    for r in reasons:
        cells = [f"{got[n]['stalls'].get(r, 0.0):.2f}" for n in PAIR]
        lines.append(f"| {r.replace('_', ' ')} | " + " | ".join(cells) + " |")
    per_issue = [f"{got[n]['warp_cycles_per_issue']:.2f}" if got[n].get("warp_cycles_per_issue") else "—"
                 for n in PAIR]
    return md("\n".join(lines) + "\n\nCycles per issued instruction, by the state a warp was in; all states "
              f"together: {' and '.join(per_issue)}.")


@functools.cache
def _pipe_counts(path: str) -> dict[str, float]:
    """{pipe: instructions in units of one pipe-peak cycle of one SM}, "all": instructions executed, and
    "cycles": the cycles elapsed, from one report: a pipe's share of its peak times the cycles elapsed (the same
    GPU, so ratios between two reports are ratios of instruction counts)."""
    action = ncu.load_action(path)
    cycles = ncu.metric(action, "gpc__cycles_elapsed.avg")
    got = {p: ncu.metric(action, f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_elapsed") / 100 * cycles
           for p in PIPES}
    return {**got, "all": ncu.metric(action, "sm__inst_executed.sum.per_cycle_elapsed") * cycles, "cycles": cycles}


def pipe_table():
    """Instructions per pipe: each kernel's share of the pipe's peak, and how many ours executed for one of
    FlashAttention-4's."""
    got, missing = summaries()
    if got is None:
        return md(missing)
    counts = {n: _pipe_counts(str(records.report_path(n, SHAPE["seq_len"]))) for n in PAIR}
    ours, theirs = counts["v8_backward"], counts["fa4_backward"]
    lines = ["| Pipe | What runs there | " + " | ".join(f"{v}: % of peak" for v in PAIR.values()) +
             " | instructions, ours / FA4 |", "|---|---|--:|--:|--:|"]
    for pipe, what in PIPES.items():
        pct = [100 * counts[n][pipe] / counts[n]["cycles"] for n in PAIR]
        ratio = f"{ours[pipe] / theirs[pipe]:.2f}×" if theirs[pipe] else "—"
        lines.append(f"| {pipe} | {what} | {pct[0]:.1f} | {pct[1]:.1f} | {ratio} |")
    lines.append(f"| all | every instruction issued | | | {ours['all'] / theirs['all']:.2f}× |")
    return md("\n".join(lines) + "\n\nFrom `sm__inst_executed_pipe_*` and `sm__inst_executed` in both reports.")


# the chapter's report (the first version: all heads first, make_desc for every wgmma), the two steps' default
# (heads that fit half the L2, each descriptor made once per tile), FlashAttention-4's
ORDER = {"v8_backward": "first version", "v8_backward_l2order": "both steps", "fa4_backward": "FlashAttention-4"}
ORDER_ROWS = ("Profiled duration", "Tensor pipe", "DRAM bandwidth")


def order_table():
    """The reports before and after the two steps beside FlashAttention-4's: time, tensor pipe, DRAM bandwidth and
    instructions."""
    got, missing = summaries(ORDER)
    if got is None:
        return md(missing)
    rows = {n: {a: b for a, b, _ in ncu_tables.table_rows(s)} for n, s in got.items()}
    counts = {n: _pipe_counts(str(records.report_path(n, SHAPE["seq_len"]))) for n in ORDER}
    lines = ["| Metric | " + " | ".join(ORDER.values()) + " |", "|---|--:|--:|--:|"]
    lines += [f"| {m} | " + " | ".join(rows[n][m] for n in ORDER) + " |" for m in ORDER_ROWS]
    lines.append("| Instructions, over FlashAttention-4's | " + " | ".join(
        f"{counts[n]['all'] / counts['fa4_backward']['all']:.2f}×" for n in ORDER) + " |")
    return md("\n".join(lines) + f"\n\nbf16, B = 2, H = 16, M = N = 8192, D = 128, non-causal, on "
              f"{got['v8_backward']['device']}; durations under Nsight Compute, not the benchmark's.")


def step_log(name: str):
    """The table a `backward_hopper_live` step printed on the H200, from results/h200/logs/NAME."""
    text = (LOGS_DIR / name).read_text()
    kept = [ln for ln in text.splitlines() if ln.startswith("|") or ln.startswith("Measured now")]
    return md("\n".join(kept).replace("\nMeasured now", "\n\nMeasured"))


def log_text(name: str) -> str:
    """A log of results/h200/logs without its '#' command line (which the page's prose gives) and blank lines."""
    text = (LOGS_DIR / name).read_text()
    return "\n".join(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("# "))


# dV_j with dK_j (the two steps' report), before dP^T's wait (V8B_EARLY_DV=1, the default when it was profiled),
# FlashAttention-4's; at D=64, both kernels at (4, 12, 2048, 64) non-causal; the warp states that moved
DV = {"v8_backward_l2order": "dV_j with dK_j", "v8_backward_early_dv": "dV_j before dPᵀ's wait",
      "fa4_backward": "FlashAttention-4"}
D64 = {"v8_backward": "V8 backward (`flash_bwd_ws`)", "fa4_backward": "FlashAttention-4"}
D64_SHAPE = dict(batch_size=4, num_heads=12, seq_len=2048, head_dim=64)
STALLS = ("barrier", "short_scoreboard", "wait", "long_scoreboard")


def stall_table(names: dict, seq_len: int = SHAPE["seq_len"], metrics=ORDER_ROWS[:2], instructions: bool = False,
                stalls=STALLS):
    """Reports side by side: time, tensor pipe (or `metrics` of ncu_tables.table_rows), the executed instructions
    over the last report's (`instructions`), and the warp states that differ (cycles per issued instruction)."""
    got = {n: records.profile_summary(n, seq_len) for n in names}
    if any(v is None for v in got.values()):
        return md(f"*Not recorded here: {', '.join(str(records.report_path(n, seq_len).name) for n in names)} "
                  "(or `ncu_report` is not installed).*")
    rows = {n: {a: b for a, b, _ in ncu_tables.table_rows(s)} for n, s in got.items()}
    lines = ["| Metric | " + " | ".join(names.values()) + " |", "|---|" + "--:|" * len(names)]
    lines += [f"| {m} | " + " | ".join(rows[n][m] for n in names) + " |" for m in metrics]
    if instructions:
        counts = {n: _pipe_counts(str(records.report_path(n, seq_len)))["all"] for n in names}
        last = counts[list(names)[-1]]
        lines.append(f"| Instructions, over {list(names.values())[-1]}'s | " +
                     " | ".join(f"{counts[n] / last:.2f}×" for n in names) + " |")
    lines += [f"| stall: {r.replace('_', ' ')} | " + " | ".join(f"{got[n]['stalls'].get(r, 0.0):.2f}" for n in names) +
              " |" for r in stalls]
    lines.append("| all states, per issued instruction | " +
                 " | ".join(f"{got[n]['warp_cycles_per_issue']:.2f}" for n in names) + " |")
    shape = SHAPE if seq_len == SHAPE["seq_len"] else D64_SHAPE
    return md("\n".join(lines) + f"\n\nbf16, B = {shape['batch_size']}, H = {shape['num_heads']}, M = N = "
              f"{seq_len}, D = {shape['head_dim']}, non-causal, on {next(iter(got.values()))['device']}; "
              "durations under Nsight Compute; stalls in cycles per issued instruction.")


# V8B_BR80's step (the same command, both builds in one session at fadf861) beside FlashAttention-4's report
TILE = {"v8_backward_tile64": "B_r = 64 (V8B_BR80=0)", "v8_backward_tile80": "B_r = 80 (now the default)",
        "fa4_backward": "FlashAttention-4"}
TILE_STALLS = ("barrier", "mio_throttle", "short_scoreboard", "wait", "long_scoreboard")


def tile_table():
    """B_r = 64 and 80 at the chapter's shape, and FlashAttention-4: time, tensor pipe, shared-memory bank conflicts,
    instructions, and the warp states."""
    return stall_table(TILE, metrics=("Profiled duration", "Tensor pipe", "Shared-memory bank conflicts"),
                       instructions=True, stalls=TILE_STALLS)


def dv_table():
    """The build that issues dV_j before dP^T's wait beside the one that issues it with dK_j, and FA4's."""
    return stall_table(DV)


def d64_table():
    """Both main kernels at (4, 12, 2048, 64), where FlashAttention-4's backward is furthest ahead."""
    return stall_table(D64, D64_SHAPE["seq_len"])


def log_lines(paths=LOGS) -> str:
    """Each command of the committed logs (its '#' line, once), then pytest's summary and the tests it names as
    failed, with the hazards racecheck counted; for a run that stopped, the tests its progress lines show."""
    out, seen = [], set()
    for block in (b for path in paths for b in re.split(r"\n(?=# )", path.read_text().strip())):
        head, _, body = block.partition("\n")
        if head in seen:
            continue
        seen.add(head)
        summary = re.search(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", body, re.M)
        if summary is None:
            marks = "".join(re.sub(r"\[\s*\d+%\]", "", ln).strip() for ln in body.splitlines()
                            if re.fullmatch(r"[.FEsx]+\s*(\[\s*\d+%\])?", ln.strip()))
            said = f"no summary (the run stopped); progress marks: {marks.count('.')} passed, {marks.count('F')} failed"
        else:
            said = summary[1]
        named = dict.fromkeys([f"failed: {t}" for t in re.findall(r"^FAILED (\S+)", body, re.M)] + [
            f"racecheck's summary: {n} hazards" for n in re.findall(r"RACECHECK SUMMARY: (\d+) hazards", body)])
        out.append(f"{head.lstrip('# ')}\n    {said}" + "".join(f"\n    {t}" for t in named))
    return "\n".join(out)


def _log_rows(name: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """A CSV log of results/h200/logs whose '# name = value' lines hold a run's totals: (those totals, the rows)."""
    text = (LOGS_DIR / name).read_text().splitlines()
    totals = {k.strip("# ").strip(): v.strip() for k, eq, v in (ln.partition("=") for ln in text if ln.startswith("#"))
              if eq and " " not in k.strip("# ").strip()}
    return totals, list(csv.DictReader(ln for ln in text if not ln.startswith("#")))


def _count(cell: str) -> int:
    return int(cell.replace(",", ""))


def shared_wavefronts(name: str = "br80_shared_wavefronts_9ceb6de.csv"):
    """The taller tile's shared-memory instructions under SourceCounters (results/h200/logs/NAME, written from
    `ncu --page source --print-source sass`): per opcode, warp instructions, wavefronts, the ideal count and the
    excess, beside the l1tex bank-conflict counters of the same run (its '#' lines)."""
    sums, rows = _log_rows(name)
    columns = ("Instructions Executed", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal",
               "L1 Wavefronts Shared Excessive")
    by_op: dict[str, list[int]] = {}
    for row in rows:
        counts = by_op.setdefault(opcode(row["Source"]), [0] * len(columns))
        for k, col in enumerate(columns):
            counts[k] += _count(row[col])
    lines = ["| SASS opcode | warp instructions | shared wavefronts | ideal | excessive |", "|---|--:|--:|--:|--:|"]
    lines += [f"| `{op}` | {c[0]:,} | {c[1]:,} | {c[2]:,} | {c[3]:,} |" for op, c in by_op.items()]
    counters = "; ".join(f"`{k}` {v}" for k, v in sums.items())
    return md("\n".join(lines) + f"\n\nThe same run's l1tex counters: {counters}.")


def _step_samples(name: str) -> tuple[Counter, str]:
    """The step's warp-state samples of a stall log (step_stalls' span) by (opcode, reason), and the span."""
    _, rows = _log_rows(name)
    ops = [opcode(r["Source"]) for r in rows]
    first = next(i for i, op in enumerate(ops) if op.startswith("HGMMA"))
    last = max(i for i, op in enumerate(ops) if op.startswith("HGMMA"))
    end = next(i for i in range(last, len(ops)) if ops[i].startswith("SYNCS.ARRIVE"))
    reasons = [c for c in rows[0] if c.startswith("stall_")]
    got: Counter = Counter()
    for r, op in zip(rows[first:end + 1], ops[first:end + 1]):
        for c in reasons:
            got[op.split(".")[0], c.removeprefix("stall_")] += _count(r[c])
    return got, f"{rows[first]['Address']} to {rows[end]['Address']}"


def step_stalls(name: str = "br80_stalls_9ceb6de.csv", top: int = 8):
    """Where the consumers' warps wait in the default build (results/h200/logs/NAME, the warp-state samples per
    SASS instruction of the SourceCounters run, which lists the sampled ones): summed over the step, from its
    first sampled wgmma to the first mbarrier arrival after its last, by opcode and reason, the `top` largest
    with their share."""
    got, span = _step_samples(name)
    total = sum(got.values())
    lines = ["| opcode | waiting on | samples | of the step's |", "|---|---|--:|--:|"]
    for (op, why), n in got.most_common(top):
        lines.append(f"| `{op}` | {why.replace('_', ' ')} | {n:,} | {n / total:.1%} |")
    return md("\n".join(lines) + f"\n\n{total:,} samples in the step, {span} of the kernel.")


# V8B_ROW_PREFETCH under Nsight Compute: (shape, build) -> stall log, each pair profiled in one call
ROW_STALLS = {("(1, 8, 4096, 128)", "0 (loads after the waits)"): "rows0_stalls_a755b71.csv",
              ("(1, 8, 4096, 128)", "2 (among the wgmmas)"): "rows2_stalls_a755b71.csv",
              ("(4, 12, 2048, 64)", "0 (loads after the waits)"): "d64_rows0_stalls_357157b.csv",
              ("(4, 12, 2048, 64)", "3 (before the wgmmas)"): "d64_rows3_stalls_357157b.csv"}
# the (opcode, reason) pairs the row terms' loads move: their users, the loads, the tensor-core waits
ROW_REASONS = (("FFMA", "short_sb"), ("FADD", "short_sb"), ("LDS", "mio"), ("WARPGROUP", "barrier"),
               ("MUFU", "wait"))


def row_stalls(logs=ROW_STALLS, reasons=ROW_REASONS):
    """The step's samples per build of V8B_ROW_PREFETCH (step_stalls' span): all of them, and those of the
    opcodes and reasons the loads move."""
    lines = ["| shape, non-causal | V8B_ROW_PREFETCH | samples in the step | " +
             " | ".join(f"`{op}` {why.replace('_', ' ')}" for op, why in reasons) + " |",
             "|---|---|--:|" + "--:|" * len(reasons)]
    for (shape, build), name in logs.items():
        got, _ = _step_samples(name)
        lines.append(f"| {shape} | {build} | {sum(got.values()):,} | " +
                     " | ".join(f"{got[r]:,}" for r in reasons) + " |")
    return md("\n".join(lines))
