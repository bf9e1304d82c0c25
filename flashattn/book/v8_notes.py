"""The V8 chapter's tables and readings (book/v8.ipynb and its lab notes, book/v8_lab.ipynb), each from a
committed record or from kernels/v8.cu itself, so every cell that shows one is a single call.

- `excerpt`, `excerpts`: lines of kernels/v8.cu cut out between two markers (the text, never typed);
- `register_lines`: the setmaxnreg split per head dim, from flashattn.book.warp_specialization.register_split;
- `setmaxnreg_table`, `overlap_window_table`: the machine code's USETMAXREG values and overlap windows;
- `steps_table`: the main path's one line per step (flashattn.measure.variants.V8_STEPS) from the sweep record;
- `variants_table`, `step_pairs_table`, `step_sentences`: the lab notes' longer readings of the same record;
- `candidates_tables`, `trace_reading`: the candidate builds and the clock-stamp trace, for the lab notes;
- `key_tile_table`: the unmasked kernel's key tile B_c, timed build against build, beside the keys it computes;
- `bench_table`, `target_lines`: the recorded timing against cuDNN, FlashAttention-2, V7 and V6;
- `profile_comparison`: V7 against V8 under Nsight Compute (tensor pipe, occupancy).
"""
from __future__ import annotations

import re
from pathlib import Path

from flashattn.book import records, trace
from flashattn.book.notebook import md
from flashattn.book.warp_specialization import register_split
from flashattn.loader import excerpt as loader_excerpt
from flashattn.measure import results, sass
from flashattn.measure.table import comparison_table, load
from flashattn.measure.variants import V8_STEPS

SWEEP = records.RESULTS / "v8_sweep.json"
BENCH = records.RESULTS / "bench_v8.json"
CANDIDATES = ("v8_candidates_run1.json", "v8_candidates.json")
# the bf16 kernels of the default build, by the start of their template arguments (D, consumer warpgroups, B_r)
KERNELS = {f"D={D}{', causal' if causal else ''}": f"<__nv_bfloat16, {D}, {wg}, 128, {str(causal).lower()},"
           for D, wg in ((64, 3), (128, 2)) for causal in (False, True)}


# ------------------------------------------------------------------------------------------- the source
def excerpt(first: str, last: str | None = None, text: str | None = None) -> str:
    """kernels/v8.cu (or `text`) from the line containing `first` to the next containing `last`."""
    return loader_excerpt("v8", first, last, text)


def excerpts(*spans: tuple[str, str | None], gap: str = "  ...") -> str:
    """Several excerpts, one after the other, separated by a line `gap`."""
    return f"\n{gap}\n".join(excerpt(*span) for span in spans)


def register_lines(rows: list[dict] | None = None) -> str:
    """One line per register split: threads and their registers at launch, the producer's and the consumers' allotments
    after setmaxnreg, and the check that the split fits what the block was launched with; head dims that share a
    split share its line."""
    rows = register_split() if rows is None else rows
    lines: dict[str, list[int]] = {}
    for r in rows:
        if r["causal"]:
            continue                     # the causal kernels share the split of their head dim
        n, entry, p, c = r["consumers"], r["entry"], r["producer"], r["consumer"]
        launched = entry * r["threads"] // 128
        split = (f"{n} consumers + 1 producer = {r['threads']} threads at {entry} registers; producer {p}, "
                 f"consumers {c}: {p} + {n} x {c} = {p + n * c} <= {launched}")
        lines.setdefault(split, []).append(r["d"])
    return "\n".join(f"D={'/'.join(map(str, ds))}: {split}" for split, ds in lines.items())


# ----------------------------------------------------------------------------------- the machine code
def setmaxnreg_rows() -> dict[str, tuple[list[int], list[int], int]]:
    """Per bf16 kernel: the producer's and the consumers' USETMAXREG values, and the highest register named."""
    out = {}
    for label, contains in KERNELS.items():
        lines = sass.texts(sass.function("v8", contains))
        moves = sass.register_moves(lines)
        top = max(int(r) for t in lines for r in re.findall(r"\bR(\d+)\b", t))
        out[label] = (moves["release"], moves["claim"], top)
    return out


def setmaxnreg_table():
    lines = ["| kernel (bf16) | producer keeps | consumers claim | highest register used |", "|---|--:|--:|--:|"]
    for label, (release, claim, top) in setmaxnreg_rows().items():
        lines.append(f"| {label} | {release} | {claim} | R{top} |")
    return md("\n".join(lines))


def overlap_window_table():
    """Every overlap window of every bf16 kernel: its length, its MUFU.EX2 and its writes to registers in flight."""
    lines = ["| kernel (bf16) | window | instructions | MUFU.EX2 inside | writes to registers in flight |",
             "|---|--:|--:|--:|--:|"]
    for label, contains in KERNELS.items():
        for k, (length, exps, clobbered) in enumerate(sass.overlap_windows(sass.texts(sass.function("v8", contains)))):
            lines.append(f"| {label} | {k + 1} | {length} | {exps} | {len(clobbered)} |")
    return md("\n".join(lines))


# ------------------------------------------------------------------------------------ the sweep record
def _sweep(path: Path):
    return results.read_if_exists(path, "sweep")


def _us(row: dict | None):
    return ((row or {}).get("timing") or {}).get("median_us")


def _before(name: str, chain: list[str], macros: dict[str, dict]) -> str | None:
    """The build a step is measured against: the (recorded) chain step before it, or, for a variant off the
    chain, the chain step whose macros are the largest subset of its own (the build it changes)."""
    if name in chain:
        k = chain.index(name)
        return chain[k - 1] if k else None
    mine = macros[name].items()
    inside = [c for c in chain if macros[c].items() <= mine]
    return max(inside, key=lambda c: len(macros[c])) if inside else None


def step_rows(path: Path = SWEEP) -> list[dict]:
    """One dict per entry of V8_STEPS recorded in the sweep, in that order: name, change, against (the build
    it is compared with), and per head dim the median µs and the ratio to `against` (above 1: faster). The
    chain runs up to the default build (no macros); a later entry is an alternative to a build of the chain."""
    doc = _sweep(path)
    if doc is None:
        return []
    got = {r["name"]: r for r in doc["rows"]}
    macros = {name: m for name, m, _, _ in V8_STEPS}
    ends = next((k for k, (_, m, _, _) in enumerate(V8_STEPS) if not m), len(V8_STEPS) - 1)
    recorded = {r["name"].split(" ", 1)[1] for r in doc["rows"] if " " in r["name"]}
    chain = [name for name, *_ in V8_STEPS[:ends + 1] if name in recorded]   # a step not yet recorded is skipped
    out = []
    for name, _, change, _ in V8_STEPS:
        against = _before(name, chain, macros)
        row = dict(name=name, change=change, against=against)
        for D in (64, 128):
            us, ref = _us(got.get(f"d{D} {name}")), _us(got.get(f"d{D} {against}")) if against else None
            row[D] = (us, ref / us if us and ref else None)
        if any(row[D][0] for D in (64, 128)):
            out.append(row)
    return out


def steps_table(path: Path = SWEEP):
    """The main path's step table: one line per recorded step, µs and ratio to the build before at both dims."""
    rows = step_rows(path)
    if not rows:
        return md("*Not recorded yet: `results/h200/v8_sweep.json` (`python -m flashattn.measure.sweep v8`).*")
    lines = ["| step | change | against | D=64 µs | × | D=128 µs | × |", "|---|---|---|--:|--:|--:|--:|"]
    for r in rows:
        cells = []
        for D in (64, 128):
            us, ratio = r[D]
            cells += ["—" if us is None else f"{us:,.1f}", "—" if ratio is None else f"{ratio:.2f}×"]
        lines.append(f"| `{r['name']}` | {r['change']} | {r['against'] or '—'} | " + " | ".join(cells) + " |")
    return md("\n".join(lines) + "\n\n×: the *against* build's time over this one's, same run (above 1: the step "
              "made the kernel faster).")


def _named_steps(doc) -> tuple[list[tuple[str, str, str]], dict[int, tuple[str, str, str]], str, str]:
    names = {r["name"] for r in doc["rows"]}
    # a record from before the persistent step calls the overlap step the default
    overlap, default = (("overlap", "persistent (default)") if "d128 persistent (default)" in names
                        else ("overlap (default)", "overlap (default)"))
    first = ([("spec0", "tile", "V8's tiles, no producer"), ("tile", "spec", "+ producer warpgroup")]
             if "d64 tile" in names else [("spec0", "spec", "+ producer warpgroup and V8's tiles")])
    steps = first + [("spec", "setmaxnreg", "+ setmaxnreg"),
             ("setmaxnreg", "pingpong", "+ ping-pong"), ("pingpong", overlap, "+ overlap")]
    if default != overlap:
        steps.append((overlap, default, "+ persistent blocks"))
    steps += [(default, "stages3", "2 → 3 stages"), ("overlap_nopp", overlap, "overlap: + ping-pong")]
    extra = {64: (default, "d64wg2", "3 → 2 consumer warpgroups"), 128: (default, "bc176", "B_c 128 → 176")}
    return steps, extra, overlap, default


def _v7_times(doc) -> dict[int, float]:
    return {ref["D"]: ref["timing"].get("median_us") for ref in doc["meta"]["references"] if ref["name"] == "v7"}


def variants_table():
    """Every build of the sweep (flashattn.measure.variants.V8_STEPS): its macros and what it changes."""
    lines = ["| variant | macros | what it is | head dims |", "|---|---|---|---|"]
    for name, macros, change, only in V8_STEPS:
        flags = " ".join(f"{k}={v}" for k, v in macros.items())
        lines.append(f"| `{name}` | {f'`{flags}`' if flags else 'none: the default build'} | {change} | "
                     f"{only if only else '64, 128'} |")
    return md("\n".join(lines))


def step_pairs_table(path: Path = SWEEP):
    """The lab notes' step table: pairs of variants that differ in one choice, with registers and blocks/SM."""
    doc = _sweep(path)
    if doc is None:
        return md("*Not recorded yet: `results/h200/v8_sweep.json` (`python -m flashattn.measure.sweep v8`).*")
    steps, extra, _, _ = _named_steps(doc)
    got, v7 = {r["name"]: r for r in doc["rows"]}, _v7_times(doc)

    def facts(r):
        t, px, occ = (r.get(k) or {} for k in ("timing", "ptxas", "occupancy"))
        return t.get("median_us"), px.get("registers"), occ.get("blocks_per_sm")

    lines = ["| D | step | µs before → after | speed-up | registers | blocks/SM | after vs V7 |",
             "|--:|---|---|--:|---|---|--:|"]
    for D in (64, 128):
        for a, b, what in steps + [extra[D]]:
            ra, rb = got.get(f"d{D} {a}"), got.get(f"d{D} {b}")
            if not ra or not rb or None in (facts(ra)[0], facts(rb)[0]):
                lines.append(f"| {D} | {what} | not timed | | | | |")
                continue
            (ta, ga, ba), (tb, gb, bb) = facts(ra), facts(rb)
            vs7 = f"{v7[D] / tb:.2f}×" if v7.get(D) else "—"
            lines.append(f"| {D} | {what} ({a} → {b}) | {ta:,.1f} → {tb:,.1f} | {ta / tb:.2f}× | {ga} → {gb} | "
                         f"{ba} → {bb} | {vs7} |")
    return md("\n".join(lines) + "\n\nSpeed-up above 1: the step made the kernel faster. The last column "
              "compares the step's result with V7 timed in the same run (above 1: faster than V7).")


def step_sentences(path: Path = SWEEP) -> str:
    """The same record as sentences: specialization alone, and the rest of the chain up to the default."""
    doc = _sweep(path)
    if doc is None:
        return "Not recorded yet: results/h200/v8_sweep.json."
    _, _, overlap, default = _named_steps(doc)
    got, v7 = {r["name"]: r for r in doc["rows"]}, _v7_times(doc)

    def word(x):
        return "faster" if x > 1 else "slower"

    out = []
    for D in (64, 128):
        spec0, tile, spec, dflt = (_us(got.get(f"d{D} {n}")) for n in ("spec0", "tile", "spec", default))
        if None in (spec0, spec, dflt) or not v7.get(D):
            out.append(f"D={D}: a step was not timed")
            continue
        if tile is not None:
            out.append(f"D={D}: V8's tiles alone (spec0 -> tile) {spec0 / tile:.2f}x, {word(spec0 / tile)}; "
                       f"the producer alone (tile -> spec) {tile / spec:.2f}x, {word(tile / spec)}")
        out.append(f"D={D}: spec0 -> spec {spec0 / spec:.2f}x, {word(spec0 / spec)}; "
                   f"spec against V7 {v7[D] / spec:.2f}x, {word(v7[D] / spec)}")
        steps = "setmaxnreg, ping-pong, overlap" + (", persistent" if default != overlap else "")
        out.append(f"D={D}: spec -> default ({steps}) {spec / dflt:.2f}x; "
                   f"default against V7 {v7[D] / dflt:.2f}x, {word(v7[D] / dflt)}")
    return "\n".join(out)


DEFAULTS = records.RESULTS / "v8_defaults.json"


def defaults_table(path: Path = DEFAULTS):
    """The default build against the sweep's fastest alternatives (a third stage; B_c = 176 at D=128), one
    column per separate process (flashattn.measure.results runs): µs and the default's time over the
    alternative's (above 1: the alternative was faster)."""
    doc = results.read_if_exists(path, "sweep")
    if doc is None:
        return md("*Not recorded yet: `results/h200/v8_defaults.json` (`scripts/record_h200.sh OUT v8-defaults`).*")
    runs = results.runs(doc)
    times = [{r["name"]: _us(r) for r in run["rows"]} for run in runs]
    names = list(dict.fromkeys(n for t in times for n in t))
    head = "| build | " + " | ".join(f"run {k + 1}: µs | ×" for k in range(len(runs))) + " |"
    lines = [head, "|---|" + "--:|--:|" * len(runs)]
    for name in names:
        default = f"d{name[1:name.index(' ')]} persistent (default)"
        cells = []
        for t in times:
            us, ref = t.get(name), t.get(default)
            cells += ["—" if us is None else f"{us:,.1f}", "—" if not (us and ref) else f"{ref / us:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rounds = runs[0]["settings"].get("rounds")
    return md("\n".join(lines) + f"\n\nbfloat16, non-causal, the sweep's shapes; {len(runs)} separate processes of "
              f"{rounds} interleaved rounds each. × : the default's time over this build's (above 1: this build "
              "was faster).")


# ------------------------------------------------------------------------- candidates and the trace
def candidates_table(path: Path) -> str:
    """Markdown: per configuration of a candidates record, each build's median µs over the runs (min-max) and
    cuDNN's time over the build's in each run."""
    doc = results.read(path, "candidates")
    configs: dict[tuple, list] = {}
    for r in doc["rows"]:
        configs.setdefault((r["D"], r["causal"], r["B"], r["H"], r["L"]), []).append(r["us"])
    lines = []
    for (D, causal, B, H, L), runs in configs.items():
        names = [n for n in runs[0] if all(isinstance(u.get(n), float) for u in runs)]
        lines += [f"**D={D}, B={B}, H={H}, M=N={L}{', causal' if causal else ''}** ({len(runs)} runs)", "",
                  "| build | µs, median (min-max) | cuDNN / build, per run |", "|---|--:|---|"]
        for n in names:
            t = sorted(u[n] for u in runs)
            ratios = ", ".join(f"{u['sdpa_cudnn'] / u[n]:.3f}" for u in runs)
            lines.append(f"| {n} | {t[len(t) // 2]:,.1f} ({t[0]:,.1f}-{t[-1]:,.1f}) | {ratios} |")
        lines.append("")
    return "\n".join(lines)


def candidates_tables(names: tuple[str, ...] = CANDIDATES):
    tables = []
    for name in names:
        path = records.RESULTS / name
        tables.append(f"*{name}*\n\n" + candidates_table(path) if path.exists() else f"*Not recorded yet: {name}.*")
    return md("\n\n".join(tables))


# the two runs of `python -m flashattn.measure.forward_candidates --set key_tile` behind V8_D128_BC and V8_D96_BC
KEY_TILE_LOGS = ("forward_candidates_key_tile_af827b5.md", "forward_candidates_key_tile_run2_af827b5.md")


def _log_rows(name: str) -> list[dict[str, str]]:
    """The rows of the markdown table a tool printed into results/h200/logs/NAME, as dicts by column header."""
    lines = [ln for ln in (records.RESULTS / "logs" / name).read_text().splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


def key_tile_table(names: tuple[str, ...] = KEY_TILE_LOGS):
    """Markdown: per shape of the key-tile runs (unmasked), each B_c's time over B_c = 128's, one value per run,
    and the keys its tiles cover per row block over N (the last tile is computed whole: ceil(N / B_c) B_c keys);
    FlashAttention-4's time over B_c = 128's."""
    runs = [_log_rows(name) for name in names]
    tiles = [int(c.removeprefix("bc")) for c in runs[0][0] if c.startswith("bc") and c != "bc128"]
    lines = ["| B, H, N, D | " + " | ".join(f"B_c = {n}: time, keys" for n in tiles) + " | FlashAttention-4: time |",
             "|---|" + "--:|" * (len(tiles) + 1)]
    for i, row in enumerate(runs[0]):
        n_keys = int(row["B, H_q/H_kv, N, D"].split(",")[2])
        cells = []
        for n in tiles:
            times = "/".join(f"{float(run[i][f'bc{n}']) / float(run[i]['bc128']):.3f}" for run in runs)
            cells.append(f"{times}, {-(-n_keys // n) * n / n_keys:.3f}")
        cells.append("/".join(f"{float(run[i]['FA4']) / float(run[i]['bc128']):.3f}" for run in runs))
        lines.append(f"| {row['B, H_q/H_kv, N, D']} | " + " | ".join(cells) + " |")
    return md("\n".join(lines) + f"\n\nTime: each build's median over B_c = 128's, in each of {len(runs)} runs "
              f"({', '.join(names)}); keys: ceil(N / B_c) B_c over N, the keys a row block computes.")


def trace_reading(doc: dict | None) -> str:
    """Per traced configuration: how the turns alternate, the waits per key tile, the segments of a tile,
    and what a block spends outside its loop."""
    if not doc:
        return "Not recorded yet."
    out = []
    for run in doc["rows"]:
        s = run["summary"]
        edges = (s["prologue"] + s["epilogue"]) / s["tile period"]
        out.append(
            f"{trace.label(run['shape'])}:\n"
            f"  consecutive turns go to different warpgroups {100 * s['alternating turns']:.1f}% of the time; per key "
            f"tile ({s['tile period']:,.0f} ns turn to turn) a consumer waits {s['turn wait']:,.0f} ns for its turn "
            f"and {s['K wait']:,.0f} ns for K_j, while the producer waits {s['producer K slot wait']:,.0f} ns for a "
            f"free K slot\n"
            f"  S issue to done {s['S = Q K^T']:,.0f} ns, then the softmax {s['softmax']:,.0f} ns (P V runs "
            f"under it: issue to done {s['P V']:,.0f} ns)\n"
            f"  per block: {s['prologue']:,.0f} ns before its first product, {s['epilogue']:,.0f} ns writing O_i "
            f"after its last = {edges:.2f} key tiles of {s['item'] / s['tile period']:,.0f} "
            f"({100 * (s['prologue'] + s['epilogue']) / s['item']:.1f}% of the block)")
    return "\n".join(out)


# ------------------------------------------------------------------------------- timing and profile
def bench_table(path: Path = BENCH):
    """The recorded timing of V8 against SDPA (cuDNN), V7, V6 and FlashAttention-2, as ratios."""
    if not path.exists():
        return md("*Not recorded yet: `results/h200/bench_v8.json` (`scripts/record_h200.sh OUT v8`).*")
    return md(comparison_table(load(path), "v8", ["sdpa", "sdpa_cudnn", "v7", "v6", "sdpa_flash"], tflops=True))


def target_ratios(path: Path = BENCH) -> list[tuple[str, float | None]]:
    """(configuration, cuDNN's median over V8's in the same run) for every recorded V8 row; None without SDPA."""
    if not path.exists():
        return []
    rows, out = load(path)["rows"], []
    for r in rows:
        if r["version"] != "v8" or r["status"] != "ok":
            continue
        key = (r["batch_size"], r["seq_len_q"], r["head_dim"], r["causal"])
        same = {o["version"]: o for o in rows
                if (o["batch_size"], o["seq_len_q"], o["head_dim"], o["causal"]) == key and o["status"] == "ok"}
        where = f"D={r['head_dim']}, M=N={r['seq_len_q']}{', causal' if r['causal'] else ''}"
        cudnn = same.get("sdpa")
        out.append((where, cudnn["median_us"] / r["median_us"] if cudnn else None))
    return out


def target_lines(path: Path = BENCH) -> str:
    ratios = target_ratios(path)
    if not ratios:
        return "Not recorded yet: the targets are judged once results/h200/bench_v8.json is committed."
    return "\n".join(f"{where}: no SDPA (cuDNN) row in the same run" if ratio is None else
                     f"{where}: V8 at {ratio:.2f}x cuDNN's speed (SDPA default), target (at least 1x) "
                     f"{'reached' if ratio >= 1 else 'not reached'}" for where, ratio in ratios)


def profile_comparison(seq_lens: tuple[int, ...] = (2048, 8192)):
    """V7 against V8 at both profiled shapes: tensor pipe activity, tensor throughput, issue rate and the
    theoretical and achieved occupancy (Nsight Compute records, results/h200/flash_v*_s*_profile.*)."""
    lines = ["| M=N | kernel | tensor pipe active | tensor TOP/s | warp cycles per issued instruction | "
             "occupancy theoretical | occupancy achieved |", "|--:|---|--:|--:|--:|--:|--:|"]
    for L in seq_lens:
        for name in ("v7", "v8"):
            s = records.profile_summary(name, L)
            if s is None:
                lines.append(f"| {L:,} | {name.upper()} | not recorded | | | | |")
                continue
            lines.append(f"| {L:,} | {name.upper()} | {s['tensor_pipe_pct']:.1f}% | "
                         f"{s['tensor_ops_per_s'] / 1e12:,.0f} | "
                         f"{s['warp_cycles_per_issue']:.2f} | {s['theoretical_occupancy_pct']:.2f}% | "
                         f"{s['achieved_occupancy_pct']:.2f}% |")
    return md("\n".join(lines))
