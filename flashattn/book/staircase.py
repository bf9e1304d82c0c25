"""What each step bought: every version from V0 to V8 on one staircase, each step labelled with the one idea
it added (from `flashattn.versions.INFO`) and the speedup it bought over the step before, with the backward's
own steps as a second panel.

Every number comes from a recorded run at the primary shape (B=4, H=12, M=N=2048, D=64, non-causal):
float32 versions from results/h200/bench.json, bf16 versions from the newest bench_v*.json run that timed V6,
V7 and V8 together, the backward from its step records (backward_layouts.json, backward_dq.json,
backward_tile.json), each of which re-times the step before beside the new one. A speedup is always the
ratio of two times from one run, except where the input dtype changes (V6's TF32 mode to V6 in bf16): that
step crosses two runs and two dtypes, and the figure says so instead of hiding it.
book/_static/concepts/staircase.png is FIGURES["staircase"]() saved with savefig(path, dpi=110,
bbox_inches="tight").
"""
from __future__ import annotations

import re
import textwrap

import matplotlib.pyplot as plt

from flashattn.book.figures import ROOF_COLORS, show_or_return
from flashattn.book.notebook import PRIMARY
from flashattn.book.records import RESULTS
from flashattn.loader import REPO_ROOT
from flashattn.measure import results, variants
from flashattn.measure.table import label
from flashattn.versions import INFO

OUTPUT = REPO_ROOT / "book" / "_static" / "concepts" / "staircase.png"
# The forward's two phases: the versions timed together, in their input dtype, and the records that may hold
# such a run (newest first).
PHASES = (("float32", ("v0", "v1", "v2", "v3", "v4", "v5", "v6"), ("bench.json",)),
          ("bfloat16", ("v6", "v7", "v8"), ("bench_v8.json", "bench_v7.json", "bench_v6.json")))
# The backward's chain: each record times the step before (its first name) beside the next ones.
BACKWARD_CHAIN = (("backward_layouts.json", ("v6_layout0", "v6_layout1", "v6_layout2")),
                  ("backward_dq.json", ("v6_layout2", "v6_layout2_bulk")),
                  ("backward_tile.json", ("v6_layout2_bulk", "v6_layout2_bulk_br128")))
ROOF = {"float32": "fp32", "tf32": "tf32", "bfloat16": "bf16"}


def _at_primary(row: dict, dtype: str) -> bool:
    return (row.get("status") == "ok" and bool(row.get("median_us")) and row["dtype"] == dtype
            and not row["causal"] and row["head_dim"] == PRIMARY["D"] and row["batch_size"] == PRIMARY["B"]
            and row["num_heads"] == PRIMARY["H"] and row["seq_len_q"] == row["seq_len_kv"] == PRIMARY["L"])


def one_run(names, dtype: str, files) -> dict | None:
    """The newest recorded run, among `files` (tried in order), that timed every one of `names` at the
    primary shape in `dtype`: {"file", "run" (its index in the file), "us" {name: median µs}}; None if none."""
    for file in files:
        doc = results.read_if_exists(RESULTS / file)
        if doc is None:
            continue
        for n, run in reversed(list(enumerate(results.runs(doc)))):
            us = {r["version"]: r["median_us"] for r in run["rows"] if _at_primary(r, dtype)}
            if all(name in us for name in names):
                return dict(file=file, run=n, us=us)
    return None


def idea(version: str, tf32: bool = False) -> str:
    """The one idea a version added, from its INFO description: the first clause, without asides in
    brackets or the "V<n> plus" that names the version before. V6 in TF32 mode: its title and its TF32
    clause; V6 in bf16: the same kernel, bf16 inputs."""
    info = INFO[version]
    clauses = [c.strip() for c in info.description.split(";")]
    if tf32:
        return f"{info.title}, {next(c for c in clauses if 'TF32' in c)}"
    text = clauses[0]
    while "(" in text and ")" in text:
        a, b = text.index("("), text.index(")")
        text = (text[:a].rstrip() + text[b + 1:]).strip()
    return re.sub(r"^V\d plus ", "", text).split(": ")[0]


def forward_steps() -> list[dict]:
    """V0 ... V8 in book order: name, version, dtype, roof key, us, file, run, idea, speedup (the step
    before's time over this one's, None for the first), same_run, dtype_change."""
    out = []
    for dtype, versions, files in PHASES:
        run = one_run(versions, dtype, files)
        if run is None:
            continue
        for v in versions:
            tf32 = v == "v6" and dtype == "float32"
            out.append(dict(name=label(v) + (" (TF32)" if tf32 else " (bf16)" if dtype == "bfloat16" else ""),
                            version=v, dtype=dtype, roof=ROOF["tf32" if tf32 else dtype], us=run["us"][v],
                            file=run["file"], run=run["run"], idea=idea(v, tf32=tf32)))
    for i, s in enumerate(out):
        prev = out[i - 1] if i else None
        s["speedup"] = prev["us"] / s["us"] if prev else None
        s["same_run"] = bool(prev) and (prev["file"], prev["run"]) == (s["file"], s["run"])
        s["dtype_change"] = bool(prev) and prev["dtype"] != s["dtype"]
        if s["dtype_change"] and s["version"] == prev["version"]:
            s["idea"] = f"the same kernel on bf16 inputs ({s['idea']})"
    return out


def backward_steps() -> list[dict]:
    """The backward's recorded chain at the primary shape in bf16: name, change (from its variant), us (from
    the record where it is the new step), file, speedup over the step before in the same run; plus the
    references "sdpa_flash" and "sdpa_cudnn" of the last record's run, as {"refs": {...}} on the last step."""
    out = []
    for file, names in BACKWARD_CHAIN:
        run = one_run(names, "bfloat16", (file,))
        if run is None:
            return []
        for n, name in enumerate(names):
            if out and n == 0:
                continue                     # the step before, re-timed as this run's baseline
            out.append(dict(name=name, change=variants.backward(name).change, us=run["us"][name], file=file,
                            run=run["run"], speedup=run["us"][names[n - 1]] / run["us"][name] if n else None,
                            same_run=bool(n), refs={k: run["us"][k] for k in ("sdpa_flash", "sdpa_cudnn")
                                                    if k in run["us"]}))
    return out


def _wrap(text: str, width: int = 58) -> str:
    return "\n".join(textwrap.wrap(text, width))


def _bars(ax, rows, labels, colors, refs, log: bool = True):
    """Horizontal bars, top to bottom, each with its time and its speedup over the row above; on a log axis
    (steps over three decades) or a linear one from zero (steps of a few percent). refs: {name: (µs, line
    style, the indices of the rows it compares with)}, drawn as vertical lines over those rows."""
    y = list(range(len(rows)))[::-1]
    ax.barh(y, [r["us"] for r in rows], color=colors, height=0.66, alpha=0.88)
    for yi, r in zip(y, rows):
        text = f"{r['us']:,.0f} µs"
        if r["speedup"] is not None:
            text += f"   {r['speedup']:.2f}×" + ("" if r["same_run"] else " †")
        ax.text(r["us"] * 1.06 if log else r["us"] + 0.01 * max(x["us"] for x in rows), yi, text, va="center",
                fontsize=10, fontweight="bold", bbox=dict(fc="white", ec="none", pad=0.4, alpha=0.85),
                color="firebrick" if r["speedup"] is not None and r["speedup"] < 1 else "0.1")
    bottom = -0.6
    for name, (us, style, idx) in refs.items():
        top, low = max(y[i] for i in idx), min(y[i] for i in idx)
        ax.vlines(us, low - 0.45, top + 0.45, color="0.2", ls=style, lw=1.1)
        above = top == len(rows) - 1      # label above the top row, else under the lowest row it spans
        ax.text(us, top + 0.55 if above else low - 0.55, f" {name}\n {us:,.0f} µs", fontsize=9, color="0.2",
                va="bottom" if above else "top")
        bottom = bottom if above else -1.5
    ax.set_yticks(y, labels, fontsize=9.5)
    lo, hi = min(r["us"] for r in rows), max(r["us"] for r in rows)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.6, hi * 5)
    else:
        ax.set_xlim(0, 1.3 * max([hi] + [ref[0] for ref in refs.values()]))
    ax.set_ylim(bottom, len(rows) + 0.6)
    ax.grid(True, axis="x", which="both", alpha=0.25)
    return y


def fig_staircase(show: bool = False):
    """Two panels: the forward from V0 to V8 (float32, then TF32 on tensor cores, then bf16: the rows are
    colored by what the arithmetic runs on and the switch to bf16 inputs is marked) and the backward's
    steps; every row is labelled with its idea and its speedup over the row above (× from one run, †
    across runs). SDPA's own times from the same runs are the dashed references."""
    fwd, bwd = forward_steps(), backward_steps()
    if not fwd:
        print("No recorded benchmark yet (results/h200/bench.json).")
        return None
    panels = 2 if bwd else 1
    fig, axes = plt.subplots(panels, 1, figsize=(13.5, 0.62 * (len(fwd) + len(bwd)) + 3.2),
                             gridspec_kw=dict(height_ratios=[len(fwd) + 1.2, len(bwd) + 1.2][:panels]),
                             constrained_layout=True, squeeze=False)
    ax = axes[0][0]
    refs = {}
    for dtype, _, files in PHASES:
        run = one_run(("sdpa",), dtype, (files[0],))
        if run:
            refs[f"SDPA {dtype}"] = (run["us"]["sdpa"], "--" if dtype == "float32" else ":",
                                     [i for i, r in enumerate(fwd) if r["dtype"] == dtype])
    y = _bars(ax, fwd, [f"{r['name']}: " + _wrap(r["idea"]) for r in fwd], [ROOF_COLORS[r["roof"]] for r in fwd],
              refs)
    switch = next((i for i, r in enumerate(fwd) if r["dtype_change"]), None)
    if switch is not None:
        ax.axhline(y[switch] + 0.5, color="firebrick", lw=1.6)
        ax.text(ax.get_xlim()[1], y[switch] + 0.5, "inputs change: float32 above, bf16 below ",
                ha="right", va="bottom", fontsize=10, color="firebrick", fontweight="bold")
    ax.set_xlabel("forward latency [µs], log scale")
    ax.set_title("The forward, V0 to V8: what each step bought (B=4, H=12, M=N=2048, D=64)\n"
                 "bar color = what the arithmetic runs on: green float32 CUDA cores, orange TF32, purple bf16 "
                 "tensor cores", fontsize=11.5, loc="left")
    if bwd:
        ax = axes[1][0]
        refs = {label(k): (us, "--" if k == "sdpa_flash" else ":", range(len(bwd)))
                for k, us in bwd[-1]["refs"].items()}
        _bars(ax, bwd, [_wrap(f"{r['name'].removeprefix('v6_')}: {r['change']}") for r in bwd],
              [ROOF_COLORS["bf16"]] * len(bwd), refs, log=False)
        ax.set_xlabel("backward latency [µs], bf16, our kernels called directly; the lines: SDPA's backward in the "
                      "last step's run,\nthrough autograd with no host slack (its host time included: the "
                      "results chapter's backward table compares like with like)")
        ax.set_title("The backward (kernels/v6_backward.cu), step by step; each × is against the step before, "
                     "re-timed in the same run", fontsize=11.5, loc="left")
    sources = sorted({f"{r['file']}" for r in fwd + bwd})
    fig.text(0.0, -0.01, "× = time of the row above / time of this row, both from one recorded run; † = across "
             "two runs (and here two input dtypes).\nRecords: results/h200/" + ", ".join(sources) + ".",
             fontsize=8.5, color="0.3", ha="left", va="top")
    return show_or_return(fig, show)


FIGURES = {"staircase": fig_staircase}

