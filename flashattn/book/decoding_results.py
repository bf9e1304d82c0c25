"""The Decoding chapter's measured comparisons (book/decoding.ipynb): the peers table and the issue's targets judged
on results/h200/decode.json, the paged and ragged-batch parts, the Nsight Compute reports of the split kernel and
the generation demo's record (results/h200/generation.json). A file or part not recorded yet gives one line.
"""
from __future__ import annotations

import functools
from pathlib import Path

from flashattn.book import plots
from flashattn.book.decoding import (
    BANDWIDTH_FRACTION,
    COLUMNS,
    CUDNN_FRACTION,
    DATASHEET_BYTES_PER_S,
    GENERATION,
    GQA_FLOOR_FRACTION,
    PAGED_PROFILES,
    PAGED_SLACK,
    PROFILES,
    RAGGED_SLACK,
    ROWS16_US,
    not_recorded,
    ok,
    part_rows,
    record,
)
from flashattn.book.figures import show_or_return
from flashattn.book.notebook import md
from flashattn.book.records import ncu_report_importable
from flashattn.measure import ncu, results


def ceiling_tb_per_s(doc: dict | None) -> float | None:
    r = next((r for r in part_rows(doc, "ceiling") if r["column"] == "torch.sum" and ok(r)), None)
    return r["tb_per_s"] if r else None


def peers_table(doc: dict | None = None):
    """Per peers shape: the floor, then µs, TB/s and % of the floor (floor / time) of every column."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "peers")
    if not rows:
        return md(not_recorded("peers"))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    cols = [c for c in COLUMNS if any(r["column"] == c for r in rows)]
    got = {(r["shape"], r["column"]): r for r in rows}
    lines = ["| shape | floor µs | " + " | ".join(f"{COLUMNS[c]}: µs, TB/s, % of floor" for c in cols) + " |",
             "|---|--:|" + "--:|" * len(cols)]
    skipped = {}
    for s in shapes:
        floor = next(r["floor_us"] for r in rows if r["shape"] == s)
        cells = []
        for c in cols:
            r = got.get((s, c))
            if ok(r):
                cells.append(f"{r['median_us']:,.1f}, {r['tb_per_s']:.2f}, {100 * r['floor_us'] / r['median_us']:.0f}%")
            else:
                cells.append("not run")
                skipped.setdefault(c, (r or {}).get("message", "no row"))
        lines.append(f"| {s} | {floor:,.1f} | " + " | ".join(cells) + " |")
    note = "Each shape's columns timed in one interleaved run."
    note += "".join(f" {COLUMNS[c]} not run: {m}." for c, m in skipped.items())
    return md("\n".join(lines) + "\n\n" + note)


def peer_lines(doc: dict | None = None) -> str:
    """Per peers shape: our time against the fastest other column's, and our bandwidth against the plain read
    of the ceiling part."""
    doc = record() if doc is None else doc
    rows = [r for r in part_rows(doc, "peers") if ok(r)]
    if not rows:
        return not_recorded("peers").strip("*")
    top, out = ceiling_tb_per_s(doc), []
    for s in dict.fromkeys(r["shape"] for r in rows):
        mine = next((r for r in rows if r["shape"] == s and r["column"] == "ours"), None)
        others = [r for r in rows if r["shape"] == s and r["column"] != "ours"]
        if mine is None:
            out.append(f"{s}: ours not timed")
            continue
        line = f"{s}:"
        if others:
            best = min(others, key=lambda r: r["median_us"])
            who = COLUMNS.get(best["column"], best["column"])
            line += f" {mine['median_us'] / best['median_us']:.2f}× the time of {who}"
        if top:
            line += f"{',' if others else ''} {100 * mine['tb_per_s'] / top:.0f}% of torch.sum's bandwidth"
        out.append(line)
    return "\n".join(out)


def _target(what: str, met: bool | None, detail: str) -> dict:
    return dict(target=what, met=met, detail=detail)


def targets(doc: dict | None = None) -> list[dict]:
    """The issue's targets, each judged on the record: met True/False, or None when its rows are missing."""
    doc = record() if doc is None else doc
    peers = {(r["shape"], r["column"]): r for r in part_rows(doc, "peers") if ok(r)}
    out = []
    ours, cudnn = peers.get(("batch8_16k", "ours")), peers.get(("batch8_16k", "cudnn"))
    what = "batch8_16k: at most cuDNN's time"
    out.append(_target(what, None, "not recorded") if not (ours and cudnn) else
               _target(what, ours["median_us"] <= CUDNN_FRACTION * cudnn["median_us"],
                       f"ours {ours['median_us']:,.1f} µs, cuDNN {cudnn['median_us']:,.1f} µs"))
    what = f"batch8_16k: at least {BANDWIDTH_FRACTION:.0%} of 4.8 TB/s"
    out.append(_target(what, None, "not recorded") if not ours else
               _target(what, ours["tb_per_s"] * 1e12 >= BANDWIDTH_FRACTION * DATASHEET_BYTES_PER_S,
                       f"{ours['tb_per_s']:.2f} TB/s = {ours['tb_per_s'] * 1e14 / DATASHEET_BYTES_PER_S:.1f}%"))
    r = peers.get(("rows16_32k", "ours"))
    what = f"rows16_32k: at most {ROWS16_US:.0f} µs"
    out.append(_target(what, None, "not recorded") if not r else
               _target(what, r["median_us"] <= ROWS16_US, f"{r['median_us']:,.1f} µs"))
    r = peers.get(("gqa64_8k", "ours"))
    what = f"gqa64_8k: at least {GQA_FLOOR_FRACTION:.0%} of the floor's speed"
    out.append(_target(what, None, "not recorded") if not r else
               _target(what, r["floor_us"] / r["median_us"] >= GQA_FLOOR_FRACTION,
                       f"floor {r['floor_us']:,.1f} µs / {r['median_us']:,.1f} µs = "
                       f"{100 * r['floor_us'] / r['median_us']:.1f}%"))
    paged = {(r["shape"], r["column"]): r for r in part_rows(doc, "paged") if ok(r)}
    what = f"paged within {PAGED_SLACK:.0%} of contiguous"
    pairs = [(s, c, paged[(s, "contiguous")], r) for (s, c), r in paged.items()
             if c.startswith("paged") and (s, "contiguous") in paged]
    if not pairs:
        out.append(_target(what, None, "not recorded"))
    for s, c, base, r in pairs:
        out.append(_target(f"{s}, {c}: {what}", r["median_us"] <= (1 + PAGED_SLACK) * base["median_us"],
                           f"{r['median_us']:,.1f} µs against {base['median_us']:,.1f} µs "
                           f"({100 * (r['median_us'] / base['median_us'] - 1):+.1f}%)"))
    lengths = {r["column"]: r for r in part_rows(doc, "lengths") if ok(r)}
    spread, even = lengths.get("spread 1..32k"), lengths.get("even, same total")
    what = f"lengths 1..32k within {RAGGED_SLACK:.0%} of the same total spread evenly"
    out.append(_target(what, None, "not recorded") if not (spread and even) else
               _target(what, spread["median_us"] <= (1 + RAGGED_SLACK) * even["median_us"],
                       f"{spread['median_us']:,.1f} µs against {even['median_us']:,.1f} µs "
                       f"({100 * (spread['median_us'] / even['median_us'] - 1):+.1f}%)"))
    return out


def anatomy_table(doc: dict | None = None):
    """Where a call's time goes (the `anatomy` part): the event-timed median of the peers part beside the
    profiler's span of the call and its kernels, with the merge launched as a dependent (the default) and
    after the split (DECODE_PDL=0). A dependent merge is resident while it waits, so its own duration
    counts the wait: the merge's time is read from the ordinary launch."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "anatomy")
    if not rows:
        return md(not_recorded("anatomy"))
    timed = {r["shape"]: r for r in part_rows(doc, "peers") if r["column"] == "ours" and ok(r)}
    by = {(r["shape"], r["column"].startswith("ours, merge launched after")): r for r in rows}
    lines = ["| shape | floor | event-timed | span | split kernel | merge kernel (ordinary launch) | "
             "span, ordinary launch |", "|---|--:|--:|--:|--:|--:|--:|"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        pdl, plain = by.get((shape, False)), by.get((shape, True))
        if not (pdl and plain):
            continue
        split = pdl["kernels"][0]["median_us"]
        merge = f"{plain['kernels'][1]['median_us']:,.1f}" if len(plain["kernels"]) > 1 else "—"
        event = f"{timed[shape]['median_us']:,.1f}" if shape in timed else "—"
        lines.append(f"| {shape} | {pdl['floor_us']:,.1f} | {event} | {pdl['span_us']:,.1f} | {split:,.1f} | {merge} | "
                     f"{plain['span_us']:,.1f} |")
    return md("\n".join(lines) + "\n\nMedian µs. Span: from the first kernel's start to the last one's end on the "
              "GPU (torch.profiler), with the merge launched as a programmatic dependent of the split kernel, "
              "the default; the last column with an ordinary launch. Event-timed: the peers part's median.")


def paged_profile_table(paths: dict[str, Path] = PAGED_PROFILES):
    """Nsight Compute on batch8_16k from a contiguous cache and from pages of 64 rows, before and after the
    copies' addresses were stepped instead of multiplied: kernel time, DRAM throughput, warp instructions."""
    lines = ["| build | cache | kernel (µs) | DRAM, % of peak | warp instructions |", "|---|---|--:|--:|--:|"]
    for when, path in paths.items():
        doc = results.read_if_exists(path, "decode")
        for r in doc["rows"] if doc else []:
            lines.append(f"| {when} | {r['build']} | {r['duration_us']:,.1f} | {r['dram_pct']:.1f}% | "
                         f"{r['inst_executed'] / 1e6:,.0f} M |")
    if len(lines) == 2:
        return md("*Not recorded yet: results/h200/decode_paged_profile*.json "
                  "(`python -m flashattn.measure.decode_bench --profile`).*")
    return md("\n".join(lines))


def hot_lines(when: str = "before", build: str = "paged64", top: int = 4, paths: dict[str, Path] = PAGED_PROFILES):
    """The source lines of kernels/decode.cu that executed the most warp instructions in one profiled build."""
    doc = results.read_if_exists(paths[when], "decode")
    r = next((r for r in doc["rows"] if r["build"] == build), None) if doc else None
    if r is None:
        return md(f"*No {build} profile recorded ({Path(paths[when]).name}).*")
    lines = ["| line | warp instructions | source |", "|--:|--:|---|"]
    lines += [f"| {x['line']} | {x['inst_executed'] / 1e6:,.1f} M | `{x['text']}` |" for x in r["lines"][:top]]
    return md("\n".join(lines) + f"\n\n{build}, {when}: {r['inst_executed'] / 1e6:,.0f} M warp instructions in all.")


def target_lines(doc: dict | None = None) -> str:
    word = {True: "met", False: "missed", None: "not recorded"}
    return "\n".join(f"{word[t['met']]:>12}  {t['target']}: {t['detail']}" if t["met"] is not None
                     else f"{word[None]:>12}  {t['target']}" for t in targets(doc))


def paged_table(doc: dict | None = None):
    """Contiguous against paged caches (pages of 64 and 256 rows in shuffled order), ours and FA4."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "paged")
    if not rows:
        return md(not_recorded("paged"))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    cols = list(dict.fromkeys(r["column"] for r in rows))
    got = {(r["shape"], r["column"]): r for r in rows}
    lines = ["| shape | " + " | ".join(cols) + " |", "|---|" + "--:|" * len(cols)]
    for s in shapes:
        base = {who: got.get((s, f"{who}contiguous")) for who in ("", "fa4 ")}
        cells = []
        for c in cols:
            r, ref = got.get((s, c)), base["fa4 " if c.startswith("fa4") else ""]
            if not ok(r):
                cells.append("not run")
            elif ok(ref) and r is not ref:
                cells.append(f"{r['median_us']:,.1f} ({100 * (r['median_us'] / ref['median_us'] - 1):+.1f}%)")
            else:
                cells.append(f"{r['median_us']:,.1f}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return md("\n".join(lines) + "\n\nMedian µs; in brackets the change against the same attention's contiguous "
              "cache.")


def lengths_table(doc: dict | None = None):
    """The ragged batch (lengths 1 to 32k) against the same total spread evenly and against padding."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "lengths")
    if not rows:
        return md(not_recorded("lengths"))
    lines = ["| case | bytes to read | µs | TB/s | % of floor |", "|---|--:|--:|--:|--:|"]
    for r in rows:
        cell = (f"{r['median_us']:,.1f} | {r['tb_per_s']:.2f} | {100 * r['floor_us'] / r['median_us']:.0f}%"
                if ok(r) else "not run | | ")
        lines.append(f"| {r['column']} | {r['bytes'] / 1e9:.2f} GB | {cell} |")
    B, H_q, H_kv, M, N, D = rows[0]["dims"]
    return md("\n".join(lines) + f"\n\nB = {B}, H_q/H_kv = {H_q}/{H_kv}, D = {D}; each floor counts that case's valid "
              "keys.")


@functools.cache
def _summary(path: str, mtime_ns: int) -> dict:
    return ncu.summarize(path)


def profile_summaries(paths: dict[str, Path] = PROFILES) -> dict[str, dict]:
    """name -> flashattn.measure.ncu's summary, for every report that exists and can be read here."""
    if not any(Path(p).exists() for p in paths.values()) or not ncu_report_importable():
        return {}
    return {n: _summary(str(p), Path(p).stat().st_mtime_ns) for n, p in paths.items() if Path(p).exists()}


def profile_lines(paths: dict[str, Path] = PROFILES) -> str:
    """Per report: the tensor pipe's utilisation beside the DRAM throughput; one line when none is recorded."""
    got = profile_summaries(paths)
    if not got:
        return ("No Nsight Compute report of the split kernel recorded yet (results/h200/decode_*_profile.ncu-rep, "
                "from `python -m flashattn.measure.decode_bench --profile`).")
    out = []
    for name, s in got.items():
        pipe = "—" if s.get("tensor_pipe_pct") is None else f"{s['tensor_pipe_pct']:.1f}%"
        dram = "—" if s.get("dram_throughput_pct") is None else f"{s['dram_throughput_pct']:.1f}%"
        bw = "—" if not s.get("dram_bytes_per_s") else f"{s['dram_bytes_per_s'] / 1e12:.2f} TB/s"
        blocks = "" if s.get("blocks_per_sm") is None else f"; {s['blocks_per_sm']:.0f} blocks/SM"
        out.append(f"{name}: tensor pipe busy {pipe} of active cycles; DRAM {dram} of peak ({bw}){blocks}")
    return "\n".join(out)


def profile_roofline(paths: dict[str, Path] = PROFILES, show: bool = True):
    """The reports' points on Nsight Compute's roofline (flashattn.book.plots); nothing when none is recorded."""
    got = profile_summaries(paths)
    if not got:
        return None
    fig, _ = plots.roofline([plots.point_from_summary(f"decode {n}", s) for n, s in got.items()],
                            title="The split kernel on the roofline (tensor-core ops count the padded rows)")
    return show_or_return(fig, show)


LABELS = {"flashattn": "ours", "sdpa": "SDPA", "fa4": "FA4"}


def generation_table(path: Path = GENERATION):
    """The generation demo's tokens per second per batch and attention, and how each agrees with SDPA."""
    doc = results.read_if_exists(path, "generation")
    if doc is None:
        return md(f"*Not recorded yet: `results/h200/{Path(path).name}` (`python -m flashattn.book.generation`).*")
    done = [r for r in doc["rows"] if r.get("status") == "ok"]
    sdpa = {r["batch"]: r for r in done if r["attention"] == "sdpa"}
    lines = ["| batch | attention | tokens/s | vs. SDPA | max rel. Δlogit | agreeing to the end | "
             "first divergence at a near-tie |", "|--:|---|--:|--:|--:|--:|--:|"]
    for r in sorted(done, key=lambda r: (r["batch"], list(LABELS).index(r["attention"]) if r["attention"] in LABELS
                                       else 9)):
        ref = sdpa.get(r["batch"])
        vs = r.get("vs_sdpa") or {}
        ratio = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}×" if ref and r is not ref else "—"
        agree = f"{vs['sequences_agreeing']} of {r['batch']}" if vs else "—"
        diff = f"{vs['max_rel_logit_diff']:.1e}" if vs else "—"
        firsts = vs.get("first_divergences") or []
        ties = f"{sum(bool(d.get('near_tie')) for d in firsts)} of {len(firsts)}" if vs else "—"
        lines.append(f"| {r['batch']} | {LABELS.get(r['attention'], r['attention'])} | {r['tokens_per_s']:,.0f} | "
                     f"{ratio} | {diff} | {agree} | {ties} |")
    st, model = doc["settings"], doc["meta"].get("model", {})
    note = (f"{model.get('n_layer', '?')} layers of {model.get('n_head', '?')} heads, "
            f"D = {model.get('head_dim', '?')}; a {st.get('prompt_len', '?')}-token prompt, then "
            f"{st.get('new_tokens', '?')} greedy steps. Δlogit: "
            "teacher-forced on SDPA's tokens; agreeing: sequences whose greedy tokens match SDPA's throughout; "
            "near-tie: the two best logits differ by at most twice the logit difference there.")
    note += "".join(f" {LABELS.get(r['attention'], r['attention'])} not run: {r.get('reason', '')}."
                    for r in doc["rows"] if r.get("status") == "skipped")
    return md("\n".join(lines) + "\n\n" + note)
