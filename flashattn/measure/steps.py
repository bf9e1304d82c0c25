"""The chapters' step sets of `python -m flashattn.measure.sweep KEY-steps`: which macros make each step, the SASS
counts of each step's hot loop (no GPU), and the Nsight Compute counters of `--metrics`.

A step set is a chain: step k is step k-1 with one compile-time switch flipped (Variant.change names it),
and the last step is the kernel file as committed. flashattn.book.records.step_table reads the result.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

from flashattn.measure import geometry


def v6_chain(Variant) -> dict:
    """kernels/v6.cu from the first tensor-core version to the committed one, one macro per step (the
    issue-12 order): every switch starts at its simplest setting and the steps turn them on one by one.
    Both head dims share each build, so the pipeline depth is set for both."""
    chain = [
        ("P via shared memory", {"V6_P_SMEM": 1, "V6_SMEM_LAYOUT": 0, "V6_LDMATRIX": 0, "STAGES": 1,
                                 "V6_BARRIERS": 2}, "mma.sync; P stored to shared memory and reloaded as A"),
        ("P in registers", {"V6_P_SMEM": 0}, "P kept in registers (accumulator layout reused as A)"),
        ("padded rows", {"V6_SMEM_LAYOUT": 1}, "shared-memory rows padded by 16 bytes"),
        ("swizzled rows", {"V6_SMEM_LAYOUT": 2}, "XOR swizzle instead of padding"),
        ("ldmatrix", {"V6_LDMATRIX": 1}, "ldmatrix instead of per-thread 32-bit shared loads"),
        ("2 stages", {"STAGES": 2}, "two-stage cp.async pipeline (tile j+1 loads during tile j)"),
        ("1 barrier (default)", {"V6_BARRIERS": 1}, "one barrier per tile instead of two"),
    ]
    out, macros = {}, {}
    for D in (64, 128):
        macros = {}
        for name, flip, change in chain:
            macros.update(flip)
            m = {k: v for k, v in macros.items() if k != "STAGES"}
            m.update({f"V6_D{d}_STAGES": macros["STAGES"] for d in (64, 128)})
            out[f"d{D} {name}"] = Variant(D, m, change)
    # the last step is the file as committed: every macro at its default
    defaults = dict(V6_P_SMEM=0, V6_SMEM_LAYOUT=2, V6_LDMATRIX=1, V6_BARRIERS=1, V6_D64_STAGES=2, V6_D128_STAGES=2)
    for D in (64, 128):
        assert out[f"d{D} 1 barrier (default)"].macros == defaults
    return out


def _v6_kernel(name: str, D: int) -> bool:
    """v6::flash_fwd_mma<T, D, WM, BC, QKS, CAUSAL, STAGES, LAZY, WITH_LSE>: bf16, non-causal, no lse."""
    a = geometry.template_args(name) if "<" in name else []
    return len(a) == 9 and a[0] == "__nv_bfloat16" and a[1] == str(D) and a[5] == "false" and a[8] == "false"


def _v5_kernel(name: str, D: int) -> bool:
    """v5::flash_v5_kernel<v5::Tiles<D, B_r, B_c, TM, TN>, UNROLL>: the head-dim-D tile that the timed shape
    runs (at D=64 the 128-row one; the 64-row short-sequence tile is for small grids)."""
    return f"Tiles<{D}, " in name and not (D == 64 and "Tiles<64, 64, " in name)


KERNEL_OF = {"v6": _v6_kernel, "v5": _v5_kernel}   # version -> the disassembled kernel timed at head dim D


_LOCK = threading.Lock()
_IN_FLIGHT: dict = {}


def sass_counts(version: str, variant) -> dict:
    """Instruction classes of the hot loop (flashattn.measure.sass) of the variant's timed kernel (KERNEL_OF: the
    instance of the timed dtype, head dim D, non-causal, forward only; the largest kernel whose name
    carries D for a version without an entry). No GPU needed. Remembered next to the builds
    (TORCH_EXTENSIONS_DIR) under a hash of the kernel text and flags, and computed once per set of
    macros, so the head dims of one build and a later timed run share the compile."""
    from flashattn import loader
    from flashattn.measure import sweep
    flags = tuple(sweep.flags(variant))
    key = hashlib.sha256(f"{version}|{list(flags)}|{loader.source(version)}".encode()).hexdigest()
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or tempfile.gettempdir()) / "flashattn_steps_sass.json"
    with _LOCK:
        lock = _IN_FLIGHT.setdefault(key, threading.Lock())
    with lock:                                          # one compile per set of macros, the others wait
        with _LOCK:
            cache = json.loads(path.read_text()) if path.exists() else {}
        if f"{key}|{variant.D}" not in cache:
            rows = _hot_loops(version, flags, sorted({v.D for vs in sweep.VARIANTS.values() for v in vs.values()}))
            with _LOCK:
                cache = json.loads(path.read_text()) if path.exists() else {}
                # a failed compile or a missing nvdisasm is reported, never remembered
                cache.update({f"{key}|{D}": row for D, row in rows.items() if "error" not in row})
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(cache))
    if f"{key}|{variant.D}" not in cache:
        return rows.get(variant.D) or {"error": f"no kernel of {version} at D={variant.D}"}
    return cache[f"{key}|{variant.D}"]


def _hot_loops(version: str, flags: tuple, head_dims) -> dict:
    from flashattn.measure import sass
    try:
        kernels = sass.disassemble(version, flags)
    except (RuntimeError, ValueError) as err:
        return {D: {"error": f"{type(err).__name__}: {str(err)[-300:]}"} for D in head_dims}
    pick = KERNEL_OF.get(version, lambda name, D: f"{D}" in name[name.find("<"):])
    out = {}
    for D in head_dims:
        mine = [f for f in kernels if pick(f.pretty, D)]
        if mine:
            fn = max(mine, key=lambda f: len(f.instructions))
            row = sass.loop_row(fn.hot_loop())
            out[D] = {"kernel": fn.pretty, **{k: v for k, v in row.items() if k != "FFMA share"}}
    return out


def target(key: str, names: list[str], warmup: int = 1) -> int:
    """What ncu runs for --metrics: for each variant in `names`, its build (from the extension cache),
    `warmup` calls and one more at sweep.METRICS_SHAPE, in the version's timed dtype (its first),
    non-causal. ncu profiles every launch; attach_metrics keeps each variant's last."""
    import torch

    from flashattn.measure import sweep
    from flashattn.versions import INFO
    B, H, M, N = sweep.METRICS_SHAPE
    dtype = INFO[sweep.kernel_version(key)].dtypes[0]
    finite = True
    for name in names:
        variant = sweep.VARIANTS[key][name]
        module = sweep._build(sweep.kernel_version(key), variant)
        g = torch.Generator(device="cuda").manual_seed(11)
        q, k, v = (torch.randn(B, H, L, variant.D, device="cuda", generator=g).to(dtype) for L in (M, N, N))
        for _ in range(warmup + 1):
            out = module.forward(q, k, v, False)
        torch.cuda.synchronize()
        finite &= bool(torch.isfinite(out).all().item())
    return 0 if finite else 1


def attach_metrics(doc: dict, key: str, out_dir: Path, warmup: int = 1) -> None:
    """--metrics: every correct variant under Nsight Compute in one process
    (flashattn.measure.profile.collect_metrics); the counters of each variant's last launch land in its row's
    "metrics". The raw page of the report (every launch, in order) stays as out_dir/<version>_steps_ncu.raw.csv;
    the report itself is deleted (tens of MB)."""
    from flashattn.measure import profile, sweep
    rows = [r for r in doc["variants"] if r.get("correct")]
    ncu = profile.find_ncu()
    if ncu is None or not rows:
        for r in rows:
            r["metrics"] = {"error": profile.MISSING_NCU}
        return
    target = [sys.executable, "-m", "flashattn.measure.sweep", key, "--warmup", str(warmup),
              "--target", *[r["name"] for r in rows]]
    got = profile.collect_metrics(ncu, target, profile.kernel_filter(sweep.kernel_version(key)),
                                  len(rows) * (warmup + 1), out_dir / f"{sweep.kernel_version(key)}_steps_ncu")
    report = out_dir / f"{sweep.kernel_version(key)}_steps_ncu.ncu-rep"
    report.unlink(missing_ok=True)       # tens of MB for a dozen launches; its raw page (.raw.csv) stays
    launches = got.get("launches", [])
    for i, r in enumerate(rows):
        one = launches[i * (warmup + 1) + warmup] if len(launches) == len(rows) * (warmup + 1) else \
            {"error": got.get("error") or f"ncu profiled {len(launches)} launches, expected {len(rows) * (warmup + 1)}"}
        r["metrics"] = {"shape": [*sweep.METRICS_SHAPE, r["D"]], "dtype": doc["dtype"], "causal": False, **one}
        print(f"metrics {r['name']}: {'ok' if 'counters' in one else one['error'][:300]}", flush=True)


# ----------------------------------------------------------------------------- shared-memory banks
LAYOUTS = {0: "plain", 1: "padded", 2: "swizzled"}


def smem_address(layout: int, row: int, chunk: int, byte: int, row_bytes: int) -> int:
    """Byte address of `byte` of 16-byte chunk `chunk` of row `row` in a kernels/v6.cu tile
    (V6_SMEM_LAYOUT): plain row-major, rows padded by one chunk, or chunk c stored at c ^ (row % 8)."""
    if layout == 1:
        return row * (row_bytes + 16) + chunk * 16 + byte
    return row * row_bytes + (geometry.swizzle(row, chunk) if layout == 2 else chunk) * 16 + byte


def wavefronts(addresses: list[int]) -> int:
    """Passes one group of accesses needs through the 32 four-byte banks: the most distinct 4-byte words
    that fall into one bank (threads reading the same word share it)."""
    per_bank: dict[int, set] = {}
    for a in addresses:
        per_bank.setdefault((a // 4) % 32, set()).add(a // 4)
    return max(len(words) for words in per_bank.values())


def bank_model(D: int = 64, elem: int = 2) -> list[dict]:
    """Shared-memory wavefronts per warp instruction of each access kernels/v6.cu makes in the steps,
    per layout, from the lane -> address formulas of the kernel (lane l: g = l // 4, q = l % 4; first
    chunk of the tile). 32- and 16-bit accesses are one group of 32 lanes; 16-byte accesses (cp.async,
    ldmatrix's row addresses) go in phases of 8 lanes. `ideal` is the count without a conflict."""
    row_bytes, lanes = D * elem, range(32)

    def a(layout, row, chunk, byte):
        return smem_address(layout, row, chunk, byte, row_bytes)

    accesses = {
        "Q_i or K_j fragment, 32-bit load (LDS, V6_LDMATRIX=0)":
            (1, [lambda L, l: a(L, l // 4, 0, 4 * (l % 4))]),
        "V_j fragment, 16-bit loads (LDS.U16, V6_LDMATRIX=0)":
            (1, [lambda L, l: a(L, 2 * (l % 4), 0, 2 * (l // 4))]),
        "P_ij store, 32-bit (STS, V6_P_SMEM=1)":
            (1, [lambda L, l: a(L, l // 4, 0, 4 * (l % 4))]),
        "ldmatrix.x4 of Q_i or V_j (four 8x8 matrices)":
            (4, [lambda L, l, i=i: a(L, l % 8 + 8 * (i % 2), i // 2, 0) for i in range(4)]),
        "cp.async 16-byte copy into the tile":
            (4, [lambda L, l, p=p: a(L, (8 * p + l % 8) // (row_bytes // 16), (8 * p + l % 8) % (row_bytes // 16), 0)
                 for p in range(4)]),
    }
    rows = []
    for name, (ideal, groups) in accesses.items():
        row = {"access": name, "ideal": ideal}
        for layout, label in LAYOUTS.items():
            if len(groups) == 1:
                row[label] = wavefronts([groups[0](layout, l) for l in lanes])
            else:   # phases of 8 lanes (the 16-byte accesses), one group per phase
                row[label] = sum(wavefronts([g(layout, l) for l in range(8)]) for g in groups)
        rows.append(row)
    return rows


def bank_table(D: int = 64) -> str:
    """bank_model as Markdown: wavefronts per warp instruction in each layout (ideal: no conflict)."""
    lines = [f"| access (D = {D}, 16-bit) | no conflict | plain | padded | swizzled |", "|---|--:|--:|--:|--:|"]
    for r in bank_model(D):
        lines.append(f"| {r['access']} | {r['ideal']} | {r['plain']} | {r['padded']} | {r['swizzled']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- accuracy
# (dtype, logit scale, causal, (B, H, M, N, D)): the chapter's accuracy cell. Scale 25 multiplies q, so the
# scores reach several hundred and exp overflows without the running max. float32 runs V6's TF32 mode.
ACCURACY_CASES = [(dtype, scale, causal, shape)
                  for dtype in ("bfloat16", "float16", "float32") for scale in (1.0, 25.0)
                  for causal, shape in ((False, (2, 3, 203, 113, 64)), (True, (1, 2, 1023, 1025, 128)))]


def accuracy_rows(version: str, cases=ACCURACY_CASES) -> list[dict]:
    """Relative error against float64 (flashattn.reference) of `version` and of SDPA on the same inputs,
    per case; needs a GPU."""
    import torch

    from flashattn.reference import attention_reference, relative_error, sdpa
    from flashattn.validate import plan
    rows = []
    for i, (dtype, scale, causal, (B, H, M, N, D)) in enumerate(cases):
        g = torch.Generator(device="cuda").manual_seed(1000 + i)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g) for L in (M, N, N))
        q, k, v = (q * scale).to(getattr(torch, dtype)), k.to(getattr(torch, dtype)), v.to(getattr(torch, dtype))
        ref = attention_reference(q, k, v, causal=causal)
        call = plan(q, k, v, version, causal)
        ours, theirs = relative_error(call.run(q, k, v), ref), relative_error(sdpa(q, k, v, causal), ref)
        rows.append(dict(dtype=dtype, logit_scale=scale, causal=causal, shape=[B, H, M, N, D],
                         runs_as=call.runs_as, rel_error=ours, sdpa_rel_error=theirs))
    return rows


def accuracy_table(version: str = "v6", file: str = "v6_accuracy.json"):
    """The accuracy cell: live on a GPU, else the H200 record (`python -m flashattn.measure.steps accuracy VERSION
    --out results/h200`)."""
    from flashattn.book.notebook import NO_GPU, gpu, md
    from flashattn.book.records import RESULTS, _json
    if gpu():
        rows, note = accuracy_rows(version), "Measured now."
    else:
        print(NO_GPU.format(what="the errors"))
        doc = _json(RESULTS / file)
        if doc is None:
            return md(f"*No recorded accuracy yet (`results/h200/{file}`).*")
        rows, note = doc["rows"], f"Recorded on {doc.get('device', 'the H200')} (`results/h200/{file}`)."
    lines = ["| input dtype | logit scale | causal | B, H, M, N, D | ran as | relative error | SDPA's | ratio |",
             "|---|--:|---|---|---|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['logit_scale']:g} | {r['causal']} | {', '.join(map(str, r['shape']))} | "
                     f"{r['runs_as']} | {r['rel_error']:.1e} | {r['sdpa_rel_error']:.1e} | "
                     f"{r['rel_error'] / r['sdpa_rel_error']:.2f} |")
    return md("\n".join(lines) + "\n\nRelative error ||O - O_ref|| / ||O_ref|| against float64 attention on the "
              "same inputs; SDPA is PyTorch's own attention in the same dtype (for float32 its float32 path, "
              "so the last rows compare TF32 with float32 accuracy). " + note)


BEGIN, END = "// steps-table-begin", "// steps-table-end"


def header_lines(version: str = "v6") -> list[str]:
    """The kernel header's step table, from results/h200/<version>_steps.json (flashattn.book.records.step_rows):
    one line per step (named as in the sweep; the chapter and docs/v6_notes.md say what each changes)
    with both head dims' median time, speedup over the step before, registers and
    spills (ptxas), and whether the odd-shape check passed."""
    from flashattn.book.records import RESULTS, _json, step_rows
    rows = step_rows(version)
    if not rows:
        return [f"//   No step chain is recorded yet (results/h200/{version}_steps.json)."]
    doc = _json(RESULTS / f"{version}_steps.json")
    by = {(r["D"], r["step"]): r for r in rows}
    Ds = sorted({r["D"] for r in rows})
    shapes = {v["D"]: v.get("shape") for v in doc["variants"] if v.get("shape")}
    label = {r["step"]: r["name"].split(" ", 1)[1] for r in rows}     # "d64 ldmatrix" -> "ldmatrix"
    width = max(len(v) for v in label.values())
    out = ["//   " + "; ".join(f"D={D}: B,H,M,N = {','.join(map(str, shapes[D][:4]))}" for D in Ds if shapes.get(D))
           + f"; {doc['dtype']}, non-causal; one interleaved",
           "//   run per D (us: median; x: vs the step before; regs, spill: ptxas; ok: odd-shape check against",
           f"//   float64); {doc['meta'].get('device', {}).get('name', '')} at "
           f"{(doc['meta'].get('git') or {}).get('commit', '?')}:"]
    out.append("//   step  " + " " * width + "".join(f"   D={D:<3} us      x  regs spill ok" for D in Ds))
    for step in sorted({r["step"] for r in rows}):
        line = f"//   {step:>4}  {label[step]:{width}}"
        for D in Ds:
            r = by.get((D, step)) or {}
            us, x = r.get("us"), r.get("vs_previous")
            line += (f" {us:>10,.1f}" if us else f" {'-':>10}") + (f" {x:6.2f}" if x else f" {'-':>6}")
            line += f" {r.get('registers') or '-':>5} {r.get('spills') if r.get('spills') is not None else '-':>5}"
            line += f" {'yes' if r.get('correct') else 'NO':>3}"
        out.append(line.rstrip())
    return out


def update_header(version: str = "v6") -> bool:
    """Rewrite the lines between BEGIN and END in kernels/<version>.cu (comments only: the machine code
    does not change). True when the file changed."""
    from flashattn.loader import KERNELS_DIR
    path = KERNELS_DIR / f"{version}.cu"
    text = path.read_text()
    start, end = text.index(BEGIN), text.index(END)
    new = text[:start] + BEGIN + "\n" + "\n".join(header_lines(version)) + "\n" + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


def main(argv=None) -> int:
    import argparse

    import torch
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.steps", description="Record the V6 chapter's "
                                "accuracy cell on a GPU (VERSION_accuracy.json in OUT), or write the step table "
                                "of the kernel header.")
    p.add_argument("what", choices=("accuracy", "header"),
                   help="accuracy: record the accuracy cell (GPU); header: rewrite kernels/VERSION.cu's step "
                        "table from results/h200/VERSION_steps.json")
    p.add_argument("version", nargs="?", default="v6")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if args.what == "header":
        print(f"kernels/{args.version}.cu {'updated' if update_header(args.version) else 'unchanged'}")
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.steps accuracy needs a CUDA GPU")
    rows = accuracy_rows(args.version)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.version}_accuracy.json"
    path.write_text(json.dumps({"version": args.version, "device": torch.cuda.get_device_name(),
                                "git_commit": os.environ.get("FLASHATTN_GIT_COMMIT"), "rows": rows}, indent=1) + "\n")
    for r in rows:
        print(f"{r['dtype']:9} x{r['logit_scale']:<4g} causal={r['causal']!s:5} {r['shape']} ours {r['rel_error']:.2e} "
              f"sdpa {r['sdpa_rel_error']:.2e}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
