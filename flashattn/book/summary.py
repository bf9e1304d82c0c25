"""The results chapter's view across versions: every step on one staircase, each version's share of its
own roof with its recorded error, PyTorch's backends on the H200, and the comparison with the RTX 4080
figures of the project's original description (results/reference/rtx4080.json).

Everything reads committed records (results/h200/, results/reference/), so the output is the same with or
without a GPU.
"""
from __future__ import annotations

import matplotlib.pyplot as plt  # flashattn.book.figures, imported below, loads it anyway

from flashattn.book.figures import ROOF_COLORS, datasheet_roofs, show_or_return
from flashattn.book.notebook import PRIMARY, md
from flashattn.book.records import RESULTS, bench_rows, ceilings, primary_rows, profile_summary
from flashattn.measure import results
from flashattn.measure.table import label

# ------------------------------------------------------------------------------------ the results chapter
# What each version's arithmetic runs on, by the dtype of its inputs: the roof it should be judged against.
ROOF_OF = {("float32", False): ("fp32", "FP32 CUDA cores"), ("float32", True): ("tf32", "TF32 tensor cores"),
           ("bfloat16", True): ("bf16", "BF16 tensor cores")}
TENSOR_VERSIONS = ("v6", "v7", "v8")


def _primary(file: str, dtype: str) -> dict[str, dict]:
    """{version: row} at the primary shape (B=4, H=12, M=N=2048, D=64, non-causal) of a recorded file."""
    return {r["version"]: r for r in primary_rows(dtype=dtype, file=file) if r["seq_len_q"] == PRIMARY["L"]}


def _recorded_error(file: str, dtype: str, version: str) -> tuple[float | None, int | None]:
    """The relative error against float64 recorded for `version` in `file`: at the primary shape when the
    file has it there, else at the shortest sequence length that has one (bench.json checks accuracy at
    its first length only). (error, sequence length)."""
    rows = sorted((r for r in primary_rows(dtype=dtype, file=file)
                   if r["version"] == version and r.get("rel_error") is not None), key=lambda r: r["seq_len_q"])
    at = [r for r in rows if r["seq_len_q"] == 2048] or rows
    return (at[0]["rel_error"], at[0]["seq_len_q"]) if at else (None, None)


def steps(include_hopper: bool = True) -> list[dict]:
    """The staircase: every version at the primary shape, in book order. V0-V5 and V6's TF32 mode with
    float32 inputs (results/h200/bench.json); V6, V7 and V8 in bf16 (bench_v6.json, and bench_v7.json and
    bench_v8.json when they are recorded; include_hopper=False leaves V7 and V8 out). Each step carries
    its latency, TFLOP/s, roof, recorded error and source file."""
    out = []
    fp32 = _primary("bench.json", "float32")
    for v in ("v0", "v1", "v2", "v3", "v4", "v5", "v6"):
        if v in fp32:
            out.append(dict(fp32[v], step=label(v) + (" (TF32)" if v == "v6" else ""), file="bench.json",
                            roof=ROOF_OF[("float32", v in TENSOR_VERSIONS)]))
    for v, file in (("v6", "bench_v6.json"), ("v7", "bench_v7.json"), ("v8", "bench_v8.json")):
        if v != "v6" and (not include_hopper or not (RESULTS / file).exists()):
            continue
        rows = _primary(file, "bfloat16")
        if v in rows:
            out.append(dict(rows[v], step=f"{label(v)} (bf16)", file=file, roof=ROOF_OF[("bfloat16", True)]))
    for s in out:
        s["error"], s["error_at"] = _recorded_error(s["file"], s["dtype"], s["version"])
    return out


def roof_table():
    """Each step against its own roof: float32 on CUDA cores against the measured SGEMM ceiling, TF32 and
    bf16 against the measured tensor-core GEMM ceilings; with the recorded error against float64."""
    c = ceilings()
    lines = ["| step | arithmetic on | latency µs | TFLOP/s | measured roof TFLOP/s | share of its roof | "
             "rel. error vs float64 | recorded in |", "|---|---|--:|--:|--:|--:|--:|---|"]
    for r in steps():
        key, name = r["roof"]
        err = "—" if r["error"] is None else f"{r['error']:.1e}" + ("" if r["error_at"] == 2048 else
                                                                     f" (N={r['error_at']})")
        lines.append(f"| {r['step']} | {name} | {r['median_us']:,.1f} | {r['tflops']:.1f} | {c[key] / 1e12:.1f} | "
                     f"{100 * r['tflops'] * 1e12 / c[key]:.1f}% | {err} | `{r['file']}` |")
    for dtype, what in (("float32", "tensor cores, 3 TF32 products per product"), ("bfloat16", "BF16 tensor cores")):
        ref = _primary("bench_v6.json", dtype).get("sdpa")       # the run that recorded SDPA's error too
        if ref:
            err, _ = _recorded_error("bench_v6.json", dtype, "sdpa")
            lines.append(f"| *SDPA {dtype} (reference)* | {what} | {ref['median_us']:,.1f} | {ref['tflops']:.1f} | — "
                         f"| — | {'—' if err is None else f'{err:.1e}'} | `bench_v6.json` |")
    return md("\n".join(lines) + "\n\nFLOP = 4·B·H·M·N·D per call (the two products). Roofs: "
              "`results/h200/ceilings.json`. Errors: the `rel_error` the benchmark recorded for the same "
              "version and dtype, at M = N = 2048 unless a length is given.")


def rtx4080() -> dict:
    """The RTX 4080 figures of the project's original description (results/reference/rtx4080.json): its meta
    (source, device, shape, timing, profiles, datasheet) and "latency_us" {version: µs} from its rows."""
    doc = results.read(RESULTS.parent / "reference" / "rtx4080.json", "reference")
    return {**doc["meta"], "latency_us": {r["version"]: r["latency_us"] for r in doc["rows"]}}


def rtx4080_table():
    """The same versions at the same shape on the RTX 4080 (as published) and on the H200 (recorded):
    latency, the factor each step gained on each GPU, and the theoretical blocks per SM of the profiles."""
    ref = rtx4080()
    h200 = _primary("bench.json", "float32")
    lines = ["| version | RTX 4080 µs | H200 µs | H200 faster by | step gain, RTX 4080 | step gain, H200 | "
             "blocks/SM, RTX 4080 | blocks/SM, H200 |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    prev = None
    for v in ("baseline", "sdpa", "v0", "v1", "v2", "v3", "v4"):
        a, b = ref["latency_us"].get(v), h200.get(v, {}).get("median_us")
        if a is None or b is None:
            continue
        gain = ("—", "—")
        if v.startswith("v") and prev is not None and prev.startswith("v"):
            gain = (f"{ref['latency_us'][prev] / a:.2f}×", f"{h200[prev]['median_us'] / b:.2f}×")
        rtx_blocks = ref["profiles"].get(v, {}).get("blocks_per_sm", "—")
        s = profile_summary(v) if v in ("v1", "v2", "v3", "v4") else None
        h_blocks = f"{s['blocks_per_sm']:.0f}" if s else "—"
        lines.append(f"| {label(v)} | {a:,.1f} | {b:,.1f} | {a / b:.1f}× | {gain[0]} | {gain[1]} | {rtx_blocks} | "
                     f"{h_blocks} |")
        prev = v
    return md("\n".join(lines) + f"\n\nRTX 4080: {ref['timing']['warmup']} warm-ups and "
              f"{ref['timing']['repetitions']} timed calls, from `results/reference/rtx4080.json` (as "
              "published in the project's original description). H200: `results/h200/bench.json` and the "
              "recorded Nsight Compute reports.")


def sdpa_vs_v4() -> dict:
    """V4 against SDPA on both GPUs and the arithmetic rates behind it: {gpu: {...}}."""
    ref = rtx4080()
    h200 = _primary("bench.json", "float32")
    sheet = datasheet_roofs()
    return {"RTX 4080": {"v4_over_sdpa": ref["latency_us"]["sdpa"] / ref["latency_us"]["v4"],
                         "tf32_over_fp32": ref["datasheet"]["tf32_tensor_tflops"] / ref["datasheet"]["fp32_tflops"]},
            "H200": {"v4_over_sdpa": h200["sdpa"]["median_us"] / h200["v4"]["median_us"],
                     "tf32_over_fp32": sheet["tf32"] / sheet["fp32"]}}


def backend_table(files=("bench_v6.json", "bench_peers.json")):
    """Which of SDPA's backends its default choice matches on the H200, per recorded shape: the forced
    backend whose latency is nearest the default's in the same run, with our versions timed in that run."""
    lines = ["| record | dtype | B, H, M = N, D | causal | SDPA default µs | flash | cuDNN | efficient | "
             "default matches | V6 µs | V7 µs | V8 µs |", "|---|---|---|---|--:|--:|--:|--:|---|--:|--:|--:|"]
    for file in files:
        rows = [r for r in bench_rows(RESULTS / file) if r["status"] == "ok"]
        shapes = dict.fromkeys((r["dtype"], r["batch_size"], r["num_heads"], r["seq_len_q"], r["head_dim"],
                                bool(r["causal"])) for r in rows)
        for dtype, B, H, L, D, causal in shapes:
            got = {r["version"]: r["median_us"] for r in rows if (r["dtype"], r["batch_size"], r["num_heads"],
                   r["seq_len_q"], r["head_dim"], bool(r["causal"])) == (dtype, B, H, L, D, causal)}
            if "sdpa" not in got:
                continue
            forced = {k: got[k] for k in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient") if k in got}
            match = min(forced, key=lambda k: abs(forced[k] - got["sdpa"])) if forced else None
            cells = [f"{got[k]:,.1f}" if k in got else "—"
                     for k in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "v6", "v7", "v8")]
            lines.append(f"| `{file}` | {dtype} | {B}, {H}, {L}, {D} | {'yes' if causal else 'no'} | "
                         f"{got['sdpa']:,.1f} | {' | '.join(cells[:3])} | {label(match) if match else '—'} | "
                         f"{' | '.join(cells[3:])} |")
    return md("\n".join(lines) + "\n\nEach row one recorded run (`results/h200/<record>`); a backend that does "
              "not take a dtype (FlashAttention-2 and cuDNN take no float32) or was not timed has no entry.")


# ------------------------------------------------------------------------------- the staircase by phase
# Versions recorded as plain sweeps list alternatives beside their steps; these variants (D=64, in
# order, one compile-time change apart) are the chapter's chain. v5 and v6 have step files
# (`python -m flashattn.measure.sweep v5-steps|v6-steps`, results/h200/<v>_steps.json) whose "steps" give the order.
# {version: ((variant, the change it makes), ...)}; kernels/v7.cu and v8.cu describe each macro.
SWEEP_CHAINS = {
    "v7": (("d64 plain loads, 1 stage", "wgmma; tiles copied by every thread (V7_TMA=0), one stage"),
           ("d64 TMA, 1 stage", "tiles copied by TMA (V7_TMA=1)"),
           ("d64 TMA, 2 stages (default)", "two K/V stages (V7_STAGES=2)")),
    "v8": (("d64 spec0", "V7's loop on V8's barriers (V8_SPECIALIZE=0)"),
           ("d64 tile", "V8's tiles: three computing warpgroups, B_r = 192 (V8_D64_WG=3)"),
           ("d64 spec", "a producer warpgroup issues the copies (V8_SPECIALIZE=1)"),
           ("d64 setmaxnreg", "registers moved from producer to consumers (V8_SETMAXNREG=1)"),
           ("d64 pingpong", "consumer warpgroups take turns on the tensor cores (V8_PINGPONG=1)"),
           ("d64 overlap", "softmax of one tile under the products of the next (V8_OVERLAP=1)"),
           ("d64 persistent (default)", "one block per SM loops over the row blocks (V8_PERSISTENT=1)")),
}
PHASES = {
    "fp32": dict(title="float32 on CUDA cores", roof="fp32", dtype="float32", file="bench.json",
                 versions=("v0", "v1", "v2", "v3", "v4", "v5")),
    "bf16": dict(title="bf16 on tensor cores", roof="bf16", dtype="bfloat16", file="bench_v6.json",
                 versions=("v6", "v7", "v8")),
}


def _chain(version: str) -> tuple[str, list[dict]] | None:
    """(file, the D=64 variants of `version`'s recorded step chain, in order), None when not recorded."""
    chain = dict(SWEEP_CHAINS.get(version, ()))
    for file, names in ((f"{version}_steps.json", None), (f"{version}_sweep.json", list(chain) or None)):
        doc = results.read_if_exists(RESULTS / file, "sweep")
        if doc is None or (names is None and "steps" not in doc["meta"]):
            continue
        by_name = {r["name"]: r for r in doc["rows"]}
        order = [n for n in (names or doc["meta"]["steps"]) if n in by_name and by_name[n]["D"] == 64]
        if order:
            return file, [dict(by_name[n], change=by_name[n].get("change") or chain.get(n, "")) for n in order]
    return None


def _flops(shape) -> float:
    B, H, M, N, D = shape
    return 4.0 * B * H * M * N * D


def phase_steps(phase: str) -> list[dict]:
    """Every step of a phase at D=64 in book order: versions without a step chain as one step from the
    phase's benchmark file, versions with one as each of its steps. Each step: version, name, change,
    us, tflops, share (of the phase's measured roof), error (and what it is), file, vs_previous (the
    previous step's time over this one's) and same_run (whether both times come from one run)."""
    p, c = PHASES[phase], ceilings()
    bench = _primary(p["file"], p["dtype"])
    out = []
    for v in p["versions"]:
        chain = _chain(v)
        if chain is None:
            if v not in bench:
                continue
            r = bench[v]
            err, at = _recorded_error(p["file"], p["dtype"], v)
            out.append(dict(version=v, name=label(v), change="", us=r["median_us"], tflops=r["tflops"], error=err,
                            error_kind=f"N={at}" if at else "", file=p["file"], run=p["file"]))
            continue
        file, variants = chain
        for r in variants:
            us = (r.get("timing") or {}).get("median_us")
            if us is None:
                continue
            out.append(dict(version=v, name=f"{label(v)}: {r['name'].removeprefix('d64 ')}", change=r.get("change", ""),
                            us=us, tflops=_flops(r["shape"]) / us / 1e6, error=r.get("max_rel_error"),
                            error_kind="odd shapes", file=file, run=file, correct=r.get("correct")))
    for i, s in enumerate(out):
        s["share"] = s["tflops"] * 1e12 / c[p["roof"]]
        s["vs_previous"] = out[i - 1]["us"] / s["us"] if i else None
        s["same_run"] = bool(i) and out[i - 1]["run"] == s["run"]
    return out


def phase_table(phase: str):
    """The steps of a phase as a table: latency, speedup over the step before (marked † when the two come
    from different runs), TFLOP/s, share of the measured roof, relative error against float64."""
    p, rows = PHASES[phase], phase_steps(phase)
    if not rows:
        return md(f"*Nothing recorded yet for the {p['title']} phase.*")
    lines = ["| # | step | one change | median µs | vs. step before | TFLOP/s | share of roof | rel. error "
             "vs float64 | record |", "|--:|---|---|--:|--:|--:|--:|--:|---|"]
    for i, r in enumerate(rows, 1):
        vs = "—" if r["vs_previous"] is None else f"{r['vs_previous']:.2f}×" + ("" if r["same_run"] else " †")
        err = "—" if r["error"] is None else f"{r['error']:.1e} ({r['error_kind']})"
        lines.append(f"| {i} | {r['name']} | {r['change'] or '—'} | {r['us']:,.1f} | {vs} | {r['tflops']:.1f} | "
                     f"{100 * r['share']:.1f}% | {err} | `{r['file']}` |")
    roof = ceilings()[p["roof"]] / 1e12
    return md("\n".join(lines) + f"\n\nB=4, H=12, M=N=2048, D=64, {p['dtype']}; FLOP = 4·B·H·M·N·D. Roof: the "
              f"measured {ROOF_OF[(p['dtype'], p['roof'] != 'fp32')][1]} GEMM ceiling, {roof:,.1f} TFLOP/s "
              "(`results/h200/ceilings.json`). Errors: the benchmark's at the length given (N=...), or the largest "
              "over a sweep's odd shapes. Within one record the steps were timed in one interleaved run; "
              "† marks a ratio between two different runs, which also carries their run-to-run spread.")


def phase_summary(phase: str) -> str:
    """A paragraph of the phase's numbers, read from the record: first and last step, the largest single
    step, the share of the roof reached."""
    p, rows = PHASES[phase], phase_steps(phase)
    if len(rows) < 2:
        return f"Not enough recorded steps for the {p['title']} phase yet."
    first, last = rows[0], rows[-1]
    big = max(rows[1:], key=lambda r: r["vs_previous"])
    worst = min(rows[1:], key=lambda r: r["vs_previous"])
    title = f"Phase {list(PHASES).index(phase) + 1}, {p['title']}"
    text = (f"{title}: {len(rows)} steps take the forward pass from {first['us']:,.1f} µs "
            f"({first['name']}) to {last['us']:,.1f} µs ({last['name']}), {first['us'] / last['us']:,.1f}× "
            f"faster, from {100 * first['share']:.1f}% to {100 * last['share']:.1f}% of the measured roof. The "
            f"largest single step is {big['name']} ({big['vs_previous']:.2f}× over the step before")
    text += ")." if big["same_run"] else ", across two runs)."
    if worst["vs_previous"] < 1:
        text += (f" Not every step is a gain on its own: {worst['name']} runs at {worst['vs_previous']:.2f}× the "
                 "speed of the step before" + ("." if worst["same_run"] else " (across two runs)."))
    return text


def fig_phase(phase: str, show: bool = True):
    """The steps of a phase as horizontal bars on a log axis, each labelled with its latency and its
    speedup over the step before; versions alternate in shade, SDPA in the same dtype dashed."""
    p, rows = PHASES[phase], phase_steps(phase)
    if not rows:
        print(f"Nothing recorded yet for the {p['title']} phase.")
        return None
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.4), constrained_layout=True)
    y = list(range(len(rows)))[::-1]
    versions = list(dict.fromkeys(r["version"] for r in rows))
    colors = [ROOF_COLORS[p["roof"]] for _ in rows]
    alphas = [0.9 if versions.index(r["version"]) % 2 == 0 else 0.55 for r in rows]
    for yi, r, col, a in zip(y, rows, colors, alphas):
        ax.barh(yi, r["us"], color=col, alpha=a, height=0.7)
        vs = "" if r["vs_previous"] is None else f"   {r['vs_previous']:.2f}×" + ("" if r["same_run"] else " †")
        share = f"{100 * r['share']:.{1 if r['share'] < 0.1 else 0}f}%"
        ax.text(r["us"] * 1.04, yi, f"{r['us']:,.1f} µs{vs}   ({share} of roof)", va="center", fontsize=9,
                bbox=dict(fc="white", ec="none", pad=0.3, alpha=0.8))
    ref = _primary(p["file"], p["dtype"]).get("sdpa")
    if ref:
        ax.axvline(ref["median_us"], color="black", ls="--", lw=1.2)
        ax.text(ref["median_us"], len(rows) - 0.4, f" SDPA {p['dtype']}: {ref['median_us']:,.0f} µs", fontsize=8,
                va="bottom")
    ax.set_yticks(y, [r["name"] for r in rows], fontsize=9)
    ax.set_xscale("log")
    lo, hi = min(r["us"] for r in rows), max(r["us"] for r in rows)
    ax.set_xlim(lo / 1.5, hi * (4 if hi / lo > 20 else 2.6))
    ax.set_ylim(-0.6, len(rows) + 0.2)
    ax.set(xlabel="latency [µs], log scale",
           title=f"{p['title']}, B=4, H=12, M=N=2048, D=64: every step\n× speedup over the step before "
                 "(† across two runs), share of the measured roof")
    ax.grid(True, axis="x", which="both", alpha=0.25)
    return show_or_return(fig, show)
