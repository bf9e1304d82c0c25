"""The README results table, generated from a benchmark JSON (never typed by hand).

    python -m flashattn.measure.table results/h200/bench.json                      # print the markdown
    python -m flashattn.measure.table results/h200/bench.json --update-readme README.md

`--update-readme` replaces what lies between `<!-- results-table:start -->` and
`<!-- results-table:end -->`. Titles and descriptions come from `flashattn.versions.INFO`.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from flashattn.measure import results
from flashattn.versions import INFO, VERSIONS

START, END = "<!-- results-table:start -->", "<!-- results-table:end -->"
EXTRA_INFO = {   # bench-only names (flashattn.measure.bench.SDPA_BACKENDS)
    "sdpa_flash": ("PyTorch SDPA (flash)", "SDPA forced to its FlashAttention-2 backend"),
    "sdpa_efficient": ("PyTorch SDPA (efficient)", "SDPA forced to its memory-efficient (CUTLASS) backend"),
    "sdpa_cudnn": ("PyTorch SDPA (cuDNN)", "SDPA forced to its cuDNN backend"),
}
LABELS = {"baseline": "Baseline", "sdpa": "SDPA", "sdpa_flash": "SDPA flash", "sdpa_efficient": "SDPA efficient",
          "sdpa_cudnn": "SDPA cuDNN", "v7": "V7", "v8": "V8", "v6_backward": "V6 backward"}


def label(name: str) -> str:
    """How tables and plots name a version: 'V4', 'SDPA flash', 'Baseline'."""
    return LABELS.get(name, name.upper() if name.startswith("v") else name)


def load(path) -> dict:
    """A benchmark record (flashattn.measure.results; `results.runs` splits it into its runs)."""
    return results.read(path, "bench")


def select_rows(doc: dict, seq_len: int | None = None, dtype: str | None = None, causal: bool = False,
                head_dim: int | None = None, direction: str = "forward") -> tuple[list[dict], dict]:
    """The rows of one shape (default: M=N=2048 if present, else the largest; the first run's dtype)
    and the run (its meta and settings) they came from; forward rows, or the backward rows of
    `python -m flashattn.measure.bench --backward` (they say "direction": "backward")."""
    rows = [(r, run) for run in results.runs(doc) for r in run["rows"]
            if bool(r["causal"]) == causal and r.get("direction", "forward") == direction]
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
    same.sort(key=lambda rm: order.get(rm[0]["version"], len(order)))
    return [r for r, _ in same], same[0][1]


def title_description(name: str) -> tuple[str, str]:
    if name in INFO:
        return INFO[name].title, INFO[name].description
    return EXTRA_INFO.get(name, (name, ""))


def sdpa_cell(r: dict) -> str:
    """'1.24× faster' / '1.40× slower' against SDPA in the same run; '—' for SDPA itself or no SDPA."""
    s = r.get("speedup_vs_sdpa")
    if s is None or r["version"] == "sdpa":
        return "—"
    return f"{s:.2f}× faster" if s >= 1 else f"{1 / s:.2f}× slower"


def markdown(rows: list[dict], run: dict | None = None) -> str:
    """Version | Title | Latency (µs) | Δ vs. baseline | vs. SDPA | Description, plus a line saying how
    and where it was measured."""
    lines = ["| Version | Title | Latency (µs) | Δ vs. baseline | vs. SDPA | Description |",
             "|---|---|--:|--:|--:|---|"]
    short = False
    for r in rows:
        title, desc = title_description(r["version"])
        name = label(r["version"])
        if r["status"] != "ok":
            lines.append(f"| {name} | {title} | n/a | — | — | {desc} (not run: {r['message']}) |")
            continue
        mark = ""
        if r.get("calls_timed", 0) < r.get("requested_repetitions", 0):
            mark, short = "†", True
        delta = "—" if r["version"] == "baseline" or r.get("change_vs_baseline_pct") is None \
            else f"{r['change_vs_baseline_pct']:+.1f}%".replace("-", "−")
        lines.append(f"| {name} | {title} | {r['median_us']:,.2f}{mark} | {delta} | {sdpa_cell(r)} | {desc} |")
    r0 = rows[0]
    shape = (f"B={r0['batch_size']}, H={r0['num_heads']}, M={r0['seq_len_q']}, N={r0['seq_len_kv']}, "
             f"D={r0['head_dim']}, {r0['dtype']}{', causal' if r0['causal'] else ', non-causal'}")
    lines.append("")
    if run:
        m, env = run.get("settings", {}), run.get("meta", {})
        dev = env.get("device", {}).get("name", "unknown GPU")
        git = (env.get("git") or {}).get("commit") or "not recorded"
        rounds = f" in {m['rounds']} interleaved rounds" if m.get("rounds", 1) > 1 else ""
        lines.append(f"{shape}. Median of {m.get('repetitions', '?')} CUDA-event-timed calls{rounds} after "
                     f"{m.get('warmup', '?')} warm-ups, L2 flushed before each call; measured on {dev} "
                     f"(driver {env.get('driver') or '?'}, torch {env.get('torch', '?')}, CUDA "
                     f"{env.get('cuda_runtime', '?')}, commit {str(git)[:10]}).")
    else:
        lines.append(f"{shape}.")
    if short:
        lines.append("")
        lines.append("† fewer timed calls: `--max-seconds` stopped this slow version early "
                     "(the JSON records how many).")
    return "\n".join(lines)


def results_table(path, **select) -> str:
    rows, run = select_rows(load(path), **select)
    return markdown(rows, run)


def update_readme(readme, table: str, block: str = "results-table") -> None:
    """Replace the text between `<!-- BLOCK:start -->` and `<!-- BLOCK:end -->` in `readme`."""
    start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
    path = Path(readme)
    text = path.read_text()
    if start not in text or end not in text or text.index(start) > text.index(end):
        raise ValueError(f"{path} has no '{start}' ... '{end}' block to replace")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{table}\n{end}{tail}")


def _suites(xml: Path) -> list[ET.Element]:
    """The <testsuite> elements of a JUnit XML file (its root, or those under a <testsuites> root)."""
    root = ET.parse(xml).getroot()
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def gpu_tests_sentence(xml: Path, commit_file: Path | None = None) -> str:
    """The README's sentence about the last GPU test run, from the JUnit XML pytest wrote there
    (scripts/gpu_session.sh, step tests). The commit comes from the suite name ("flashattn at <commit>")
    or, failing that, from `commit_file` (results/h200/git_commit.txt)."""
    xml = Path(xml)
    if not xml.exists():
        return (f"No GPU test run is recorded yet: `{xml.as_posix()}` is written by the `tests` step of "
                f"`scripts/gpu_session.sh` on the H200.")
    suites = _suites(xml)
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    name = suites[0].get("name", "") if suites else ""
    commit = name.split(" at ", 1)[1] if " at " in name else None
    if (not commit or commit == "unknown") and commit_file and Path(commit_file).exists():
        commit = Path(commit_file).read_text().split()[0]
    when = (suites[0].get("timestamp") or "")[:10] if suites else ""
    failed = count["failures"] + count["errors"]
    return (f"The last full run of the test suite on the H200 ({when + ', ' if when else ''}commit "
            f"`{(commit or 'unknown')[:10]}`): {passed} passed, {count['skipped']} skipped, {failed} failed "
            f"(`{xml.as_posix()}`).")


def merge_junit(parts: list[Path], out: Path) -> Path:
    """The JUnit XML files of one suite's parts (scripts/gpu_session.sh part:NAME, one call each) as one file
    for gpu_tests_sentence: their <testsuite> elements under one <testsuites>. The parts must name the same
    commit ("flashattn at <commit>"): a README sentence counts one commit's run."""
    suites = [s for path in parts for s in _suites(path)]
    names = {s.get("name", "") for s in suites}
    if len(names) != 1:
        raise ValueError(f"the parts name different runs: {sorted(names)}")
    merged = ET.Element("testsuites")
    merged.extend(suites)
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)
    return out


def not_recorded(path) -> str:
    """What a table says in place of its figures while its benchmark file does not exist."""
    return (f"*Not recorded yet: `{Path(path).as_posix()}` does not exist; `scripts/record_h200.sh` writes it "
            f"on a GPU machine, then `scripts/update_tables.sh` fills this table in.*")


def _by_shape(run: dict) -> dict:
    """One run's rows by shape (B, H, L, D, dtype, causal), each shape's rows by version."""
    by_shape: dict = {}
    for r in run["rows"]:
        key = (r["batch_size"], r["num_heads"], r["seq_len_q"], r["head_dim"], r["dtype"], bool(r["causal"]))
        by_shape.setdefault(key, {})[r["version"]] = r
    return by_shape


def time_ratios(doc: dict, numerator: str, denominator: str) -> list[float]:
    """numerator's median time over denominator's at every shape where both ran ok, each ratio within one
    run: what a sentence such as "takes 0.86 to 0.96 of its time" states (its min and max, ratio_range)."""
    out = []
    for run in results.runs(doc):
        for rows in _by_shape(run).values():
            a, b = rows.get(numerator), rows.get(denominator)
            if a and b and a["status"] == "ok" and b["status"] == "ok":
                out.append(a["median_us"] / b["median_us"])
    return out


def ratio_range(doc: dict, numerator: str, denominator: str, digits: int = 2) -> str:
    """time_ratios' smallest and largest as prose writes them: "0.86 to 0.96"."""
    r = time_ratios(doc, numerator, denominator)
    if not r:
        raise ValueError(f"no shape has both {numerator} and {denominator}")
    return f"{min(r):.{digits}f} to {max(r):.{digits}f}"


def comparison_table(doc: dict, version: str, against: list[str], group_shapes: bool = False,
                     tflops: bool = False) -> str:
    """One line per shape in the file: `version`'s median and its speed relative to each of `against`
    (>1: version is faster), every ratio taken within one run. For the README's v5, v6, v7 and backward
    sections. `group_shapes`: a file of repeated runs, one line per run, the runs of one shape together.
    `tflops`: a column with `version`'s TFLOP/s (the row's own FLOP count: forward or backward)."""
    lines = ["| B, H, M=N, D | dtype | causal | " + f"{version} (µs) | " + ("TFLOP/s | " if tflops else "")
             + " | ".join(f"{a} (µs) | {version} vs {a}" for a in against) + " |",
             "|---|---|---|--:|" + ("--:|" if tflops else "") + "--:|--:|" * len(against)]
    body = []
    for run in results.runs(doc):
        for (B, H, L, D, dtype, causal), rows in _by_shape(run).items():
            mine = rows.get(version)
            if not mine or mine["status"] != "ok":
                continue
            cells = []
            for a in against:
                other = rows.get(a)
                if other and other["status"] == "ok":
                    cells.append(f"{other['median_us']:,.1f} | {other['median_us'] / mine['median_us']:.2f}×")
                else:
                    cells.append("n/a | —")
            rate = f"{mine['tflops']:,.0f} | " if tflops else ""
            body.append(((B, H, L, D, dtype, causal), f"| {B}, {H}, {L}, {D} | {dtype} | {'yes' if causal else 'no'} | "
                         f"{mine['median_us']:,.1f} | {rate}" + " | ".join(cells) + " |"))
    if group_shapes:
        order = list(dict.fromkeys(key for key, _ in body))
        body.sort(key=lambda kv: order.index(kv[0]))      # stable: runs keep their order within a shape
    return "\n".join(lines + [line for _, line in body])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.table",
                                description="README results table from bench JSON")
    p.add_argument("json", type=Path, nargs="?", help="a benchmark JSON (not needed with --gpu-tests)")
    p.add_argument("--seq-len", type=int, help="M = N of the rows to show (default: 2048, else the largest)")
    p.add_argument("--dtype", help="dtype of the rows to show (default: the first run's)")
    p.add_argument("--head-dim", type=int)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--update-readme", type=Path, metavar="README", help="replace the marked block in README")
    p.add_argument("--compare", nargs="+", metavar="NAME",
                   help="VERSION OTHER...: a table of VERSION against OTHER at every shape in the file")
    p.add_argument("--block", help="with --compare --update-readme: the README block to replace "
                                   "(default: VERSION-table)")
    p.add_argument("--gpu-tests", type=Path, metavar="XML",
                   help="the sentence about a recorded GPU test run (pytest's JUnit XML); with --update-readme: "
                        "into the gpu-tests block")
    p.add_argument("--merge-junit", type=Path, nargs="+", metavar="XML",
                   help="the JUnit files of one suite's parts, merged into --out")
    p.add_argument("--out", type=Path, help="with --merge-junit: the merged file")
    p.add_argument("--tflops", action="store_true", help="with --compare: VERSION's TFLOP/s too (default: off)")
    p.add_argument("--group-shapes", action="store_true",
                   help="with --compare: repeated runs, one line each, grouped by shape")
    args = p.parse_args(argv)
    select = dict(seq_len=args.seq_len, dtype=args.dtype, causal=args.causal, head_dim=args.head_dim)
    if args.merge_junit:
        if args.out is None:
            p.error("--merge-junit needs --out")
        print(gpu_tests_sentence(merge_junit(args.merge_junit, args.out)))
        return 0
    if args.gpu_tests:
        sentence = gpu_tests_sentence(args.gpu_tests, args.gpu_tests.parent / "git_commit.txt")
        if args.update_readme:
            update_readme(args.update_readme, sentence, block="gpu-tests")
        else:
            print(sentence)
        return 0
    if args.json is None:
        p.error("a benchmark JSON is required (or --gpu-tests XML)")
    if not args.json.exists():               # say so in the README rather than fail the whole update
        note = not_recorded(args.json)
        if args.update_readme:
            block = (args.block or f"{args.compare[0]}-table") if args.compare else "results-table"
            update_readme(args.update_readme, note, block=block)
        print(note)
        return 0
    if args.compare:
        table = comparison_table(load(args.json), args.compare[0], args.compare[1:], args.group_shapes, args.tflops)
        if args.update_readme:
            update_readme(args.update_readme, table, block=args.block or f"{args.compare[0]}-table")
        else:
            print(table)
        return 0
    table = results_table(args.json, **select)
    if args.update_readme:
        update_readme(args.update_readme, table)
        print(f"updated {args.update_readme}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
