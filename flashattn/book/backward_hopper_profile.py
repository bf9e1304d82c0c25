"""The Hopper backward's Nsight Compute report beside FlashAttention-4's, for "The backward on Hopper":
`python -m flashattn.measure.profile v8_backward -B 2 -H 16 -D 128 --seq-len 8192 --out results/h200` and the
same with `fa4_backward` record each main kernel (the one that accumulates dK and dV) in its own gradient call
at the shape where the two are furthest apart. Both tables read the committed reports only.
"""
from __future__ import annotations

from flashattn.book import records
from flashattn.book.notebook import md
from flashattn.measure import ncu_tables

SHAPE = dict(batch_size=2, num_heads=16, seq_len=8192, head_dim=128)
PAIR = {"v8_backward": "V8 backward (`flash_bwd_ws`)", "fa4_backward": "FlashAttention-4"}
# the rows of ncu_tables.table_rows that differ between two tensor-core kernels at one shape
ROWS = ("Profiled duration", "Tensor-core throughput", "Tensor pipe", "DRAM bandwidth", "Occupancy", "Registers",
        "Shared memory")
COMMAND = ("`python -m flashattn.measure.profile {name} -B 2 -H 16 -D 128 --seq-len 8192 --out results/h200`")


def summaries() -> tuple[dict | None, str | None]:
    """({name: flashattn.measure.ncu summary} of both reports, None) or (None, the sentence to show instead)."""
    got = {}
    for name in PAIR:
        path = records.report_path(name, SHAPE["seq_len"])
        if not path.exists():
            return None, f"*Not recorded yet: `results/h200/{path.name}` ({COMMAND.format(name=name)}).*"
        got[name] = records.profile_summary(name, SHAPE["seq_len"])
        if got[name] is None:
            return None, "*The reports are there but `ncu_report` is not installed (`pip install ncu-report`).*"
    return got, None


def _cell(value: str, note: str) -> str:
    return value if note in ("—", "") else f"{value} ({note})"


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
    kernels = "; ".join(f"{PAIR[n]}: `{s['kernel'].split('(')[0][:60]}`" for n, s in got.items())
    return md("\n".join(lines) + f"\n\nbf16, B = 2, H = 16, M = N = 8192, D = 128, non-causal, on "
              f"{got['v8_backward']['device']}; {kernels}.")


def stall_pair(top: int = 6):
    """The warp states that take the most cycles in either kernel, cycles per issued instruction in each."""
    got, missing = summaries()
    if got is None:
        return md(missing)
    reasons = list(dict.fromkeys(r for s in got.values() for r, *_ in ncu_tables.stall_rows(s, top)))
    lines = ["| Warp state | " + " | ".join(PAIR.values()) + " | Waiting for |", "|---|--:|--:|---|"]
    for r in reasons:
        cells = [f"{got[n]['stalls'].get(r, 0.0):.2f}" for n in PAIR]
        lines.append(f"| {r.replace('_', ' ')} | " + " | ".join(cells) + f" | {ncu_tables.STALL_MEANING.get(r, '')} |")
    per_issue = [f"{got[n]['warp_cycles_per_issue']:.2f}" if got[n].get("warp_cycles_per_issue") else "—"
                 for n in PAIR]
    return md("\n".join(lines) + "\n\nCycles per issued instruction, by the state a warp was in; all states "
              f"together: {' and '.join(per_issue)}.")
