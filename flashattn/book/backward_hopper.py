"""The chapter "The backward on Hopper" (book/backward_hopper.ipynb), read, evaluated and compiled from
kernels/v8_backward.cu on the CPU, so that its tables follow the file (its figure: backward_hopper_figure):

- `excerpt`, `v6_excerpt`: lines of the two backward kernels between two markers (never typed);
- `layout`, `registers`, `regions`: the kernel's `Layout` and `Registers` structs evaluated for a head dim, a
  stage count and the build's macros (V8B_DQ_BULK decides whether dQ's image is there);
- `smem_table`, `sass_offsets`, `offset_lines`: the shared-memory budget, and the offsets the machine code uses;
- `resource_table`: ptxas's registers and spills, and the setmaxnreg split as the SASS carries it;
- `step_rows`, `step_table`: what one step issues, and what runs while a product is still in flight;
- `dq_rows`, `dq_table`: how dQ leaves a step in the two builds (V8B_DQ_BULK 1 and 0), side by side;
- `writer_lines`: the dQ writer thread's memory and ordering instructions, in SASS order;
- `v6_rows`, `v6_table`: one warp's instructions per query tile, V6's mma.sync backward against this one.
"""
from __future__ import annotations

import functools
import re
from collections import Counter

from flashattn.loader import excerpt as loader_excerpt
from flashattn.loader import source
from flashattn.measure import resources, sass

KERNEL = "v8_backward"
HEAD_DIMS = (64, 128)
SMEM_OPTIN = resources.SM90["smem_per_block_max"]   # what one block may opt into on sm_90
DQ_ATOMICS = ("-DV8B_DQ_BULK=0",)                   # the first version's dQ path, kept as a build
# The row terms loaded after the waits (V8B_ROW_PREFETCH=0), as in every step timed before that one (the
# default loads lse2_i's before the step's wgmmas; without the exponentials' fence that spills at D = 64)
ROWS_LATE = ("-DV8B_ROW_PREFETCH=0",)
# B_r = 64 in the unbanded D = 128 kernel, the tile of every step before V8B_BR80 (the default takes 80), with
# the row terms loaded late: the tables of those steps compile it, so that they show the builds that were timed
BR64 = ("-DV8B_BR80=0",) + ROWS_LATE
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


def _conditional(expr: str) -> str:
    """`c ? a : b` (b may be another conditional) without parentheses, as Python's `a if c else b`."""
    if "?" not in expr:
        return expr
    cond, rest = expr.split("?", 1)
    a, b = rest.split(":", 1)
    if "?" in a:
        raise ValueError(f"a conditional inside the middle of {expr!r}: parenthesise it")
    return f"({a.strip()}) if ({cond.strip()}) else ({_conditional(b).strip()})"


def _python(expr: str) -> str:
    """One C++ constant expression of the structs as Python: integer division, &&, ||, ! and conditionals,
    each parenthesised group converted before the one around it."""
    expr = re.sub(r"!(?!=)", " not ", expr.replace("&&", " and ").replace("||", " or ").replace("/", "//"))
    while group := re.search(r"\(([^()]*)\)", expr):   # innermost first; \x01 \x02 stand for its parentheses
        expr = expr[:group.start()] + "\x01" + _conditional(group[1]) + "\x02" + expr[group.end():]
    return _conditional(expr).replace("\x01", "(").replace("\x02", ")")


def macros(text: str, flags=()) -> dict[str, int]:
    """The file's V8B_* build macros: their `#define` defaults, overridden by -DNAME=value flags."""
    found = {k: int(v) for k, v in re.findall(r"#define (V8B_\w+) (\d+)", text)}
    return found | {k: int(v) for k, v in (f[2:].split("=") for f in flags if f.startswith("-DV8B_"))}


def evaluate(name: str, known: dict, text: str | None = None) -> dict:
    """Every `static constexpr` of struct `name` of the kernel file (or `text`), evaluated in order with
    the template arguments and macros `known` (e.g. D, STAGES, V8B_DQ_BULK); booleans as 0 and 1."""
    values = dict(known)
    for line in _struct(name, source(KERNEL) if text is None else text).splitlines():
        m = re.match(r"\s*static constexpr \w+ (.*);", line.split("//")[0])
        for part in (m.group(1).split(", ") if m else []):
            key, expr = part.split(" = ", 1)
            values[key.strip()] = int(eval(_python(expr), {"__builtins__": {}}, values))
    return values


def layout(D: int, stages: int | None = None, text: str | None = None, flags=(), banded: bool = False) -> dict:
    """Layout<D, STAGES, BANDED> of the kernel as a build with `flags` has it (`stages` None: V8B_STAGES's)."""
    text = source(KERNEL) if text is None else text
    known = macros(text, flags)
    return evaluate("Layout", {**known, "D": D, "STAGES": stages or known["V8B_STAGES"], "BANDED": int(banded)}, text)


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
    out += [("dQ image", L["DQ_OFF"], L["DQ_IMAGE"])] if L["DQ_BULK"] else []
    return out + [("barriers", L["BAR_OFF"], L["BYTES"] - L["BAR_OFF"])]


def kb(n: int, unit: bool = True) -> str:
    """n bytes in KB (unit=False: the number only, for a table whose caption gives the unit)."""
    if not unit:
        return f"{n / 1024:,.1f}"
    return f"{n / 1024:,.1f} KB" if n >= 1024 else f"{n} B"


# the kernels with a tile of their own: D = 64 (masked or not), D = 128 with a band and without (V8B_BR80)
INSTANCES = ((64, False, "64"), (128, True, "128, masked"), (128, False, "128, unmasked"))


def smem_table(stages=(None,)) -> str:
    """Shared memory per block by region in KB, per kernel of INSTANCES, for each stage count (None: the
    default)."""
    lines = ["| D | B_r×B_c | stages | K_j, V_j | Q_i, dO_i | dSᵀ ×2 | lse2_i, D_i | dQ image | barriers | "
             "total, aligned | fits |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    k = functools.partial(kb, unit=False)   # the line under the table gives the unit
    for s in stages:
        for D, banded, label in INSTANCES:
            L = layout(D, s, banded=banded)
            lines.append(f"| {label} | {L['BR']}×{L['BC']} | {L['STAGES']} | {k(2 * L['KV_BYTES'])} | "
                         f"{k(2 * L['STAGES'] * L['QO_BYTES'])} | {k(2 * L['DS_BYTES'])} | "
                         f"{k(2 * L['STAGES'] * L['ROW_BYTES'])} | "
                         f"{k(L['DQ_IMAGE']) if L['DQ_BULK'] else 'no room'} | {k(L['BYTES'] - L['BAR_OFF'])} | "
                         f"{k(L['DYNAMIC'])} | {'yes' if L['DYNAMIC'] <= SMEM_OPTIN else 'no'} |")
    return "\n".join(lines) + f"\n\nKB. One block may opt into {SMEM_OPTIN / 1024:.0f} KB on sm_90."


# ------------------------------------------------------------------------------------ the machine code
def kernel_name(D: int, banded: bool = False, dtype: str = "__nv_bfloat16", stages: int | None = None,
                rows: int | None = None) -> str:
    """The default mode's dK/dV kernel; rows: its row-term placement (the deterministic mode's banded kernel at
    D = 128 is the instance of V8B_DET_ROW_PREFETCH). None: the file's defaults."""
    L = layout(D)
    return (f"flash_bwd_ws<{dtype}, {D}, {str(banded).lower()}, {stages or L['STAGES']}, "
            f"{L['V8B_ROW_PREFETCH'] if rows is None else rows}>")


def texts(D: int, banded: bool = False, flags=()) -> list[str]:
    """The SASS instruction texts of one bf16 dK/dV kernel, compiled for sm_90a here (no GPU)."""
    L = layout(D, flags=flags)
    name = kernel_name(D, banded, stages=L["STAGES"], rows=L["V8B_ROW_PREFETCH"])
    return sass.texts(sass.function(KERNEL, name, tuple(flags)))


def sass_offsets(lines: list[str]) -> dict[str, list[int]]:
    """Shared-memory offsets (from the aligned base) in the SASS: the mbarriers initialised (SYNCS.EXCH),
    the 8-byte loads of the row terms (LDS.64) and the 8-byte stores into dQ's image (STS.64)."""
    found = {"barriers": set(), "row terms": set(), "image": set()}
    for t in lines:
        for off in re.findall(r"\+(0x[0-9a-f]+)\]", t):
            for op, kind in (("SYNCS.EXCH", "barriers"), ("LDS.64 ", "row terms"), ("STS.64 ", "image")):
                if t.startswith(op):
                    found[kind].add(int(off, 16))
    return {k: sorted(v) for k, v in found.items()}


def offset_lines(flags=BR64) -> str:
    """Where the SASS of each head dim's kernel puts the row terms, dQ's image (in 8-byte stores: not B_r = 80's)
    and the barriers, against Layout."""
    out = []
    for D in HEAD_DIMS:
        L, got = layout(D, flags=flags), sass_offsets(texts(D, flags=flags))
        lse = [o for o in got["row terms"] if L["LSE_OFF"] <= o < L["DVEC_OFF"]]
        dvec = [o for o in got["row terms"] if L["DVEC_OFF"] <= o < L["DQ_OFF"]]
        out.append(f"D={D}, from the base: lse2_i read at {min(lse):#x} (Layout's LSE_OFF {L['LSE_OFF']:#x}), D_i "
                   f"at {min(dvec):#x} (DVEC_OFF {L['DVEC_OFF']:#x}), dQ's image stored at {min(got['image']):#x} "
                   f"(DQ_OFF {L['DQ_OFF']:#x}), {len(got['barriers'])} mbarriers at {min(got['barriers']):#x} "
                   f"(BAR_OFF {L['BAR_OFF']:#x})")
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


def step_spans(lines: list[str], L: dict) -> list[list[str]]:
    """Each copy of the consumers' step: from the wait for its slot's full barrier (the last SYNCS.PHASECHK
    before its first wgmma fence) to the arrival on an *empty* barrier that releases the slot (an
    SYNCS.ARRIVE...A1T0 at one of Layout's empty offsets; dQ's image has an arrival of its own)."""
    empties = {f"{L['BAR_OFF'] + 8 * (1 + L['STAGES'] + s):#x}]" for s in range(L["STAGES"])}
    spans, prev = [], 0
    for end, t in enumerate(lines):
        if t.startswith("SYNCS.ARRIVE.TRANS64.A1T0") and any(t.endswith(e + ", RZ") for e in empties):
            fence = next(i for i in range(prev, end) if lines[i].startswith("WARPGROUP.ARRIVE"))
            start = max(i for i in range(prev, fence) if "SYNCS.PHASECHK" in lines[i])
            spans.append(lines[start:end + 1])
            prev = end + 1
    return spans


def opcode(t: str) -> str:
    """The opcode with its modifiers of one SASS instruction text, without a predicate: "LDS.64"."""
    return re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]


def span_counts(span: list[str]) -> dict:
    """One step's instructions by kind, and two stretches between its waits (flashattn.measure.sass.wgmma_gaps):
    from S^T's wait to dP^T's (the exponentials), from dQ's to the last (dQ's way out); dv_early: dV_j's
    wgmma (A in registers) issued before dP^T's wait."""
    ops, full = Counter(opcode(t).split(".")[0] for t in span), Counter(opcode(t) for t in span)
    gaps = sass.wgmma_gaps(span)
    return dict(instructions=len(span), hgmma=ops["HGMMA"],
                register_a=sum(bool(re.match(r"HGMMA\.\S+ \S+ R\d+, R\d+, gdesc", t)) for t in span),
                transposed_a=sum("tnspA" in t for t in span), waits=sum("DEPBAR.LE gsb0" in t for t in span),
                ex2=full["MUFU.EX2"], fsel=ops["FSEL"],
                # dS (B_r = 80): stmatrix, and the image's 4-byte stores; else 4-byte dS^T and 8-byte image stores
                ds_stores=ops["STSM"] or full["STS"], image_stores=full["STS"] if ops["STSM"] else full["STS.64"],
                lds=ops["LDS"], redg=ops["REDG"], bar=ops["BAR"], windows=[c for _, _, c in gaps[0:3:2]],
                dv_early=sum(bool(re.match(r"HGMMA\.\S+ \S+ R\d+, R\d+, gdesc", t)) for t in gaps[0][1]))


def step_rows(flags=(), banded: bool = False) -> list[dict]:
    """Per head dim, the plain and the masked copy of the step (the masked one selects -inf: FSEL)."""
    rows = []
    for D in HEAD_DIMS:
        spans = step_spans(texts(D, banded, flags), layout(D, flags=flags))
        copies = sorted((span_counts(s) for s in spans), key=lambda c: c["fsel"])
        rows += [dict(D=D, step=name, **c) for name, c in zip(("plain", "masked"), copies)]
    return rows


def out_of_window(w: Counter) -> str:
    """How dQ leaves in a window: its 8-byte and 4-byte (B_r = 80) shared stores, mbarrier arrivals and global
    reductions (those there are), and its branches (none, or ptxas would have waited for the product first)."""
    got = {"st.shared.v2": w["STS.64"], "st.shared": w["STS"] - w["STS.64"], "arrive": w["SYNCS.ARRIVE"],
           "red.global": w["REDG"]}
    return ", ".join([f"{n} {name}" for name, n in got.items() if n] + [f"{w['BRA']} branches"])


def step_table(flags=()) -> str:
    lines = ["| D | step | instructions | wgmma (A in registers; A transposed) | waits | exp2 while dPᵀ runs | "
             "dV_j's wgmma issued before dPᵀ's wait | while dK_j runs | dSᵀ stores | row-term loads | named barrier |",
             "|--:|---|--:|--:|--:|--:|--:|---|--:|--:|--:|"]
    for r in step_rows(flags):
        first, second = r["windows"]
        lines.append(f"| {r['D']} | {r['step']} | {r['instructions']} | {r['hgmma']} ({r['register_a']}; "
                     f"{r['transposed_a']}) | {r['waits']} | {first['MUFU.EX2']} of {r['ex2']} | "
                     f"{r['dv_early']} of {r['register_a'] // 2} | {out_of_window(second)} | {r['ds_stores']} | "
                     f"{r['lds']} | {r['bar']} |")
    return "\n".join(lines)


# What a plain step's instructions do, by opcode (the first group that matches); "uniform" is the warp-uniform
# datapath and R2UR, the moves into it: there the wgmma descriptors and the tiles' addresses are computed
MIX = (("wgmma, its fences and waits", ("HGMMA", "WARPGROUP")),
       ("P, dS: FFMA, FADD, FMUL, MUFU, FSEL, F2FP", ("FFMA", "FADD", "FMUL", "MUFU", "FSEL", "F2FP")),
       ("uniform datapath (U*, R2UR)", ("U", "R2UR")),
       ("integer and logic: LOP3, SHF, IMAD, VIADD, LEA, ISETP, SEL", ("LOP3", "SHF", "IMAD", "VIADD", "IADD",
                                                                      "LEA", "ISETP", "SEL", "MOV", "PRMT")),
       ("shared memory: LDS, STS", ("LDS", "STS")),
       ("barriers, mbarriers, fences", ("SYNCS", "BAR", "FENCE", "MEMBAR")))


def mix_rows(D: int, flags=()) -> dict[str, int]:
    """The plain step's instructions per consumer thread by MIX group ("other": the rest)."""
    plain = min(step_spans(texts(D, False, flags), layout(D, flags=flags)), key=lambda span: span_counts(span)["fsel"])
    got = Counter()
    for t in plain:
        op = opcode(t)
        got[next((name for name, prefixes in MIX if op.startswith(prefixes)), "other")] += 1
    return {name: got[name] for name, _ in MIX + (("other", ()),)}


DESC_MAKE = ("-DV8B_DESC_ADD=0",)   # make_desc for every wgmma: the first version's descriptors


def mix_table(base=BR64) -> str:
    """Per head dim, the first version's descriptors (V8B_DESC_ADD=0) beside the default's, on the tile the step
    was timed on (base: B_r = 64 at D = 128)."""
    rows = {f"D={D}, {label}": mix_rows(D, base + flags) for D in HEAD_DIMS
            for label, flags in (("make_desc per wgmma", DESC_MAKE), ("descriptor + offset", ()))}
    lines = ["| instructions of one plain step, per thread | " + " | ".join(rows) + " |", "|---|" + "--:|" * len(rows)]
    for name in next(iter(rows.values())):
        lines.append(f"| {name} | " + " | ".join(str(r[name]) for r in rows.values()) + " |")
    lines.append("| all | " + " | ".join(str(sum(r.values())) for r in rows.values()) + " |")
    return "\n".join(lines)


def dq_rows(base=BR64) -> list[dict]:
    """The plain step of the default build beside the V8B_DQ_BULK=0 build's, per head dim, on the tile the step
    was timed on (base: B_r = 64 at D = 128): what runs in dQ's window, the step's length, the kernel's bulk
    reductions and its shared memory."""
    rows = []
    for D in HEAD_DIMS:
        for name, flags in (("V8B_DQ_BULK=1 (default)", ()), ("V8B_DQ_BULK=0 (first version)", DQ_ATOMICS)):
            lines, L = texts(D, flags=base + flags), layout(D, flags=base + flags)
            plain = min((span_counts(s) for s in step_spans(lines, L)), key=lambda c: c["fsel"])
            rows.append({"D": D, "build": name, "while dV_j, dK_j run": out_of_window(plain["windows"][1]),
                         "step instructions": plain["instructions"],
                         "UBLKRED in the kernel": sum(opcode(t).startswith("UBLKRED") for t in lines),
                         "shared memory": kb(L["DYNAMIC"])})
    return rows


def dq_table() -> str:
    rows = dq_rows()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|--:|---|---|--:|--:|--:|"]
    return "\n".join(lines + ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows])


WRITER_OPS = ("SYNCS", "LDG", "FENCE", "UBLKRED", "DEPBAR", "MEMBAR", "REDG")


def writer_lines(D: int = 128) -> str:
    """The dQ writer's loop in the default build's SASS: from its wait on dq_full, past its arrival on
    dq_empty, to the deterministic mode's release of the turn, the instructions that wait, order or move
    memory (WRITER_OPS), with their source lines."""
    L = layout(D)
    fn = sass.function(KERNEL, kernel_name(D))
    full, empty = (f"{L['BAR_OFF'] + 8 * (1 + 2 * L['STAGES'] + k):#x}]" for k in (0, 1))
    start = next(k for k, i in enumerate(fn.instructions) if i.suffix.startswith(".PHASECHK") and full in i.operands)
    freed = next(k for k in range(start, len(fn.instructions)) if empty in fn.instructions[k].operands)
    end = next(k for k in range(freed, len(fn.instructions)) if fn.instructions[k].opcode == "REDG")
    return "\n".join(f"{i.text:<58} // {_ptx(i.line)}" for i in fn.instructions[start:end + 1]
                     if i.opcode in WRITER_OPS)


def _ptx(line: int) -> str:
    """What source line `line` (or the asm statement it continues, up to two lines above) asks for: the PTX
    instruction of an asm statement, or the line itself."""
    text = source(KERNEL).splitlines()
    for k in (line, line - 1, line - 2):
        if m := re.search(r'asm volatile\("([\w.:]+)', text[k - 1]):
            return m[1]
    return text[line - 1].strip()


def tensor_flops(t: str) -> int:
    """FLOPs one warp's share of a tensor-core instruction does: HMMA.16816 is a warp's m16n8k16; an
    HGMMA.64xNx16 is the warpgroup's m64nNk16, a quarter of it per warp."""
    if m := re.match(r"HMMA\.(16)(8)(16)\b", t):
        return 2 * int(m[1]) * int(m[2]) * int(m[3])
    if m := re.match(r"HGMMA\.(\d+) ?x(\d+)x(\d+)", t):
        return 2 * int(m[1]) * int(m[2]) * int(m[3]) // 4
    return 0


def _tensor_row(label: str, lines: list[str]) -> dict:
    ops = Counter(opcode(t).split(".")[0] for t in lines)
    return {"kernel": label, "tensor-core instructions": ops["HMMA"] + ops["HGMMA"],
            "their FLOPs": sum(tensor_flops(t) for t in lines), "ldmatrix": ops["LDSM"],
            "shared stores": ops["STS"] + ops["STSM"], "bar.sync": ops["BAR"]}


def v6_rows(base=BR64) -> list[dict]:
    """One warp, one query tile: V6's hot loop (sm_90 default build) and this kernel's plain step, on V6's tile
    (base: B_r = 64 at D = 128, so that both do the same tensor work)."""
    rows = []
    for D in HEAD_DIMS:
        hot = sass.function("v6_backward", V6_KERNELS[D]).hot_loop()
        rows.append(_tensor_row(f"V6, D={D} (mma.sync)", [i.text for i in hot.instructions]))
        plain = min(step_spans(texts(D, flags=base), layout(D, flags=base)), key=lambda s: span_counts(s)["fsel"])
        rows.append(_tensor_row(f"this kernel, D={D} (wgmma{', B_r = 64' if D == 128 else ''})", plain))
    return rows


def v6_table() -> str:
    rows = v6_rows()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "--:|" * (len(cols) - 1)]
    lines += ["| " + " | ".join(f"{r[c]:,}" if isinstance(r[c], int) else r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)
