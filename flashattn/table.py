"""The README results table, generated from a benchmark JSON (never typed by hand).

    python -m flashattn.table results/h200/bench.json                      # print the markdown
    python -m flashattn.table results/h200/bench.json --update-readme README.md

`--update-readme` replaces what lies between `<!-- results-table:start -->` and
`<!-- results-table:end -->`. Titles and descriptions come from `flashattn.versions.INFO`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .versions import INFO, VERSIONS

START, END = "<!-- results-table:start -->", "<!-- results-table:end -->"
EXTRA_INFO = {   # bench-only names (flashattn.bench.SDPA_BACKENDS)
    "sdpa_flash": ("PyTorch SDPA (flash)", "SDPA forced to its FlashAttention-2 backend"),
    "sdpa_efficient": ("PyTorch SDPA (efficient)", "SDPA forced to its memory-efficient (CUTLASS) backend"),
    "sdpa_cudnn": ("PyTorch SDPA (cuDNN)", "SDPA forced to its cuDNN backend"),
}
LABELS = {"baseline": "Baseline", "sdpa": "SDPA", "sdpa_flash": "SDPA flash", "sdpa_efficient": "SDPA efficient",
          "sdpa_cudnn": "SDPA cuDNN"}


def load(path) -> dict:
    doc = json.loads(Path(path).read_text())
    return doc if "runs" in doc else {"runs": [doc]}


def select_rows(doc: dict, seq_len: int | None = None, dtype: str | None = None, causal: bool = False,
                head_dim: int | None = None) -> tuple[list[dict], dict]:
    """The rows of one shape (default: M=N=2048 if present, else the largest; the first run's dtype)
    and the run (its meta and settings) they came from."""
    rows = [(r, run) for run in doc["runs"] for r in run["rows"] if bool(r["causal"]) == causal]
    if dtype:
        rows = [(r, m) for r, m in rows if r["dtype"] == dtype]
    if head_dim:
        rows = [(r, m) for r, m in rows if r["head_dim"] == head_dim]
    if not rows:
        raise ValueError("no benchmark rows match the requested dtype/causal/head_dim")
    lens = sorted({r["seq_len_q"] for r, _ in rows})
    seq_len = seq_len or (2048 if 2048 in lens else lens[-1])
    rows = [(r, m) for r, m in rows if r["seq_len_q"] == seq_len]
    if not rows:
        raise ValueError(f"no benchmark rows at seq_len {seq_len}; the file has {lens}")
    first = rows[0][0]
    same = [(r, m) for r, m in rows if (r["dtype"], r["head_dim"], r["batch_size"], r["num_heads"])
            == (first["dtype"], first["head_dim"], first["batch_size"], first["num_heads"])]
    order = {n: i for i, n in enumerate(list(VERSIONS) + list(EXTRA_INFO))}
    same.sort(key=lambda rm: order.get(rm[0]["impl"], len(order)))
    return [r for r, _ in same], same[0][1]


def title_description(name: str) -> tuple[str, str]:
    if name in INFO:
        return INFO[name].title, INFO[name].description
    return EXTRA_INFO.get(name, (name, ""))


def _sdpa_cell(r: dict) -> str:
    s = r.get("speedup_vs_sdpa")
    if s is None or r["impl"] == "sdpa":
        return "—"
    return f"{s:.2f}× faster" if s >= 1 else f"{1 / s:.2f}× slower"


def markdown(rows: list[dict], run: dict | None = None) -> str:
    """Version | Title | Latency (µs) | Δ vs. baseline | vs. SDPA | Description, plus a line saying how
    and where it was measured."""
    lines = ["| Version | Title | Latency (µs) | Δ vs. baseline | vs. SDPA | Description |",
             "|---|---|--:|--:|--:|---|"]
    short = False
    for r in rows:
        title, desc = title_description(r["impl"])
        label = LABELS.get(r["impl"], r["impl"].upper())
        if r["status"] != "ok":
            lines.append(f"| {label} | {title} | n/a | — | — | {desc} (not run: {r['message']}) |")
            continue
        mark = ""
        if r.get("calls_timed", 0) < r.get("requested_repetitions", 0):
            mark, short = "†", True
        delta = "—" if r["impl"] == "baseline" or r.get("change_vs_baseline_pct") is None \
            else f"{r['change_vs_baseline_pct']:+.1f}%".replace("-", "−")
        lines.append(f"| {label} | {title} | {r['median_us']:,.2f}{mark} | {delta} | {_sdpa_cell(r)} | {desc} |")
    r0 = rows[0]
    shape = (f"B={r0['batch_size']}, H={r0['num_heads']}, M={r0['seq_len_q']}, N={r0['seq_len_kv']}, "
             f"D={r0['head_dim']}, {r0['dtype']}{', causal' if r0['causal'] else ', non-causal'}")
    lines.append("")
    if run:
        m, env = run.get("settings", {}), run.get("meta", {})
        dev = env.get("device", {}).get("name", "unknown GPU")
        git = (env.get("git") or {}).get("commit") or "uncommitted tree"
        lines.append(f"{shape}. Median of {m.get('repetitions', '?')} CUDA-event-timed calls after "
                     f"{m.get('warmup', '?')} warm-ups, L2 flushed before each call; measured on {dev} "
                     f"(driver {env.get('driver') or '?'}, torch {env.get('torch', '?')}, CUDA "
                     f"{env.get('cuda_runtime', '?')}, commit {str(git)[:10]}).")
    else:
        lines.append(f"{shape}.")
    if short:
        lines.append("")
        lines.append("† fewer timed calls: `--max-seconds` stopped this slow version early (the JSON records how many).")
    return "\n".join(lines)


def results_table(path, **select) -> str:
    rows, run = select_rows(load(path), **select)
    return markdown(rows, run)


def update_readme(readme, table: str) -> None:
    path = Path(readme)
    text = path.read_text()
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise ValueError(f"{path} has no '{START}' ... '{END}' block to replace")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{table}\n{END}{tail}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.table", description="README results table from bench JSON")
    p.add_argument("json", type=Path)
    p.add_argument("--seq-len", type=int, help="M = N of the rows to show (default: 2048, else the largest)")
    p.add_argument("--dtype", help="dtype of the rows to show (default: the first run's)")
    p.add_argument("--head-dim", type=int)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--update-readme", type=Path, metavar="README", help="replace the marked block in README")
    args = p.parse_args(argv)
    table = results_table(args.json, seq_len=args.seq_len, dtype=args.dtype, causal=args.causal,
                          head_dim=args.head_dim)
    if args.update_readme:
        update_readme(args.update_readme, table)
        print(f"updated {args.update_readme}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
