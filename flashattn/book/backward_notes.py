"""The backward chapter's tables and excerpts (book/backward.ipynb, book/backward_lab.ipynb): each function reads
kernels/v6_backward.cu or a record under results/h200/ (made by flashattn.book.backward_steps and the benchmark),
compiles on the CPU, or (the live cells) runs the kernels, and returns Markdown or lines."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from flashattn import loader
from flashattn.autograd import attention
from flashattn.book.backward_steps import RECORD_NAMES, STEP_SETS
from flashattn.book.records import RESULTS, ceilings, ncu_record
from flashattn.loader import KERNELS_DIR
from flashattn.measure import ncu, ncu_pages, resources, results, sass
from flashattn.measure.backward import backward_call, backward_flops
from flashattn.measure.bench import attention_flops
from flashattn.reference import attention_reference, relative_error, sdpa

SOURCE = KERNELS_DIR / "v6_backward.cu"
COLUMNS = {"v6_layout0": "layout 0", "v6_layout1": "layout 1", "v6_layout2": "layout 2", "v6_layout2_fuse1":
           "layout 2, S/dP fused", "v6_layout2_fuse3": "layout 2, both fused", "v6_layout2_heads": "layout 2, heads "
           "first", "v6_layout2_stages3": "layout 2, 3 stages", "v6_layout2_bulk": "layout 2, bulk dQ",
           "v6_layout2_bulk_stages3": "layout 2, bulk dQ, 3 stages", "v6_layout2_bulk_br128":
           "layout 2, bulk dQ, B_r = 128", "sdpa_flash": "SDPA flash (FA2)", "sdpa_cudnn": "cuDNN"}
TARGET_SHAPES = ((4, 12, 2048, 64), (2, 16, 8192, 128))

def excerpt(first: str, last: str) -> str:
    """kernels/v6_backward.cu from the line containing `first` to the next containing `last`."""
    return loader.excerpt("v6_backward", first, last)

def store_vs_recompute_table() -> str:
    """Storing P against recomputing S = tau Q K^T, at the H200's measured ceilings, at the V6 chapter's shapes."""
    c = ceilings()
    lines = ["| B, H, M=N, D | P in bf16 | lse (float32) | Q, K, V, O, dO (bf16) | P written and read back, "
             "at the copy bandwidth | S = τQKᵀ recomputed, at the bf16 rate |", "|---|--:|--:|--:|--:|--:|"]
    for B, H, L, D in TARGET_SHAPES:
        p_bytes, lse_bytes, io_bytes = 2 * B * H * L * L, 4 * B * H * L, 5 * 2 * B * H * L * D
        store_us = 2 * p_bytes / c["dram"] * 1e6
        recompute_us = attention_flops(B, H, L, L, D) / 2 / c["bf16"] * 1e6
        lines.append(f"| {B}, {H}, {L}, {D} | {p_bytes / 1e6:,.0f} MB | {lse_bytes / 1e6:,.2f} MB | "
                     f"{io_bytes / 1e6:,.0f} MB | {store_us:,.0f} µs | {recompute_us:,.0f} µs |")
    return "\n".join(lines) + f"\n\nCeilings: {c['dram'] / 1e12:.2f} TB/s copy, {c['bf16'] / 1e12:,.0f} TFLOP/s bf16."

PASSES = {"forward": ["S = τ Q Kᵀ", "O = P V"],
          "backward, dQ by atomics": ["S = τ Q Kᵀ", "dP = dO Vᵀ", "dV = Pᵀ dO", "dK = τ dSᵀ Q", "dQ = τ dS K"],
          "backward, separate dQ kernel": ["S = τ Q Kᵀ", "dP = dO Vᵀ", "dV = Pᵀ dO", "dK = τ dSᵀ Q",
                                           "S = τ Q Kᵀ", "dP = dO Vᵀ", "dQ = τ dS K"]}

def work_table() -> str:
    """The matrix products of the forward and of both backward modes, checked against the benchmark's FLOP count."""
    lines = ["| pass | matrix products (each 2·M·N·D FLOPs per head) | FLOPs per head | vs. forward |",
             "|---|---|--:|--:|"]
    for name, products in PASSES.items():
        lines.append(f"| {name} | {', '.join(products)} | {2 * len(products)}·M·N·D | "
                     f"{len(products) / len(PASSES['forward']):.1f}× |")
    ratio = len(PASSES["backward, dQ by atomics"]) / len(PASSES["forward"])
    for B, H, L, D in TARGET_SHAPES:
        for causal in (False, True):
            assert backward_flops(B, H, L, L, D, causal) == ratio * attention_flops(B, H, L, L, D, causal)
    return ("\n".join(lines) + "\n\nEvery product has the sizes M, N and D in some order. The exponentials and "
            "the element-wise dS are not counted, as in the forward; causal masking skips about half of each.")

def gradient_errors(B, H, M, N, D, causal, scale=1.0):
    """Relative errors of (dQ, dK, dV) against float64 autograd: (flashattn, SDPA) for each, bf16 inputs."""
    g = torch.Generator(device="cuda").manual_seed(M + 7 * N + D)
    q, k = (scale * torch.randn(B, H, L, D, device="cuda", generator=g) for L in (M, N))
    v, do = (torch.randn(B, H, L, D, device="cuda", generator=g) for L in (N, M))
    q, k, v, do = (t.bfloat16() for t in (q, k, v, do))
    def grads(fn, *t):
        q, k, v = (x.detach().requires_grad_() for x in t[:3])
        return torch.autograd.grad(fn(q, k, v, causal=causal), (q, k, v), t[3])
    ref = grads(attention_reference, *(t.double() for t in (q, k, v, do)))
    ours, theirs = grads(attention, q, k, v, do), grads(sdpa, q, k, v, do)
    return [(relative_error(a, r), relative_error(b, r)) for a, b, r in zip(ours, theirs, ref)]

GRADIENT_SHAPES = [(1, 1, 1, 17, 64, False, 1), (2, 3, 113, 203, 64, False, 1), (2, 3, 203, 113, 128, False, 1),
                   (2, 3, 113, 203, 64, True, 1), (1, 2, 1023, 1025, 128, True, 1), (2, 2, 1025, 1023, 64, False, 1),
                   (2, 3, 256, 256, 64, True, 3)]   # B, H, M, N, D, causal, logit scale

def gradient_table() -> str:
    """Live (GPU): the gradients' errors at GRADIENT_SHAPES, ours beside SDPA's bf16 backward."""
    lines = ["| B, H, M, N, D | causal | dQ: flashattn · SDPA | dK: flashattn · SDPA | dV: flashattn · SDPA | "
             "within 2× SDPA |", "|---|---|--:|--:|--:|---|"]
    for B, H, M, N, D, causal, scale in GRADIENT_SHAPES:
        errors = gradient_errors(B, H, M, N, D, causal, scale)
        ok = all(a <= 2 * b or a < 1e-6 for a, b in errors)
        lines.append(f"| {B}, {H}, {M}, {N}, {D}{' (×3 logits)' if scale != 1 else ''} | {causal} | "
                     + " | ".join(f"{a:.1e} · {b:.1e}" for a, b in errors) + f" | {ok} |")
    return "\n".join(lines)

def determinism_lines() -> list[str]:
    """Live (GPU): the backward run twice on the same inputs in both modes; are the gradients bit-identical?"""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(4, 12, 2048, 64, device="cuda", generator=g).bfloat16() for _ in range(4))
    out = []
    for d in (False, True):
        run = backward_call("v6", q, k, v, do, deterministic=d)
        a, b = run(), run()
        same = [torch.equal(x, y) for x, y in zip(a, b)]
        out.append(f"deterministic={d!s:<5}  identical in two runs: dQ {same[0]}, dK {same[1]}, dV {same[2]};  "
                   f"largest dQ difference {(a[0].float() - b[0].float()).abs().max():.1e}")
    return out

def backward_table(rows, note) -> str:
    """Backward times, V6 (atomic dQ) against its deterministic mode and SDPA's backends (benchmark rows)."""
    names = {"impl": "version", "batch_size": "B", "num_heads": "H", "seq_len_q": "M", "head_dim": "D"}
    rows = [{names.get(key, key): value for key, value in r.items()} for r in rows]
    timed = {(r["B"], r["H"], r["M"], r["D"], bool(r["causal"]), r["version"]): r for r in rows if r.get("median_us")}
    others = {"v6_deterministic": "V6 (dQ kernel)", "sdpa_flash": "FA2", "sdpa_cudnn": "cuDNN", "fa4": "FA4"}
    lines = ["| B, H, M=N, D | causal | V6 (atomic dQ) µs | TFLOP/s | " + " | ".join(f"{o} µs | V6 vs {o}"
             for o in others.values()) + " |", "|---|---|--:|--:|" + "--:|--:|" * len(others)]
    for B, H, M, D, causal in dict.fromkeys(key[:5] for key in timed):
        v6 = timed.get((B, H, M, D, causal, "v6"))
        if v6 is None:
            continue
        cells = []
        for o in others:
            r = timed.get((B, H, M, D, causal, o))
            cells.append("n/a | —" if r is None else f"{r['median_us']:,.1f} | {r['median_us'] / v6['median_us']:.2f}×")
        lines.append(f"| {B}, {H}, {M}, {D} | {'yes' if causal else 'no'} | {v6['median_us']:,.1f} | "
                     f"{v6['tflops']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + note

def step_run(step: str) -> tuple[list[dict], dict]:
    """The timed rows and the meta of the last run in a step's record ([], {} when it is not recorded)."""
    path = RESULTS / f"{RECORD_NAMES[step]}.json" if step in RECORD_NAMES else RESULTS / f"{step}.json"
    if not path.exists():
        return [], {}
    run = results.runs(results.read(path))[-1]
    return [r for r in run["rows"] if r.get("median_us")], run.get("meta", {})

def _where(key: tuple) -> str:
    return f"B={key[0]}, H={key[1]}, M=N={key[2]}, D={key[3]}, {'causal' if key[4] else 'non-causal'}"

def by_config(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    """{(B, H, L, D, causal): {version: median µs}} in the record's order."""
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        out.setdefault((r["batch_size"], r["num_heads"], r["seq_len_q"], r["head_dim"], r["causal"]), {})[
            r["version"]] = r["median_us"]
    return out

def recorded_note(meta: dict, what: str, fa2: bool = True) -> str:
    return (f"Recorded on {meta['device']['name']} (torch {meta['torch']}, commit {str(meta['git']['commit'])[:10]}), "
            f"bf16, {what}" + ("; ratios above 1: faster than FlashAttention-2." if fa2 else "."))

def default_variant(D: int, step: str = "layouts") -> str:
    """The build of STEP_SETS[step] that kernels/v6_backward.cu makes today at head dim D (on the step's macros)."""
    macros = {k: int(v) for k, v in re.findall(r"#define (V6B_\w+) (\d+)", SOURCE.read_text())}
    builds = {name: variant.macros for name, variant in STEP_SETS[step].items()}
    varied = {k for m in builds.values() for k in m if len({b[k] for b in builds.values()}) > 1}
    varied = {k for k in varied if f"_D{192 - D}_" not in k}   # the other head dim's macros
    return next((n for n, m in builds.items() if all(macros[k] == m[k] for k in varied)), "?")

def layout_table(rows: list[dict], step: str = "layouts") -> str:
    """A step's record: every build and SDPA's backends per configuration, and today's build against FA2."""
    t = by_config(rows)
    names = [n for n in COLUMNS if any(n in v for v in t.values())]
    lines = ["| B, H, M=N, D | causal | " + " | ".join(f"{COLUMNS[n]} µs" for n in names)
             + " | today's build | it vs FA2 |", "|---|---|" + "--:|" * len(names) + "---|--:|"]
    for key, us in t.items():
        default = default_variant(key[3], step)
        mine, fa2 = us.get(default), us.get("sdpa_flash")
        lines.append(f"| {key[0]}, {key[1]}, {key[2]}, {key[3]} | {'yes' if key[4] else 'no'} | "
                     + " | ".join(f"{us[n]:,.1f}" if n in us else "—" for n in names)
                     + f" | {COLUMNS.get(default, default)} | "
                     + (f"{fa2 / mine:.2f}×" if mine and fa2 else "—") + " |")
    return "\n".join(lines)

def same_dkdv_lines(rows: list[dict]) -> list[str]:
    """Whether each build's dK, dV were bit-identical to layout 0's, per configuration of the record."""
    same = {n: [r["dkdv_same_as_first"] for r in rows if r["version"] == n] for n in COLUMNS if n != "v6_layout0"}
    return [f"{COLUMNS[n]}: dK, dV bit-identical to layout 0's at {sum(v)} of {len(v)} configurations"
            for n, v in same.items() if v and n.startswith("v6_")]

def versus_lines(rows: list[dict], before: str, after: str, labels: tuple[str, str], one_kernel_at=()) -> list[str]:
    """Per configuration: `after` against `before` (labels: theirs) and against SDPA's backends; at a head dim of
    `one_kernel_at`, where the two builds are one kernel, how far apart its two columns are."""
    out = []
    for key, t in by_config(rows).items():
        old, new = t.get(before), t.get(after)
        if not (old and new and "sdpa_flash" in t and "sdpa_cudnn" in t):
            continue
        if key[3] in one_kernel_at:
            out.append(f"{_where(key)}: one kernel, two columns {100 * abs(old / new - 1):.1f}% apart")
        else:
            out.append(f"{_where(key)}: {labels[1]} at {old / new:.3f}× the speed of {labels[0]}; "
                       f"{t['sdpa_flash'] / new:.3f}× FlashAttention-2's, {t['sdpa_cudnn'] / new:.3f}× cuDNN's")
    return out

def target_lines(rows: list[dict], second: list[dict]) -> list[str]:
    """The layout step's choice against FlashAttention-2 in its record, then in a second run (backward_heads)."""
    first, out = by_config(rows), []
    for key, t in first.items():
        mine, fa2 = t[default_variant(key[3])], t["sdpa_flash"]
        out.append(f"{_where(key)}: layout 2 {mine:,.1f} µs, FlashAttention-2 {fa2:,.1f} µs: {fa2 / mine:.3f}× its "
                   f"speed, {'meets' if mine <= fa2 else 'misses'} the target (at least FlashAttention-2's speed)")
    if second:
        out.append("\nA second interleaved run (results/h200/backward_heads.json), layout 2 against FlashAttention-2:")
    for key, t in by_config(second).items():
        fa2, mine, f = t["sdpa_flash"], t["v6_layout2"], first[key]
        heads = f"; heads first {fa2 / t['v6_layout2_heads']:.3f}×" if "v6_layout2_heads" in t else ""
        out.append(f"{_where(key)}: FlashAttention-2 {fa2:,.1f} µs, layout 2 {mine:,.1f} µs: {fa2 / mine:.3f}× its "
                   f"speed{heads} (against the first record: FlashAttention-2 "
                   f"{100 * (fa2 / f['sdpa_flash'] - 1):+.1f}%, layout 2 {100 * (mine / f['v6_layout2'] - 1):+.1f}%)")
    return out

def repeat_lines(path: Path = RESULTS / "bench_backward_repeat.json") -> list[str]:
    """V6 against FlashAttention-2 in the repeated runs, each in its own process, per non-causal shape."""
    by_shape: dict[tuple, list] = {}
    for run in results.runs(results.read(path)):
        t, r0 = {r["version"]: r["median_us"] for r in run["rows"] if r.get("median_us")}, run["rows"][0]
        if "v6" in t and "sdpa_flash" in t:
            key = (r0["batch_size"], r0["num_heads"], r0["seq_len_q"], r0["head_dim"])
            by_shape.setdefault(key, []).append((t["v6"], t["sdpa_flash"]))
    return [f"B={B}, H={H}, M=N={L}, D={D}, non-causal, {len(runs)} runs: V6 "
            + ", ".join(f"{v6:,.1f}" for v6, _ in runs) + " µs; FlashAttention-2 "
            + ", ".join(f"{fa2:,.1f}" for _, fa2 in runs) + f" µs; V6 at {min(r):.3f}× to {max(r):.3f}× "
            f"its speed (median {sorted(r)[len(r) // 2]:.3f}×)"
            for (B, H, L, D), runs in by_shape.items() for r in [[fa2 / v6 for v6, fa2 in runs]]]

DET_COLUMNS = {"v6_layout2_bulk_br128": "deterministic, bwd_dkdv (4 warps)",
               "v6_det_split": "deterministic, bwd_dkdv_split", "atomic": "atomic dQ",
               "sdpa_flash": "SDPA flash (FA2)", "sdpa_cudnn": "cuDNN"}

def det_table(rows: list[dict], meta: dict) -> str:
    """The deterministic mode with either dK/dV kernel, beside the atomic mode and SDPA's backends."""
    lines = ["| B, H, M=N, D | causal | " + " | ".join(f"{c} µs" for c in DET_COLUMNS.values())
             + " | split vs 4 warps | cost of determinism |", "|---|---|" + "--:|" * (len(DET_COLUMNS) + 2)]
    for key, t in by_config(rows).items():
        us = {n: t.get(n) for n in DET_COLUMNS}
        old, new, atomic = us["v6_layout2_bulk_br128"], us["v6_det_split"], us["atomic"]
        ratios = f" | {old / new:.2f}× | +{100 * (old / atomic - 1):.0f}% |" if old and new and atomic else " | — | — |"
        lines.append(f"| {key[0]}, {key[1]}, {key[2]}, {key[3]} | {'yes' if key[4] else 'no'} | "
                     + " | ".join("—" if v is None else f"{v:,.1f}" for v in us.values()) + ratios)
    return "\n".join(lines) + "\n\n" + recorded_note(meta, "one interleaved run per row (200 calls in 20 rounds); "
                                                          "the cost of determinism is the default's deterministic "
                                                          "time (bwd_dkdv) over the atomic time", fa2=False)

def ncu_kernels(step: str) -> tuple[dict, list[tuple[str, dict]]]:
    """A step's Nsight Compute record: its JSON and (build, {metric: value in base units}) per kernel."""
    path = RESULTS / f"{RECORD_NAMES[step]}_ncu.json"
    info = ncu_record(path)
    return info, [(label, {name: ncu.parse_number(v[0]) * ncu.unit_scale(v[1]) for name, v in k.items()
                           if isinstance(v, tuple) and ncu.parse_number(v[0]) is not None})
                  for label, k in zip(info["kernels"], ncu_pages.read_raw_rows(path.with_name(info["raw_csv"])))]

# (header, Nsight Compute metric, format); durations in µs
PROFILE_COLUMNS = tuple(c.split(";") for c in (
    "duration µs;gpu__time_duration.sum;{:,.1f}", "instructions;smsp__inst_executed.sum;{:,.0f}",
    "LDSM instructions;smsp__inst_executed_op_ldsm.sum;{:,.0f}",
    "shared-load wavefronts;l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum;{:,.0f}",
    "shared-load bank conflicts;l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum;{:,.0f}",
    "shared-store wavefronts;l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum;{:,.0f}",
    "tensor pipe active %;sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active;{:.1f}",
    "L1 throughput %;l1tex__throughput.avg.pct_of_peak_sustained_active;{:.1f}",
    "registers;launch__registers_per_thread;{:.0f}",
    *(f"stall {s.replace('_', ' ')};smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio;{{:.2f}}"
      for s in ("short_scoreboard", "wait", "long_scoreboard", "mio_throttle", "math_pipe_throttle", "barrier"))))

def _fmt(k: dict, metric: str, fmt: str) -> str:
    return "—" if metric not in k else fmt.format(k[metric] * (1e6 if metric == "gpu__time_duration.sum" else 1))

def profile_table(step: str, columns=PROFILE_COLUMNS) -> str:
    """The kernels of a step's Nsight Compute record, one row per build."""
    info, kernels = ncu_kernels(step)
    lines = [f"| build (bf16, {info['shape']}) | " + " | ".join(c[0] for c in columns) + " |",
             "|---|" + "--:|" * len(columns)]
    for label, k in kernels:
        lines.append(f"| {COLUMNS.get(label, label)} | " + " | ".join(
            _fmt(k, metric, fmt) for _, metric, fmt in columns) + " |")
    return "\n".join(lines) + (f"\n\nNsight Compute, one launch of each dK/dV kernel (results/h200/{RECORD_NAMES[step]}"
                               "_ncu.json has the command); stalls in cycles per issued instruction.")

KEY_STEPS = (("layout 0 → 2", "layouts", "v6_layout0", "v6_layout2", ("LDSM instructions", "shared-load wavefronts")),
             ("red → bulk dQ", "dq", "v6_layout2", "v6_layout2_bulk", ("instructions", "stall long scoreboard")),
             ("B_r 64 → 128", "tile", "v6_layout2_bulk", "v6_layout2_bulk_br128",
              ("instructions", "LDSM instructions")))

def key_profile_table() -> str:
    """Per step, the counters its text reads, before and after, from the step's Nsight Compute record."""
    cols = {c[0]: c for c in PROFILE_COLUMNS}
    lines = ["| step | counter | before | after |", "|---|---|--:|--:|"]
    shapes = []
    for label, step, before, after, names in KEY_STEPS:
        info, kernels = ncu_kernels(step)
        k = dict(kernels)
        shapes.append(f"{label}: {info['shape']}")
        for name in ("duration µs", *names):
            _, metric, fmt = cols[name]
            lines.append(f"| {label} | {name} | {_fmt(k[before], metric, fmt)} | {_fmt(k[after], metric, fmt)} |")
    return "\n".join(lines) + ("\n\nNsight Compute, one launch of each dK/dV kernel, bf16 (results/h200/"
                               "backward_{layouts,dq,tile}_ncu.json); " + "; ".join(shapes) + ".")

def bank_conflict_runs(build: str = "v6_layout2") -> list[str]:
    """The shared-load bank conflicts of one build in every step's profile that has it (same shape, other runs)."""
    metric = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
    return [f"{COLUMNS[build]} in results/h200/{RECORD_NAMES[step]}_ncu.json ({info['shape']}): "
            f"{k[metric]:,.0f} shared-load bank conflicts" for step in ("layouts", "dq", "tile")
            for info, kernels in [ncu_kernels(step)] for label, k in kernels if label == build and metric in k]

def long_scoreboard_table(build: str, top: int = 3) -> str:
    """The SASS instructions of `build` with the most long-scoreboard samples (the dQ step's source page), each
    with the memory instruction whose register it overwrites."""
    path = RESULTS / f"{RECORD_NAMES['dq']}_ncu.json"
    info = ncu_record(path)
    rows = ncu_pages.read_source_rows(path.with_name(info["source_csv"]))[build]
    total = sum(float(r["stall_long_sb"] or 0) for r in rows)
    every = sum(float(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows)
    lines = ["| SASS instruction | long-scoreboard samples | share of them | the memory instruction whose "
             "register it overwrites (instructions before) | the three instructions before it |",
             "|---|--:|--:|---|---|"]
    sources = [r["Source"].strip() for r in rows]
    for w in ncu_pages.register_waits(rows, top=top):
        at = sources.index(w["source"])
        before = "; ".join(f"`{s}`" for s in sources[max(0, at - 3):at])
        culprit = w["waits_for"]
        held = f"`{culprit['source']}` ({culprit['distance']})" if culprit else "none within 64"
        lines.append(f"| `{w['source']}` | {w['samples']:,.0f} | {100 * w['samples'] / total:.0f}% | {held} | "
                     f"{before} |")
    return ("\n".join(lines) + f"\n\n{COLUMNS.get(build, build)}: {total:,.0f} long-scoreboard samples of "
            f"{every:,.0f} in all ({100 * total / every:.0f}%); {info['shape']}, bf16, "
            f"from results/h200/{info['source_csv']}.")

def layout_sass_rows(D: int) -> list[dict]:
    """The hot loop of each layout's key-tile kernel (red.global builds: the layout step came before the bulk dQ)."""
    rows = []
    for layout, label in enumerate(("layout 0: bwd_dkdv", "layout 1: split", "layout 2: split + stmatrix, dQ 2×4")):
        kernel = (f"bwd_dkdv<__nv_bfloat16, {D}, 8, false, true" if layout == 0
                  else f"bwd_dkdv_split<__nv_bfloat16, {D}, 64, {layout}, 2, 0, false")
        flags = (f"-DV6B_D64_LAYOUT={layout}", f"-DV6B_D128_LAYOUT={layout}", "-DV6B_DQ_BULK=0")
        row = sass.loop_row(sass.function("v6_backward", kernel, flags).hot_loop())
        del row["loop: its most frequent source line"]
        row["LDSM per HMMA"] = f"{row['LDSM'] / row['HMMA']:.2f}"
        rows.append({"kernel (bf16, non-causal)": f"{label}, D = {D}", **row})
    return rows

def tile_sass_rows() -> list[dict]:
    """The hot loop at D = 64 with B_r = 64 and 128 (bulk dQ), per query tile and per 64 query rows."""
    rows = []
    for br in (64, 128):
        kernel = f"bwd_dkdv_split<__nv_bfloat16, 64, {br}, 2, 2, 1, false"   # DQ_SUM 1: the bulk reduction
        row = sass.loop_row(sass.function("v6_backward", kernel, (f"-DV6B_D64_BR={br}",)).hot_loop())
        counts = {k: row[k] for k in ("instructions", "HMMA", "LDSM", "MUFU", "BAR/sync", "integer")}
        rows.append({"kernel (bf16, D = 64, non-causal)": f"B_r = {br}, one query tile", **counts})
        rows.append({"kernel (bf16, D = 64, non-causal)": f"B_r = {br}, per 64 query rows",
                     **{k: f"{v * 64 / br:g}" for k, v in counts.items()}})
    return rows

STEP_ROWS = (("dK/dV split over the warps: layout 0 → 2", "layouts", "v6_layout0", "v6_layout2"),
             ("dQ by one bulk reduction per tile: red → bulk", "dq", "v6_layout2", "v6_layout2_bulk"),
             ("taller query tile at D = 64: B_r 64 → 128", "tile", "v6_layout2_bulk", "v6_layout2_bulk_br128"),
             ("deterministic mode on the split kernel (not kept)", "det", "v6_layout2_bulk_br128", "v6_det_split"))

def steps_table() -> str:
    """What each step bought: the before build's time over the after build's, in the step's own interleaved run,
    per target configuration; the last rows: today's build against FlashAttention-2 and cuDNN in the tile run."""
    runs = {step: by_config(step_run(step)[0]) for step in ("layouts", "dq", "tile", "det")}
    keys = list(runs["tile"])
    lines = ["| step | record | " + " | ".join(f"D={k[3]}{', causal' if k[4] else ''}" for k in keys) + " |",
             "|---|---|" + "--:|" * len(keys)]
    for label, step, before, after in STEP_ROWS:
        cells = []
        for k in keys:
            t = runs[step].get(k, {})
            same = step == "tile" and k[3] != 64
            cells.append("same kernel" if same else
                         f"{t[before] / t[after]:.2f}×" if before in t and after in t else "—")
        lines.append(f"| {label} | {RECORD_NAMES[step]}.json | " + " | ".join(cells) + " |")
    for other, name in (("sdpa_flash", "FlashAttention-2"), ("sdpa_cudnn", "cuDNN")):
        cells = [f"{t[other] / t[default_variant(k[3], 'tile')]:.2f}×" for k, t in runs["tile"].items()]
        lines.append(f"| today's kernels against {name} | {RECORD_NAMES['tile']}.json | " + " | ".join(cells) + " |")
    shapes = ", ".join(sorted({f"D={k[3]}: B={k[0]}, H={k[1]}, M=N={k[2]}" for k in keys}))
    return "\n".join(lines) + (f"\n\nSpeed ratios (time before / time after; above 1: faster), bf16; {shapes}; each "
                               "from its step's interleaved run, the kernels called directly (not through autograd).")

def det_occupancy() -> list[str]:
    """Blocks per SM of the deterministic mode's two dK/dV kernels (bf16, non-causal): registers from ptxas (nvcc on
    the CPU, default and V6B_DET_SPLIT=1 builds), shared memory from launch_dkdv's and launch_dkdv_split's formulas."""
    reports = {0: resources.compile_report("v6_backward", "90"),
               1: resources.compile_report("v6_backward", "90", ("-DV6B_DET_SPLIT=1",))}
    out = []
    for D in (64, 128):
        br = 128 if D == 64 else 64     # the split kernel's query tile on sm_90 (V6B_D64_BR at D = 64)
        for split, name, threads, smem in (
                (0, f"bwd_dkdv<__nv_bfloat16, {D}, 4, false, false>", 128,
                 (2 * 64 + 4 * 64) * D * 2 + 64 * 64 * 2 + 4 * 64 * 4),
                (1, f"bwd_dkdv_split<__nv_bfloat16, {D}, {br}, 2, 2, 2, false>", 256,
                 (2 * 128 + 4 * br) * D * 2 + 2 * 128 * br * 2 + 4 * br * 4)):
            regs = next(k["registers"] for k in reports[split] if name in k["name"])
            occ = resources.occupancy(regs, smem, threads)
            out.append(f"{name}: {regs} registers x {threads} threads, {smem / 1024:.0f} KB shared memory: "
                       f"{occ['blocks']} block(s) per SM, limited by {' and '.join(occ['limited_by'])}")
    return out
