"""The machine code (SASS) of a kernel's hot loop, counted by instruction class, without a GPU.

nvcc compiles a kernel file to a cubin for the architecture the book measured (sm_90, or sm_90a for a
version built for it) with the loader's flags, `nvdisasm` disassembles it with the source lines of
`-lineinfo`, and the loops are found from the branches: a branch to an earlier label closes a loop. The
innermost loops are where a kernel spends its time, so their instruction mix is what a "loads per FFMA"
or "mma per tile" argument is about.

The disassembler ships with the CUDA toolkit and, for machines without one, inside the triton wheel that
torch installs (triton/backends/nvidia/bin), so `find_tool` looks there too.

    python -m flashattn.measure.sass v4                  # every innermost loop of v4, counted
    python -m flashattn.measure.sass v6 --kernel bf16 --excerpt 40
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from flashattn.loader import KERNELS_DIR, NVCC_FLAGS, gencode_flags, version_archs
from flashattn.measure.resources import demangle, nvcc

# Instruction classes in the order the tables show them: opcode (the part before the first dot) -> class.
CLASSES: dict[str, tuple[str, ...]] = {
    "FFMA": ("FFMA",),
    "FP32 other": ("FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FCHK", "FSWZADD"),
    "MUFU": ("MUFU",),
    "HMMA": ("HMMA",),
    "HGMMA": ("HGMMA", "WARPGROUP"),
    "LDS": ("LDS",),
    "LDSM": ("LDSM",),
    "STS": ("STS", "STSM"),
    "global loads": ("LDG", "LDGSTS", "UTMALDG", "LDGDEPBAR", "UBLKCP", "UTMAPF"),
    "STG": ("STG", "UTMASTG", "RED", "ATOM", "ATOMG", "REDG"),
    "LDL/STL": ("LDL", "STL"),
    "BAR/sync": ("BAR", "DEPBAR", "SYNCS", "MEMBAR", "ARRIVES", "ERRBAR"),
    "SHFL": ("SHFL",),
    "integer": ("IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "IMNMX", "VIADD", "VIMNMX", "VIADDMNMX",
                "IABS", "SEL", "LOP", "IADD", "IMUL", "SGXT", "BMSK", "PRMT", "POPC", "FLO", "IDP", "BREV",
                "UIADD3", "UIMAD", "ULEA", "USHF", "ULOP3", "UISETP", "USEL", "UMOV", "UPRMT", "UMNMX",
                "UIABS", "ULDC", "USGXT", "UBMSK", "UFLO", "UPOPC", "ISCADD"),
    "conversion": ("F2F", "F2I", "I2F", "F2FP", "I2FP", "F2IP", "FRND"),
    "move/predicate": ("MOV", "CS2R", "S2R", "S2UR", "R2UR", "P2R", "R2P", "PLOP3", "UPLOP3", "CSETP",
                       "LDC", "MOVM", "VOTE", "VOTEU"),
    "branch": ("BRA", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "RET", "CALL", "BREAK", "YIELD", "NOP", "JMP",
               "BPT", "ACQBULK", "ELECT", "ENDCOLLECTIVE"),
}
_CLASS_OF = {op: cls for cls, ops in CLASSES.items() for op in ops}
SPIN = 8     # a loop of at most this many instructions is a wait (poll) loop, not work

_SECTION = re.compile(r"^\.text\.(\S+):")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^(\.L_x_\d+):")
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def class_of(opcode: str) -> str:
    """The class of an opcode such as 'FFMA' or 'LDS' (no suffix); 'other' for the rest."""
    return _CLASS_OF.get(opcode, "other")


@dataclass
class Instruction:
    offset: int
    opcode: str          # 'LDS'
    suffix: str          # '.128'
    operands: str
    line: int | None     # source line from -lineinfo (the innermost inlined one)
    predicate: str = ""
    target: str | None = None
    file: str | None = None

    @property
    def text(self) -> str:
        return f"{self.predicate}{self.opcode}{self.suffix} {self.operands}".strip()


@dataclass
class Loop:
    start: int           # offset of the first instruction (the branch target)
    end: int             # offset of the backward branch
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def lines(self) -> tuple[int, int] | None:
        nums = [i.line for i in self.instructions if i.line]
        return (min(nums), max(nums)) if nums else None

    def counts(self) -> Counter:
        return Counter(class_of(i.opcode) for i in self.instructions)

    def main_line(self) -> str:
        """The source line most of the loop's instructions come from, as 'line N: text'."""
        where = Counter((i.file, i.line) for i in self.instructions if i.line)
        if not where:
            return "-"
        (file, line), _ = where.most_common(1)[0]
        try:
            text = Path(file).read_text().splitlines()[line - 1].strip()
        except (OSError, IndexError, TypeError):
            text = ""
        text = text if len(text) <= 48 else text[:45] + "..."
        return f"{line}: `{text}`" if text else str(line)

    def opcodes(self) -> Counter:
        return Counter(i.opcode + i.suffix for i in self.instructions)


@dataclass
class Function:
    name: str            # mangled
    pretty: str          # demangled
    instructions: list[Instruction]
    labels: dict[str, int]

    def loops(self) -> list[Loop]:
        """Every loop: a branch to a label at or before itself. Sorted by start offset."""
        found = []
        for ins in self.instructions:
            if ins.opcode == "BRA" and ins.target and self.labels.get(ins.target, 1 << 62) <= ins.offset:
                start = self.labels[ins.target]
                if start == ins.offset:      # the `BRA` to itself after EXIT, which never runs
                    continue
                body = [i for i in self.instructions if start <= i.offset <= ins.offset]
                found.append(Loop(start, ins.offset, body))
        return sorted(found, key=lambda lp: (lp.start, lp.end))

    def innermost_loops(self) -> list[Loop]:
        """Loops that contain no other loop: where a kernel spends its time. A wait loop of a few
        instructions (an mbarrier poll) does not count as a loop, so the loop around it stays innermost."""
        loops = [lp for lp in self.loops() if len(lp.instructions) > SPIN]
        return [a for a in loops
                if not any(b is not a and a.start <= b.start and b.end <= a.end for b in loops)]

    def hot_loop(self) -> Loop:
        """The innermost loop with the most instructions (for these kernels, the unrolled product loop)."""
        inner = self.innermost_loops()
        if not inner:
            raise ValueError(f"{self.pretty}: no loop in the disassembly")
        return max(inner, key=lambda lp: len(lp.instructions))


def find_tool(name: str = "nvdisasm") -> str | None:
    """Path of a CUDA binary tool (nvdisasm, cuobjdump): $CUDA_HOME/bin, PATH, /usr/local/cuda/bin, the
    triton wheel's bundled copy, then the nvidia-cuda-* pip packages. None when there is none."""
    places = [Path(os.environ["CUDA_HOME"]) / "bin" / name] if os.environ.get("CUDA_HOME") else []
    if found := shutil.which(name):
        places.append(Path(found))
    places.append(Path("/usr/local/cuda/bin") / name)
    try:
        import triton  # optional, and slow to import: only asked when the toolkit has no copy
        places.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)
    except ImportError:
        pass
    try:
        import nvidia  # optional: the nvidia-cuda-* pip packages
        for root in nvidia.__path__:
            places.extend(Path(root).glob(f"*/bin/{name}"))
    except ImportError:
        pass
    return next((str(p) for p in places if p.is_file() and os.access(p, os.X_OK)), None)


def tool_missing_reason() -> str | None:
    """Why this module cannot work here (no nvcc, no nvdisasm), or None when it can."""
    if shutil.which(nvcc()) is None and not Path(nvcc()).is_file():
        return "nvcc not found (set CUDA_HOME)"
    if find_tool("nvdisasm") is None:
        return "nvdisasm not found: not in CUDA_HOME/bin, PATH, the triton wheel or an nvidia-* pip package"
    return None


def arch_of(version: str) -> str:
    """'9.0', or a version's own exact build such as '9.0a': the machine code the book measured on the
    H200, whatever GPU (if any) this machine has."""
    exact = version_archs(version)
    return exact[0] if exact else "9.0"


def compile_command(version: str, out: Path, extra_flags=()) -> list[str]:
    """nvcc on the kernel half of the file (nvcc never sees the binding half), with the loader's flags."""
    return [nvcc(), *NVCC_FLAGS, *gencode_flags([arch_of(version)]), *extra_flags, "-cubin", "-o", str(out),
            str(KERNELS_DIR / f"{version}.cu")]


def parse(text: str) -> list[Function]:
    """Functions of `nvdisasm -c -g` output, with their instructions, labels and source lines."""
    functions, current, line, file = [], None, None, None
    pending: list[str] = []
    for raw in text.splitlines():
        s = raw.strip()
        if m := _SECTION.match(s):
            current = Function(m.group(1), m.group(1), [], {})
            functions.append(current)
            line, pending = None, []
        elif current is None:
            continue
        elif m := _LINE.search(s):
            file, line = m.group(1), int(m.group(2))
        elif m := _LABEL.match(s):
            pending.append(m.group(1))
        elif m := _INSTR.search(s):
            target = _TARGET.search(m.group(5))
            ins = Instruction(int(m.group(1), 16), m.group(3), m.group(4), m.group(5).strip(), line,
                              (m.group(2) or "").strip() + (" " if m.group(2) else ""),
                              target.group(1) if target else None, file)
            for label in pending:
                current.labels[label] = ins.offset
            pending = []
            current.instructions.append(ins)
    names = demangle([f.name for f in functions])
    for f in functions:
        f.pretty = names.get(f.name, f.name)
    return functions


@functools.cache
def disassemble(version: str, extra_flags: tuple[str, ...] = ()) -> tuple[Function, ...]:
    """Compile kernels/<version>.cu for the architecture the book measured and disassemble every kernel."""
    reason = tool_missing_reason()
    if reason:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / f"{version}.cubin"
        res = subprocess.run(compile_command(version, cubin, extra_flags), capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed for {version}:\n{res.stderr}")
        dis = subprocess.run([find_tool("nvdisasm"), "-c", "-g", str(cubin)], capture_output=True, text=True)
    if dis.returncode != 0:
        raise RuntimeError(f"nvdisasm failed for {version}:\n{dis.stderr}")
    return tuple(parse(dis.stdout))


def function(version: str, contains: str = "", extra_flags: tuple[str, ...] = ()) -> Function:
    """The kernel of `version` whose demangled name contains the text `contains` (for a template
    instance, e.g. "<__nv_bfloat16, 64, 2, 64, 4, false"); the largest one when several match."""
    kernels = disassemble(version, tuple(extra_flags))
    matches = [f for f in kernels if contains in f.pretty]
    if not matches:
        names = "; ".join(f.pretty for f in kernels)
        raise ValueError(f"no kernel of {version} matches {contains!r}; kernels: {names}")
    return max(matches, key=lambda f: len(f.instructions))


SHOWN = ("FFMA", "FP32 other", "MUFU", "HMMA", "HGMMA", "LDS", "LDSM", "STS", "global loads",
         "LDL/STL", "BAR/sync", "SHFL", "integer")


def loop_row(loop: Loop) -> dict:
    """The loop's most frequent source line (which loop it is), its instructions, the count of each
    class in SHOWN, the shared loads by width and FFMA's share."""
    c = loop.counts()
    row = {"loop: its most frequent source line": loop.main_line(), "instructions": len(loop.instructions)}
    row.update({k: c.get(k, 0) for k in SHOWN})
    kinds = Counter(i.opcode + i.suffix for i in loop.instructions if class_of(i.opcode) in ("LDS", "LDSM"))
    row["shared loads by width"] = ", ".join(f"{n} {op}" for op, n in sorted(kinds.items())) or "-"
    row["FFMA share"] = f"{100 * c.get('FFMA', 0) / len(loop.instructions):.0f}%"
    return row


def loop_rows(version: str, contains: str = "", loops: str = "innermost", extra_flags=()) -> list[dict]:
    """One loop_row per loop of the kernel: every innermost loop, or with loops="hot" the hot one."""
    fn = function(version, contains, tuple(extra_flags))
    return [loop_row(lp) for lp in ([fn.hot_loop()] if loops == "hot" else fn.innermost_loops())]


def markdown(rows: list[dict]) -> str:
    """Rows as a Markdown table; columns that are zero (or "-") in every row are left out."""
    text = ("kernel", "loop: its most frequent source line", "shared loads by width")
    always = text[:2] + ("instructions", "FFMA share")
    always = tuple(c for c in always if c in rows[0])
    cols = [c for c in rows[0] if c in always or any(r[c] not in (0, "-") for r in rows)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "".join("---|" if c in text else "--:|" for c in cols)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def loop_table(version: str, contains: str = "", loops: str = "innermost", extra_flags=()) -> str:
    """Every innermost loop (or the hot one) of one kernel of `version`, as a Markdown table."""
    return markdown(loop_rows(version, contains, loops, extra_flags))


def hot_loop_table(version: str, kernels: dict[str, str]) -> str:
    """The hot loop of several kernels of one file, one row each: `kernels` maps a row label to the text
    that picks the template instance (see `function`)."""
    rows = []
    for name, contains in kernels.items():
        row = loop_row(function(version, contains).hot_loop())
        del row["loop: its most frequent source line"]     # one loop per kernel: the kernel names it
        rows.append({"kernel": name, **row})
    return markdown(rows)


def excerpt(loop: Loop, count: int = 24, skip: int = 0, first: str | None = None) -> str:
    """`count` instructions of a loop from its `skip`-th on (or from four before the first `first`
    opcode, such as "HMMA"), one a line with offset and source line."""
    if first is not None:
        skip = max(0, next((k for k, i in enumerate(loop.instructions) if i.opcode == first), 0) - 4)
    shown = loop.instructions[skip:skip + count]
    out = [f"... {skip} instructions from the loop's start at /*{loop.start:04x}*/"] if skip else []
    out += [f"/*{i.offset:04x}*/  {i.text:<52} // line {i.line}" for i in shown]
    rest = len(loop.instructions) - skip - len(shown)
    if rest > 0:
        out.append(f"... {rest} more instructions up to the branch back at /*{loop.end:04x}*/")
    return "\n".join(out)


# -------------------- Hopper scheduling (V8); lines: instruction texts ("@P0 FMUL R24, R24, R5") or cuobjdump's SASS
_HGMMA_RS = re.compile(r"HGMMA\.64 ?x(\d+)x16\S* R(\d+), R(\d+), gdesc")   # A from registers: P V
_WRITES = re.compile(r"(?:@!?U?P\w+\s+)?\S+\s+R(\d+)\b")                  # first operand: the destination


def overlap_windows(lines: list[str]) -> list[tuple[int, int, list[str]]]:
    """Every stretch between 'one wgmma group left' (WARPGROUP.DEPBAR.LE gsb0, 0x1) and 'none left'
    (0x0), where the softmax of tile j + 1 runs while P_ij V_j is on the tensor cores: its length in
    instructions, its exponentials (MUFU.EX2), and the instructions in it that write a register of that
    product -- its accumulators O_i or its A operand P_ij, which the tensor cores may still read and write."""
    windows, previous_wait = [], 0
    for start, line in enumerate(lines):
        if "DEPBAR.LE gsb0, 0x1" not in line:
            if "DEPBAR.LE gsb0" in line:
                previous_wait = start
            continue
        end = next(i for i in range(start, len(lines)) if "DEPBAR.LE gsb0, 0x0" in lines[i])
        in_flight = set()
        for issued in lines[previous_wait:start]:   # the register-A products issued since the last wait
            if m := _HGMMA_RS.search(issued):
                n, acc, a = (int(g) for g in m.groups())
                in_flight |= set(range(acc, acc + n // 2)) | set(range(a, a + 4))
        body = lines[start + 1:end]
        clobbered = [ins for ins in body if (m := _WRITES.match(ins)) and int(m.group(1)) in in_flight]
        windows.append((end - start - 1, sum("MUFU.EX2" in ins for ins in body), clobbered))
        previous_wait = end
    return windows


def register_moves(lines: list[str]) -> dict[str, list[int]]:
    """The setmaxnreg instructions of a kernel: {"release": [...], "claim": [...]}, registers per thread
    after each (USETMAXREG.DEALLOC, the producer's; USETMAXREG.TRY_ALLOC, the consumers')."""
    moves = {"release": [], "claim": []}
    for line in lines:
        if m := re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL (0x[0-9a-f]+)", line):
            moves["release"].append(int(m.group(1), 16))
        elif m := re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \S+, (0x[0-9a-f]+)", line):
            moves["claim"].append(int(m.group(1), 16))
    return moves


def wgmma_gaps(lines) -> list[tuple[int, list[str], Counter]]:
    """Per WARPGROUP.DEPBAR.LE gsb0, N wait: N, the instructions from it to the next wait (or the end), and those
    by opcode at every depth ("MUFU", "MUFU.EX2"); `lines`: texts, or cuobjdump's SASS as a string."""
    out = []
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        if wait := re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", line):
            out.append((int(wait[1], 16), [], Counter()))
        elif out and (m := re.match(r"(?:/\*\w+\*/)?\s*(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", line.strip())):
            out[-1][1].append(line)
            out[-1][2].update(m[1].rsplit(".", k)[0] for k in range(m[1].count(".") + 1))
    return out


def wgmma_windows(lines) -> list[Counter]:
    """wgmma_gaps from a 0x1 wait to a 0x0 one: one wgmma group in flight all along."""
    after = wgmma_gaps(lines)
    return [c for (n, _, c), (m, _, _) in zip(after, after[1:]) if n == 1 and m == 0]


def texts(fn: Function) -> list[str]:
    """The instruction texts of a disassembled function, in order (for the functions above)."""
    return [i.text for i in fn.instructions]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version")
    parser.add_argument("--kernel", default="", help="words the demangled kernel name must contain")
    parser.add_argument("--excerpt", type=int, default=0, help="print this many instructions of the hot loop")
    parser.add_argument("-D", dest="defines", action="append", default=[], help="macro, e.g. V5_TM=4")
    args = parser.parse_args(argv)
    flags = tuple(f"-D{d}" for d in args.defines)
    fn = function(args.version, args.kernel, flags)
    print(fn.pretty)
    print(loop_table(args.version, args.kernel, extra_flags=flags))
    if args.excerpt:
        print(excerpt(fn.hot_loop(), args.excerpt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
