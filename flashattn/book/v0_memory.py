"""V0's memory traffic as Nsight Compute measured it, beside what its thread mapping predicts.

`python -m flashattn.book.kernel_times --out results/h200 --ncu` runs `run_ncu` on the H200: V0's three kernels
of one forward at the primary shape, global-load sectors per request, L1 hit rate, L2 and DRAM bytes and the
stall ratios, written to results/h200/v0_memory.raw.csv (the evidence for the uncoalesced key reads of
`scores_kernel`). The readers (`ncu_table`, `pace_table`, `ncu_sentence`) only read that committed file.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from flashattn.book.notebook import PRIMARY, md
from flashattn.measure.ncu import parse_number, unit_scale
from flashattn.measure.ncu_pages import read_raw_rows
from flashattn.measure.profile import MISSING_NCU, find_ncu
from flashattn.measure.results import H200

NCU_METRICS = ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
               "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
               "l1tex__t_sector_hit_rate.pct", "lts__t_bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "gpu__time_duration.sum")
# Which unit sets the pace: each level's throughput as a share of its peak, and where warps wait (cycles per
# issued instruction in each stall state, the WarpStateStats ratios), all names this ncu records in
# every profile of results/h200 (*.raw.csv).
PACE_METRICS = {"L1 throughput": "l1tex__throughput.avg.pct_of_peak_sustained_active",
                "L2 throughput": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
                "DRAM throughput": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                "warp cycles per instruction": "smsp__average_warp_latency_per_inst_issued.ratio",
                "stall: global-load queue full (lg_throttle)":
                    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
                "stall: waiting for a load (long_scoreboard)":
                    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
                "stall: MIO queue full (mio_throttle)":
                    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
                "stall: MIO result (short_scoreboard)":
                    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"}
NCU_FILE = "v0_memory.raw.csv"

MISSING = ("*Not recorded yet: `python -m flashattn.book.kernel_times --out results/h200 --ncu` on the H200 writes "
           f"`results/h200/{NCU_FILE}`, and this cell shows it once that run is committed.*")


NCU_TARGET = ("import torch, flashattn\n"
              "q, k, v = (torch.randn({B}, {H}, {L}, {D}, device='cuda') for _ in range(3))\n"
              "for _ in range(2): flashattn.forward(q, k, v, version='v0')\n"
              "torch.cuda.synchronize()\n")


def run_ncu(out: Path, L: int = 2048) -> Path:
    """V0's three kernels of the second forward at B, H, L, D under Nsight Compute, NCU_METRICS only; the
    raw page in base units is written to out/NCU_FILE (with the report beside it)."""
    ncu = find_ncu()
    if ncu is None:
        raise SystemExit(MISSING_NCU)
    rep = out / NCU_FILE.replace(".raw.csv", ".ncu-rep")
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "v0_target.py"
        target.write_text(NCU_TARGET.format(L=L, B=PRIMARY["B"], H=PRIMARY["H"], D=PRIMARY["D"]))
        subprocess.run([ncu, "--kernel-name", "regex:scores_kernel|softmax_kernel|pv_kernel", "--launch-skip", "3",
                        "--launch-count", "3", "--clock-control", "none", "--metrics",
                        ",".join(NCU_METRICS + tuple(PACE_METRICS.values())),
                        "-f", "-o", str(rep.with_suffix("")), sys.executable, str(target)], check=True)
    raw = subprocess.run([ncu, "--import", str(rep), "--page", "raw", "--csv", "--print-units", "base"],
                         check=True, capture_output=True, text=True).stdout
    (out / NCU_FILE).write_text(raw)
    return out / NCU_FILE


def read_ncu_rows(path: Path) -> list[dict]:
    """Each kernel's row of an `ncu --page raw --csv --print-units base` file: {column: value}, the
    metrics as floats in base units (seconds, bytes; the second row of the file gives each unit)."""
    metrics = NCU_METRICS + tuple(PACE_METRICS.values())
    return [{k: (parse_number(v) * unit_scale(u) if k in metrics and parse_number(v) is not None else v)
             for k, (v, u) in row.items()} for row in read_raw_rows(path)]


def expected_sectors(kernel: str, D: int = 64, N: int = 2048) -> dict[str, float]:
    """Sectors (32 bytes) one warp-wide global load or store touches, worked out from kernels/v0.cu's
    thread mapping for a full warp: lane = 16 * y + x of the 16 x 16 block (scores, PV), or 32 lanes
    along a row (softmax). Loads are averaged over the kernel's load instructions."""
    lanes = [(lane % 16, lane // 16) for lane in range(32)]

    def sectors(addresses):                        # float index -> byte address -> 32-byte sector
        return len({4 * a // 32 for a in addresses})
    if kernel == "scores_kernel":                  # q[d] of row i = y, k[d] of row j = x, at d = 0
        loads = [sectors(y * D for x, y in lanes), sectors(x * D for x, y in lanes)]
        store = sectors(y * N + x for x, y in lanes)
    elif kernel == "pv_kernel":                    # p[j] of row i = y; v[j * D + d] with d = x
        loads = [sectors(y * N for x, y in lanes), sectors(x for x, y in lanes)]
        store = sectors(y * D + x for x, y in lanes)
    elif kernel == "softmax_kernel":               # lane j of one row
        loads = [sectors(range(32))]
        store = sectors(range(32))
    else:
        raise ValueError(f"kernel must be one of V0's three kernels, got {kernel!r}")
    return {"load": sum(loads) / len(loads), "store": store}


def ncu_rows(path: Path | None = None) -> list[dict]:
    """V0's kernels as Nsight Compute measured them (results/h200/v0_memory.raw.csv), [] when absent."""
    path = path or H200 / NCU_FILE
    if not path.exists():
        return []
    out = []
    for r in read_ncu_rows(path):
        name = next((k for k in ("scores_kernel", "softmax_kernel", "pv_kernel") if k in r.get("Kernel Name", "")),
                    None)
        if name is None:
            continue
        ld = r[NCU_METRICS[0]] / r[NCU_METRICS[1]] if r[NCU_METRICS[1]] else None
        st = r[NCU_METRICS[2]] / r[NCU_METRICS[3]] if r[NCU_METRICS[3]] else None
        out.append(dict(kernel=name, load_sectors_per_request=ld, store_sectors_per_request=st,
                        l1_load_bytes=32 * r[NCU_METRICS[0]],
                        l1_hit_pct=r["l1tex__t_sector_hit_rate.pct"], l2_bytes=r["lts__t_bytes.sum"],
                        dram_read=r["dram__bytes_read.sum"], dram_write=r["dram__bytes_write.sum"],
                        time_s=r["gpu__time_duration.sum"],
                        pace={k: r.get(m) for k, m in PACE_METRICS.items() if isinstance(r.get(m), float)}))
    return out


def pace_table():
    """Throughput of each memory level as a share of its peak and the main stall ratios, per V0 kernel
    (Markdown); the rows a recorded file lacks are left out."""
    rows = ncu_rows()
    names = [k for k in PACE_METRICS if any(k in r["pace"] for r in rows)]
    if not names:
        return md(MISSING)
    lines = ["| | " + " | ".join(f"`{r['kernel']}`" for r in rows) + " |", "|---|" + "--:|" * len(rows)]
    for k in names:
        unit = "%" if "throughput" in k else ""
        lines.append(f"| {k} | " + " | ".join("—" if k not in r["pace"] else f"{r['pace'][k]:,.1f}{unit}"
                                              for r in rows) + " |")
    return md("\n".join(lines) + "\n\nSame Nsight Compute run (`results/h200/v0_memory.raw.csv`). Throughputs are "
              "shares of each unit's peak; stall rows are cycles per issued instruction that a warp spends in that "
              "state (they add up, with the states not shown, to the warp cycles per instruction).")


def ncu_table():
    """Global-memory access per V0 kernel at the primary shape: sectors per request as measured and as the
    thread mapping predicts, L1 hit rate, L2 and DRAM bytes (Markdown)."""
    rows = ncu_rows()
    if not rows:
        return md(MISSING)
    lines = ["| kernel | load sectors / request (measured) | expected from the mapping | store sectors / request "
             "| global-load sectors through L1 | L1 hit rate | L2 traffic | DRAM read | DRAM written | duration µs |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        exp = expected_sectors(r["kernel"])
        lines.append(f"| `{r['kernel']}` | {r['load_sectors_per_request']:.2f} | {exp['load']:.1f} | "
                     f"{r['store_sectors_per_request']:.2f} | {r['l1_load_bytes'] / 1e9:,.1f} GB | "
                     f"{r['l1_hit_pct']:.1f}% | {r['l2_bytes'] / 1e9:,.2f} GB | "
                     f"{r['dram_read'] / 1e9:,.2f} GB | {r['dram_write'] / 1e9:,.2f} GB | {r['time_s'] * 1e6:,.1f} |")
    return md("\n".join(lines) + "\n\nNsight Compute, the three kernels of V0's second forward at B=4, H=12, "
              "M=N=2048, D=64 (`results/h200/v0_memory.raw.csv`, written by `python -m flashattn.book.kernel_times "
              "--ncu`). A sector is 32 bytes; a warp's 32 four-byte loads need 4 sectors when they are contiguous.")


def ncu_sentence() -> str:
    """What the counters say about V0's score kernel, against the bytes it must read (Q and K once)."""
    rows = {r["kernel"]: r for r in ncu_rows()}
    if "scores_kernel" not in rows:
        return "Not recorded yet (results/h200/v0_memory.raw.csv)."
    r, B, H, D, L = rows["scores_kernel"], PRIMARY["B"], PRIMARY["H"], PRIMARY["D"], PRIMARY["L"]
    qk = 2 * B * H * L * D * 4                     # Q and K, once
    asked = B * H * L * L * 2 * D * 4              # every thread reads a query row and a key row
    return (f"scores_kernel: its {B * H * L * L:,} threads ask for {asked / 1e9:,.1f} GB (a query row and a key row "
            f"each), and their loads touch {r['l1_load_bytes'] / 1e9:,.1f} GB of 32-byte sectors in L1, "
            f"{r['l1_load_bytes'] / asked:.2f}× the bytes asked for. L1 serves {r['l1_hit_pct']:.1f}% of those "
            f"sectors, so only {r['dram_read'] / 1e6:,.0f} MB come from DRAM (Q and K are {qk / 1e6:,.0f} MB). In "
            f"{r['time_s'] * 1e6:,.0f} µs that is {r['l1_load_bytes'] / r['time_s'] / 1e12:,.1f} TB/s of sectors "
            "through the L1 caches.")
