"""Read Nsight Compute reports (.ncu-rep) into the book's per-version profile table.

Reports are parsed with NVIDIA's `ncu_report` module (PyPI `ncu-report`), which needs neither a GPU nor
ncu. Every figure is computed from the report's own metrics the way ncu computes it, so it equals what
`ncu --import REPORT --page details` (or `--page raw`) prints; tests/test_ncu.py checks that against the
pages saved next to each committed report by `flashattn.measure.profile`.

Metrics, as Nsight Compute's section files use them (sections/*.section of ncu 2025.x):

* Roofline, from SpeedOfLight_RooflineChart.section ("Single Precision Roofline" and "Single Precision
  Achieved Value"):
  - achieved FP32 FLOP/s = (smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed
      + smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed
      + 2 * smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed)
      * smsp__cycles_elapsed.avg.per_second
  - FP32 peak FLOP/s = 2 * sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained
      * sm__cycles_elapsed.avg.per_second
  - DRAM bandwidth = dram__bytes.sum.per_second; DRAM peak = dram__bytes.sum.peak_sustained
      * dram__cycles_elapsed.avg.per_second
  - arithmetic intensity = achieved FLOP/s / DRAM bandwidth (FLOP per DRAM byte)
* Tensor cores, from SpeedOfLight_HierarchicalTensorRooflineChart.section: per data path,
  sm__ops_path_tensor_<path>.sum.per_cycle_elapsed (achieved) and .sum.peak_sustained (peak), both times
  sm__cycles_elapsed.avg.per_second; the busiest path present in the report is used. Pipe utilisation
  from ComputeWorkloadAnalysis.section: sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  ("Tensor (FP)"; falls back to sm__pipe_tensor_cycles_active, "Tensor (All)").
* SpeedOfLight.section: Duration gpu__time_duration.sum; DRAM Throughput
  gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed.
* Occupancy.section: Theoretical Occupancy sm__maximum_warps_per_active_cycle_pct; Achieved Occupancy
  sm__warps_active.avg.pct_of_peak_sustained_active; Block Limit Registers / Shared Mem / Warps / SM /
  Barriers launch__occupancy_limit_{registers,shared_mem,warps,blocks,barriers}.
* WarpStateStats.section: Warp Cycles Per Issued Instruction
  smsp__average_warp_latency_per_inst_issued.ratio, and per stall reason R
  smsp__average_warps_issue_stalled_R_per_issue_active.ratio: the cycles a warp spends in state R per
  instruction issued, so the reasons add up to the warp cycles per issued instruction ("selected", the
  issuing cycle itself, is one of them). ComputeWorkloadAnalysis.section: Issued Ipc Active
  sm__inst_issued.avg.per_cycle_active (instructions per active cycle per SM, at most 4).
* LaunchStatistics.section: Registers Per Thread launch__registers_per_thread; Dynamic / Static / Driver
  Shared Memory Per Block launch__shared_mem_per_block_{dynamic,static,driver}; Block Size
  launch__block_size; Grid Size launch__grid_size.

All values are returned in base SI units (seconds, bytes, FLOP/s, %), whatever unit the report stores.
CLI: `python -m flashattn.measure.ncu REPORT...` prints each report's table as markdown.
"""
from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

# summary field -> (details-page label, raw metric name)
FIELDS = {
    "duration_s": ("Duration", "gpu__time_duration.sum"),
    "dram_throughput_pct": ("DRAM Throughput", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    "theoretical_occupancy_pct": ("Theoretical Occupancy", "sm__maximum_warps_per_active_cycle_pct"),
    "achieved_occupancy_pct": ("Achieved Occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    "registers_per_thread": ("Registers Per Thread", "launch__registers_per_thread"),
    "shared_dynamic_bytes": ("Dynamic Shared Memory Per Block", "launch__shared_mem_per_block_dynamic"),
    "shared_static_bytes": ("Static Shared Memory Per Block", "launch__shared_mem_per_block_static"),
    "shared_driver_bytes": ("Driver Shared Memory Per Block", "launch__shared_mem_per_block_driver"),
    "block_size": ("Block Size", "launch__block_size"),
    "grid_size": ("Grid Size", "launch__grid_size"),
    "warp_cycles_per_issue": ("Warp Cycles Per Issued Instruction",
                              "smsp__average_warp_latency_per_inst_issued.ratio"),
    "issued_ipc": ("Issued Ipc Active", "sm__inst_issued.avg.per_cycle_active"),
}
BLOCK_LIMITS = {   # limiter -> (details-page label, metric)
    "registers": ("Block Limit Registers", "launch__occupancy_limit_registers"),
    "shared memory": ("Block Limit Shared Mem", "launch__occupancy_limit_shared_mem"),
    "warps": ("Block Limit Warps", "launch__occupancy_limit_warps"),
    "blocks per SM": ("Block Limit SM", "launch__occupancy_limit_blocks"),
    "barriers": ("Block Limit Barriers", "launch__occupancy_limit_barriers"),
}
FADD = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed"
FMUL = "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed"
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed"
SMSP_HZ = "smsp__cycles_elapsed.avg.per_second"
SM_HZ = "sm__cycles_elapsed.avg.per_second"
FFMA_PEAK = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained"
DRAM_BW = "dram__bytes.sum.per_second"
DRAM_PEAK = "dram__bytes.sum.peak_sustained"
DRAM_HZ = "dram__cycles_elapsed.avg.per_second"
TENSOR_PIPE = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active")
TENSOR_PATH = re.compile(r"^sm__ops_path_tensor_(\w+)\.sum\.per_cycle_elapsed$")
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
STALL_MEANING = {   # what a warp in each state is waiting for (Kernel Profiling Guide, in our words)
    "wait": "a fixed-latency dependency: the result of a recent math instruction (mma, FFMA) is not ready",
    "short_scoreboard": "an MIO result: a shared-memory load (ldmatrix, ld.shared), a shuffle or an exp2",
    "long_scoreboard": "a global- or local-memory load",
    "math_pipe_throttle": "its math pipe (tensor or FMA) is still busy with earlier instructions",
    "not_selected": "nothing: it was ready, but the scheduler issued another warp's instruction",
    "selected": "nothing: this is the cycle it issues (one per instruction)",
    "dispatch_stall": "chosen, but the dispatch stage could not send the instruction on this cycle",
    "barrier": "the block's other warps at __syncthreads",
    "mio_throttle": "room in the queue to shared memory, shuffles and special functions",
    "lg_throttle": "room in the queue for global- and local-memory instructions",
    "no_instruction": "its next instruction to be fetched (instruction-cache miss, or just after a branch)",
    "branch_resolving": "a branch target to be computed",
    "drain": "its memory stores to drain before it exits",
    "membar": "a memory fence",
    "imc_miss": "a constant-cache miss",
}
# Shared memory, collected by flashattn.measure.profile with --metrics on top of the sections (reports recorded
# before that lack them: None). A bank conflict is an extra wavefront: a warp's shared-memory request
# that needs k passes through the 32 banks counts k wavefronts and k - 1 conflicts. ldmatrix is a
# shared load of the LSU pipe, so its wavefronts and conflicts are inside the _op_ld counters.
SHARED = {
    "bank_conflicts_ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "bank_conflicts_st": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "shared_wavefronts_ld": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "shared_wavefronts_st": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
}
# The per-step counters of `python -m flashattn.measure.sweep KEY-steps --metrics`, beside the stall ratios of
# WarpStateStats (STALL). OPTIONAL ones are dropped (and the run repeated) if this ncu does not know them.
STEP_METRICS = {
    **SHARED,
    "inst_executed": "smsp__inst_executed.sum",
    "shared_ld_inst": "smsp__inst_executed_op_shared_ld.sum",
    "shared_st_inst": "smsp__inst_executed_op_shared_st.sum",
    "ldsm_inst": "smsp__inst_executed_op_ldsm.sum",
    "achieved_occupancy_pct": FIELDS["achieved_occupancy_pct"][1],
    "duration_s": FIELDS["duration_s"][1],
}
OPTIONAL_METRICS = ("shared_ld_inst", "shared_st_inst", "ldsm_inst")
RAW_METRICS = ([m for _, m in FIELDS.values()] + [m for _, m in BLOCK_LIMITS.values()]
               + [FADD, FMUL, FFMA, SMSP_HZ, SM_HZ, FFMA_PEAK, DRAM_BW, DRAM_PEAK, DRAM_HZ, *TENSOR_PIPE]
               + list(SHARED.values()))

# ------------------------------------------------------------------------------------------ units
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_BASE = {"second", "byte", "cycle", "hz", "inst", "warp", "thread", "block", "register", "sector", "request",
         "wavefront", "transaction", "flop", "op", "pass", "bit"}


_ABBREV = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
           "Hz": 1.0, "KHz": 1e3, "kHz": 1e3, "MHz": 1e6, "GHz": 1e9}


def _token_scale(token: str) -> float:
    t = token.strip()
    if t.lower() in _BASE or not t:
        return 1.0
    if t in _ABBREV:
        return _ABBREV[t]
    for p in sorted(_PREFIX, key=len, reverse=True):
        if t.startswith(p) and t[len(p):].lower() in _BASE:
            return _PREFIX[p]
    return 1.0                                     # '%', 'register/thread', unknown: already base


def unit_scale(unit: str | None) -> float:
    """Factor taking a value in `unit` (e.g. 'usecond', 'Gbyte/second', 'cycle/nsecond') to base units."""
    if not unit:
        return 1.0
    num, _, den = unit.partition("/")
    return _token_scale(num) / (_token_scale(den) if den else 1.0)


def parse_number(text: str) -> float | None:
    """A number as ncu prints it ('1,234.5', '3.2e+09', 'n/a' -> None)."""
    t = text.strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def printed_resolution(text: str) -> float:
    """Half a unit in the last printed digit of `text` (how far a printed value may be from the true one)."""
    t = text.strip().replace(",", "")
    mant, _, exp = t.lower().partition("e")
    decimals = len(mant.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exp) if exp else 0))


def equals_printed(value: float, text: str, unit: str | None = None) -> bool:
    """True when `value` (base units) rounds to what ncu printed as `text` in `unit`."""
    printed = parse_number(text)
    if printed is None or value is None:
        return False
    scale = unit_scale(unit)
    slack = printed_resolution(text) * 1.0001 + 1e-9 * abs(printed)
    return abs(value / scale - printed) <= slack


# ---------------------------------------------------------------------------------------- reports
def load_action(path, kernel: str | None = None):
    """The profiled kernel launch of a report (the first one, or the first whose name contains `kernel`)."""
    import ncu_report
    ctx = ncu_report.load_report(str(path))
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            if kernel is None or kernel in action.name():
                return action
    raise ValueError(f"{path}: no profiled kernel{' matching ' + kernel if kernel else ''}")


def metric(action, name: str):
    """A metric's value in base units; None when the report lacks it. Strings stay strings."""
    try:
        m = action.metric_by_name(name)
    except (KeyError, ValueError, RuntimeError):
        return None
    if m is None:
        return None
    value = m.value()
    if isinstance(value, (int, float)):
        return value * unit_scale(m.unit())
    return value


def _f(action, name):
    v = metric(action, name)
    return float(v) if isinstance(v, (int, float)) else None


def summarize(path, kernel: str | None = None) -> dict:
    """The per-version profile table of one report, in base units (see the module docstring)."""
    action = load_action(path, kernel)
    s = {"report": Path(path).name, "kernel": action.name(),
         "device": metric(action, "device__attribute_display_name")}
    for field, (_, name) in FIELDS.items():
        s[field] = _f(action, name)

    fadd, fmul, ffma, smsp_hz = (_f(action, n) for n in (FADD, FMUL, FFMA, SMSP_HZ))
    sm_hz, ffma_peak = _f(action, SM_HZ), _f(action, FFMA_PEAK)
    s["sm_frequency_hz"] = sm_hz
    s["fp32_flops_per_s"] = ((fadd or 0) + (fmul or 0) + 2 * (ffma or 0)) * smsp_hz if smsp_hz else None
    s["fp32_peak_flops_per_s"] = 2 * ffma_peak * sm_hz if ffma_peak and sm_hz else None
    dram_peak, dram_hz = _f(action, DRAM_PEAK), _f(action, DRAM_HZ)
    s["dram_bytes_per_s"] = _f(action, DRAM_BW)
    s["dram_peak_bytes_per_s"] = dram_peak * dram_hz if dram_peak and dram_hz else None

    s.update(tensor_path=None, tensor_ops_per_s=None, tensor_peak_ops_per_s=None)
    best = 0.0
    for name in action.metric_names():
        match = TENSOR_PATH.match(name)
        if not match or not sm_hz:
            continue
        achieved = _f(action, name)
        peak = _f(action, f"sm__ops_path_tensor_{match.group(1)}.sum.peak_sustained")
        if achieved and peak and achieved > best:
            best = achieved
            s.update(tensor_path=match.group(1), tensor_ops_per_s=achieved * sm_hz,
                     tensor_peak_ops_per_s=peak * sm_hz)
    # the largest: mma.sync (v6) shows on both the hmma and the whole-pipe counter, wgmma (v7) only on
    # the whole-pipe one, with the hmma counter at 0
    pipes = [v for v in (_f(action, n) for n in TENSOR_PIPE) if v is not None]
    s["tensor_pipe_pct"] = max(pipes) if pipes else None

    work = (s["fp32_flops_per_s"] or 0) + (s["tensor_ops_per_s"] or 0)
    bw = s["dram_bytes_per_s"]
    s["work_per_s"] = work
    s["fp32_pct_of_peak"] = (100 * s["fp32_flops_per_s"] / s["fp32_peak_flops_per_s"]
                             if s["fp32_flops_per_s"] is not None and s["fp32_peak_flops_per_s"] else None)
    s["tensor_pct_of_peak"] = (100 * s["tensor_ops_per_s"] / s["tensor_peak_ops_per_s"]
                               if s["tensor_ops_per_s"] else None)
    s["fp32_intensity"] = s["fp32_flops_per_s"] / bw if bw and s["fp32_flops_per_s"] is not None else None
    s["arithmetic_intensity"] = work / bw if bw else None
    s["fp32_ridge"] = (s["fp32_peak_flops_per_s"] / s["dram_peak_bytes_per_s"]
                       if s["fp32_peak_flops_per_s"] and s["dram_peak_bytes_per_s"] else None)

    limits = {k: _f(action, m) for k, (_, m) in BLOCK_LIMITS.items()}
    limits = {k: v for k, v in limits.items() if v is not None}
    s["block_limits"] = limits
    s["blocks_per_sm"] = min(limits.values()) if limits else None
    s["limited_by"] = [k for k, v in limits.items() if v == s["blocks_per_sm"]]
    parts = [s[k] for k in ("shared_dynamic_bytes", "shared_static_bytes", "shared_driver_bytes")]
    s["shared_total_bytes"] = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    s["stalls"] = stalls(action)
    s.update({k: _f(action, m) for k, m in SHARED.items()})
    return s


def stalls(action) -> dict[str, float]:
    """Stall reason -> warp cycles in that state per issued instruction, largest first; {} when the
    report has no WarpStateStats section."""
    found = {}
    for name in action.metric_names():
        match = STALL.match(name)
        value = _f(action, name) if match else None
        if value:
            found[match.group(1)] = value
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


# ------------------------------------------------------------------------------- ncu's own exports
def read_details_csv(path) -> dict[str, tuple[str, str]]:
    """`ncu --import R --page details --csv --print-units base`: label -> (printed value, unit), first
    kernel, first occurrence of each label."""
    out = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(_skip_preamble(fh)):
            label = row.get("Metric Name")
            if label and label not in out:
                out[label] = (row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return out


def raw_values(raw: dict[str, tuple[str, str]], names: dict[str, str]) -> tuple[dict, dict]:
    """From a raw page (read_raw_csv): ({key: value in base units or None} for names {key: metric},
    {stall reason: cycles per issued instruction}, largest first)."""
    def value(name):
        text, unit = raw.get(name, ("", ""))
        x = parse_number(text)
        return None if x is None else x * unit_scale(unit)
    found = {k: value(m) for k, m in names.items()}
    stall = {m.group(1): value(n) for n in raw if (m := STALL.match(n))}
    return found, dict(sorted(((k, v) for k, v in stall.items() if v), key=lambda kv: -kv[1]))


def read_raw_csv(path) -> dict[str, tuple[str, str]]:
    """`ncu --import R --page raw --csv --print-units base`: metric -> (printed value, unit), first kernel.
    The file has a header row of metric names, a row of units, then one row per kernel."""
    return read_raw_rows(path)[0]


def read_raw_rows(path) -> list[dict[str, tuple[str, str]]]:
    """Every kernel of a raw page (see read_raw_csv), in the report's order."""
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(_skip_preamble(fh)) if r]
    names, units = rows[0], rows[1]
    return [{n: (v, u) for n, u, v in zip(names, units, values)} for values in rows[2:] if len(values) == len(names)]


def _skip_preamble(fh):
    """ncu may print '==PROF==' or warning lines before the CSV; start at the first quoted line."""
    lines = fh.read().splitlines()
    first = next((i for i, l in enumerate(lines) if l.startswith('"')), 0)
    return lines[first:]


# ------------------------------------------------------------------ the source page, per SASS instruction
# `ncu --import R --page source --csv --print-source sass` of a report with the SourceCounters section: per
# kernel a line `"Kernel Name","<name>"`, then a CSV table with one row per SASS instruction (Address,
# Source, warp stall samples in all and per reason: stall_long_sb, stall_wait, ...).
SOURCE_COLUMNS = ("Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_short_sb",
                  "stall_wait", "stall_math", "stall_mio", "stall_barrier", "stall_lg")


def split_source_page(text: str) -> dict[str, list[dict[str, str]]]:
    """The source page of several kernels -> {kernel name: its rows, as dicts keyed by column}."""
    pages, name, block = {}, None, []

    def close():
        if name is not None and block:
            rows = list(csv.reader(block))
            pages[name] = [dict(zip(rows[0], r)) for r in rows[1:] if len(r) == len(rows[0])]

    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            close()
            name, block = next(csv.reader([line]))[1], []
        elif name is not None and line.strip():
            block.append(line)
    close()
    return pages


def write_source_rows(pages: dict[str, list[dict]], path, labels=None, columns=SOURCE_COLUMNS) -> None:
    """The columns of `columns` of every kernel's rows, one CSV with the kernel first: its label from
    `labels` (in the page's order) or its full name (the whole page is megabytes; these are what the book
    reads)."""
    names = list(labels) if labels is not None else list(pages)
    if len(names) != len(pages):
        raise ValueError(f"{len(names)} labels for {len(pages)} kernels")
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(("Kernel Name", *columns))
        for name, rows in zip(names, pages.values()):
            out.writerows((name, *(r.get(c, "") for c in columns)) for r in rows)


def read_source_rows(path) -> dict[str, list[dict[str, str]]]:
    """write_source_rows' file back: {kernel name: rows}, in the file's order."""
    pages: dict[str, list[dict[str, str]]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            pages.setdefault(r.pop("Kernel Name"), []).append(r)
    return pages


_REG = re.compile(r"\bR(\d+)(\.64)?\b")
_MEMORY_OPS = ("LDG", "STG", "RED", "ATOM")   # opcode prefixes: LDGSTS, REDG, ATOMG, ... too


def _registers(operands: str) -> set[int]:
    """Register numbers an operand list names (R12.64 is R12 and R13)."""
    regs = set()
    for n, wide in _REG.findall(operands):
        regs.update((int(n), int(n) + 1) if wide else (int(n),))
    return regs


def _split(sass: str) -> tuple[str, str, str]:
    """'@P0 IMAD.X R76, RZ, RZ, R66, P0' -> ('IMAD', 'R76', ' RZ, R66, P0'): opcode, first operand, rest."""
    text = sass.strip()
    if text.startswith("@"):
        text = text.split(None, 1)[1] if " " in text else ""
    op, _, operands = text.partition(" ")
    first, _, rest = operands.partition(",")
    return op.split(".")[0], first.strip(), rest


def register_waits(rows: list[dict[str, str]], column: str = "stall_long_sb", top: int = 3,
                   window: int = 64) -> list[dict]:
    """The `top` instructions with the most samples in `column`, each with the nearest earlier global-memory
    instruction (LDG, STG, RED, ATOM, LDGSTS) that reads a register this one overwrites, or None. A warp may
    not overwrite a register that a memory instruction still has to read; the wait for that shows up as
    long scoreboard on the instruction that overwrites it. "Earlier" looks back `window` instructions in
    address order and wraps around the end, for an instruction at the top of a loop whose memory
    instructions sit at its bottom ("wrapped": True)."""
    def samples(r):
        return float(r.get(column) or 0)

    found = []
    for i in sorted(range(len(rows)), key=lambda i: -samples(rows[i]))[:top]:
        op, dst, _ = _split(rows[i]["Source"])
        written = _registers(dst) if not op.startswith(_MEMORY_OPS) else set()
        culprit = None
        for step in range(1, min(window, len(rows))):
            j = (i - step) % len(rows)
            jop, jfirst, jrest = _split(rows[j]["Source"])
            if jop.startswith(_MEMORY_OPS) and written & _registers(jfirst + "," + jrest):
                culprit = {"source": rows[j]["Source"].strip(), "distance": step, "wrapped": j > i}
                break
        found.append({"source": rows[i]["Source"].strip(), "samples": samples(rows[i]), "waits_for": culprit})
    return found


def compare_with_exports(summary: dict, details: dict | None = None, raw: dict | None = None,
                         action=None) -> list[str]:
    """Mismatches between our parsed values and ncu's printed pages (empty list: all equal)."""
    problems = []
    for field, (label, _) in FIELDS.items():
        if details and label in details and summary.get(field) is not None:
            text, unit = details[label]
            if parse_number(text) is not None and not equals_printed(summary[field], text, unit):
                problems.append(f"{field}: parsed {summary[field]!r}, details page prints {text} {unit}")
    for key, (label, _) in BLOCK_LIMITS.items():
        if details and label in details and key in summary["block_limits"]:
            text, unit = details[label]
            if not equals_printed(summary["block_limits"][key], text, unit):
                problems.append(f"block limit {key}: parsed {summary['block_limits'][key]}, details prints {text}")
    if raw and action is not None:
        for name in RAW_METRICS + [n for n in action.metric_names() if STALL.match(n)]:
            value = _f(action, name)
            if name in raw and value is not None and parse_number(raw[name][0]) is not None:
                text, unit = raw[name]
                if not equals_printed(value, text, unit):
                    problems.append(f"{name}: parsed {value!r}, raw page prints {text} {unit}")
    return problems


# ---------------------------------------------------------------------------------------- tables
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


def version_of(report_name: str) -> str:
    """'flash_v4_s2048_profile.ncu-rep' -> 'v4'."""
    m = re.match(r"flash_(\w+?)_s\d+_profile", Path(report_name).name)
    return m.group(1) if m else Path(report_name).stem


def main(argv=None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths or paths[0] in ("-h", "--help"):
        print("usage: python -m flashattn.measure.ncu REPORT.ncu-rep [...]   (prints each report's table)")
        return 0 if paths else 2
    for p in paths:
        s = summarize(p)
        print(f"\n### {version_of(p)}: `{s['kernel']}` on {s['device']}\n")
        print(markdown_table(s))
        if s["stalls"]:
            print("\n" + stall_table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
