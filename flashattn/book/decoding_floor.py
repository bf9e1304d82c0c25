"""The Decoding lab's read floor (book/decoding_lab.ipynb): what reading a call's bytes costs on the H200 when
nothing is computed, from results/h200/decode_floor.json (`python -m flashattn.measure.decode_bench --parts
floor`), and why the cluster merge lost, from results/h200/decode_timeline_cluster.json (a DECODE_TRACE build
of it, `python -m flashattn.measure.decode_timeline --flags=-DDECODE_CLUSTER_MERGE=1`).

- `floor_table`: every column of the floor part at every shape, µs and TB/s;
- `floor_lines`: at one shape, the fastest read that computes nothing against a time target and against ours;
- `fixed_cost`, `fixed_cost_lines`, `fit_figure`: the line time = fixed + bytes / pace through two sizes;
- `bytes_for_fraction`: how many bytes a call must read, on that line, to reach a fraction of 4.8 TB/s;
- `cluster_waves`: how the cluster build's blocks were placed: how many started late, and by how much.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from flashattn.book.decoding import DATASHEET_BYTES_PER_S, ROWS16_US, ok, part_rows
from flashattn.book.figures import show_or_return
from flashattn.book.notebook import md
from flashattn.measure import results
from flashattn.measure.results import H200

FLOOR = H200 / "decode_floor.json"
CLUSTER_TIMELINE = H200 / "decode_timeline_cluster.json"
OURS = "ours"
BUILDS = ("ours, no arithmetic", "ours, splits interleaved", "ours, merge in a cluster")   # our kernel's builds
LATE_NS = 1000          # a block that starts this long after the first belongs to a later wave


def record(path=FLOOR) -> dict | None:
    return results.read_if_exists(path, "decode")


def _missing(path) -> str:
    return f"*Not recorded yet: `results/h200/{path.name}`.*"


def floor_table(doc: dict | None = None):
    """Rows: the floor part's columns in the order they were timed; columns: its shapes, each cell µs (TB/s)."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "floor")
    if not rows:
        return md(_missing(FLOOR))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    columns = list(dict.fromkeys(r["column"] for r in rows))
    got = {(r["shape"], r["column"]): r for r in rows}
    lines = ["| read | " + " | ".join(f"{s}: µs (TB/s)" for s in shapes) + " |", "|---|" + "--:|" * len(shapes)]
    for c in columns:
        cells = [f"{r['median_us']:,.1f} ({r['tb_per_s']:.2f})" if ok(r := got.get((s, c))) else "not run"
                 for s in shapes]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    floors = ", ".join(f"{s} {next(r['floor_us'] for r in rows if r['shape'] == s):,.1f} µs" for s in shapes)
    note = f"Each shape's reads timed in one interleaved run. The floor at 4.8 TB/s: {floors}."
    return md("\n".join(lines) + "\n\n" + note)


def reads(doc: dict | None, shape: str) -> list[dict]:
    """The shape's rows that compute nothing: our kernel without its arithmetic and the plain reads."""
    return [r for r in part_rows(doc, "floor") if r["shape"] == shape and ok(r)
            and r["column"] not in (OURS, *BUILDS[1:])]


def floor_lines(shape: str = "rows16_32k", target_us: float = ROWS16_US, doc: dict | None = None) -> str:
    doc = record() if doc is None else doc
    found = reads(doc, shape)
    mine = next((r for r in part_rows(doc, "floor") if r["shape"] == shape and r["column"] == OURS and ok(r)), None)
    if not found or mine is None:
        return _missing(FLOOR).strip("*")
    best = min(found, key=lambda r: r["median_us"])
    return (f"At {shape} the fastest read that computes nothing, {best['column']}, took {best['median_us']:,.1f} µs "
            f"({best['tb_per_s']:.2f} TB/s): {100 * (best['median_us'] / target_us - 1):.1f}% above the "
            f"{target_us:.0f} µs target. Ours took {mine['median_us']:,.1f} µs, "
            f"{100 * (mine['median_us'] / best['median_us'] - 1):.1f}% behind that read.")


def cluster_waves(doc: dict | None = None) -> str:
    """Per traced call of the cluster build: the blocks that started a wave late, when, and the SMs used."""
    doc = results.read_if_exists(CLUSTER_TIMELINE, "decode_timeline") if doc is None else doc
    if doc is None:
        return _missing(CLUSTER_TIMELINE).strip("*")
    out = []
    for r in doc["rows"]:
        blocks = r["split"]      # per block: SM, then start, first tile, last tile, end (ns from the first start)
        t0 = min(b[1] for b in blocks)
        late = [b for b in blocks if b[1] - t0 > LATE_NS]
        first = {b[0] for b in blocks if b[1] - t0 <= LATE_NS}
        when = min((b[1] - t0 for b in late), default=0) / 1000
        out.append(f"call {r['call']}: {len(blocks) - len(late)} blocks on {len(first)} SMs at once, "
                   f"{len(late)} starting {when:,.0f} µs later")
    return f"{doc['rows'][0]['shape']}, the cluster build: " + "; ".join(out) + "."


def fixed_cost(column: str = "ours, no arithmetic", doc: dict | None = None) -> dict | None:
    """The line time = fixed + bytes / bandwidth through `column`'s two sizes of the floor part (rows16_32k and
    batch8_16k): what a call costs whatever it reads, and the pace beyond that. None when either is missing."""
    doc = record() if doc is None else doc
    got = {r["shape"]: r for r in part_rows(doc, "floor") if r["column"] == column and ok(r)}
    small, large = got.get("rows16_32k"), got.get("batch8_16k")
    if not (small and large):
        return None
    bytes_per_us = (large["bytes"] - small["bytes"]) / (large["median_us"] - small["median_us"])
    return dict(column=column, fixed_us=small["median_us"] - small["bytes"] / bytes_per_us,
                tb_per_s=bytes_per_us / 1e6, small=small, large=large)


def fixed_cost_lines(target_us: float = ROWS16_US, doc: dict | None = None) -> str:
    fit = fixed_cost(doc=doc)
    if fit is None:
        return _missing(FLOOR).strip("*")
    s = fit["small"]
    room = target_us - s["bytes"] / (fit["tb_per_s"] * 1e6)
    return (f"Through {fit['column']} at rows16_32k ({s['median_us']:,.1f} µs) and batch8_16k "
            f"({fit['large']['median_us']:,.1f} µs): a fixed {fit['fixed_us']:,.1f} µs per call, then "
            f"{fit['tb_per_s']:.2f} TB/s. At that pace rows16_32k's bytes alone take "
            f"{target_us - room:,.1f} µs, which leaves {room:,.1f} µs of the {target_us:.0f} µs target for "
            f"everything else.")


def bytes_for_fraction(fraction: float, doc: dict | None = None) -> float | None:
    """The bytes a call must read for the line's time to reach `fraction` of 4.8 TB/s (bytes / time =
    fraction x 4.8 TB/s), or None when the line's pace alone is below that (or nothing is recorded)."""
    fit = fixed_cost(doc=doc)
    if fit is None:
        return None
    goal = fraction * DATASHEET_BYTES_PER_S / 1e12                 # TB/s = bytes per ps
    if goal >= fit["tb_per_s"]:
        return None
    return fit["fixed_us"] * 1e-6 / (1 / (goal * 1e12) - 1 / (fit["tb_per_s"] * 1e12))


def fit_figure(target_us: float = ROWS16_US, doc: dict | None = None, show: bool = True):
    """Time above the floor (time - bytes / 4.8 TB/s) against bytes, for our call and every read that computes
    nothing at the floor part's two sizes: the line through our kernel without arithmetic, and the target at
    rows16_32k's bytes. (The steps of FLOOR_BUILDS are in the table, not here.)"""
    doc = record() if doc is None else doc
    fit = fixed_cost(doc=doc)
    if fit is None:
        print(_missing(FLOOR).strip("*"))
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
    rows = [r for r in part_rows(doc, "floor") if ok(r) and r["shape"] in ("rows16_32k", "batch8_16k")
            and r["column"] not in BUILDS[1:]]
    for i, column in enumerate(dict.fromkeys(r["column"] for r in rows)):
        pts = sorted((r["bytes"] / 1e6, r["median_us"] - r["floor_us"]) for r in rows if r["column"] == column)
        ax.plot(*zip(*pts, strict=True), "o-" if column.startswith("ours") else "o--", ms=5, lw=0.8,
                color=f"C{i}", label=column)
    small, large = fit["small"]["bytes"], fit["large"]["bytes"]
    over = 1 / (fit["tb_per_s"] * 1e6) - 1e6 / DATASHEET_BYTES_PER_S      # µs per byte beyond the floor's pace
    xs = [0, large * 1.05]
    ax.plot([x / 1e6 for x in xs], [fit["fixed_us"] + x * over for x in xs], "-", color="0.3", lw=1.5,
            label=f"{fit['fixed_us']:.1f} µs + bytes / {fit['tb_per_s']:.2f} TB/s, less the floor")
    ax.plot([small / 1e6], [target_us - small / DATASHEET_BYTES_PER_S * 1e6], "*", ms=13, color="k",
            label=f"rows16_32k's target ({target_us:.0f} µs)")
    ax.set(xlabel="MB read by the call", ylabel="µs above bytes / 4.8 TB/s", xlim=(0, None), ylim=(0, None),
           title="What a read costs beyond the floor, at two sizes")
    ax.legend(fontsize=7, loc="upper left")
    return show_or_return(fig, show)
