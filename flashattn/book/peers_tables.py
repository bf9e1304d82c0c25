"""The results chapter's Hopper tables: every bf16 version of ours beside cuDNN, FlashAttention-2 and
FlashAttention-4, forward (results/h200/bench_peers.json, bench_peers_seq.json) and backward
(results/h200/bench_backward.json), each row one interleaved run, ratios taken within it.

`python -m flashattn.measure.bench` made them (`scripts/record_h200.sh OUT peers backward`); FlashAttention-4
is a column where it imported on the GPU host (flashattn.measure.peers). A ratio above 1 means ours was faster.
"""
from __future__ import annotations

from pathlib import Path

from flashattn.book.notebook import md
from flashattn.book.records import RESULTS, bench_rows
from flashattn.measure import results
from flashattn.measure.table import comparison_table

PEERS = RESULTS / "bench_peers.json"
PEERS_SEQ = RESULTS / "bench_peers_seq.json"
BACKWARD = RESULTS / "bench_backward.json"
NAMES = {"v8": "V8", "v7": "V7", "v6": "V6", "v6_deterministic": "V6 det.", "v8_backward": "V8 bwd",
         "v8_backward_deterministic": "V8 bwd det.",
         "sdpa_cudnn": "cuDNN", "sdpa_flash": "FA2", "fa4": "FA4", "sdpa": "SDPA"}


def _key(r: dict) -> tuple:
    return r["batch_size"], r["num_heads"], r["seq_len_q"], r["seq_len_kv"], r["head_dim"], bool(r["causal"])


def _shapes(path: Path) -> dict[tuple, dict[str, dict]]:
    """{shape: {version: row}} of a bench record, in the order of its runs."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in bench_rows(path):
        out.setdefault(_key(r), {})[r["version"]] = r
    return out


def _us(row: dict | None) -> float | None:
    return row.get("median_us") if row and row.get("status") == "ok" else None


def _method(path: Path) -> str:
    rows = bench_rows(path)
    if not rows:
        return ""
    s, meta = rows[0]["_settings"], rows[0]["_meta"]
    fa4 = (meta.get("peers") or {}).get("fa4")
    slack = s.get("host_slack_us")
    medians = [r["host_median_us"] for r in rows if r.get("host_median_us") is not None]
    slowest = max((r["host_max_us"] for r in rows if r.get("host_max_us") is not None), default=None)
    return (f"Median µs of {s.get('repetitions')} calls in {s.get('rounds')} interleaved rounds per row, L2 flushed "
            f"before each call" + (f", the GPU held {slack:g} µs after each flush so that the host side of every "
                                    "call is hidden alike" if slack else ", no host slack") +
            (f" (the host's median time to enqueue a call was at most {max(medians):,.0f} µs in any row, the "
             f"slowest single call {slowest:,.0f} µs)" if medians else "") +
            f"; FlashAttention-4 {fa4 or 'not installed'}; `{path.relative_to(RESULTS.parent.parent)}` (commit "
            f"{(meta.get('git') or {}).get('commit', '?')}).")


def ratio_table(path: Path, ours: str, against: tuple[str, ...]) -> str | None:
    """flashattn.measure.table.comparison_table of the record (one row per shape: `ours`' µs and TFLOP/s, then
    each of `against` in µs and `ours` over it, above 1 when ours is faster), with the short names of this
    chapter in its header. None when the record is absent."""
    doc = results.read_if_exists(path, "bench")
    if doc is None:
        return None
    head, *rest = comparison_table(doc, ours, list(against), tflops=True).splitlines()
    for name in (ours, *against):
        head = head.replace(f" {name} (µs)", f" {NAMES[name]} µs").replace(f" vs {name} ", f" vs {NAMES[name]} ")
    head = head.replace(f"| {ours} vs ", f"| {NAMES[ours]} vs ")
    return "\n".join([head, *rest])


def forward_table(path: Path = PEERS):
    """V8, V7, V6 against cuDNN, FlashAttention-2 and FlashAttention-4 at every recorded forward shape."""
    table = ratio_table(path, "v8", ("fa4", "sdpa_cudnn", "sdpa_flash", "v7", "v6"))
    if table is None:
        return md("*Not recorded yet: `results/h200/bench_peers.json` (`scripts/record_h200.sh OUT peers`).*")
    return md(table + "\n\nbfloat16. " + _method(path))


def sequence_table(path: Path = PEERS_SEQ):
    """The same columns at one B, H, D over sequence lengths (non-causal)."""
    table = ratio_table(path, "v8", ("fa4", "sdpa_cudnn", "v7"))
    if table is None:
        return md("*Not recorded yet: `results/h200/bench_peers_seq.json` (`scripts/record_h200.sh OUT peers`).*")
    return md(table + "\n\nbfloat16. " + _method(path))


def backward_table(path: Path = BACKWARD, ours: str = "v6",
                   peers=("fa4", "sdpa_cudnn", "sdpa_flash", "v6_deterministic")):
    """The backward (dQ, dK, dV given dO, through torch.autograd.grad for every column) of `ours` against
    `peers`: by default V6 (which V7 and V8 train on unless told otherwise) against cuDNN, FlashAttention-2
    and FlashAttention-4."""
    table = ratio_table(path, ours, peers)
    if table is None:
        return md("*Not recorded yet: `results/h200/bench_backward.json` (`scripts/record_h200.sh OUT backward`).*")
    return md(table + "\n\nbfloat16, FLOPs 2.5 × the forward's. " + _method(path))


def summary(path: Path = PEERS, ours: str = "v8") -> dict[str, tuple[float, float]]:
    """{peer: (lowest, highest) ratio of `ours` against it over the recorded shapes} (above 1: ours faster)."""
    out: dict[str, list[float]] = {}
    for got in _shapes(path).values():
        mine = _us(got.get(ours))
        for peer in ("fa4", "sdpa_cudnn", "sdpa_flash"):
            theirs = _us(got.get(peer))
            if mine and theirs:
                out.setdefault(peer, []).append(theirs / mine)
    return {p: (min(v), max(v)) for p, v in out.items()}


def summary_lines(path: Path = PEERS, ours: str = "v8") -> str:
    """The range of `ours` against each peer, one line each, for the prose to read."""
    got = summary(path, ours)
    if not got:
        return "Not recorded yet."
    return "\n".join(f"{NAMES[ours]} against {NAMES[p]}: {lo:.2f}× to {hi:.2f}× over {len(_shapes(path))} shapes"
                     for p, (lo, hi) in got.items())
