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
CLI: `python -m flashattn.measure.ncu REPORT...` prints each report's table as markdown (flashattn.measure.ncu_tables).
The pages ncu prints for a report (details, raw, source) are read by flashattn.measure.ncu_pages.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from flashattn.measure.ncu_tables import markdown_table, stall_table

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
    import ncu_report  # Nsight Compute's own module: optional, and only the report readers need it
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


def instructions_by_opcode(action) -> dict[str, int]:
    """Warp instructions executed per SASS opcode (the InstructionStats section), largest first."""
    m = action.metric_by_name("sass__inst_executed_per_opcode")
    if m is None:
        return {}
    ids = m.correlation_ids()
    counts = {ids.as_string(i): m.as_uint64(i) for i in range(m.num_instances())}
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def instructions_by_line(action) -> dict[int, int]:
    """Warp instructions executed per line of the kernel's source (the SourceCounters section's count per
    PC, attributed through the line table the build's -lineinfo keeps), largest first; {} without it."""
    m = action.metric_by_name("inst_executed")
    if m is None:
        return {}
    ids, counts = m.correlation_ids(), {}
    for i in range(m.num_instances()):
        info = action.source_info(ids.as_uint64(i))
        line = info.line() if info else 0
        counts[line] = counts.get(line, 0) + m.as_uint64(i)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
