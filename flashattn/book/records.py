"""Readers of what was recorded on the H200 (results/h200/) and by the compiler (results/compile/).

Every function here reads committed files only, so its output is the same on every machine (the book
checks the tables of these cells with nbval's `nbval-check-output` tag); a missing file gives one sentence
saying what will fill it in, never an error.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

from flashattn.book.notebook import PRIMARY, md
from flashattn.loader import REPO_ROOT, version_archs
from flashattn.measure import ncu, ncu_tables, profile, resources, results, table
from flashattn.measure.table import label, sdpa_cell
from flashattn.versions import VERSIONS

ROOT = REPO_ROOT
RESULTS = results.H200
COMPILE_RECORD = ROOT / "results" / "compile" / "resources.json"


def ceiling_record() -> dict:
    """results/h200/ceilings.json: a row per measured ceiling (name, value, datasheet, how); meta: the device,
    the source and PyTorch's own attention timed with them (pytorch_attention)."""
    return results.read(RESULTS / "ceilings.json", "ceilings")


def ceiling_rows() -> dict[str, dict]:
    """The measured ceilings by name."""
    return {r["name"]: r for r in ceiling_record()["rows"]}


def ceilings() -> dict:
    """The H200 ceilings measured with PyTorch's own GEMMs and copies (results/h200/ceilings.json), in base
    units."""
    doc = ceiling_record()
    c = {r["name"]: r["value"] for r in doc["rows"]}
    return {"fp32": c["fp32_cuda_core_tflops"] * 1e12, "tf32": c["tf32_tensor_tflops"] * 1e12,
            "bf16": c["bf16_tensor_tflops"] * 1e12, "fp16": c["fp16_tensor_tflops"] * 1e12,
            "dram": c["dram_copy_tbps"] * 1e12, "sm_count": doc["meta"]["sm_count"], "source": doc["meta"]["source"]}


def ceilings_table():
    """The measured ceilings next to the datasheet, and the ridge points they imply."""
    rows = ceiling_rows()
    dram = rows["dram_copy_tbps"]["value"]
    lines = ["| Ceiling | Measured on the H200 | Datasheet | How | Ridge point |", "|---|--:|--:|---|--:|"]
    for key, name in (("fp32_cuda_core_tflops", "FP32, CUDA cores"), ("tf32_tensor_tflops", "TF32, tensor cores"),
                      ("bf16_tensor_tflops", "BF16, tensor cores")):
        c = rows[key]
        lines.append(f"| {name} | {c['value']:,.1f} TFLOP/s | {c['datasheet']:,} TFLOP/s | {c['how']} | "
                     f"{c['value'] / dram:,.0f} FLOP/byte |")
    c = rows["dram_copy_tbps"]
    lines.append(f"| DRAM bandwidth | {c['value']:.2f} TB/s | {c['datasheet']} TB/s | {c['how']} | — |")
    return md("\n".join(lines))


def bench_rows(path: Path | None = None) -> list[dict]:
    """Every row of a recorded benchmark file (default results/h200/bench.json), [] when absent."""
    path = path or RESULTS / "bench.json"
    if not path.exists():
        return []
    return [dict(r, _meta=run["meta"], _settings=run["settings"])
            for run in results.runs(table.load(path)) for r in run["rows"]]


def ncu_record(path: Path) -> dict:
    """A step's Nsight Compute note (results/h200/*_ncu.json): what its meta says (shape, raw_csv, command,
    git_commit, source_csv) and "kernels", the builds in launch order (its rows)."""
    doc = results.read(path, "ncu")
    return dict(doc["meta"], kernels=[r["kernel"] for r in doc["rows"]])


def report_path(version: str, seq_len: int = PRIMARY["L"]) -> Path:
    return RESULTS / f"flash_{version}_s{seq_len}_profile.ncu-rep"


def ncu_report_importable() -> bool:
    """ncu_report comes from PyPI (ncu-report) or from Nsight Compute's own extras/python folder."""
    try:
        import ncu_report  # noqa: F401
        return True
    except ImportError:
        pass
    found = profile.find_ncu()
    if found:
        extras = Path(found).resolve().parent / "extras" / "python"
        if extras.is_dir():
            sys.path.append(str(extras))
            try:
                import ncu_report  # noqa: F401
                return True
            except ImportError:
                return False
    return False


def profile_summary(version: str, seq_len: int = PRIMARY["L"]) -> dict | None:
    """flashattn.measure.ncu's summary of the recorded report of `version`, None when there is none."""
    path = report_path(version, seq_len)
    if not path.exists() or not ncu_report_importable():
        return None
    return _summary(str(path), path.stat().st_mtime_ns)


@functools.cache
def _summary(path: str, mtime_ns: int) -> dict:
    """One parse per report and version of the file: a chapter asks for the table, the stalls and the
    roofline point of the same report."""
    return ncu.summarize(path)


def _recorded_summary(version: str, seq_len: int):
    """(summary, None) or (None, the sentence to show instead)."""
    path = report_path(version, seq_len)
    if not path.exists():
        return None, (f"*No Nsight Compute report recorded yet for {label(version)} "
                      f"(`results/h200/{path.name}`); it appears here once the H200 run is committed.*")
    s = profile_summary(version, seq_len)
    if s is None:
        return None, "*The report is there but `ncu_report` is not installed (`pip install ncu-report`).*"
    return s, None


def profile_table(version: str, seq_len: int = PRIMARY["L"], batch_size: int = PRIMARY["B"],
                  num_heads: int = PRIMARY["H"], head_dim: int = PRIMARY["D"]):
    """The Nsight Compute table of `version`, parsed from the committed report (profiled with
    `python -m flashattn.measure.profile` at the shape given here; the primary one by default)."""
    s, missing = _recorded_summary(version, seq_len)
    if s is None:
        return md(missing)
    return md(f"`{s['kernel'].split('(')[0]}` on {s['device']}, B={batch_size}, H={num_heads}, "
               f"M=N={seq_len}, D={head_dim} ({profile.default_dtype(version)}):\n\n" + ncu_tables.markdown_table(s))


def stall_table(version: str, seq_len: int = PRIMARY["L"], top: int = 6):
    """Where the warps of `version` spent their cycles (ncu's warp-state statistics), largest first."""
    s, missing = _recorded_summary(version, seq_len)
    if s is None:
        return md(missing)
    return md(ncu_tables.stall_table(s, top))


def bench_table(rows: list[dict], note: str) -> str:
    lines = ["| version | M = N | median µs | min – max µs | calls | TFLOP/s | vs. baseline | vs. SDPA |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {label(r['version'])} | {r['seq_len_q']} | {r['status']}: {r['message']} | | | | | |")
            continue
        base = r.get("change_vs_baseline_pct")
        sd = sdpa_cell(r)
        lines.append(f"| {label(r['version'])} | {r['seq_len_q']} | {r['median_us']:,.1f} | "
                     f"{r['min_us']:,.1f} – {r['max_us']:,.1f} | {r['calls_timed']} | {r['tflops']:.2f} | "
                     f"{'—' if base is None or r['version'] == 'baseline' else f'{base:+.1f}%'} | {sd} |")
    return "\n".join(lines) + "\n\n" + note


def _recorded_note(rows: list[dict]) -> str:
    if not rows:
        return ""
    meta, st = rows[0]["_meta"], rows[0]["_settings"]
    dev = (meta.get("device") or {}).get("name", "?")
    commit = ((meta.get("git") or {}).get("commit") or "uncommitted")[:10]
    rounds = f" in {st['rounds']} interleaved rounds" if st.get("rounds", 1) > 1 else ""
    return (f"Recorded on {dev} (torch {meta.get('torch', '?')}, commit {commit}): median of up to "
            f"{st.get('repetitions', '?')} calls{rounds} after {st.get('warmup', '?')} warm-ups, L2 flushed "
            f"before each.")


def recorded(versions, seq_lens=(PRIMARY["L"],), dtype="float32", causal=False, head_dim=64, file="bench.json"):
    """The recorded H200 rows of these versions and lengths, as a table (same columns as `timing`)."""
    rows = [r for r in bench_rows(RESULTS / file) if r["version"] in versions and r["seq_len_q"] in seq_lens
            and r["dtype"] == dtype and bool(r["causal"]) == causal and r["head_dim"] == head_dim]
    if not rows:
        return md(f"*No recorded benchmark yet (`results/h200/{file}`); the H200 run fills it in.*")
    order = {v: i for i, v in enumerate(versions)}
    rows.sort(key=lambda r: (r["seq_len_q"], order[r["version"]]))
    return md(bench_table(rows, _recorded_note(rows)))


def pytorch_attention_table(dtype: str | None = None):
    """PyTorch's attention on the H200 as measured with the ceilings (results/h200/ceilings.json)."""
    rows = [r for r in ceiling_record()["meta"]["pytorch_attention"]["rows"] if dtype is None or r["dtype"] == dtype]
    lines = ["| N | dtype | PyTorch path | µs | TFLOP/s |", "|--:|---|---|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['N']} | {r['dtype']} | {r['impl']} | {r['us']:,.1f} | {r['tflops']:.1f} |")
    return md("\n".join(lines) + "\n\nB=4, H=12, D=64, non-causal; measured with the ceilings, not by this "
               "book's benchmark (which times everything side by side).")


def kernel_resources(version: str) -> list[dict]:
    """ptxas's registers and static shared memory per kernel for sm_90 (sm_90a for a version built for
    that exact architecture), from results/compile/resources.json (or a fresh nvcc run when the record
    has no entry for this version yet)."""
    arch = (version_archs(version) or ["9.0"])[0].replace(".", "")
    rec = resources.load_record(COMPILE_RECORD)[1] if COMPILE_RECORD.exists() else {}
    return rec.get(version, {}).get(f"sm_{arch}") or resources.compile_report(version, arch)


def repeat_table(file="bench_v6_repeat.json", version="v6", against=("sdpa_flash", "sdpa")):
    """The same comparison recorded in several separate processes, one line per run: how far a ratio
    moves from run to run (`scripts/record_h200.sh OUT repeat`)."""
    if not (RESULTS / file).exists():
        return md(f"*No repeated runs recorded yet (`results/h200/{file}`).*")
    return md(table.comparison_table(table.load(RESULTS / file), version, list(against), group_shapes=True))


def primary_rows(dtype="float32", causal=False, head_dim=64, file="bench.json"):
    return [r for r in bench_rows(RESULTS / file) if r["dtype"] == dtype and bool(r["causal"]) == causal
            and r["head_dim"] == head_dim and r["batch_size"] == PRIMARY["B"] and r["num_heads"] == PRIMARY["H"]
            and r["status"] == "ok"]


def results_table(seq_len: int = PRIMARY["L"], file="bench.json", dtype="float32", causal=False, head_dim=64):
    """The README's table (flashattn.measure.table) for one sequence length of the recorded benchmark."""
    path = RESULTS / file
    if not path.exists():
        return md(f"*No recorded benchmark yet (`results/h200/{file}`).*")
    return md(table.results_table(path, seq_len=seq_len, dtype=dtype, causal=causal, head_dim=head_dim))


def latency_grid(file="bench.json", dtype="float32"):
    """Median latency in µs, one row per version, one column per recorded sequence length."""
    rows = primary_rows(dtype=dtype, file=file)
    if not rows:
        return md(f"*No recorded benchmark yet (`results/h200/{file}`).*")
    lens = sorted({r["seq_len_q"] for r in rows})
    got = {(r["version"], r["seq_len_q"]): r for r in rows}
    lines = ["| version | " + " | ".join(f"{L}" for L in lens) + " |", "|---|" + "--:|" * len(lens)]
    for v in VERSIONS:
        if any((v, L) in got for L in lens):
            cells = [f"{got[(v, L)]['median_us']:,.1f}" if (v, L) in got else "—" for L in lens]
            lines.append(f"| {label(v)} | " + " | ".join(cells) + " |")
    return md("\n".join(lines) + "\n\nMedian µs at B=4, H=12, D=64, " + dtype + ". " + _recorded_note(rows))


def sweep_table(version: str, file: str | None = None):
    """A recorded variant sweep (`python -m flashattn.measure.sweep VERSION`; default results/h200/VERSION_sweep.json):
    one row per variant with its geometry, compiler report, correctness and latency beside the references
    timed in the same run."""
    file = file or f"{version}_sweep.json"
    doc = results.read_if_exists(RESULTS / file, "sweep")
    if doc is None:
        return md(f"*No recorded sweep yet (`results/h200/{file}`).*")
    meta = doc["meta"]
    refs = list(dict.fromkeys(r["name"] for r in meta["references"]))
    lines = ["| variant | D | tile B_r × B_c (TM × TN) | B, H, M=N | threads | registers | spills | shared memory | "
             "blocks/SM | correct | median µs | TFLOP/s | " + " | ".join(f"vs. {label(r)}" for r in refs) + " |",
             "|---|--:|---|---|--:|--:|--:|--:|--:|---|--:|--:|" + "--:|" * len(refs)]

    def cell(x, fmt="{}"):
        return "—" if x is None else fmt.format(x)

    for r in doc["rows"]:
        geo, px, occ, t = (r.get(k) or {} for k in ("geometry", "ptxas", "occupancy", "timing"))
        B, H, M = (r.get("shape") or [None] * 3)[:3]      # no shape: the variant did not build
        correct = {True: "yes", False: "NO", None: "—"}[r.get("correct")]
        vs = [cell((r.get("vs") or {}).get(ref), "{:.2f}×") for ref in refs]
        tile = f"{geo['B_r']} × {geo['B_c']}" if geo else "—"
        tile += f" ({geo['TM']} × {geo['TN']})" if "TM" in geo else ""
        lines.append(f"| {r['name']} | {r['D']} | {tile} | {B}, {H}, {M} | {cell(geo.get('threads'))} | "
                     f"{cell(px.get('registers'))} | {cell(px.get('spill_store_bytes'), '{} B')} | "
                     f"{cell(geo.get('smem'), '{:,} B')} | {cell(occ.get('blocks_per_sm'))} | {correct} | "
                     f"{cell(t.get('median_us'), '{:,.1f}')} | {cell(t.get('tflops'), '{:.1f}')} | "
                     + " | ".join(vs) + " |")
    device = (meta.get("device") or {}).get("name", "the H200")
    note = (f"{meta['dtype']}, non-causal, on {device}; {doc['settings']['timing']}. Correct: "
            f"{doc['settings']['correct_if']}. Ratios above 1 mean the variant is faster.")
    best = {}
    for r in doc["rows"]:
        t = (r.get("timing") or {}).get("median_us")
        if r.get("correct") is not False and t and (r["D"] not in best or t < best[r["D"]][1]):
            best[r["D"]] = (r["name"], t)
    note += " Fastest " + ("correct " if all(r.get("correct") is not None for r in doc["rows"]) else "") + \
        "variant per head dim: " + ", ".join(f"D={D}: {n}" for D, (n, _) in sorted(best.items())) + "."
    if meta.get("converted_from"):
        note += f" Recorded in an earlier format ({meta['converted_from']['format']}), same measurements."
    return md("\n".join(lines) + "\n\n" + note)


# Columns of step_table: (header, where in a step row, format). Counters come from `--metrics`; SASS counts
# of the hot loop from flashattn.measure.sass (no GPU).
STEP_COLUMNS = {
    **{name.replace("_", " "): (("metrics", "counters", name), "{:,.0f}") for name in (
        "bank_conflicts_ld", "bank_conflicts_st", "shared_wavefronts_ld", "shared_wavefronts_st")},
    "instructions": (("metrics", "counters", "inst_executed"), "{:,.0f}"),
    "occupancy %": (("metrics", "counters", "achieved_occupancy_pct"), "{:.1f}"),
    **{f"stall {reason.replace('_', ' ')}": (("metrics", "stalls", reason), "{:.2f}") for reason in (
        "barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "wait",
        "not_selected")},
    **{op: (("sass_hot_loop", op), "{}") for op in ("HMMA", "LDS", "LDSM", "STS", "BAR/sync", "MUFU", "global loads")},
}


def _dig(row: dict, path: tuple):
    for k in path:
        row = row.get(k) if isinstance(row, dict) else None
    return row


def step_rows(version: str, file: str | None = None) -> list[dict]:
    """The recorded step chain of a chapter (`python -m flashattn.measure.sweep VERSION-steps [--metrics]`,
    results/h200/VERSION_steps.json), in step order, one dict per step: name, D, step (1-based within its
    head dim), change, correct, us (median), vs_previous and vs_first (speedups: the earlier step's time
    over this one's, so above 1 is faster), the references' times, and every STEP_COLUMNS value. [] when
    nothing is recorded."""
    doc = results.read_if_exists(RESULTS / (file or f"{version}_steps.json"), "sweep")
    if doc is None:
        return []
    by_name = {r["name"]: r for r in doc["rows"]}
    out, last, first = [], {}, {}
    for name in doc["meta"].get("steps") or list(by_name):
        r = by_name[name]
        D, us = r["D"], (r.get("timing") or {}).get("median_us")
        row = dict(name=name, D=D, step=sum(1 for o in out if o["D"] == D) + 1, change=r.get("change", ""),
                   correct=r.get("correct"), max_rel_error=r.get("max_rel_error"), us=us,
                   vs_previous=last[D] / us if us and last.get(D) else None,
                   vs_first=first[D] / us if us and first.get(D) else None,
                   registers=(r.get("ptxas") or {}).get("registers"), smem=(r.get("geometry") or {}).get("smem"),
                   spills=(r.get("ptxas") or {}).get("spill_store_bytes"))
        row.update({col: _dig(r, path) for col, (path, _) in STEP_COLUMNS.items()})
        out.append(row)
        if us:
            last[D] = us
            first.setdefault(D, us)
    return out


def step_table(version: str, D: int | None = None, columns=("bank conflicts ld", "bank conflicts st"),
               file: str | None = None, steps=None):
    """The step chain as a table: step, change, median µs, speedup over the step before and over the first
    step, and the chosen columns (STEP_COLUMNS, or a key of step_rows such as "registers" or "smem"), for
    one head dim (or all) and the step numbers in `steps` (or all)."""
    file = file or f"{version}_steps.json"
    rows = [r for r in step_rows(version, file) if (D is None or r["D"] == D) and (not steps or r["step"] in steps)]
    if not rows:
        return md(f"*No recorded step chain yet (`results/h200/{file}`, from `python -m flashattn.measure.sweep "
                  f"{version}-steps --metrics`).*")
    lines = ["| D | step | change | correct | median µs | vs. step before | vs. step 1 |"
             + "".join(f" {c} |" for c in columns), "|--:|--:|---|---|--:|--:|--:|" + "--:|" * len(columns)]

    def cell(x, fmt):
        return "—" if x is None else fmt.format(x)
    for r in rows:
        correct = {True: "yes", False: "NO", None: "—"}[r["correct"]]
        lines.append(f"| {r['D']} | {r['step']} | {r['change']} | {correct} | {cell(r['us'], '{:,.1f}')} | "
                     f"{cell(r['vs_previous'], '{:.2f}×')} | {cell(r['vs_first'], '{:.2f}×')} |"
                     + "".join(f" {cell(r.get(c), STEP_COLUMNS.get(c, ((), '{:,}'))[1])} |" for c in columns))
    doc = results.read(RESULTS / file, "sweep")
    shapes = sorted({(r["D"], tuple(v.get("shape") or ())) for v in doc["rows"] for r in rows
                     if v["name"] == r["name"]})
    note = ("Times: " + "; ".join(f"D={d}: B, H, M, N = {', '.join(map(str, s[:4]))}" for d, s in shapes if s)
            + f", {doc['meta']['dtype']}, non-causal; {doc['settings']['timing']}.")
    metric_shape = next((v["metrics"]["shape"] for v in doc["rows"] if (v.get("metrics") or {}).get("shape")),
                        None)
    if metric_shape and any(c in columns for c in STEP_COLUMNS if c.startswith(("bank", "shared", "instr",
                                                                                   "occ", "stall"))):
        note += (f" Counters: one launch under Nsight Compute at B, H, M, N = "
                 f"{', '.join(map(str, metric_shape[:4]))} and the row's D (stalls: cycles per issued "
                 f"instruction).")
    return md("\n".join(lines) + "\n\n" + note)


def step_sentence(version: str, step: int, file: str | None = None, columns=()) -> str:
    """What step `step` of the recorded chain did to the time, per head dim, and to each of `columns`
    (STEP_COLUMNS names), as a sentence read from the record (so that prose never carries a typed number)."""
    rows = [r for r in step_rows(version, file) if r["step"] == step]
    if not rows:
        return f"(step {step}: no recorded step chain yet, results/h200/{file or version + '_steps.json'})"
    parts = []
    for r in rows:
        before = next((o for o in step_rows(version, file) if o["D"] == r["D"] and o["step"] == step - 1), None)
        if r["us"] is None or (before and before["us"] is None):
            parts.append(f"at D = {r['D']} it was not timed ({'incorrect' if r['correct'] is False else 'no time'})")
        elif before is None:
            parts.append(f"at D = {r['D']} it takes {r['us']:,.1f} µs")
        else:
            parts.append(f"at D = {r['D']} it goes from {before['us']:,.1f} µs to {r['us']:,.1f} µs "
                         f"({r['vs_previous']:.2f}× the speed of the step before)")
        for c in columns if before else ():
            fmt = STEP_COLUMNS.get(c, ((), "{:,}"))[1]
            if before.get(c) is not None and r.get(c) is not None:
                parts[-1] += f", {c} {fmt.format(before[c])} → {fmt.format(r[c])}"
    return f"Step {step} ({rows[0]['change']}): " + "; ".join(parts) + "."
