"""Helpers the book's notebooks call, so that each code cell stays one or two readable lines.

Three kinds of helper live here:

* **live or recorded** -- `correctness`, `timing`: with a CUDA GPU they run the kernels now (float64
  reference, CUDA-event timing through `flashattn.bench`); without one they say so in one line and show
  what was recorded on the H200 in `results/h200/bench.json`.
* **recorded only, deterministic** -- `profile_table`, `resources`, `ceilings_table`, `smem_layout`: they
  read committed files (Nsight Compute reports, the ptxas record, the anchors' ceilings) or do arithmetic,
  so their output is the same on every machine; the notebooks check it with `# NBVAL_CHECK_OUTPUT`.
* **figures** -- `fig_*` functions draw the book's diagrams with matplotlib from fixed data (no random
  state without a seed), so they look the same on every run.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from .resources import occupancy  # noqa: F401  (the chapters call nb.occupancy)
from .table import label, sdpa_cell
from .versions import INFO, VERSIONS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "h200"
COMPILE_RECORD = ROOT / "results" / "compile" / "resources.json"
PRIMARY = dict(B=4, H=12, L=2048, D=64)       # the shape every chapter times and profiles

# torch warns "No CUDA runtime is found" at import of cpp_extension on a machine without a GPU; the
# notebooks say that themselves, once.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def gpu() -> bool:
    return torch.cuda.is_available()


def _md(text: str):
    from IPython.display import Markdown
    return Markdown(text)


NO_GPU = "No CUDA GPU on this machine: {what} recorded on the H200 are shown instead."
LIVE_ONLY = ("No CUDA GPU on this machine: this experiment runs live only; the book's pages show the output "
             "of its run on the H200.")


def setup() -> None:
    """Matplotlib defaults for the book's figures and one line saying where this notebook runs."""
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 10,
                                "axes.titlesize": 11, "figure.max_open_warning": 0,
                                "svg.hashsalt": "flashattn", "image.interpolation": "nearest"})
    plt.close("all")
    if gpu():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        print(f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs), torch {torch.__version__}: "
              f"cells run live.")
    else:
        print(f"No CUDA GPU (torch {torch.__version__}): kernels are compiled; recorded H200 figures stand in "
              f"for live runs.")


# ----------------------------------------------------------------------------------------- records
def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def ceilings() -> dict:
    """The H200 ceilings measured by the anchor run (results/h200/ceilings.json), in base units."""
    doc = _json(RESULTS / "ceilings.json")
    c = {k: v["value"] for k, v in doc["ceilings"].items()}
    return {"fp32": c["fp32_cuda_core_tflops"] * 1e12, "tf32": c["tf32_tensor_tflops"] * 1e12,
            "bf16": c["bf16_tensor_tflops"] * 1e12, "fp16": c["fp16_tensor_tflops"] * 1e12,
            "dram": c["dram_copy_tbps"] * 1e12, "sm_count": doc["sm_count"], "source": doc["source"]}


def ceilings_table():
    """The measured ceilings next to the datasheet, and the ridge points they imply."""
    doc = _json(RESULTS / "ceilings.json")
    dram = doc["ceilings"]["dram_copy_tbps"]["value"]
    lines = ["| Ceiling | Measured on the H200 | Datasheet | How | Ridge point |", "|---|--:|--:|---|--:|"]
    for key, name in (("fp32_cuda_core_tflops", "FP32, CUDA cores"), ("tf32_tensor_tflops", "TF32, tensor cores"),
                      ("bf16_tensor_tflops", "BF16, tensor cores")):
        c = doc["ceilings"][key]
        lines.append(f"| {name} | {c['value']:,.1f} TFLOP/s | {c['datasheet']:,} TFLOP/s | {c['how']} | "
                     f"{c['value'] / dram:,.0f} FLOP/byte |")
    c = doc["ceilings"]["dram_copy_tbps"]
    lines.append(f"| DRAM bandwidth | {c['value']:.2f} TB/s | {c['datasheet']} TB/s | {c['how']} | — |")
    return _md("\n".join(lines))


def bench_rows(path: Path | None = None) -> list[dict]:
    """Every row of a recorded benchmark file (default results/h200/bench.json), [] when absent."""
    doc = _json(path or RESULTS / "bench.json")
    if not doc:
        return []
    runs = doc["runs"] if "runs" in doc else [doc]
    return [dict(r, _meta=run.get("meta", {}), _settings=run.get("settings", {})) for run in runs for r in run["rows"]]


def report_path(version: str, seq_len: int = PRIMARY["L"]) -> Path:
    return RESULTS / f"flash_{version}_s{seq_len}_profile.ncu-rep"


def _ncu_report_importable() -> bool:
    """ncu_report comes from PyPI (ncu-report) or from Nsight Compute's own extras/python folder."""
    try:
        import ncu_report  # noqa: F401
        return True
    except ImportError:
        pass
    from .profile import find_ncu
    ncu = find_ncu()
    if ncu:
        extras = Path(ncu).resolve().parent / "extras" / "python"
        if extras.is_dir():
            sys.path.append(str(extras))
            try:
                import ncu_report  # noqa: F401
                return True
            except ImportError:
                return False
    return False


def profile_summary(version: str, seq_len: int = PRIMARY["L"]) -> dict | None:
    """flashattn.ncu's summary of the recorded report of `version`, None when there is none."""
    path = report_path(version, seq_len)
    if not path.exists() or not _ncu_report_importable():
        return None
    return _summary(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _summary(path: str, mtime_ns: int) -> dict:
    """One parse per report and version of the file: a chapter asks for the table, the stalls and the
    roofline point of the same report."""
    from .ncu import summarize
    return summarize(path)


def _recorded_summary(version: str, seq_len: int):
    """(summary, None) or (None, the sentence to show instead)."""
    path = report_path(version, seq_len)
    if not path.exists():
        return None, (f"*No Nsight Compute report recorded yet for {label(version)} "
                      f"(`results/h200/{path.name}`); it appears here once the H200 run is committed.*")
    s = profile_summary(version, seq_len)
    if s is None:
        return None, "*The report is there but `ncu_report` is not installed (`pip install ncu-report`).*"
    return s, None


def profile_table(version: str, seq_len: int = PRIMARY["L"], batch_size: int = PRIMARY["B"],
                  num_heads: int = PRIMARY["H"], head_dim: int = PRIMARY["D"]):
    """The Nsight Compute table of `version`, parsed from the committed report (profiled with
    `python -m flashattn.profile` at the shape given here; the primary one by default)."""
    s, missing = _recorded_summary(version, seq_len)
    if s is None:
        return _md(missing)
    from .ncu import markdown_table
    from .profile import default_dtype
    return _md(f"`{s['kernel'].split('(')[0]}` on {s['device']}, B={batch_size}, H={num_heads}, "
               f"M=N={seq_len}, D={head_dim} ({default_dtype(version)}):\n\n" + markdown_table(s))


def stall_table(version: str, seq_len: int = PRIMARY["L"], top: int = 6):
    """Where the warps of `version` spent their cycles (ncu's warp-state statistics), largest first."""
    s, missing = _recorded_summary(version, seq_len)
    if s is None:
        return _md(missing)
    from .ncu import stall_table as table
    return _md(table(s, top))


# -------------------------------------------------------------------------------------- kernels
def build(version: str) -> None:
    """Compile (or load from torch's cache) kernels/<version>.cu; one line says how long it took.

    Without a GPU the extension still compiles for sm_90 (flashattn.loader's default), which checks the
    kernel and the binding; nothing is launched."""
    from .loader import arch_list, load
    start = time.perf_counter()
    load(version)
    took = time.perf_counter() - start
    archs = ", ".join("sm_" + a.replace(".", "").replace("+PTX", "") for a in arch_list())
    how = "compiled" if took > 2 else "loaded from the build cache"
    print(f"{label(version)}: kernels/{version}.cu {how} for {archs} in {took:.1f} s.")


def requirements(version: str):
    """What the kernel accepts and which GPUs it needs, from flashattn.versions."""
    i = INFO[version]
    dtypes = ", ".join(str(d).replace("torch.", "") for d in i.dtypes)
    dims = ("any D from 1 to %d" % i.max_head_dim) if i.head_dims is None else \
        "D in {" + ", ".join(map(str, i.head_dims)) + "}" + (f" (other D run {i.fallback})" if i.fallback else "")
    sm = f"{i.min_sm[0]}.{i.min_sm[1]}"
    gpus = {"7.0": "Volta (V100) or newer: any GPU that current PyTorch supports",
            "8.0": "Ampere (A100, RTX 30xx) or newer: cp.async, ldmatrix and bf16 mma.sync need sm_80"}[sm]
    lines = ["| | |", "|---|---|", f"| dtypes | {dtypes} |", f"| head dim | {dims} |",
             f"| sequence lengths | any M, N >= 1{'; M = N only' if i.self_attention_only else ''} |",
             f"| causal | {'yes' if i.causal else 'no'} |", f"| GPU | compute capability {sm}+, {gpus} |"]
    return _md("\n".join(lines))


def gpu_table():
    """Every version's dtypes, head dims and the oldest GPU generation its instructions allow."""
    gen = {(7, 0): "Volta / sm_70 and newer", (8, 0): "Ampere / sm_80 and newer (A100, RTX 30xx, L4, H100, H200)"}
    lines = ["| version | dtypes | head dims | M ≠ N | causal | needs |", "|---|---|---|---|---|---|"]
    for v in VERSIONS:
        i = INFO[v]
        dt = ", ".join(str(d).replace("torch.", "") for d in i.dtypes)
        dims = f"1–{i.max_head_dim}" if i.head_dims is None else ", ".join(map(str, i.head_dims)) + \
            (f" (others via {i.fallback})" if i.fallback else "")
        if not i.kernel:
            dims, need = "any", "whatever PyTorch supports"
        else:
            need = gen.get(tuple(i.min_sm), f"sm_{i.min_sm[0]}{i.min_sm[1]}")
        lines.append(f"| {label(v)} | {dt} | {dims} | {'no' if i.self_attention_only else 'yes'} | "
                     f"{'yes' if i.causal else 'no'} | {need} |")
    return _md("\n".join(lines))


def timing_pitfalls(version: str = "baseline", L: int = 1024):
    """The same call timed four ways, to show what each mistake does to the number."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    import flashattn
    from .timing import l2_flush_buffer, time_cuda
    q, k, v = _inputs(PRIMARY["B"], PRIMARY["H"], L, L, PRIMARY["D"], seed=1)
    if version in INFO and INFO[version].kernel:
        flashattn.load(version)
    fn = lambda: flashattn.forward(q, k, v, version=version)
    torch.cuda.synchronize()
    t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); first = (time.perf_counter() - t0) * 1e6
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    host_nosync = (time.perf_counter() - t0) / 20 * 1e6
    torch.cuda.synchronize()
    warm = time_cuda(fn, warmup=5, repetitions=50, flush_l2=False).median_ms * 1e3
    cold = time_cuda(fn, warmup=5, repetitions=50, flush_l2=True).median_ms * 1e3
    l2 = l2_flush_buffer().numel() // 2
    rows = [("first call, host timer, synchronised", first, "includes lazy initialisation (cuBLAS handles, allocator)"),
            ("host timer around 20 launches, no synchronisation", host_nosync, "measures how fast the CPU enqueues work"),
            ("CUDA events, warm L2 (inputs stay cached)", warm, "optimistic when the working set fits in L2"),
            ("CUDA events, L2 flushed before each call (the book's method)", cold, "every call starts from DRAM")]
    lines = ["| method | µs per call | what it really measures |", "|---|--:|---|"]
    lines += [f"| {a} | {b:,.1f} | {c} |" for a, b, c in rows]
    return _md("\n".join(lines) + f"\n\n{label(version)} at B=4, H=12, M=N={L}, D=64 on "
               f"{torch.cuda.get_device_name()}; Q, K, V and O take {4 * q.numel() * 4 / 1e6:.0f} MB, the L2 "
               f"cache {l2 / 1e6:.0f} MB.")


# ---------------------------------------------------------------------------------- correctness
def _inputs(B, H, M, N, D, dtype=torch.float32, seed=0, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, M, D, device="cuda", generator=gen) * scale
    k = torch.randn(B, H, N, D, device="cuda", generator=gen) * scale
    v = torch.randn(B, H, N, D, device="cuda", generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def default_shapes(version: str) -> list[tuple]:
    """Odd sizes that are not multiples of any tile, M != N where allowed, and one long row."""
    D = (INFO[version].head_dims or (64,))[0]
    if INFO[version].self_attention_only:
        return [(1, 1, 1, 1, D), (2, 3, 113, 113, D), (1, 2, 1000, 1000, D), (4, 12, 512, 512, D)]
    return [(1, 1, 1, 1, D), (2, 3, 113, 203, D), (1, 2, 1000, 17, D), (1, 1, 17, 2048, D), (4, 12, 512, 512, D)]


def correctness(version: str, shapes=None, dtype=torch.float32, causal: bool = False, scale: float = 1.0):
    """Relative error ||out - ref|| / ||ref|| against the float64 reference, per shape (live), or the
    error the H200 benchmark recorded at its smallest shape (no GPU)."""
    if not gpu():
        print(NO_GPU.format(what="the errors"))
        rows = [r for r in bench_rows() + bench_rows(RESULTS / "bench_v6.json")
                if r["impl"] == version and r.get("rel_error") is not None]
        if not rows:
            return _md("*No recorded benchmark yet (`results/h200/bench.json`).*")
        lines = ["| B, H, M, N, D | dtype | causal | relative error |", "|---|---|---|--:|"]
        for r in rows:
            lines.append(f"| {r['batch_size']}, {r['num_heads']}, {r['seq_len_q']}, {r['seq_len_kv']}, "
                         f"{r['head_dim']} | {r['dtype']} | {r['causal']} | {r['rel_error']:.1e} |")
        return _md("\n".join(lines))
    import flashattn
    from .reference import attention_reference, relative_error
    lines = ["| B, H, M, N, D | ran as | relative error | finite |", "|---|---|--:|---|"]
    for B, H, M, N, D in shapes or default_shapes(version):
        q, k, v = _inputs(B, H, M, N, D, dtype, scale=scale)
        out = flashattn.forward(q, k, v, version=version, causal=causal)
        err = relative_error(out, attention_reference(q, k, v, causal=causal))
        ran = flashattn.check_inputs(q, k, v, version, causal)
        lines.append(f"| {B}, {H}, {M}, {N}, {D} | {ran} | {err:.1e} | {bool(torch.isfinite(out).all())} |")
    return _md("\n".join(lines))


# -------------------------------------------------------------------------------------- timing
def _bench_table(rows: list[dict], note: str) -> str:
    lines = ["| version | M = N | median µs | min – max µs | calls | TFLOP/s | vs. baseline | vs. SDPA |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {label(r['impl'])} | {r['seq_len_q']} | {r['status']}: {r['message']} | | | | | |")
            continue
        base = r.get("change_vs_baseline_pct")
        sd = sdpa_cell(r)
        lines.append(f"| {label(r['impl'])} | {r['seq_len_q']} | {r['median_us']:,.1f} | "
                     f"{r['min_us']:,.1f} – {r['max_us']:,.1f} | {r['calls_timed']} | {r['tflops']:.2f} | "
                     f"{'—' if base is None or r['impl'] == 'baseline' else f'{base:+.1f}%'} | {sd} |")
    return "\n".join(lines) + "\n\n" + note


def _recorded_note(rows: list[dict]) -> str:
    if not rows:
        return ""
    meta, st = rows[0]["_meta"], rows[0]["_settings"]
    dev = (meta.get("device") or {}).get("name", "?")
    commit = ((meta.get("git") or {}).get("commit") or "uncommitted")[:10]
    rounds = f" in {st['rounds']} interleaved rounds" if st.get("rounds", 1) > 1 else ""
    return (f"Recorded on {dev} (torch {meta.get('torch', '?')}, commit {commit}): median of up to "
            f"{st.get('repetitions', '?')} calls{rounds} after {st.get('warmup', '?')} warm-ups, L2 flushed "
            f"before each.")


def recorded(versions, seq_lens=(PRIMARY["L"],), dtype="float32", causal=False, head_dim=64, file="bench.json"):
    """The recorded H200 rows of these versions and lengths, as a table (same columns as `timing`)."""
    rows = [r for r in bench_rows(RESULTS / file) if r["impl"] in versions and r["seq_len_q"] in seq_lens
            and r["dtype"] == dtype and bool(r["causal"]) == causal and r["head_dim"] == head_dim]
    if not rows:
        return _md(f"*No recorded benchmark yet (`results/h200/{file}`); the H200 run fills it in.*")
    order = {v: i for i, v in enumerate(versions)}
    rows.sort(key=lambda r: (r["seq_len_q"], order[r["impl"]]))
    return _md(_bench_table(rows, _recorded_note(rows)))


def timing(versions, seq_lens=(PRIMARY["L"],), B=PRIMARY["B"], H=PRIMARY["H"], D=PRIMARY["D"],
           dtype="float32", causal=False, warmup=5, repetitions=30, rounds=3, max_seconds=2.0, file="bench.json"):
    """Time `versions` side by side on the same inputs (flashattn.bench: CUDA events, L2 flush, median),
    or show the recorded H200 rows without a GPU."""
    versions = list(versions)
    if not gpu():
        print(NO_GPU.format(what="the latencies"))
        return recorded(versions, seq_lens, dtype, causal, D, file)
    from .bench import DTYPES, add_comparisons, bench_shape
    args = SimpleNamespace(warmup=warmup, repetitions=repetitions, rounds=rounds, max_seconds=max_seconds)
    rows = []
    for L in seq_lens:
        q, k, v = _inputs(B, H, L, L, D, DTYPES[dtype], seed=L)
        rows += bench_shape(versions, q, k, v, causal, args)
        del q, k, v
        torch.cuda.empty_cache()
    add_comparisons(rows)
    name = torch.cuda.get_device_name()
    return _md(_bench_table(rows, f"Measured now on {name}: median of up to {repetitions} calls in {rounds} "
                                  f"interleaved rounds after {warmup} warm-ups, L2 flushed before each "
                                  f"(B={B}, H={H}, D={D}, {dtype})."))


def score_bytes_table(lengths=(512, 1024, 2048, 4096, 8192, 16384), B=PRIMARY["B"], H=PRIMARY["H"],
                      D=PRIMARY["D"]):
    """Size of the score matrix S next to Q, K, V and O together, float32, for several lengths."""
    lines = ["| N | Q, K, V, O | S = QKᵀ (B·H·N² floats) | S / (Q, K, V, O) |", "|--:|--:|--:|--:|"]
    for N in lengths:
        io, s = 4 * 4 * B * H * N * D, 4 * B * H * N * N
        lines.append(f"| {N:,} | {io / 1e6:,.0f} MB | {s / 1e6:,.0f} MB | {s / io:,.0f}× |")
    return _md("\n".join(lines) + f"\n\nB={B}, H={H}, D={D}, float32: the ratio is N / (4D).")


def peak_memory(versions, L: int = PRIMARY["L"]):
    """Peak memory PyTorch's allocator reports during one forward of each version (live only)."""
    if not gpu():
        print(LIVE_ONLY)
        return None
    import flashattn
    q, k, v = _inputs(PRIMARY["B"], PRIMARY["H"], L, L, PRIMARY["D"], seed=2)
    base = torch.cuda.memory_allocated()
    lines = ["| version | extra memory during one forward |", "|---|--:|"]
    for name in versions:
        if INFO[name].kernel:
            flashattn.load(name)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        out = flashattn.forward(q, k, v, version=name)
        torch.cuda.synchronize()
        lines.append(f"| {label(name)} | {(torch.cuda.max_memory_allocated() - base) / 1e6:,.0f} MB |")
        del out
    return _md("\n".join(lines) + f"\n\nB=4, H=12, M=N={L}, D=64, float32; the output itself is "
               f"{q.numel() * 4 / 1e6:.0f} MB.")


def anchor_attention_table(dtype: str | None = None):
    """PyTorch's attention on the H200 as measured by the anchor run (results/h200/ceilings.json)."""
    doc = _json(RESULTS / "ceilings.json")
    rows = [r for r in doc["pytorch_attention"]["rows"] if dtype is None or r["dtype"] == dtype]
    lines = ["| N | dtype | PyTorch path | µs | TFLOP/s |", "|--:|---|---|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['N']} | {r['dtype']} | {r['impl']} | {r['us']:,.1f} | {r['tflops']:.1f} |")
    return _md("\n".join(lines) + "\n\nB=4, H=12, D=64, non-causal; from the anchor run, not from this "
               "book's benchmark (which times everything side by side).")


# ------------------------------------------------------------------------------ resources / tiles
# Launch facts at D = 64 that ptxas does not report: threads per block and dynamic shared memory.
LAUNCH = {
    "v0": {"scores_kernel": (256, 0), "softmax_kernel": (256, 0), "pv_kernel": (256, 0)},
    "v1": {"flash_v1_kernel": (128, 4 * (32 * 64 + 2 * 32 * 64 + 32 * 32))},
    "v2": {"flash_v2_kernel": (128, 4 * (2 * 64 * 64 + 2 * 32 * 64 + 64 * 32 + 3 * 64))},
    "v3": {"flash_v3_kernel": (256, 0)},
    "v4": {"flash_v4_kernel": (256, 0)},
}


def kernel_resources(version: str) -> list[dict]:
    """ptxas's registers and static shared memory per kernel for sm_90, from results/compile/resources.json
    (or a fresh nvcc run when the record has no entry for this version yet)."""
    rec = _json(COMPILE_RECORD) or {}
    kernels = rec.get(version, {}).get("sm_90")
    if not kernels:
        from .resources import compile_report
        kernels = compile_report(version, "90")
    return kernels


def _template_args(name: str) -> list[str]:
    inner = name[name.index("<") + 1: name.rindex(">")]
    out, depth, cur = [], 0, ""
    for ch in inner:
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            out.append(cur.strip()); cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def launch_of(version: str, kernel: str) -> tuple[int, int] | None:
    """(threads per block, dynamic shared memory bytes) of one compiled kernel at its own tile shape.
    v5 and v6 are templates: the tile shape is read from the template arguments and put through the
    same formulas as the kernel files (v5: struct Tiles; v6: its launcher's Q tile + two stages of K, V)."""
    if version == "v5" and "Tiles<" in kernel:
        D, BR, BC, TM, TN = (int(x) for x in kernel.split("Tiles<")[1].split(">")[0].split(","))
        WC, NRG = BC // TN, BR // TM
        PS = BC + ((WC - BC % 32) % 32 + 32) % 32
        return WC * NRG, 4 * (BR * (D + 4) + BC * (D + 4) + BC * D + BR * PS)
    if version == "v6" and "flash_fwd_mma<" in kernel:
        args = _template_args(kernel)
        T, D, WM, BC = args[0], int(args[1]), int(args[2]), int(args[3])
        STAGES = int(args[6])                          # pipeline buffers of K_j, V_j
        BR = 16 * WM * 4
        return 128, (4 if T == "float" else 2) * D * (BR + 2 * STAGES * BC)   # Q_i + STAGES x (K_j, V_j)
    for name, facts in LAUNCH.get(version, {}).items():
        if name in kernel:
            return facts
    return None


def _short(kernel: str) -> str:
    name = kernel.removeprefix("void ")
    head, _, tail = name.partition("<")
    return head.split("::")[-1] + (("<" + tail) if tail else "")


def resources(version: str, only: str | None = None):
    """Registers, shared memory and the occupancy they allow on an H200 SM, per kernel of `version`
    (`only`: a substring the kernel name must contain, e.g. a dtype of a templated kernel)."""
    lines = ["| kernel | threads | registers | spills | shared memory | blocks/SM by regs · smem · warps | "
             "blocks/SM | occupancy |", "|---|--:|--:|--:|--:|---|--:|--:|"]
    for k in sorted(kernel_resources(version), key=lambda k: k["name"]):
        facts = launch_of(version, k["name"])
        if facts is None or (only and only not in k["name"]):
            continue
        threads, dyn = facts
        smem = k.get("static_smem_bytes", 0) + dyn
        o = occupancy(k["registers"], smem, threads)
        b = o["by"]
        lines.append(f"| `{_short(k['name'])}` | {threads} | {k['registers']} | {k.get('spill_store_bytes', 0)} B | "
                     f"{smem:,} B | {b['registers']} · {b['shared memory']} · {b['warps']} | {o['blocks']} | "
                     f"{o['occupancy_pct']:.1f}% |")
    return _md("\n".join(lines) + "\n\nOccupancy = resident warps / 64 on sm_90 (65,536 registers and "
               "228 KB of shared memory per SM, 1 KB reserved per block).")


def smem_traffic_table():
    """Shared-memory wavefronts against FFMA issue for V4's inner loop and V5's register tiles: an H200
    SM issues 4 warp-wide FFMA per clock but serves 1 shared-memory wavefront (128 bytes) per clock."""
    rows = [("V4: lane owns 8 rows × 1 column, one d per step", 9, 8, "1 K float + 8 Q broadcasts")]
    for TM, TN in ((4, 4), (4, 8), (8, 4), (8, 8)):
        rows.append((f"V5 with a {TM} × {TN} register tile, 4 d per step", TM + TN, 4 * TM * TN,
                     f"{TN} K + {TM} Q float4 loads"))
    lines = ["| inner loop of S = Q Kᵀ (one warp, one step) | shared loads | FFMA | wavefront clocks : FFMA "
             "clocks | FFMA pipe ceiling |", "|---|---|--:|--:|--:|"]
    for name, waves, ffma, loads in rows:
        ffma_clocks = ffma / 4
        lines.append(f"| {name} | {loads} ({waves} wavefronts) | {ffma} | {waves} : {ffma_clocks:g} | "
                     f"{min(1.0, ffma_clocks / waves) * 100:.0f}% |")
    return _md("\n".join(lines) + "\n\nWith 8 column groups (B_c / T_N = 8) every listed load is one "
               "wavefront: a broadcast, or 8 distinct 16-byte words on distinct banks; with 16 column groups "
               "the K loads take two. The ceiling ignores everything but these two pipes.")


def v5_tiles() -> dict:
    """The default tile shape per head dim that kernels/v5.cu compiles (its V5_D64_* / V5_D128_* macros),
    with the threads and shared memory they imply (the formulas of the file's struct Tiles)."""
    import re
    src = (ROOT / "kernels" / "v5.cu").read_text()
    out = {}
    for D in (64, 128):
        BR, BC, TM, TN = (int(re.search(rf"#define V5_D{D}_{k} (\d+)", src).group(1)) for k in ("BR", "BC", "TM", "TN"))
        threads, smem = launch_of("v5", f"Tiles<{D}, {BR}, {BC}, {TM}, {TN}>")
        out[D] = dict(B_r=BR, B_c=BC, TM=TM, TN=TN, threads=threads, smem=smem, WC=BC // TN, NRG=BR // TM)
    return out


def v5_tiles_table():
    lines = ["| D | B_r × B_c | TM × TN | row groups × column groups | threads | shared memory | blocks/SM by shared memory |",
             "|--:|---|---|---|--:|--:|--:|"]
    for D, t in v5_tiles().items():
        o = occupancy(0, t["smem"], t["threads"])
        lines.append(f"| {D} | {t['B_r']} × {t['B_c']} | {t['TM']} × {t['TN']} | {t['NRG']} × {t['WC']} | "
                     f"{t['threads']} | {t['smem']:,} B | {o['by']['shared memory']} |")
    return _md("\n".join(lines) + "\n\nThe defaults compiled into `kernels/v5.cu` (its `V5_D64_*` and "
               "`V5_D128_*` macros).")


def repeat_table(file="bench_v6_repeat.json", impl="v6", against=("sdpa_flash", "sdpa")):
    """The same comparison recorded in several separate processes, one line per run: how far a ratio
    moves from run to run (`scripts/record_h200.sh OUT repeat`)."""
    doc = _json(RESULTS / file)
    if not doc:
        return _md(f"*No repeated runs recorded yet (`results/h200/{file}`).*")
    from .table import comparison_table
    return _md(comparison_table(doc, impl, list(against), group_shapes=True))


SW_POWER_CAP = 0x4          # NVML's clocks-event (throttle) reason bit for the software power cap


def clock_log(file="gpu_clocks.csv") -> dict | None:
    """Summary of the nvidia-smi samples taken during the repeated runs (every 200 ms): peak board
    power, how often the power cap held the clock down, and how low the SM clock went then."""
    import csv
    path = RESULTS / file
    if not path.exists():
        return None
    busy = capped = 0
    peak_w, max_mhz, capped_mhz = 0.0, 0, []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh, skipinitialspace=True):
            mhz = int(row["clocks.current.sm [MHz]"].split()[0])
            watts = float(row["power.draw [W]"].split()[0])
            # newer drivers name the column clocks_event_reasons, older ones clocks_throttle_reasons
            reasons = int(row.get("clocks_event_reasons.active") or row["clocks_throttle_reasons.active"], 16)
            busy += mhz > 1000                              # idle samples sit at 345 MHz
            peak_w, max_mhz = max(peak_w, watts), max(max_mhz, mhz)
            if reasons & SW_POWER_CAP:
                capped += 1
                capped_mhz.append(mhz)
    return dict(busy_samples=busy, capped_samples=capped, peak_watts=peak_w, max_mhz=max_mhz,
                min_capped_mhz=min(capped_mhz) if capped_mhz else None)


def clock_table(file="gpu_clocks.csv"):
    c = clock_log(file)
    if c is None:
        return _md(f"*No clock log recorded yet (`results/h200/{file}`).*")
    lines = ["| busy samples | power cap active | peak board power | SM clock | lowest SM clock under the cap |",
             "|--:|--:|--:|--:|--:|",
             f"| {c['busy_samples']} | {c['capped_samples']} samples | {c['peak_watts']:.0f} W | "
             f"up to {c['max_mhz']} MHz | {c['min_capped_mhz'] or '—'} MHz |"]
    return _md("\n".join(lines))


def sweep_table(version: str):
    """The recorded tile sweep of v5 or v6 (results/h200/v5_sweep.json, v6_sweep.json or v6_sweep_tiles.json)."""
    doc = next((d for d in (_json(RESULTS / f"{version}_sweep.json"), _json(RESULTS / f"{version}_sweep_tiles.json"))
                if d is not None), None)
    if doc is None:
        return _md(f"*No recorded sweep yet (`results/h200/{version}_sweep.json`).*")
    if version == "v5":
        lines = ["| variant | D | B_r × B_c | TM × TN | threads | regs | shared memory | blocks/SM | correct | "
                 "median µs | TFLOP/s | vs. SDPA |", "|---|--:|---|---|--:|--:|--:|--:|---|--:|--:|--:|"]
        for r in doc["configs"]:
            p, th = r.get("primary", {}), r.get("theory", {})
            smem = (r.get("runtime") or {}).get("smem_bytes", r.get("smem_bytes_formula"))
            lines.append(f"| {r['name']} | {r['D']} | {r['B_r']} × {r['B_c']} | {r['TM']} × {r['TN']} | "
                         f"{r['threads']} | {r.get('regs_ptxas', '?')} | {smem:,} B | {th.get('blocks_per_sm', '?')} | "
                         f"{'yes' if r.get('correct') else 'NO'} | "
                         + (f"{p['median_us']:,.1f} | {p['tflops']:.1f} | {p['vs_sdpa']:.2f}× |" if p else "— | — | — |"))
        sd = "; ".join(f"D={D}: {v['median_us']:,.1f} µs" for D, v in doc.get("sdpa", {}).items())
        return _md("\n".join(lines) + f"\n\nB=4, H=12, M=N=2048, float32 on {doc.get('device', '?')}; "
                   f"{doc.get('timing', '')}. SDPA in the same run: {sd}. Fastest correct: {doc.get('best')}.")
    lines = ["| configuration | D | B, H, M=N | median µs | TFLOP/s | vs. SDPA flash | vs. SDPA default |",
             "|---|--:|---|--:|--:|--:|--:|"]
    for r in doc:
        B, H, L, _, D = r["shape"]
        vf, vd = r.get("vs_flash"), r.get("vs_default")
        lines.append(f"| {r['config']} | {r['D']} | {B}, {H}, {L} | {r['us']:,.1f} | {r['tflops']:.0f} | "
                     f"{'—' if vf is None else f'{vf:.2f}×'} | {'—' if vd is None else f'{vd:.2f}×'} |")
    return _md("\n".join(lines) + "\n\nbf16, non-causal; ratios above 1 mean V6 is faster.")


def smem_layout(parts: list[tuple[str, int, int]], title: str = ""):
    """Shared-memory budget of one block: parts are (name, rows, cols) of float32 arrays."""
    lines = ["| array | shape | floats | bytes |", "|---|---|--:|--:|"]
    total = 0
    for name, r, c in parts:
        lines.append(f"| {name} | {r} × {c} | {r * c:,} | {4 * r * c:,} |")
        total += r * c
    lines.append(f"| **total** | | **{total:,}** | **{4 * total:,}** ({4 * total / 1024:.2f} KiB) |")
    return _md((f"{title}\n\n" if title else "") + "\n".join(lines))


def tile_options(options, D: int = 64, regs: int | None = None, rows_per_warp: int = 8, M: int = 2048,
                 BH: int = PRIMARY["B"] * PRIMARY["H"], kv_tile_floats=lambda B_c, D: B_c * D):
    """The arithmetic behind a v3-style tile choice, for each (B_r, B_c): threads (one warp per
    `rows_per_warp` query rows), shared memory Q_i + one K/V tile + P_ij, blocks per SM by shared memory
    and warps (and registers, with the given count per thread), the grid, and how often each K/V byte is
    fetched per (batch, head)."""
    sms = ceilings()["sm_count"]
    lines = ["| B_r | B_c | threads | shared memory | blocks/SM | warps/SM | grid | waves | K/V passes |",
             "|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for B_r, B_c in options:
        threads = 32 * (B_r // rows_per_warp)
        smem = 4 * (B_r * D + kv_tile_floats(B_c, D) + B_r * B_c)
        o = occupancy(regs or 0, smem, threads)
        grid = math.ceil(M / B_r) * BH
        lines.append(f"| {B_r} | {B_c} | {threads} | {smem:,} B | {o['blocks']} | {o['warps']} | {grid:,} | "
                     f"{grid / (sms * o['blocks']):.1f} | {math.ceil(M / B_r)}× |")
    note = f"registers assumed {regs}/thread (ptxas, B_r = 64)" if regs else "registers not counted"
    return _md("\n".join(lines) + f"\n\nAt M = N = {M}, D = {D}, B·H = {BH}; {note}. Waves: grid / (blocks "
               f"per SM × {sms} SMs). K/V passes: how often each (batch, head) streams its K and V.")


def variant_timing(version: str, variants: dict, seq_len: int = PRIMARY["L"], warmup=5, repetitions=30):
    """Build `version` with textual edits of its source and time the variants side by side.

    variants: {label: [(old, new), ...]}; every `old` must occur in kernels/<version>.cu, so a cell that
    names an edit fails loudly when the kernel changes. Without a GPU the variants are only compiled."""
    from .loader import build, source
    base = source(version)
    modules = {f"{version} (as committed)": None}
    for name, edits in variants.items():
        src = base
        for old, new in edits:
            if old not in src:
                raise ValueError(f"{version}: the text {old!r} of variant {name!r} is not in kernels/{version}.cu")
            src = src.replace(old, new)
        tag = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        modules[name] = build(version, src=src, module_name=f"flashattn_{version}_{tag}")
    print(f"built {len(variants)} variant(s) of {version}.")
    if not gpu():
        print(LIVE_ONLY)
        return None
    import flashattn
    from .reference import attention_reference, relative_error
    from .timing import time_cuda
    B, H, D = PRIMARY["B"], PRIMARY["H"], PRIMARY["D"]
    q, k, v = _inputs(B, H, seq_len, seq_len, D, seed=7)
    ref = attention_reference(q[:1, :2], k[:1, :2], v[:1, :2])
    lines = ["| variant | median µs | min – max µs | calls | rel. error |", "|---|--:|--:|--:|--:|"]
    for name, mod in modules.items():
        fn = (lambda: flashattn.forward(q, k, v, version=version)) if mod is None else (lambda m=mod: m.forward(q, k, v))
        out = fn()
        err = relative_error(out[:1, :2], ref)
        t = time_cuda(fn, warmup=warmup, repetitions=repetitions, max_seconds=2.0)
        lines.append(f"| {name} | {t.median_ms * 1e3:,.1f} | {t.min_ms * 1e3:,.1f} – {t.max_ms * 1e3:,.1f} | "
                     f"{t.calls} | {err:.1e} |")
    return _md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, B={B}, H={H}, "
               f"M=N={seq_len}, D={D}, float32; same method as `timing`.")


def naive_cost(B: int = PRIMARY["B"], H: int = PRIMARY["H"], N: int = PRIMARY["L"], D: int = PRIMARY["D"],
               elem: int = 4):
    """Work and DRAM traffic of the three steps of unfused attention (M = N), with the time each would
    need at the measured FP32 and copy ceilings: which roof bounds which step."""
    c = ceilings()
    bh, qkvo = B * H, B * H * N * D * elem
    s_bytes = bh * N * N * elem
    steps = [("S = Q Kᵀ / √D", 2.0 * bh * N * N * D, 2 * qkvo / 4 * 1 + s_bytes),
             ("P = softmax(S)", 5.0 * bh * N * N, 2 * s_bytes),
             ("O = P V", 2.0 * bh * N * N * D, s_bytes + 2 * qkvo / 4)]
    lines = ["| step | GFLOP | DRAM GB | FLOP/byte | µs at 50.4 TFLOP/s | µs at 4.18 TB/s | bound by |",
             "|---|--:|--:|--:|--:|--:|---|"]
    tot_f = tot_b = 0.0
    for name, f, b in steps + [("fused (ideal): Q, K, V in, O out", 4.0 * bh * N * N * D + 5.0 * bh * N * N, qkvo * 4)]:
        tf, tb = f / c["fp32"] * 1e6, b / c["dram"] * 1e6
        if not name.startswith("fused"):
            tot_f, tot_b = tot_f + f, tot_b + b
        lines.append(f"| {name} | {f / 1e9:,.1f} | {b / 1e9:,.3f} | {f / b:,.1f} | {tf:,.0f} | {tb:,.0f} | "
                     f"{'compute' if tf > tb else 'memory'} |")
    lines.insert(5, f"| **unfused total** | **{tot_f / 1e9:,.1f}** | **{tot_b / 1e9:,.3f}** | **{tot_f / tot_b:,.1f}** | "
                    f"**{tot_f / c['fp32'] * 1e6:,.0f}** | **{tot_b / c['dram'] * 1e6:,.0f}** | |")
    return _md("\n".join(lines) + f"\n\nB={B}, H={H}, M=N={N}, D={D}, {elem}-byte elements; the softmax is "
               "counted as 5 FLOP per score (max, subtract, exponential, sum, scale).")


# -------------------------------------------------------------------------------------- rooflines
def roofline(versions=None, highlight: str | None = None, title: str | None = None):
    """Roofline of the recorded reports of `versions` (default: every one that has a report), under
    the measured ceilings of results/h200/ceilings.json; the report's own peaks are drawn too."""
    import matplotlib.pyplot as plt
    import numpy as np
    from .plots import point_from_summary, roofline as draw
    c = ceilings()
    versions = [v for v in (versions or VERSIONS) if report_path(v).exists()]
    points = []
    for v in versions:
        s = profile_summary(v)
        if s is not None:
            points.append(point_from_summary(label(v), s))
    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    if points:
        draw(points, title=title or "Roofline from the recorded Nsight Compute reports", ax=ax)
        if highlight:
            for p in points:
                if p["label"] == label(highlight):
                    ax.plot(p["intensity"], p["flops_per_s"], "o", ms=16, mfc="none", mec="crimson", mew=2)
    x = np.logspace(-1, 4.3, 200)
    tensor = highlight == "v6" or any(p.get("tensor_peak") for p in points)
    for peak, name, style in ((c["fp32"], "FP32 SGEMM", "-."), (c["tf32"], "TF32 GEMM", ":"),
                              (c["bf16"], "BF16 GEMM", ":")):
        if name != "FP32 SGEMM" and not tensor:
            continue                                   # CUDA-core chapters: only the FP32 roof matters
        ax.plot(x, np.minimum(peak, c["dram"] * x), style, color="tab:green", lw=1.2,
                label=f"measured: {name} {peak / 1e12:,.0f} TFLOP/s, copy {c['dram'] / 1e12:.2f} TB/s")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP / DRAM byte]",
           ylabel="performance [FLOP/s]")
    if not points:
        ax.set_title(title or "Measured H200 ceilings (no report recorded yet)")
        ax.text(0.5, 0.08, "no Nsight Compute report recorded yet", transform=ax.transAxes, ha="center",
                color="0.4")
    top = max([c["fp32"]] + [p["flops_per_s"] for p in points if p.get("flops_per_s")]
              + [p.get("tensor_peak") or 0 for p in points])
    ax.set_ylim(top=top * 3)
    ax.legend(loc="upper left", fontsize=7.5)
    ax.grid(True, which="both", alpha=0.25)
    plt.show()


# ----------------------------------------------------------------------------------- results plots
def _primary_rows(dtype="float32", causal=False, head_dim=64, file="bench.json"):
    return [r for r in bench_rows(RESULTS / file) if r["dtype"] == dtype and bool(r["causal"]) == causal
            and r["head_dim"] == head_dim and r["batch_size"] == PRIMARY["B"] and r["num_heads"] == PRIMARY["H"]
            and r["status"] == "ok"]


def fig_scaling(versions=VERSIONS, file="bench.json", dtype="float32"):
    """Latency and TFLOP/s against sequence length for every version, from the recorded benchmark."""
    import matplotlib.pyplot as plt
    rows = _primary_rows(dtype=dtype, file=file)
    if not rows:
        print(f"No recorded benchmark yet (results/h200/{file}): the H200 run fills these plots in.")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for i, v in enumerate(versions):
        pts = sorted((r["seq_len_q"], r["median_us"], r["tflops"]) for r in rows if r["impl"] == v)
        if not pts:
            continue
        L, us, tf = zip(*pts)
        style = dict(marker="o", color=f"C{i % 10}", label=label(v), ls="--" if v in ("baseline", "sdpa") else "-")
        a.plot(L, us, **style)
        b.plot(L, tf, **style)
    c = ceilings()
    b.axhline(c["fp32"] / 1e12, color="tab:green", ls="-.", lw=1)
    b.text(rows[0]["seq_len_q"], c["fp32"] / 1e12 * 1.08, "FP32 SGEMM ceiling", color="tab:green", fontsize=8)
    a.set(xscale="log", yscale="log", xlabel="sequence length M = N", ylabel="latency [µs]",
          title="Latency (B=4, H=12, D=64)")
    b.set(xscale="log", yscale="log", xlabel="sequence length M = N", ylabel="TFLOP/s",
          title="Throughput, 4·B·H·M·N·D FLOP per call")
    for ax in (a, b):
        ax.set_xticks(sorted({r["seq_len_q"] for r in rows}))
        ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        ax.grid(True, which="both", alpha=0.25)
    a.legend(fontsize=8, ncol=2)
    plt.show()


def results_table(seq_len: int = PRIMARY["L"], file="bench.json", dtype="float32", causal=False, head_dim=64):
    """The README's table (flashattn.table) for one sequence length of the recorded benchmark."""
    path = RESULTS / file
    if not path.exists():
        return _md(f"*No recorded benchmark yet (`results/h200/{file}`).*")
    from .table import results_table as table
    return _md(table(path, seq_len=seq_len, dtype=dtype, causal=causal, head_dim=head_dim))


def latency_grid(file="bench.json", dtype="float32"):
    """Median latency in µs, one row per version, one column per recorded sequence length."""
    rows = _primary_rows(dtype=dtype, file=file)
    if not rows:
        return _md(f"*No recorded benchmark yet (`results/h200/{file}`).*")
    lens = sorted({r["seq_len_q"] for r in rows})
    got = {(r["impl"], r["seq_len_q"]): r for r in rows}
    lines = ["| version | " + " | ".join(f"{L}" for L in lens) + " |", "|---|" + "--:|" * len(lens)]
    for v in VERSIONS:
        if any((v, L) in got for L in lens):
            cells = [f"{got[(v, L)]['median_us']:,.1f}" if (v, L) in got else "—" for L in lens]
            lines.append(f"| {label(v)} | " + " | ".join(cells) + " |")
    return _md("\n".join(lines) + "\n\nMedian µs at B=4, H=12, D=64, " + dtype + ". " + _recorded_note(rows))


# ======================================================================================== figures
def _boxes(ax, x, y, w, h, text, color, fs=9, **kw):
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="0.3", **kw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs)


def _arrow(ax, a, b, text="", color="0.3"):
    ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="->", color=color, lw=1.4))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12, text, ha="center", fontsize=8, color=color)


def fig_attention_bytes(D: int = 64, B: int = 4, H: int = 12):
    """Bytes a naive float32 forward moves (S written, read, P written, read) against the bytes of Q, K,
    V and O alone, and the arithmetic intensity each implies, against sequence length."""
    import matplotlib.pyplot as plt
    import numpy as np
    c = ceilings()
    L = np.array([256, 512, 1024, 2048, 4096, 8192, 16384])
    flops = 4.0 * B * H * L * L * D
    io = 4.0 * B * H * 4 * L * D                   # Q, K, V read once, O written once
    naive = io + 4.0 * B * H * L * L * 4            # S written, S read, P written, P read
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    a.plot(L, naive / 1e9, "o-", label="naive: Q, K, V, O + S and P through DRAM")
    a.plot(L, io / 1e9, "s-", label="fused: Q, K, V, O only")
    a.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="DRAM traffic per forward [GB]",
          title=f"Bytes moved (B={B}, H={H}, D={D}, float32)")
    b.plot(L, flops / naive, "o-", label="naive")
    b.plot(L, flops / io, "s-", label="fused (ideal)")
    b.axhline(c["fp32"] / c["dram"], color="tab:green", ls="-.", lw=1)
    b.text(L[0], c["fp32"] / c["dram"] * 0.6, f"FP32 ridge of the H200: {c['fp32'] / c['dram']:.0f} FLOP/byte",
           color="tab:green", fontsize=8)
    b.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="FLOP per DRAM byte",
          title="Arithmetic intensity")
    for ax in (a, b):
        ax.set_xticks(L)
        ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        ax.tick_params(axis="x", labelrotation=45)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=8)
    plt.show()


def fig_roofline_model():
    """The roofline model drawn from the measured H200 ceilings, with the two attention intensities."""
    import matplotlib.pyplot as plt
    import numpy as np
    c = ceilings()
    x = np.logspace(-1, 4, 300)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), constrained_layout=True)
    for peak, name, col in ((c["bf16"], "BF16 tensor cores", "C3"), (c["tf32"], "TF32 tensor cores", "C1"),
                            (c["fp32"], "FP32 CUDA cores", "C0")):
        ax.plot(x, np.minimum(peak, c["dram"] * x) / 1e12, color=col, lw=2,
                label=f"{name}: {peak / 1e12:,.1f} TFLOP/s, ridge {peak / c['dram']:.0f} FLOP/B")
        ax.plot([peak / c["dram"]] * 2, [0.05, peak / 1e12], ":", color=col, lw=1)
    for xi, name in ((16, "naive attention\nD=64: D/4 = 16"), (512, "fused, N=2048:\nN/4 = 512")):
        ax.axvline(xi, color="0.5", ls="--", lw=1)
        ax.text(xi * 1.1, 0.12, name, fontsize=8, color="0.3")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP / DRAM byte]",
           ylabel="attainable TFLOP/s", ylim=(0.05, 2000),
           title=f"Roofline of the H200 from measured ceilings (DRAM copy {c['dram'] / 1e12:.2f} TB/s)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize=8)
    plt.show()


def online_softmax_trace(scores, tile: int):
    """m, l after each tile of one row of scores, and the exact softmax sum, for the derivation."""
    import numpy as np
    m, l, out = -np.inf, 0.0, []
    for t in range(0, len(scores), tile):
        s = scores[t:t + tile]
        m_new = max(m, s.max())
        l = l * np.exp(m - m_new) + np.exp(s - m_new).sum()
        m = m_new
        out.append((t // tile, m, l))
    return out


def fig_online_softmax(n: int = 32, tile: int = 8, seed: int = 3):
    """One row of scores processed tile by tile: the running max m and the running sum l, whose last
    value times exp(m) equals the full sum."""
    import matplotlib.pyplot as plt
    import numpy as np
    rng = np.random.default_rng(seed)
    s = np.clip(rng.normal(0, 1.0, n), -3.0, 1.8)
    s[3], s[12], s[19] = 2.2, 3.2, 5.0               # the max grows in tiles 2 and 3, not in tile 4
    trace = online_softmax_trace(s, tile)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    cols = [f"C{(i // tile) % 10}" for i in range(n)]
    a.bar(range(n), s, color=cols)
    last = None
    for t, m, _ in trace:
        if m != last:                                 # label the running max where it changes
            a.hlines(m, t * tile - 0.4, n - 0.6, color="k", lw=1, ls="--")
            a.text(t * tile, m + 0.2, f"m from tile {t + 1} on", fontsize=8)
            last = m
    a.set(xlabel="key index j", ylabel="score $s_j$", title=f"One row of S in tiles of {tile} keys")
    steps = [t + 1 for t, _, _ in trace]
    b.plot(steps, [l for *_, l in trace], "o-", label="running $\\ell$ (relative to the running max)")
    b.plot(steps, [np.exp(s[:(t + 1) * tile] - s.max()).sum() * np.exp(s.max() - m) for t, m, _ in trace],
           "x", ms=10, color="k", label="$\\sum_{j<\\mathrm{seen}} e^{s_j - m}$ recomputed from scratch")
    b.set(xlabel="tiles seen", ylabel="$\\ell$", xticks=steps,
          title="$\\ell$ drops when m grows: old terms are rescaled, not recomputed")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    plt.show()


def fig_v0_dataflow():
    """v0's three launches and where the score matrix lives between them."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 2.8), constrained_layout=True)
    ax.set(xlim=(0, 10), ylim=(0, 3)); ax.axis("off")
    _boxes(ax, 0.1, 1.9, 1.5, 0.8, "Q, K\n(DRAM)", "#dbe9f6")
    _boxes(ax, 2.2, 1.9, 1.9, 0.8, "scores_kernel\nS = QKᵀ/√D", "#fde0c5")
    _boxes(ax, 4.7, 0.9, 1.9, 1.0, "S / P\n[B, H, N, N] floats\nin DRAM", "#f7c6c7")
    _boxes(ax, 2.2, 0.1, 1.9, 0.8, "softmax_kernel\nP = softmax(S)", "#fde0c5")
    _boxes(ax, 7.2, 1.9, 1.9, 0.8, "pv_kernel\nO = PV", "#fde0c5")
    _boxes(ax, 7.2, 0.1, 1.9, 0.8, "V (DRAM) → O", "#dbe9f6")
    _arrow(ax, (1.6, 2.3), (2.2, 2.3))
    _arrow(ax, (4.1, 2.3), (4.9, 1.9))
    ax.text(4.6, 2.35, "write N² floats", fontsize=8, color="crimson")
    _arrow(ax, (4.7, 1.1), (4.1, 0.6))
    ax.text(4.45, 0.55, "read + write N²", fontsize=8, color="crimson")
    _arrow(ax, (6.6, 1.6), (7.2, 2.2))
    ax.text(6.25, 2.05, "read N²", fontsize=8, color="crimson")
    _arrow(ax, (8.15, 0.9), (8.15, 1.9))
    plt.show()


def fig_grid_fill(blocks_v1: int = 48, blocks_v2: int = 1536, blocks_per_sm_v2: int = 3):
    """How many of the H200's SMs each grid keeps busy: v1 launches one block per (batch, head)."""
    import matplotlib.pyplot as plt
    import numpy as np
    sms = ceilings()["sm_count"]
    fig, axes = plt.subplots(2, 1, figsize=(11, 2.6), constrained_layout=True)
    for ax, blocks, per, name in ((axes[0], blocks_v1, 1, "v1: one block per (batch, head)"),
                                  (axes[1], blocks_v2, blocks_per_sm_v2, "v2: one block per query tile")):
        first_wave = np.minimum(blocks, sms * per)
        busy = np.zeros(sms)
        busy[: min(sms, blocks)] = 1
        ax.imshow(busy[None, :], cmap="Greens", vmin=0, vmax=1.4, aspect="auto")
        ax.set_yticks([]); ax.set_xticks([0, 47, sms - 1]); ax.set_xticklabels(["SM 0", "SM 47", f"SM {sms - 1}"])
        waves = blocks / (sms * per)
        ax.set_title(f"{name}: {blocks:,} blocks; {int(first_wave):,} run at once "
                     f"({min(blocks, sms)} of {sms} SMs busy, {waves:.1f} waves)", fontsize=9, loc="left")
    plt.show()


def fig_smem_stack(budgets: dict):
    """Stacked bars of each version's shared memory per block (KiB), by array, at D = 64."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 0.7 + 0.55 * len(budgets)), constrained_layout=True)
    names = list(budgets)
    colors = {}
    for y, v in enumerate(names):
        left = 0.0
        for part, nbytes in budgets[v]:
            col = colors.setdefault(part, f"C{len(colors) % 10}")
            ax.barh(y, nbytes / 1024, left=left, color=col, ec="white")
            if nbytes / 1024 > 2.5:
                ax.text(left + nbytes / 2048, y, part, ha="center", va="center", fontsize=8, color="white")
            left += nbytes / 1024
        ax.text(left + 0.5, y, f"{left:.1f} KiB", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), [label(n) for n in names])
    ax.invert_yaxis()
    ax.set(xlabel="shared memory per block [KiB] at D = 64", xlim=(0, max(sum(b for _, b in p) for p in budgets.values()) / 1024 * 1.18))
    plt.show()


def fig_loop_order():
    """v1 walks K/V tiles outside and all query tiles inside; v2 gives each block one query tile."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.7), constrained_layout=True)
    n = 6
    for ax, name in zip(axes, ("v1 (FlashAttention-1 order)", "v2 (FlashAttention-2 order)")):
        ax.set(xlim=(-0.2, n + 0.2), ylim=(n + 0.2, -0.9), aspect="equal"); ax.axis("off")
        for i in range(n):
            for j in range(n):
                if name.startswith("v1"):
                    col = plt.cm.Blues(0.25 + 0.6 * j / n)    # one block, visiting column by column
                else:
                    col = plt.cm.tab10(i % 10)                # block i owns row i
                ax.add_patch(Rectangle((j, i), 1, 1, fc=col, ec="white", alpha=0.85))
        ax.text(n / 2, -0.45, "key tiles j (K_j, V_j) →", ha="center", fontsize=9)
        ax.text(-0.15, n / 2, "query tiles i ↓", rotation=90, va="center", ha="right", fontsize=9)
        ax.set_title(name, fontsize=10)
    axes[0].text(n / 2, n + 0.1, "one block: for j: load K_j, V_j; for i: update O_i, m_i, l_i in DRAM",
                 ha="center", va="top", fontsize=8)
    axes[1].text(n / 2, n + 0.1, "block i (colour): keeps O_i, m_i, l_i on chip; streams every K_j, V_j",
                 ha="center", va="top", fontsize=8)
    plt.show()


def fig_warp_ownership(B_r=64, B_c=32, D=64, warps=8):
    """v3/v4: which warp owns which query rows, and which lane owns which score / output columns."""
    import matplotlib.pyplot as plt
    import numpy as np
    rows = B_r // warps
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), constrained_layout=True,
                             gridspec_kw={"width_ratios": [D, B_c, D]})
    warp_of_row = np.repeat(np.arange(warps), rows)
    q = np.tile(warp_of_row[:, None], (1, D))
    axes[0].imshow(q, cmap="tab10", vmin=0, vmax=9, aspect="auto")
    axes[0].set_title(f"Q_i ({B_r} × {D}): row → warp\n(warp w owns rows 8w … 8w+7)", fontsize=9)
    lane = np.tile(np.arange(B_c)[None, :], (B_r, 1))
    shade = warp_of_row[:, None] * 0 + (lane % 32) / 31
    axes[1].imshow(np.where(warp_of_row[:, None] == 0, shade, np.nan), cmap="viridis", aspect="auto")
    axes[1].imshow(np.where(warp_of_row[:, None] == 0, np.nan, warp_of_row[:, None] + 0 * lane), cmap="tab10",
                   vmin=0, vmax=9, alpha=0.35, aspect="auto")
    axes[1].set_title(f"S_ij ({B_r} × {B_c}): lane c computes column c\n(warp 0 shaded by lane)", fontsize=9)
    out_lane = np.tile((np.arange(D) % 32)[None, :], (B_r, 1)) / 31
    axes[2].imshow(np.where(warp_of_row[:, None] == 0, out_lane, np.nan), cmap="viridis", aspect="auto")
    axes[2].imshow(np.where(warp_of_row[:, None] == 0, np.nan, warp_of_row[:, None] + 0 * out_lane), cmap="tab10",
                   vmin=0, vmax=9, alpha=0.35, aspect="auto")
    axes[2].set_title(f"O_i ({B_r} × {D}) in registers: lane c owns\ncolumns c and c+32 of its warp's rows", fontsize=9)
    for ax in axes:
        ax.set_xlabel("column"); ax.set_ylabel("row")
    plt.show()


def bank_map(stride: int, d: int = 0, lanes: int = 32) -> list[int]:
    """Bank hit by lane c reading element [c][d] of a float array with row stride `stride`."""
    return [(c * stride + d) % 32 for c in range(lanes)]


def conflict_degree(stride: int, d: int = 0) -> int:
    """How many shared-memory wavefronts one warp-wide 4-byte read of column d needs (1 = conflict-free)."""
    banks = bank_map(stride, d)
    return max(banks.count(b) for b in set(banks))


def fig_bank_mapping(strides=(64, 65), d: int = 0):
    """Lane c reads K_j[c][d]: which of the 32 banks it hits, for each row stride."""
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, len(strides), figsize=(5.2 * len(strides), 3.6), constrained_layout=True)
    for ax, stride in zip(np.atleast_1d(axes), strides):
        grid = np.zeros((32, 32))
        for c, b in enumerate(bank_map(stride, d)):
            grid[b, c] = 1
        ax.imshow(grid, cmap="Reds" if conflict_degree(stride, d) > 1 else "Greens", origin="lower", vmin=0, vmax=1.2)
        ax.set(xlabel="lane c (reads row c of K_j)", ylabel="shared-memory bank",
               title=f"row stride {stride} floats: {conflict_degree(stride, d)}-way "
                     f"{'conflict' if conflict_degree(stride, d) > 1 else '(conflict-free)'}")
        ax.set_xticks(range(0, 32, 4)); ax.set_yticks(range(0, 32, 4))
    plt.show()


def fig_register_tile(B_r=None, B_c=None, TM=None, TN=None, highlight=(0, 1, 8, 9)):
    """v5: the threads of a block tile S_ij; thread (rg, cg) owns rows rg + i*NRG and columns cg + j*WC.
    The shape defaults to the one kernels/v5.cu compiles for D = 64."""
    t = v5_tiles()[64]
    B_r, B_c, TM, TN = B_r or t["B_r"], B_c or t["B_c"], TM or t["TM"], TN or t["TN"]
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    WC, NRG = B_c // TN, B_r // TM
    owner = np.full((B_r, B_c), -1.0)
    for k, t in enumerate(highlight):
        rg, cg = t // WC, t % WC
        for i in range(TM):
            for j in range(TN):
                owner[rg + i * NRG, cg + j * WC] = k
    colors = ["#eeeeee"] + [plt.cm.tab10(k) for k in range(len(highlight))]
    fig, ax = plt.subplots(figsize=(6.2, 5.6), constrained_layout=True)
    ax.pcolormesh(np.arange(B_c + 1), np.arange(B_r + 1), owner + 1, cmap=ListedColormap(colors),
                  vmin=0, vmax=len(highlight), edgecolors="white", linewidth=0.3)
    ax.set_xticks(range(0, B_c + 1, WC)); ax.set_yticks(range(0, B_r + 1, NRG))
    ax.set_xlim(0, B_c); ax.set_ylim(B_r, 0); ax.set_aspect("equal")
    ax.grid(color="0.5", lw=0.8)
    ax.legend(handles=[Patch(color=colors[k + 1], label=f"thread {t}: rg={t // WC}, cg={t % WC}")
                       for k, t in enumerate(highlight)], loc="upper center", bbox_to_anchor=(0.5, -0.1),
              ncol=2, fontsize=8)
    ax.set(xlabel="key column of S_ij", ylabel="query row of S_ij")
    ax.set_title(f"{B_r} × {B_c} score tile, {NRG * WC} threads, each owning a {TM} × {TN} register tile:\n"
                 f"rows rg + {NRG}·i (i < {TM}), columns cg + {WC}·j (j < {TN}); thread = {WC}·rg + cg", fontsize=9)
    plt.show()


def fig_pipeline(tiles: int = 3):
    """v5's two-stage cp.async pipeline: each copy hides behind half a tile of arithmetic."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(11, 2.2), constrained_layout=True)
    t = 0.0
    for j in range(tiles):
        ax.barh(1, 1.0, left=t, color="C0", ec="white"); ax.text(t + 0.5, 1, f"S = Q K_{j}ᵀ, softmax", ha="center", va="center", color="white", fontsize=8)
        ax.barh(0, 0.8, left=t + 0.05, color="C1", ec="white"); ax.text(t + 0.45, 0, f"cp.async V_{j}", ha="center", va="center", fontsize=8)
        ax.barh(1, 1.0, left=t + 1, color="C2", ec="white"); ax.text(t + 1.5, 1, f"O += P V_{j}", ha="center", va="center", color="white", fontsize=8)
        if j < tiles - 1:
            ax.barh(0, 0.8, left=t + 1.05, color="C4", ec="white"); ax.text(t + 1.45, 0, f"cp.async K_{j + 1}", ha="center", va="center", color="white", fontsize=8)
        t += 2
    ax.set_yticks([0, 1], ["copy engine\n(cp.async)", "FFMA pipes"])
    ax.set(xlabel="time →", xticks=[]); ax.set_xlim(0, t)
    plt.show()


def mma_accumulator_owner(rows=16, cols=8):
    """Lane that holds each element of an m16n8 fp32 accumulator (PTX ISA fragment layout)."""
    import numpy as np
    lane = np.zeros((rows, cols), dtype=int)
    for r in range(rows):
        for c in range(cols):
            lane[r, c] = (r % 8) * 4 + (c % 8) // 2
    return lane


def fig_mma_fragment():
    """m16n8k16: which lane of the warp holds which element of the 16 x 8 accumulator tile C (and
    hence of P), and how two neighbouring n8 tiles form one k16 slice of the A operand."""
    import matplotlib.pyplot as plt
    own = mma_accumulator_owner(16, 16)
    fig, ax = plt.subplots(figsize=(8.5, 5.2), constrained_layout=True)
    ax.imshow(own % 4, cmap="Pastel1", vmin=0, vmax=8)
    for r in range(16):
        for c in range(16):
            reg = (c % 2) + 2 * (r >= 8)
            ax.text(c, r, f"{own[r, c]}\nc{reg}", ha="center", va="center", fontsize=6.5)
    ax.axvline(7.5, color="k", lw=2)
    ax.set_xticks(range(16)); ax.set_yticks(range(16))
    ax.set(xlabel="key column (two n8 accumulator tiles = one k16 slice of P)", ylabel="query row",
           title="S/P accumulator fragment of m16n8k16: lane (top) and its register c0..c3 (bottom)\n"
                 "lane = 4·(row mod 8) + column/2 : the same placement the A operand of the next mma expects")
    ax.title.set_fontsize(9)
    plt.show()


def swizzle(row: int, chunk: int) -> int:
    """v6's shared-memory swizzle: 16-byte chunk `chunk` of row `row` is stored at chunk ^ (row % 8)."""
    return chunk ^ (row % 8)


def fig_swizzle():
    """ldmatrix reads one 16-byte chunk from each of 8 rows: without the swizzle all 8 chunks sit in the
    same 4 banks; with chunk ^ (row % 8) they cover all 32 banks."""
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for ax, swz in zip(axes, (False, True)):
        grid = np.full((8, 8), np.nan)
        for r in range(8):
            grid[r, swizzle(r, 0) if swz else 0] = r
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
        for r in range(8):
            c = swizzle(r, 0) if swz else 0
            ax.text(c, r, f"row {r}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(8), [f"{4 * c}-{4 * c + 3}" for c in range(8)], fontsize=7)
        ax.set(xlabel="banks of the 16-byte chunk (128-byte row)", ylabel="row of the tile",
               title=("swizzled: chunk 0 of row r at chunk r: 8 rows, 32 banks, 1 wavefront" if swz else
                      "plain row-major: chunk 0 of 8 rows, 4 banks, 8 wavefronts"))
        ax.title.set_fontsize(9)
    plt.show()
