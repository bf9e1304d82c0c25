"""The V5 chapter's tables, read from the committed records (results/h200/) or, for the opcode counts, from the
kernel compiled here (nvcc and nvdisasm, no GPU): the compact step table of the main page and the deep evidence
of its lab notes (per-step counters, opcode counts around the product loops, the tile experiments, the D = 128
profiles beside SDPA's). Each function returns Markdown (flashattn.book.notebook.md) or a string to print, so a
notebook cell stays one line.
"""
from __future__ import annotations

import csv
from collections import Counter

import torch

from flashattn import loader
from flashattn.book import records
from flashattn.book.notebook import md
from flashattn.measure import ncu, ncu_tables, results, sass, variants
from flashattn.reference import attention_reference, relative_error, sdpa

STEPS = [name for name, _, _ in variants.V5_STEPS]
STEP_RECORD = records.RESULTS / "v5_steps.json"
SWEEP_RECORD = records.RESULTS / "v5_sweep.json"
EXPLORE_RECORD = records.RESULTS / "v5_explore.json"
SDPA_RAW = records.RESULTS / "sdpa_vs_v5_d128.raw.csv"
D128_REPORT = records.RESULTS / "flash_v5_d128_s2048_profile.ncu-rep"
# the tile sweep's two builds that differ only in V5_BLOCKED_PV (D = 64, 64 x 64 tile of 4 x 8)
BLOCKED_PAIR = ("d64_64x64_4x8", "d64_64x64_4x8_flat")
# the recorded experiments' build names, as the chapter calls them
SMALL_TILE_LABELS = {"d64 default": "128-row tile only (before the choice existed)",
                     "d64 small auto": "the launcher's choice (committed)", "d64 small forced": "64-row tile always",
                     "sdpa": "SDPA"}
D128_LABELS = {"d128 default": "committed: 128 × 64 tile of 8 × 4, V5_UNROLL=4", "d128 u2": "V5_UNROLL=2",
               "d128 u8": "V5_UNROLL=8", "d128 flat": "plain sum (V5_BLOCKED_PV=0)",
               "d128 96x64 6x4": "96 × 64 tile of 6 × 4", "d128 128x32 8x2": "128 × 32 tile of 8 × 2", "sdpa": "SDPA"}
# what each step changed, and the counter (a records.STEP_COLUMNS name) that shows it, for the compact table
STEP_EVIDENCE = {2: "bank conflicts ld", 3: "stall long scoreboard", 4: "instructions", 5: "instructions"}
NO_STEPS = "*No recorded step chain yet (`results/h200/v5_steps.json`).*"


def _short(name: str) -> str:
    """'cp.async' from the record's step name 'd64 cp.async': the words after the head dim."""
    return name.split(" ", 1)[1]


def _fmt(x, f: str) -> str:
    return "—" if x is None else f.format(x)


def _column_format(column: str) -> str:
    return {"max_rel_error": "{:.1e}", "registers": "{}"}.get(column) or records.STEP_COLUMNS[column][1]


def sdpa_times(file: str = "v5_steps.json") -> dict[int, float]:
    """SDPA's median µs per head dim, timed in the same interleaved run as the step chain."""
    doc = results.read(records.RESULTS / file)
    return {r["D"]: r["timing"]["median_us"] for r in doc["meta"]["references"] if r["name"] == "sdpa"}


def blocked_sum_errors() -> dict[str, float]:
    """{'plain': error, 'blocked': error} of the tile sweep's pair that differs only in the blocked sum, at the
    sweep's primary shape (M = N = 2048, D = 64)."""
    rows = {v["name"]: v for v in results.read(SWEEP_RECORD)["rows"]}
    return {"blocked": rows[BLOCKED_PAIR[0]]["primary_rel_error"], "plain": rows[BLOCKED_PAIR[1]]["primary_rel_error"]}


def step_summary():
    """The main page's step table: per step its time at both head dims, the speedup over the step before, and at
    D = 64 the one number that shows what the step changed (step 5: the error at M = N = 2048 from the tile
    sweep, where the sum is long enough to matter)."""
    rows = records.step_rows("v5")
    if not rows:
        return md(NO_STEPS)
    dims = sorted({r["D"] for r in rows})
    lines = ["| step | " + " | ".join(f"D = {d}: µs | × before" for d in dims) + " | what moved (D = 64) |",
             "|---|" + "--:|--:|" * len(dims) + "---|"]
    for k in sorted({r["step"] for r in rows}):
        by_d = {r["D"]: r for r in rows if r["step"] == k}
        cells = " | ".join(f"{_fmt(by_d[d]['us'], '{:,.1f}')} | {_fmt(by_d[d]['vs_previous'], '{:.2f}×')}"
                           for d in dims)
        col = STEP_EVIDENCE.get(k)
        moved = "—"
        if col:
            before = next(r for r in rows if r["D"] == 64 and r["step"] == k - 1)
            f = _column_format(col)
            moved = f"{col.replace(' ld', ' (loads)')}: {_fmt(before[col], f)} → {_fmt(by_d[64][col], f)}"
        if k == 5:
            e = blocked_sum_errors()
            moved += f"; error at M = N = 2048: {e['plain']:.1e} → {e['blocked']:.1e}"
        lines.append(f"| {k}. {_short(by_d[dims[0]]['name'])} | {cells} | {moved} |")
    sd = sdpa_times()
    note = ("B = 4, H = 12, M = N = 2048, float32, one interleaved run (`results/h200/v5_steps.json`); SDPA in the "
            "same run: " + ", ".join(f"{sd[d]:,.1f} µs at D = {d}" for d in dims) + ". Stalls in cycles per "
            "issued instruction; instructions as executed; registers per thread.")
    return md("\n".join(lines) + "\n\n" + note)


def chain_summary() -> str:
    """One line per head dim: first and last step's time, the total speedup and the largest single step."""
    rows = records.step_rows("v5")
    if not rows:
        return "No recorded step chain yet (results/h200/v5_steps.json)."
    out = []
    for D in sorted({r["D"] for r in rows}):
        chain = [r for r in rows if r["D"] == D and r["us"]]
        best = max(chain[1:], key=lambda r: r["vs_previous"])
        out.append(f"D={D}: {chain[0]['us']:,.1f} µs -> {chain[-1]['us']:,.1f} µs over the {len(chain)} steps "
                   f"({chain[-1]['vs_first']:.2f}x); the largest single step is {_short(best['name'])!r} "
                   f"({best['vs_previous']:.2f}x).")
    return "\n".join(out)


def step1_vs_sdpa() -> str:
    """Step 1's time beside SDPA's in the same run, per head dim."""
    if not STEP_RECORD.exists():
        return "No recorded step chain yet (results/h200/v5_steps.json)."
    sd = sdpa_times()
    return "\n".join(f"D={r['D']}: step 1 takes {r['us']:,.1f} µs, SDPA {sd[r['D']]:,.1f} µs "
                     f"({sd[r['D']] / r['us']:.2f}x SDPA's speed)." for r in records.step_rows("v5") if r["step"] == 1)


def step_compare(k: int, columns):
    """Step k beside step k-1, per head dim, from the record: time, speedup, and the columns that explain it
    (names of records.STEP_COLUMNS, or max_rel_error / registers)."""
    rows = [r for r in records.step_rows("v5") if r["step"] in (k - 1, k)]
    if not rows:
        return md(NO_STEPS)
    lines = ["| D | step | median µs | vs. step before | " + " | ".join(c.replace("_", " ") for c in columns) + " |",
             "|--:|---|--:|--:|" + "--:|" * len(columns)]
    for r in rows:
        lines.append(f"| {r['D']} | {r['step']}. {_short(r['name'])} | {_fmt(r['us'], '{:,.1f}')} | "
                     f"{_fmt(r['vs_previous'], '{:.2f}×')} | "
                     + " | ".join(_fmt(r[c], _column_format(c)) for c in columns) + " |")
    return md("\n".join(lines))


def around_products(step: str, D: int = 64) -> Counter:
    """Opcode counts of one step's head-dim-D kernel outside its two product loops (the copies, the softmax, the
    rescale of O_i, the epilogue), from nvcc and nvdisasm: no GPU needed."""
    fn = sass.function("v5", f"Tiles<{D},", tuple(variants.SETS["v5-steps"][f"d{D} {step}"].flags))
    inner = {i.offset for lp in fn.innermost_loops() for i in lp.instructions}
    return Counter(i.opcode + i.suffix for i in fn.instructions if i.offset not in inner)


OPCODES = ("FFMA", "FMUL", "MUFU.EX2", "LDG.E.128.CONSTANT", "LDGSTS.E.BYPASS.128", "STS.128", "STS")


def opcode_table(D: int = 64):
    """Per step, the static instructions of the head-dim-D kernel outside the product loops, and the opcodes the
    steps move."""
    lines = ["| step | instructions | " + " | ".join(f"`{op}`" for op in OPCODES) + " |",
             "|---|--:|" + "--:|" * len(OPCODES)]
    for k, step in enumerate(STEPS, 1):
        c = around_products(step, D)
        lines.append(f"| {k}. {step} | {sum(c.values()):,} | " + " | ".join(str(c.get(op, 0)) for op in OPCODES)
                     + " |")
    return md("\n".join(lines))


def blocked_sum_lines() -> str:
    """The tile sweep's blocked and plain sum of the same tile at its primary shape, one line each."""
    out = []
    for v in results.read(SWEEP_RECORD)["rows"]:
        if v["name"] in BLOCKED_PAIR:
            kind = "plain sum (V5_BLOCKED_PV=0)" if v["macros"].get("V5_BLOCKED_PV") == 0 else "blocked sum"
            B, H, M, N, D = v["shape"]
            out.append(f"{v['name']}, {kind}: relative error {v['primary_rel_error']:.1e} at B={B}, H={H}, "
                       f"M=N={M}, D={D}")
    return "\n".join(out)


def explore_tables(D: int, labels: dict | None = None):
    """The recorded tile experiments (results/h200/v5_explore.json) at head dim D, one table per shape, fastest
    first, each beside SDPA timed in the same run."""
    if not EXPLORE_RECORD.exists():
        return md("*No recorded experiment yet (`results/h200/v5_explore.json`).*")
    parts = []
    for row in results.read(EXPLORE_RECORD)["rows"]:
        B, H, M, N, d = row["shape"]
        if d != D:
            continue
        res = row["results"]
        sd = res["sdpa"]["median_us"]
        lines = [f"**B={B}, H={H}, M=N={M}, D={D}**", "", "| kernel | median µs | TFLOP/s | × SDPA's speed |",
                 "|---|--:|--:|--:|"]
        for name, t in sorted(res.items(), key=lambda kv: kv[1]["median_us"]):
            lines.append(f"| {(labels or {}).get(name, name)} | {t['median_us']:,.1f} | {t['tflops']:.1f} | "
                         f"{sd / t['median_us']:.2f} |")
        parts.append("\n".join(lines))
    return md("\n\n".join(parts))


LOGIT_SHAPES = [(2, 3, 203, 113, 64), (2, 3, 113, 1025, 64), (2, 3, 203, 113, 128), (1, 4, 1023, 17, 128)]


def large_logits():
    """With a GPU: the committed V5's error against float64 at unit and 25× scaled logits, SDPA's beside it.
    Without one: the errors the step record holds for the last step on its odd shapes (logits scaled by 20)."""
    if torch.cuda.is_available():
        v5 = loader.load("v5")
        lines = ["| B, H, M, N, D | logit scale | V5 error | SDPA error |", "|---|--:|--:|--:|"]
        for B, H, M, N, D in LOGIT_SHAPES:
            for scale in (1.0, 25.0):
                q, k, v = (torch.randn(B, H, L, D, device="cuda") for L in (M, N, N))
                q = q * scale
                ref = attention_reference(q, k, v)
                lines.append(f"| {B}, {H}, {M}, {N}, {D} | {scale:g} | "
                             f"{relative_error(v5.forward(q, k, v, False), ref):.1e} "
                             f"| {relative_error(sdpa(q, k, v), ref):.1e} |")
        return md("\n".join(lines))
    if not STEP_RECORD.exists():
        return md(NO_STEPS)
    lines = ["| D | B, H, M, N | logit scale | V5 error | largest SDPA error over the odd shapes |",
             "|--:|---|--:|--:|--:|"]
    for r in results.read(STEP_RECORD)["rows"]:
        if r["name"] == f"d{r['D']} {STEPS[-1]}":
            for s in r["odd_shapes"]:
                lines.append(f"| {r['D']} | {s['B']}, {s['H']}, {s['M']}, {s['N']} | {s['logit_scale']:g} | "
                             f"{s['rel_error']:.1e} | {r['error_bound'] / 2:.1e} |")
    return md("\n".join(lines))


def _reports() -> dict:
    return {64: records.report_path("v5"), 128: D128_REPORT}


def profiles() -> dict[int, dict]:
    """ncu.summarize of the committed kernel's recorded reports at D = 64 and 128 ({} when either is missing or
    ncu_report cannot be imported)."""
    reports = _reports()
    if not all(p.exists() for p in reports.values()) or not records.ncu_report_importable():
        return {}
    return {D: ncu.summarize(str(p)) for D, p in reports.items()}


def d128_stall_tables():
    """The warp-state tables of both recorded profiles, one per head dim."""
    s = profiles()
    if not s:
        return md("*No D=128 profile recorded yet (`results/h200/flash_v5_d128_s2048_profile.ncu-rep`).*")
    return md("\n\n".join(f"**D = {D}**\n\n" + ncu_tables.stall_table(x, 6) for D, x in s.items()))


def profile_summary() -> str:
    """One line per head dim: issue rate, barrier and dispatch-stall shares, blocks per SM, FP32 share of peak and
    the shared-load bank conflicts, from the recorded profiles."""
    lines = []
    for D, x in profiles().items():
        total = sum(x["stalls"].values())
        lines.append(f"D={D}: {x['issued_ipc']:.2f} instructions issued per SM cycle (at most 4); barrier "
                     f"{100 * x['stalls'].get('barrier', 0) / total:.0f}% and dispatch stall "
                     f"{100 * x['stalls'].get('dispatch_stall', 0) / total:.0f}% of a warp's cycles; "
                     f"{x['blocks_per_sm']:.0f} block(s) of {x['block_size']:.0f} threads per SM; FP32 at "
                     f"{x['fp32_pct_of_peak']:.0f}% of the clock's peak"
                     + ("" if x.get("bank_conflicts_ld") is None
                        else f"; {x['bank_conflicts_ld']:,.0f} shared-load bank conflicts") + ".")
    return "\n".join(lines) or "No recorded profiles yet (results/h200/flash_v5_*_profile.ncu-rep)."


SDPA_COLUMNS = {"duration ms": "gpu__time_duration.sum", "warp instructions": "smsp__inst_executed.sum",
                "FFMA": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
                "FADD": "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
                "FMA pipe": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed",
                "tensor pipe": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"}


def sdpa_launches() -> list[dict]:
    """The recorded launches of SDPA's and V5's kernels at D = 128 under the same counters, one dict each:
    kernel name and the SDPA_COLUMNS values as numbers (duration in ns)."""
    if not SDPA_RAW.exists():
        return []
    header, _units, *launches = csv.reader(SDPA_RAW.open())
    out = []
    for row in launches:
        d = {"kernel": row[header.index("Kernel Name")].split("(")[0].replace("void ", "")}
        d.update({k: float(row[header.index(m)].replace(",", "")) for k, m in SDPA_COLUMNS.items()})
        out.append(d)
    return out


def sdpa_vs_v5_table():
    """SDPA's float32 kernel beside V5's at D = 128: time, instructions, FFMA and FADD, FMA and tensor pipes."""
    launches = sdpa_launches()
    if not launches:
        return md("*No SDPA profile recorded yet (`results/h200/sdpa_vs_v5_d128.raw.csv`).*")
    lines = ["| kernel | duration ms | warp instructions | FFMA (thread instructions) | FADD (thread instructions) "
             "| FMA pipe active | tensor pipe active |", "|---|--:|--:|--:|--:|--:|--:|"]
    for x in launches:
        lines.append(f"| `{x['kernel'][:60]}` | {x['duration ms'] / 1e6:.2f} | {x['warp instructions']:,.0f} | "
                     f"{x['FFMA']:,.0f} | {x['FADD']:,.0f} | {x['FMA pipe']:.1f}% | {x['tensor pipe']:.1f}% |")
    return md("\n".join(lines))
