"""The Decoding lab's block-by-block timeline (book/decoding_lab.ipynb), from results/h200/decode_timeline.json
(flashattn.measure.decode_timeline: a DECODE_TRACE build's global-timer stamps of every block).

- `timeline_table`: per shape, the median over the traced calls of each number `decode_timeline.summary` gives;
- `timeline_figure`: one call's blocks as bars (ramp to the first tile, streaming, the end), the merge's after;
- `budget_lines`: what the streaming pace alone leaves for everything else against a time target.
"""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt

from flashattn.book.figures import show_or_return
from flashattn.book.notebook import md
from flashattn.measure import results
from flashattn.measure.results import H200

TIMELINE = H200 / "decode_timeline.json"


def record(path=TIMELINE) -> dict | None:
    return results.read_if_exists(path, "decode_timeline")


def _median(rows: list[dict], key: str, sub: str | None = None) -> float:
    return statistics.median(r["summary"][key][sub] if sub else r["summary"][key] for r in rows)


def by_shape(doc: dict) -> dict[str, list[dict]]:
    shapes: dict[str, list[dict]] = {}
    for r in doc["rows"]:
        shapes.setdefault(r["shape"], []).append(r)
    return shapes


def timeline_table(doc: dict | None = None):
    doc = record() if doc is None else doc
    if doc is None:
        return md("*Not recorded yet: run `python -m flashattn.measure.decode_timeline --out results/h200`.*")
    lines = ["| shape | blocks | splits | floor | first tile | streaming, median block (min–max) | "
             "median block's pace | last block ends | tail | merge ends |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for shape, rows in by_shape(doc).items():
        s0 = rows[0]["summary"]
        merge = f"{_median(rows, 'merge_end_us'):,.1f}" if "merge_end_us" in s0 else "—"
        lines.append(
            f"| {shape} | {s0['blocks']} | {rows[0]['splits']} | {s0['floor_us']:,.1f} | "
            f"{_median(rows, 'first_tile_us'):.1f} | {_median(rows, 'streaming_us', 'median'):,.1f} "
            f"({_median(rows, 'streaming_us', 'min'):,.1f}–{_median(rows, 'streaming_us', 'max'):,.1f}) | "
            f"{_median(rows, 'median_block_tb_per_s'):.2f} TB/s | {_median(rows, 'split_kernel_us'):,.1f} | "
            f"{_median(rows, 'tail_us'):.1f} | {merge} |")
    calls = doc["settings"]["calls"]
    return md("\n".join(lines) + f"\n\nµs from the first block's start, the median over {calls} traced calls (L2 "
              "flushed before each). First tile: from a block's start until its first K/V tile has landed. "
              "Streaming: from then until its last tile has. Pace: the call's bytes over the median block's "
              "streaming time. Tail: the last block's end after the median block's.")


def timeline_figure(shape: str = "rows16_32k", doc: dict | None = None, show: bool = True):
    """The middle traced call at `shape`: a bar per block, sorted by its end (ramp, streaming, end), and one bar
    for the merge kernel's blocks from the first's start to the last's end."""
    doc = record() if doc is None else doc
    if doc is None:
        print("not recorded yet: python -m flashattn.measure.decode_timeline --out results/h200")
        return None
    rows = by_shape(doc)[shape]
    call = sorted(rows, key=lambda r: r["summary"]["split_kernel_us"])[len(rows) // 2]
    blocks = sorted(call["split"], key=lambda b: b[4])
    fig, ax = plt.subplots(figsize=(9, 3.6), constrained_layout=True)
    y = range(len(blocks))
    us = [[t / 1e3 for t in b[1:]] for b in blocks]
    ax.barh(y, [u[1] - u[0] for u in us], left=[u[0] for u in us], height=1, color="C1", label="until the first tile")
    ax.barh(y, [u[2] - u[1] for u in us], left=[u[1] for u in us], height=1, color="C0", label="streaming")
    ax.barh(y, [u[3] - u[2] for u in us], left=[u[2] for u in us], height=1, color="C3",
            label="after the last tile (merge of warps, partial output)")
    if call["merge"]:
        start = min(m[1] for m in call["merge"]) / 1e3
        end = max(m[2] for m in call["merge"]) / 1e3
        ax.barh(len(blocks) + 6, end - start, left=start, height=10, color="C2", label="merge kernel")
    floor = call["summary"]["floor_us"]
    ax.axvline(floor, ls=":", color="0.3")
    ax.text(floor, len(blocks) * 0.5, f" floor {floor:.0f} µs", fontsize=8, va="center", ha="right", rotation=90)
    ax.set(xlabel="µs from the first block's start", ylabel="blocks, by end",
           title=f"{shape}: {len(blocks)} blocks, {call['splits']} splits (one traced call)")
    ax.legend(fontsize=8, loc="lower left")
    return show_or_return(fig, show)


def budget_lines(shape: str = "rows16_32k", target_us: float = 125.0, doc: dict | None = None) -> str:
    """The streaming window at the median block's pace against `target_us`, and what is left for the rest."""
    doc = record() if doc is None else doc
    if doc is None:
        return "*Not recorded yet.*"
    rows = by_shape(doc)[shape]
    streaming = _median(rows, "streaming_us", "median")
    end = _median(rows, "merge_end_us") if "merge_end_us" in rows[0]["summary"] else _median(rows, "split_kernel_us")
    return (f"At {shape} the median block streams for {streaming:,.1f} µs and the call's last kernel ends "
            f"{end:,.1f} µs after the first block starts: {end - streaming:,.1f} µs go to the ramp, the ends of "
            f"the blocks and the merge. A {target_us:g} µs target leaves {target_us - streaming:,.1f} µs for all "
            "of that, and for the launch itself, at this pace.")
