"""V8's measured timeline: clock stamps written by the instrumented build (kernels/v8.cu, V8_TRACE=1).

On the GPU, `python -m flashattn.book.trace [--out results/h200/v8_trace.json] [--flags=-DV8_...=...]` builds
the traced kernel (with a candidate's macros), runs it at the chapter's shapes, times it beside the
untraced build (what the stamps cost) and writes a record. Everywhere else the functions below read that
record: `timeline` turns one work item's stamps into segments (producer, consumer 0, consumer 1, ...),
`fig_timeline` draws them, `summarize` gives the medians over the traced items, `table` prints them.

The buffer (`buffer`) is [items][ROLES][1 + tiles][WORDS] int64: role 0 the producer, 1.. the consumer
warpgroups; row 0 a header, row 1 + t the clock64 stamps of key tile t (-1: not written). The indices
below are the kernel's enums (TraceHeader, TraceConsumer, TraceProducer); tests/test_schedule.py checks
that they agree with the .cu file.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch

from flashattn import loader
from flashattn.book.figures import show_or_return
from flashattn.measure import results, timing
from flashattn.reference import attention_reference, relative_error

ROLES, WORDS = 4, 10
HEADER = ["smid", "gt0", "clk0", "gt1", "clk1", "tiles", "m_block", "bh", "q", "end"]
CONSUMER = ["kwait", "kready", "vready", "turnwait", "turn", "s_issued", "s_done", "softmax_end",
            "pv_issued", "pv_done"]
PRODUCER = ["kwait", "k_issued", "vwait", "v_issued"]
KIND = "trace"                     # the record's kind (flashattn.measure.results): a row per shape
RECORD = results.H200 / "v8_trace.json"

# (name, first stamp, last stamp, which tile the last stamp is read from: 0 same, 1 next) per segment kind
CONSUMER_SEGMENTS = [("K wait", "kwait", "kready"), ("turn wait", "turnwait", "turn"),
                     ("S = Q K^T", "s_issued", "s_done"), ("softmax", "s_done", "softmax_end"),
                     ("P V", "pv_issued", "pv_done")]
PRODUCER_SEGMENTS = [("K slot wait", "kwait", "k_issued"), ("V slot wait", "vwait", "v_issued")]


def buffer(items: int, N: int, device="cuda"):
    """A trace buffer for `items` work items of a problem with N keys (rows for B_c = 64, the smallest)."""
    return torch.full((items, ROLES, 1 + math.ceil(N / 64), WORDS), -1, dtype=torch.int64, device=device)


def build(flags=(), name: str = "trace"):
    """kernels/v8.cu with -DV8_TRACE=1 (and `flags`), exporting forward and forward_trace."""
    return loader.build("v8", archs=["9.0a"], module_name=f"flashattn_v8_{name}",
                        extra_cuda_cflags=["-DV8_TRACE=1", *flags], functions=("forward", "forward_trace"))


def _role_rows(raw, item: int, role: int) -> tuple[dict, list[dict]]:
    """Header and per-tile stamps (dicts, -1 left out) of one role of one item of a raw nested list."""
    rows = raw[item][role]
    head = dict(zip(HEADER, rows[0]))
    names = PRODUCER if role == 0 else CONSUMER
    tiles = [{n: v for n, v in zip(names, row) if v >= 0} for row in rows[1:1 + max(0, head["tiles"])]]
    return head, tiles


def clock_ghz(raw) -> float:
    """SM clock in GHz: clock64 cycles over %globaltimer nanoseconds across every traced role (the median)."""
    rates = []
    for item in raw:
        for rows in item:
            h = dict(zip(HEADER, rows[0]))
            if h["gt0"] >= 0 and h["gt1"] > h["gt0"] + 2000:
                rates.append((h["clk1"] - h["clk0"]) / (h["gt1"] - h["gt0"]))
    rates.sort()
    return rates[len(rates) // 2] if rates else float("nan")


def timeline(run: dict, item: int | None = None) -> list[tuple[str, str, int, float, float]]:
    """Segments (row, kind, tile, start_ns, end_ns) of one kept work item of a recorded run, times from the
    item's first stamp. Rows: "producer", "consumer 0", ...; kinds: CONSUMER_SEGMENTS / PRODUCER_SEGMENTS
    names (the producer also gets "Q_i + K_0 issued" as an instant)."""
    raw = run["items"][0 if item is None else item]["stamps"]
    ghz = run["clock_ghz"]
    starts = [r[0][HEADER.index("clk0")] for r in raw if r[0][HEADER.index("clk0")] >= 0]
    t0 = min(starts)
    segments = []
    for role in range(len(raw)):
        if raw[role][0][HEADER.index("clk0")] < 0:
            continue
        head, tiles = _role_rows([raw], 0, role)
        row = "producer" if role == 0 else f"consumer {role - 1}"
        kinds = PRODUCER_SEGMENTS if role == 0 else CONSUMER_SEGMENTS
        for t, stamps in enumerate(tiles):
            for kind, a, b in kinds:
                if a in stamps and b in stamps:
                    segments.append((row, kind, t, (stamps[a] - t0) / ghz, (stamps[b] - t0) / ghz))
        if role > 0 and head["end"] >= 0 and tiles and "pv_done" in tiles[-1]:
            segments.append((row, "write O_i", len(tiles) - 1, (tiles[-1]["pv_done"] - t0) / ghz,
                             (head["end"] - t0) / ghz))
    return segments


def summarize(raw, ghz: float) -> dict:
    """Medians in ns over every traced item and every inner tile (not the first or the last): each consumer
    segment, the producer's waits for a free slot, the tile period (turn to turn of one consumer), the
    items' length, their prologue (start to the first S issued) and epilogue (last P V done to O_i written),
    and how often the consumers' turns alternate strictly (ping-pong)."""
    acc: dict[str, list[float]] = {}
    alternations = turns = 0
    for i in range(len(raw)):
        item_turns = []
        for role in range(ROLES):
            if raw[i][role][0][HEADER.index("clk0")] < 0:
                continue
            head, tiles = _role_rows(raw, i, role)
            if not tiles:
                continue
            if role == 0:
                for kind, a, b in PRODUCER_SEGMENTS:
                    acc.setdefault("producer " + kind, []).extend(
                        (s[b] - s[a]) / ghz for s in tiles[1:-1] if a in s and b in s)
                continue
            for kind, a, b in CONSUMER_SEGMENTS:
                acc.setdefault(kind, []).extend((s[b] - s[a]) / ghz for s in tiles[1:-1] if a in s and b in s)
            acc.setdefault("tile period", []).extend(
                (tiles[t + 1]["turn"] - tiles[t]["turn"]) / ghz for t in range(1, len(tiles) - 2)
                if "turn" in tiles[t] and "turn" in tiles[t + 1])
            acc.setdefault("item", []).append((head["end"] - head["clk0"]) / ghz)
            if "s_issued" in tiles[0]:
                acc.setdefault("prologue", []).append((tiles[0]["s_issued"] - head["clk0"]) / ghz)
            if "pv_done" in tiles[-1]:
                acc.setdefault("epilogue", []).append((head["end"] - tiles[-1]["pv_done"]) / ghz)
            item_turns += [(s["turn"], role) for s in tiles if "turn" in s]
        item_turns.sort()
        turns += max(0, len(item_turns) - 1)
        alternations += sum(a[1] != b[1] for a, b in zip(item_turns, item_turns[1:]))
    out = {k: statistics.median(v) for k, v in acc.items() if v}
    out["alternating turns"] = alternations / turns if turns else None
    return out


def label(shape: dict) -> str:
    return (f"D={shape['D']}, B={shape['B']}, H={shape['H']}, M=N={shape['M']}"
            + (", causal" if shape["causal"] else ""))


# rows of `table`: summary key, what it measures
ROWS = [("tile period", "one consumer's turn to its next turn (a key tile)"),
        ("S = Q K^T", "S issued to its wait done"), ("softmax", "S done to softmax done"),
        ("P V", "P V issued to its wait done"), ("turn wait", "waiting for the ping-pong turn"),
        ("K wait", "waiting for K_j's TMA copy"), ("producer K slot wait", "producer waiting for a free K slot"),
        ("prologue", "item start to its first S issued"), ("epilogue", "last P V done to O_i written"),
        ("item", "one work item, start to O_i written")]


def table(doc: dict) -> str:
    """Markdown: the medians (ns) of every recorded shape side by side, the clock and what tracing cost."""
    runs = doc["rows"]
    head = "| median, ns | " + " | ".join(label(r["shape"]) for r in runs) + " |"
    lines = [head, "|---" * (len(runs) + 1) + "|"]
    for key, what in ROWS:
        cells = [r["summary"].get(key) for r in runs]
        lines.append(f"| {key} ({what}) | " + " | ".join("-" if c is None else f"{c:,.0f}" for c in cells) + " |")
    alt = [r["summary"].get("alternating turns") for r in runs]
    lines.append("| turns that alternate between the consumers | "
                 + " | ".join("-" if a is None else f"{100 * a:.1f}%" for a in alt) + " |")
    clocks = " | ".join(f"{r['clock_ghz']:.2f}" for r in runs)
    lines.append(f"| SM clock, GHz (clock64 / globaltimer) | {clocks} |")
    cost = []
    for r in runs:
        o = r.get("overhead_us", {})
        ok = isinstance(o.get("traced"), float) and isinstance(o.get("untraced"), float)
        cost.append(f"{o['untraced']:,.1f} -> {o['traced']:,.1f} us" if ok else "-")
    lines.append("| untraced -> traced build, same interleaved run | " + " | ".join(cost) + " |")
    return "\n".join(lines)


def load(path: Path = RECORD) -> dict | None:
    """A recorded trace (flashattn.measure.results, one row per shape), None when there is none."""
    return results.read_if_exists(path, KIND)


COLORS = {"K wait": "#bbbbbb", "turn wait": "#e8c547", "S = Q K^T": "#1f77b4", "softmax": "#ff7f0e",
          "P V": "#2ca02c", "write O_i": "#9467bd", "K slot wait": "#bbbbbb", "V slot wait": "#dddddd"}


def fig_timeline(run: dict, tiles: tuple[int, int] = (4, 8), item: int = 0, ax=None, show: bool = True):
    """One work item's measured timeline from consumer 0's turn for key tile tiles[0] to its turn for
    tiles[1]: a row per role, a bar per segment (cut at the window's edges). Upper lane: S (issue to its
    wait done) and the softmax; lower lane: P V (issue to its wait done), which runs under the next
    softmax; thin bars: waits."""
    segs = timeline(run, item)
    turns = {s[2]: s[4] for s in segs if s[0] == "consumer 0" and s[1] == "turn wait"}
    lo, hi = turns.get(tiles[0], 0.0), turns.get(tiles[1], max(s[4] for s in segs))
    inside = [(r, k, t, max(a, lo), min(b, hi)) for r, k, t, a, b in segs if b > lo and a < hi]
    rows = sorted({s[0] for s in segs}, key=lambda r: (r != "producer", r), reverse=True)
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(11, 0.8 + 0.8 * len(rows)))
    lanes = {"S = Q K^T": (0.2, 0.36), "softmax": (0.2, 0.36), "P V": (-0.2, 0.36), "write O_i": (-0.2, 0.36),
             "K slot wait": (0.2, 0.36), "V slot wait": (-0.2, 0.36)}
    for r, kind, t, a, b in inside:
        dy, h = lanes.get(kind, (0.0, 0.8))
        ax.barh(rows.index(r) + dy, (b - a) / 1e3, left=(a - lo) / 1e3, height=h, color=COLORS.get(kind, "gray"),
                edgecolor="black", linewidth=0.3)
        if kind in ("S = Q K^T", "P V") and b - a > 0.03 * (hi - lo):
            ax.text((a + b) / 2e3 - lo / 1e3, rows.index(r) + dy, str(t), ha="center", va="center", fontsize=7,
                    color="white")
    ax.set_yticks(range(len(rows)), rows)
    kinds = [k for k in COLORS if any(s[1] == k for s in inside)]
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], ncol=len(kinds), fontsize=7,
              loc="upper center", bbox_to_anchor=(0.5, -0.3))
    ax.set_title(f"measured, one block: {label(run['shape'])}, from consumer 0's turn for key tile {tiles[0]} "
                 f"to tile {tiles[1]} (numbers: key tile)", fontsize=9)
    ax.set_xlabel("microseconds (clock64 stamps of one lane per warpgroup, instrumented build)")
    if own:
        fig.tight_layout()
        return show_or_return(fig, show)
    return ax


# ---------------------------------------------------------------- recording (GPU)
SHAPES = [dict(B=2, H=16, M=8192, N=8192, D=128, causal=False), dict(B=4, H=12, M=2048, N=2048, D=64, causal=False),
          dict(B=2, H=16, M=8192, N=8192, D=128, causal=True), dict(B=4, H=12, M=2048, N=2048, D=64, causal=True)]


def capture(module, shape: dict, dtype=None, seed: int = 0):
    """Run the traced kernel once (after a warm-up call) on fresh random inputs, every item traced;
    returns (output, raw nested list [items][roles][1 + tiles][words])."""
    dtype = dtype or torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(seed)
    B, H, M, N, D = (shape[k] for k in "BHMND")
    q = torch.randn(B, H, M, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g)
    items = B * H * math.ceil(M / 64)          # at least the blocks of any B_r
    buf = buffer(items, N)
    module.forward_trace(q, k, v, shape["causal"], buf)
    buf.fill_(-1)
    out = module.forward_trace(q, k, v, shape["causal"], buf)
    torch.cuda.synchronize()
    used = int((buf[:, :, 0, HEADER.index("clk0")] >= 0).any(dim=1).sum())
    return (q, k, v, out), buf[:used].cpu()


def record_run(module, shape: dict, keep: int = 2, most: int = 600) -> dict:
    """Capture one shape; keep the stamps of `keep` items from the middle of the launch (steady state) and
    summarize at most `most` items around it (Python loops: a few seconds)."""
    (q, k, v, out), stamps = capture(module, shape)
    first = max(0, len(stamps) // 2 - most // 2)
    raw = stamps[first:first + most].tolist()
    ghz = clock_ghz(raw)
    ref = attention_reference(q[:1, :1], k[:1, :1], v[:1, :1], causal=shape["causal"])
    err = relative_error(out[:1, :1].double(), ref)
    lengths = [dict(zip(HEADER, it[1][0]))["tiles"] for it in raw]
    full = [i for i, n in enumerate(lengths) if n == max(lengths)]
    picks = full[len(full) // 2:len(full) // 2 + keep]
    return {"shape": shape, "clock_ghz": ghz, "items_traced": len(stamps),
            "items_summarized": [first, first + len(raw)], "rel_error_head0": err, "summary": summarize(raw, ghz),
            "items": [{"item": first + i, "stamps": raw[i]} for i in picks]}


def overhead(shape: dict, traced, plain) -> dict:
    """The traced and the untraced build timed in one interleaved run (flashattn.measure.timing), median us."""
    B, H, M, N, D = (shape[k] for k in "BHMND")
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for L in (M, N, N))
    buf = buffer(B * H * math.ceil(M / 64), N)
    calls = {"untraced": (lambda: plain.forward(q, k, v, shape["causal"]), contextlib.nullcontext),
             "traced": (lambda: traced.forward_trace(q, k, v, shape["causal"], buf), contextlib.nullcontext)}
    res = timing.time_interleaved(calls)
    return {name: (t.median_ms * 1e3 if isinstance(t, timing.Timing) else repr(t)) for name, t in res.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RECORD)
    ap.add_argument("--flags", action="append", default=[],
                    help="an extra -D flag for both builds, as --flags=-DNAME=VALUE (repeat for more)")
    args = ap.parse_args(argv)
    tag = "".join(f.replace("-D", "_").replace("=", "") for f in args.flags)
    traced = build(args.flags, name="trace" + tag)
    # without flags, the default build under tests/test_v8.py's module name (one build serves both)
    plain = loader.build("v8", archs=["9.0a"], extra_cuda_cflags=list(args.flags),
                         module_name="flashattn_v8_" + ("untraced" + tag if tag else "default"))
    meta = dict(results.environment(argv, prog="python -m flashattn.book.trace"), flags=args.flags)
    rows = []
    for shape in SHAPES:
        run = record_run(traced, shape)
        run["overhead_us"] = overhead(shape, traced, plain)
        rows.append(run)
        print(json.dumps({k: run[k] for k in ("shape", "clock_ghz", "overhead_us", "summary")}), flush=True)
        # after every shape, so that a killed run keeps what it has; one line: every stamp of the kept items
        results.write(args.out, KIND, rows, meta, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
