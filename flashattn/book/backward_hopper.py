"""The chapter "The backward on Hopper" (book/backward_hopper.ipynb), read, evaluated and compiled from
kernels/v8_backward.cu on the CPU, so that its tables and its figure follow the file:

- `excerpt`, `v6_excerpt`: lines of the two backward kernels between two markers (never typed);
- `layout`, `registers`: the kernel's `Layout` and `Registers` structs evaluated for a head dim and a stage count;
- `smem_table`, `sass_offsets`: the shared-memory budget per region, and the offsets the machine code uses;
- `resource_table`: ptxas's registers and spills, and the setmaxnreg split as the SASS carries it;
- `step_rows`, `step_table`: what one step issues, and what runs while a product is still in flight;
- `v6_rows`, `v6_table`: one warp's instructions per query tile, V6's mma.sync backward against this one;
- `log_lines`: what the committed H200 log (results/h200/logs) records;
- `fig_dataflow` (FIGURES, FOLDER): the chapter's concept figure, kept as a PNG beside the book.

    python -m flashattn.book.backward_hopper           # redraw the figure into book/_static/backward_hopper/
    python -m flashattn.book.backward_hopper --check   # compare the committed PNG with a fresh drawing
"""
from __future__ import annotations

import re
from collections import Counter

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from flashattn.book import figure_files
from flashattn.book.figures import show_or_return
from flashattn.loader import REPO_ROOT, source
from flashattn.loader import excerpt as loader_excerpt
from flashattn.measure import resources, sass

KERNEL = "v8_backward"
FOLDER = REPO_ROOT / "book" / "_static" / "backward_hopper"
LOG = REPO_ROOT / "results" / "h200" / "logs" / "v8_backward_arrive_all_threads.log"
HEAD_DIMS = (64, 128)
SMEM_OPTIN = resources.SM90["smem_per_block_max"]   # what one block may opt into on sm_90
# V6's key-tile kernel as sm_90 builds it by default: layout 2, two stages, dQ by bulk reduction (DQ_SUM 1)
V6_KERNELS = {64: "bwd_dkdv_split<__nv_bfloat16, 64, 128, 2, 2, 1, false>",
              128: "bwd_dkdv_split<__nv_bfloat16, 128, 64, 2, 2, 1, false>"}


# ------------------------------------------------------------------------------------------- the source
def excerpt(first: str, last: str | None = None) -> str:
    """kernels/v8_backward.cu from the line containing `first` to the next containing `last`."""
    return loader_excerpt(KERNEL, first, last)


def v6_excerpt(first: str, last: str | None = None) -> str:
    """kernels/v6_backward.cu from the line containing `first` to the next containing `last`."""
    return loader_excerpt("v6_backward", first, last)


def _struct(name: str, text: str) -> str:
    start = text.find(f"struct {name} {{")
    if start < 0:
        raise ValueError(f"kernels/{KERNEL}.cu has no struct {name}: update flashattn/book/backward_hopper.py")
    return text[start:text.find("\n};", start)]


def _python(expr: str) -> str:
    """One C++ constant expression of the structs as Python: `c ? a : b` (not nested) and integer division."""
    expr = expr.replace("/", "//")
    if "?" in expr:
        cond, rest = expr.split("?", 1)
        a, b = rest.split(":", 1)
        expr = f"({a}) if ({cond}) else ({b})"
    return expr


def evaluate(name: str, known: dict, text: str | None = None) -> dict:
    """Every `static constexpr` of struct `name` of the kernel file (or `text`), evaluated in order with
    the template arguments `known` (e.g. D, STAGES)."""
    values = dict(known)
    for line in _struct(name, source(KERNEL) if text is None else text).splitlines():
        m = re.match(r"\s*static constexpr \w+ (.*);", line.split("//")[0])
        for part in (m.group(1).split(", ") if m else []):
            key, expr = part.split(" = ", 1)
            values[key.strip()] = int(eval(_python(expr), {"__builtins__": {}}, values))
    return values


def layout(D: int, stages: int | None = None, text: str | None = None) -> dict:
    """Layout<D, STAGES> of the kernel (the default V8B_STAGES when `stages` is None): tiles, offsets, bytes."""
    text = source(KERNEL) if text is None else text
    stages = stages or int(re.search(r"#define V8B_STAGES (\d+)", text).group(1))
    return evaluate("Layout", {"D": D, "STAGES": stages}, text)


def registers(text: str | None = None) -> dict:
    """The Registers struct: ENTRY (per thread at launch), PRODUCER and CONSUMER (after setmaxnreg)."""
    return evaluate("Registers", {}, text)


def regions(L: dict) -> list[tuple[str, int, int]]:
    """(name, offset, bytes) of every region of one Layout, in address order, from its offsets."""
    s = L["STAGES"]
    out = [("K_j", L["K_OFF"], L["KV_BYTES"]), ("V_j", L["V_OFF"], L["KV_BYTES"])]
    out += [(f"Q_i[{k}]", L["Q_OFF"] + k * L["QO_BYTES"], L["QO_BYTES"]) for k in range(s)]
    out += [(f"dO_i[{k}]", L["DO_OFF"] + k * L["QO_BYTES"], L["QO_BYTES"]) for k in range(s)]
    out += [(f"dS^T[{b}]", L["DS_OFF"] + b * L["DS_BYTES"], L["DS_BYTES"]) for b in range(2)]
    out += [(f"lse2_i[{k}]", L["LSE_OFF"] + k * L["ROW_BYTES"], L["ROW_BYTES"]) for k in range(s)]
    out += [(f"D_i[{k}]", L["DVEC_OFF"] + k * L["ROW_BYTES"], L["ROW_BYTES"]) for k in range(s)]
    return out + [("barriers", L["BAR_OFF"], L["BYTES"] - L["BAR_OFF"])]


def kb(n: int) -> str:
    return f"{n / 1024:,.1f} KB" if n >= 1024 else f"{n} B"


def smem_table(stages=(None,)) -> str:
    """Shared memory per block by region, at both head dims, for each stage count (None: the default)."""
    lines = ["| D | B_r × B_c | stages | K_j, V_j | Q_i, dO_i ring | dSᵀ (2 buffers) | lse2_i, D_i | barriers | "
             "with 1 KB to align | fits one block |", "|--:|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for s in stages:
        for D in HEAD_DIMS:
            L = layout(D, s)
            lines.append(f"| {D} | {L['BR']} × {L['BC']} | {L['STAGES']} | {kb(2 * L['KV_BYTES'])} | "
                         f"{kb(2 * L['STAGES'] * L['QO_BYTES'])} | {kb(2 * L['DS_BYTES'])} | "
                         f"{kb(2 * L['STAGES'] * L['ROW_BYTES'])} | {L['BYTES'] - L['BAR_OFF']} B | "
                         f"{kb(L['DYNAMIC'])} | {'yes' if L['DYNAMIC'] <= SMEM_OPTIN else 'no'} |")
    return "\n".join(lines) + f"\n\nOne block may opt into {SMEM_OPTIN / 1024:.0f} KB on sm_90."


# ------------------------------------------------------------------------------------ the machine code
def kernel_name(D: int, banded: bool = False, dtype: str = "__nv_bfloat16", stages: int | None = None) -> str:
    return f"flash_bwd_ws<{dtype}, {D}, {str(banded).lower()}, {stages or layout(D)['STAGES']}>"


def texts(D: int, banded: bool = False, flags=()) -> list[str]:
    """The SASS instruction texts of one bf16 dK/dV kernel, compiled for sm_90a here (no GPU)."""
    stages = next((int(f.split("=")[1]) for f in flags if f.startswith("-DV8B_STAGES=")), None)
    return sass.texts(sass.function(KERNEL, kernel_name(D, banded, stages=stages), tuple(flags)))


def sass_offsets(lines: list[str]) -> dict[str, list[int]]:
    """Shared-memory offsets (from the aligned base) in the SASS: the mbarriers initialised (SYNCS.EXCH)
    and the 8-byte loads of the row terms (LDS.64 at base + offset, every offset past the tiles)."""
    found = {"barriers": set(), "row terms": set()}
    for t in lines:
        for off in re.findall(r"\+(0x[0-9a-f]+)\]", t):
            if t.startswith("SYNCS.EXCH"):
                found["barriers"].add(int(off, 16))
            elif t.startswith("LDS.64"):
                found["row terms"].add(int(off, 16))
    return {k: sorted(v) for k, v in found.items()}


def offset_lines() -> str:
    """Where the SASS of each head dim's kernel puts the row terms and the barriers, against Layout."""
    out = []
    for D in HEAD_DIMS:
        L, got = layout(D), sass_offsets(texts(D))
        lse = [o for o in got["row terms"] if L["LSE_OFF"] <= o < L["DVEC_OFF"]]
        dvec = [o for o in got["row terms"] if L["DVEC_OFF"] <= o < L["BAR_OFF"]]
        out.append(f"D={D}: the SASS reads lse2_i from base + {min(lse):#x} (Layout's LSE_OFF {L['LSE_OFF']:#x}), D_i "
                   f"from base + {min(dvec):#x} (DVEC_OFF {L['DVEC_OFF']:#x}), initialises {len(got['barriers'])} "
                   f"mbarriers from base + {min(got['barriers']):#x} (BAR_OFF {L['BAR_OFF']:#x})")
    return "\n".join(out)


def resource_table() -> str:
    """ptxas on each bf16 dK/dV kernel (registers at launch, spills, stack) and, from its SASS, the
    setmaxnreg values and the highest register any instruction names."""
    report = resources.compile_report(KERNEL, "90a")
    lines = ["| kernel (bf16) | ptxas: registers | spills, stack | producer keeps | consumers claim | "
             "highest register named |", "|---|--:|--:|--:|--:|--:|"]
    for D in HEAD_DIMS:
        for banded in (False, True):
            k = next(r for r in report if kernel_name(D, banded) in r["name"])
            lines_ = texts(D, banded)
            moves = sass.register_moves(lines_)
            top = max(int(r) for t in lines_ for r in re.findall(r"\bR(\d+)\b", t))
            lines.append(f"| D={D}{', banded' if banded else ''} | {k['registers']} | "
                         f"{k['spill_store_bytes'] + k['spill_load_bytes']} B, {k['stack_bytes']} B | "
                         f"{', '.join(map(str, moves['release']))} | {', '.join(map(str, moves['claim']))} | R{top} |")
    return "\n".join(lines)


def step_spans(lines: list[str]) -> list[list[str]]:
    """Each copy of the consumers' step: from the wait for its slot's full barrier (the last SYNCS.PHASECHK
    before its first wgmma fence) to the arrival that releases the slot (SYNCS.ARRIVE...A1T0)."""
    spans, prev = [], 0
    for end, t in enumerate(lines):
        if t.startswith("SYNCS.ARRIVE.TRANS64.A1T0"):
            fence = next(i for i in range(prev, end) if lines[i].startswith("WARPGROUP.ARRIVE"))
            start = max(i for i in range(prev, fence) if "SYNCS.PHASECHK" in lines[i])
            spans.append(lines[start:end + 1])
            prev = end + 1
    return spans


def _op(t: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]


def span_counts(span: list[str]) -> dict:
    """One step's instructions by kind, and what sits in each window between 'one product group left'
    (DEPBAR.LE gsb0, 0x1) and 'none left' (0x0): exponentials in the first, dQ reductions in the second."""
    ops = Counter(_op(t).split(".")[0] for t in span)
    windows, inside = [], None
    for t in span:
        if "DEPBAR.LE gsb0, 0x1" in t:
            inside = Counter()
        elif "DEPBAR.LE gsb0, 0x0" in t and inside is not None:
            windows.append(inside)
            inside = None
        elif inside is not None:
            inside[_op(t)] += 1
    return dict(instructions=len(span), hgmma=ops["HGMMA"],
                register_a=sum(bool(re.match(r"HGMMA\.\S+ \S+ R\d+, R\d+, gdesc", t)) for t in span),
                transposed_a=sum("tnspA" in t for t in span), waits=sum("DEPBAR.LE gsb0" in t for t in span),
                ex2=sum(_op(t) == "MUFU.EX2" for t in span), fsel=ops["FSEL"], sts=ops["STS"], lds=ops["LDS"],
                redg=ops["REDG"], bar=ops["BAR"], windows=[(w["MUFU.EX2"], sum(v for k, v in w.items()
                                                                               if k.startswith("REDG")))
                                                           for w in windows])


def step_rows(flags=(), banded: bool = False) -> list[dict]:
    """Per head dim, the plain and the masked copy of the step (the masked one selects -inf: FSEL)."""
    rows = []
    for D in HEAD_DIMS:
        copies = sorted((span_counts(s) for s in step_spans(texts(D, banded, flags))), key=lambda c: c["fsel"])
        rows += [dict(D=D, step=name, **c) for name, c in zip(("plain", "masked"), copies)]
    return rows


def step_table(flags=()) -> str:
    lines = ["| D | step | instructions | wgmma (A in registers; A transposed) | waits | exp2 while dPᵀ runs | "
             "dQ reductions while dV_j, dK_j run | dSᵀ stores | row-term loads | named barrier |",
             "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in step_rows(flags):
        (e1, _), (_, q2) = r["windows"]
        lines.append(f"| {r['D']} | {r['step']} | {r['instructions']} | {r['hgmma']} ({r['register_a']}; "
                     f"{r['transposed_a']}) | {r['waits']} | {e1} of {r['ex2']} | {q2} of {r['redg']} | {r['sts']} | "
                     f"{r['lds']} | {r['bar']} |")
    return "\n".join(lines)


def tensor_flops(t: str) -> int:
    """FLOPs one warp's share of a tensor-core instruction does: HMMA.16816 is a warp's m16n8k16; an
    HGMMA.64xNx16 is the warpgroup's m64nNk16, a quarter of it per warp."""
    if m := re.match(r"HMMA\.(16)(8)(16)\b", t):
        return 2 * int(m[1]) * int(m[2]) * int(m[3])
    if m := re.match(r"HGMMA\.(\d+) ?x(\d+)x(\d+)", t):
        return 2 * int(m[1]) * int(m[2]) * int(m[3]) // 4
    return 0


def _tensor_row(label: str, lines: list[str]) -> dict:
    ops = Counter(_op(t).split(".")[0] for t in lines)
    return {"kernel": label, "tensor-core instructions": ops["HMMA"] + ops["HGMMA"],
            "their FLOPs": sum(tensor_flops(t) for t in lines), "ldmatrix": ops["LDSM"],
            "shared stores": ops["STS"] + ops["STSM"], "dQ instructions": ops["REDG"] + ops["UBLKRED"],
            "bar.sync": ops["BAR"]}


def v6_rows() -> list[dict]:
    """One warp, one query tile: V6's hot loop (sm_90 default build) and this kernel's plain step."""
    rows = []
    for D in HEAD_DIMS:
        hot = sass.function("v6_backward", V6_KERNELS[D]).hot_loop()
        rows.append(_tensor_row(f"V6, D={D} (mma.sync)", [i.text for i in hot.instructions]))
        plain = min(step_spans(texts(D)), key=lambda s: span_counts(s)["fsel"])
        rows.append(_tensor_row(f"this kernel, D={D} (wgmma)", plain))
    return rows


def v6_table() -> str:
    rows = v6_rows()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "--:|" * (len(cols) - 1)]
    lines += ["| " + " | ".join(f"{r[c]:,}" if isinstance(r[c], int) else r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def log_lines(path=LOG) -> str:
    """Each command of the committed log (its '#' line, once), the tests its progress lines show and pytest's
    summary, or that there is none."""
    out, seen = [], set()
    for block in re.split(r"\n(?=# )", path.read_text().strip()):
        head, _, body = block.partition("\n")
        if head in seen:
            continue
        seen.add(head)
        marks = "".join(re.sub(r"\[\s*\d+%\]", "", ln).strip() for ln in body.splitlines()
                        if re.fullmatch(r"[.FEsx]+\s*(\[\s*\d+%\])?", ln.strip()))
        summary = re.search(r"^=*\s*(\d+ passed.*?)\s*=*$", body, re.M)
        said = summary[1] if summary else "none (the run stopped)"
        out.append(f"{head.lstrip('# ')}\n    progress marks: {marks.count('.')} passed, {marks.count('F')} failed, "
                   f"{marks.count('E')} errors; pytest's summary: {said}")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- the figure
COLORS = {"global": "#e8eef7", "shared": "#eef6e8", "registers": "#fbefe3", "once": "#1f5fa8",
          "per step": "#d2691e", "end": "#2e8b57", "sync": "#7a3e9d"}
REGION_COLORS = {"K_j": "#9ec5e8", "V_j": "#b8d4ee", "Q_i": "#f6c28b", "dO_i": "#f9d7ad", "dSᵀ": "#c7a3d9",
                 "lse2_i": "#e07b39", "D_i": "#b85c1e", "barriers": "#555555"}
STEPS = ("1  wait full[s]", "2  Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ   (wgmma, both operands in shared)",
         "3  Pᵀ = exp2(Sᵀ · scale · log₂e − lse2_i)   while dPᵀ runs",
         "4  dSᵀ = Pᵀ ∘ (dPᵀ − D_i): kept as A operands, and stored", "5  fence.proxy.async; bar.sync 1, 256",
         "6  dQ half += dS K_j   (A = the stored dSᵀ, read transposed)",
         "7  dV_j += Pᵀ dO_i,  dK_j += dSᵀ Q_i   (A in registers)", "8  red.global.add.v2.f32 of dQ while 7 runs",
         "9  mbarrier.arrive on empty[s]")


def box(ax, x, y, w, h, title, sub="", color="white", edge="0.35", fs=10.5):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03,rounding_size=0.1", fc=color, ec=edge, lw=1.2))
    ax.text(x + w / 2, y + h * (0.7 if sub else 0.5), title, ha="center", va="center", fontsize=fs, fontweight="bold")
    if sub:
        ax.text(x + w / 2, y + h * 0.32, sub, ha="center", va="center", fontsize=fs - 2.5, color="0.2")


def arrow(ax, start, end, kind, text="", at=None, rad=0.0, style="-|>", ls="-"):
    """An arrow colored by when it happens; its label at `at` (default: its middle)."""
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle=style, color=COLORS[kind], lw=1.8, ls=ls,
                                                          mutation_scale=14, connectionstyle=f"arc3,rad={rad}"))
    if text:
        x, y = at or ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        ax.text(x, y, text, ha="center", va="center", fontsize=8, color=COLORS[kind],
                bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.9))


def smem_strip(ax, D: int, y: float, width: float = 15.6, x0: float = 0.4):
    """Layout<D, default stages> to scale: one rectangle per region (gid 'smem:D<D>:<name>')."""
    L = layout(D)
    scale = width / L["BYTES"]
    for name, off, size in regions(L):
        label = name.replace("^T", "ᵀ")
        r = Rectangle((x0 + off * scale, y), size * scale, 0.5, fc=REGION_COLORS[label.split("[")[0]], ec="white",
                      lw=0.6, gid=f"smem:D{D}:{name}")
        ax.add_patch(r)
        if size * scale > 0.9:
            ax.text(x0 + (off + size / 2) * scale, y + 0.25, label, ha="center", va="center", fontsize=8)
    ax.text(x0, y + 0.62, f"D = {D}: B_r = {L['BR']}, B_c = {L['BC']}, {L['STAGES']} stages, {L['BYTES']:,} bytes "
            "to scale (lse2_i, D_i and the mbarriers: the sliver at the right)", fontsize=8.5, va="bottom")


def fig_dataflow(show: bool = False):
    """One block of flash_bwd_ws: what each warpgroup does per step, the ring of Q_i / dO_i / lse2_i / D_i slots
    with their full and empty barriers, dSᵀ through shared memory for dQ, and dQ leaving by reductions; below,
    the shared memory of both head dims to scale (Layout evaluated from the file)."""
    L, R = layout(128), registers()
    fig, ax = plt.subplots(figsize=(16, 10.8))
    ax.set(xlim=(0, 16.4), ylim=(-1.9, 10.2))
    ax.axis("off")
    for key, x, w, title in (("global", 0.0, 3.3, "global memory"), ("shared", 3.6, 4.8, "shared memory (one block)"),
                             ("registers", 9.5, 6.9, "three warpgroups (registers)")):
        ax.add_patch(FancyBboxPatch((x, 0.6), w, 9.4, boxstyle="round,pad=0.02,rounding_size=0.2", fc=COLORS[key],
                                    ec="none"))
        ax.text(x + w / 2, 9.7, title, ha="center", fontsize=12, fontweight="bold")
    box(ax, 0.2, 8.3, 2.9, 0.9, "K_j, V_j", f"B_c = {L['BC']} keys of one kv head")
    box(ax, 0.2, 6.7, 2.9, 1.1, "Q_i, dO_i", "B_r query rows; every query\nhead of the group in turn")
    box(ax, 0.2, 5.1, 2.9, 1.1, "lse2_i, D_i", "float32, padded to whole\ntiles by the pre-pass")
    box(ax, 0.2, 2.0, 2.9, 1.4, "dQ accumulator", "float32; then dQ = scale · acc\n(bwd_convert)", color="#fff6d6")
    box(ax, 0.2, 0.8, 2.9, 0.8, "dK_j, dV_j", "written once, at the end")
    box(ax, 3.8, 8.3, 4.4, 0.9, "K_j, V_j", "loaded once, on the K/V barrier")
    for s in range(L["STAGES"]):
        box(ax, 3.8, 6.45 - 1.6 * s, 4.4, 1.35, f"slot {s}: Q_i | dO_i | lse2_i | D_i",
            f"full[{s}]: {L['STAGE_TX']:,} bytes at D = 128\nempty[{s}]: 256 arrivals, every consumer thread",
            color="#fdf3e7", edge=COLORS["per step"])
    box(ax, 3.8, 2.9, 4.4, 1.4, "dSᵀ[u mod 2]", f"[{L['BC']} keys][B_r queries], 128-byte swizzle;\ntwo "
        "buffers: one barrier per step", color="#efe3f5", edge=COLORS["sync"])
    box(ax, 9.7, 8.1, 6.5, 1.1, f"warpgroup 0: producer (setmaxnreg → {R['PRODUCER']})", "thread 0, step u: wait "
        "empty[s], expect bytes on full[s],\nTMA Q_i, dO_i; bulk-copy lse2_i, D_i (s = u mod stages)")
    ax.add_patch(FancyBboxPatch((9.7, 0.8), 6.5, 6.9, boxstyle="round,pad=0.03,rounding_size=0.1", fc="white",
                                ec="0.35", lw=1.2))
    ax.text(12.95, 7.35, f"warpgroups 1, 2: consumers (setmaxnreg → {R['CONSUMER']})", ha="center", fontsize=10.5,
            fontweight="bold")
    ax.text(12.95, 6.95, "keys 0–63 and 64–127 of the tile; one step per (query head, query tile):", ha="center",
            fontsize=8.5, color="0.25")
    for n, line in enumerate(STEPS):
        ax.text(9.85, 6.45 - 0.52 * n, line, fontsize=9, va="center")
    ax.text(12.95, 1.2, "dK_j, dV_j: accumulators in registers across all steps", ha="center", fontsize=9,
            color=COLORS["end"], fontweight="bold")
    arrow(ax, (3.1, 8.75), (3.8, 8.75), "once", "TMA")
    arrow(ax, (3.1, 7.25), (3.8, 7.0), "per step", "TMA", at=(3.45, 7.45))
    arrow(ax, (3.1, 5.65), (3.8, 5.5), "per step", "bulk", at=(3.45, 5.9))
    arrow(ax, (9.7, 8.5), (8.2, 7.5), "per step", "issues", at=(8.95, 8.25))
    arrow(ax, (8.2, 8.6), (9.7, 6.05), "per step", "operands by\ndescriptor", at=(8.95, 7.35))
    arrow(ax, (8.2, 6.9), (9.7, 6.0), "per step")
    arrow(ax, (9.7, 2.3), (8.2, 5.1), "sync", "9: arrive", at=(8.95, 4.85), ls="--")
    arrow(ax, (9.7, 4.8), (8.2, 3.95), "sync", "4: store", at=(9.0, 4.5))
    arrow(ax, (8.2, 3.25), (9.7, 3.8), "sync", "6: read", at=(8.95, 3.25))
    arrow(ax, (9.7, 2.7), (3.1, 2.7), "per step", "8: red.global.add.v2.f32 into the accumulator", at=(6.0, 2.5))
    arrow(ax, (9.7, 1.2), (3.1, 1.2), "end", "after the last step", at=(6.0, 1.2))
    smem_strip(ax, 64, -0.45)
    smem_strip(ax, 128, -1.75)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in REGION_COLORS.items()], loc="lower center",
              bbox_to_anchor=(0.5, -0.06), ncol=8, fontsize=8.5, frameon=False)
    ax.set_title("The backward on Hopper, one key tile per block (kernels/v8_backward.cu, flash_bwd_ws); below: "
                 "its shared memory to scale", fontsize=12.5, loc="left")
    return show_or_return(fig, show)


FIGURES = {"hopper_backward_dataflow": fig_dataflow}


if __name__ == "__main__":
    raise SystemExit(figure_files.main("python -m flashattn.book.backward_hopper", __doc__, FIGURES, FOLDER))
