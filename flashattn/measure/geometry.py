"""Launch geometry of every kernel: threads per block, the shared-memory arrays and their bytes.

The kernel files are the truth. Tile sizes are read from their text (`constexpr int B_r = 64;`,
`#define V5_D64_BR 128`), and the few formulas that turn a tile into bytes are written here once, in the
kernel's own terms, for the book's tables, the tile sweep and the tests; tests/test_geometry.py checks
the V5 formula against the compiled binding's `kernel_info`, which asks the CUDA runtime.
Also here: the bank and fragment arithmetic of shared-memory reads (bank_map, swizzle, mma layouts); what
each access of kernels/v6.cu costs per layout is flashattn.measure.banks.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from flashattn.loader import KERNELS_DIR

FLOAT = 4


@functools.cache
def _text(version: str) -> str:
    return (KERNELS_DIR / f"{version}.cu").read_text()


def constant(version: str, name: str) -> int:
    """An integer tile constant of kernels/<version>.cu: `constexpr int NAME = <expr>;` or `#define NAME 64`,
    where <expr> is integer arithmetic on other such constants (`K_STRIDE = D + 1`)."""
    src = _text(version)
    m = re.search(rf"constexpr int {re.escape(name)} = ([^;]+);", src) or \
        re.search(rf"#define {re.escape(name)} (\d+)\b", src)
    if m is None:
        raise KeyError(f"kernels/{version}.cu defines no integer constant {name}")
    expr = re.sub(r"[A-Za-z_]\w*", lambda ident: str(constant(version, ident.group(0))), m.group(1))
    if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
        raise KeyError(f"kernels/{version}.cu: {name} = {m.group(1)} is not integer arithmetic")
    return int(eval(expr.replace("/", "//"), {"__builtins__": {}}))   # digits and + - * / ( ) only


# ------------------------------------------------------------------------------------ v1 ... v4
def smem_parts(version: str, D: int = 64) -> list[tuple[str, int, int]]:
    """Shared-memory arrays of one block of v1 ... v4 as (name, rows, floats per row), in file order."""
    c = functools.partial(constant, version)
    B_r, B_c = c("B_r"), c("B_c")
    if version == "v1":
        return [("Q_i", B_r, D), ("K_j", B_c, D), ("V_j", B_c, D), ("P_ij", B_r, B_c)]
    if version == "v2":
        return [("Q_i", B_r, D), ("O_i", B_r, D), ("K_j", B_c, D), ("V_j", B_c, D), ("P_ij", B_r, B_c),
                ("m_i, l_i, alpha", 3, B_r)]
    if version == "v3":
        return [("Q_i", B_r, c("D")), ("K_j, then V_j", B_c, c("D")), ("P_ij", B_r, B_c)]
    if version == "v4":     # K_j rows padded by one float: lane c starts in bank c
        return [("Q_i", B_r, c("D")), ("K_j (padded), then V_j", B_c, c("K_STRIDE")), ("P_ij", B_r, B_c)]
    raise ValueError(f"smem_parts covers v1 ... v4; got {version!r}")


def smem_bytes(parts: list[tuple[str, int, int]]) -> int:
    return FLOAT * sum(rows * cols for _, rows, cols in parts)


# ----------------------------------------------------------------------------------------- v5
def v5_tiles(D: int, B_r: int, B_c: int, TM: int, TN: int) -> dict:
    """kernels/v5.cu's struct Tiles: thread grid, padded strides and shared-memory bytes of one tile shape.
    WC lanes share a query row; the P_ij stride is padded to WC (mod 32) so the lanes of a row group hit
    distinct banks."""
    WC, NRG = B_c // TN, B_r // TM
    PS = B_c + ((WC - B_c % 32) % 32 + 32) % 32
    smem = FLOAT * (B_r * (D + 4) + B_c * (D + 4) + B_c * D + B_r * PS)
    return dict(D=D, B_r=B_r, B_c=B_c, TM=TM, TN=TN, WC=WC, NRG=NRG, threads=WC * NRG, smem=smem)


def v5_default_tiles(macros: dict[str, int] | None = None) -> dict[int, dict]:
    """The tile shape per head dim that kernels/v5.cu compiles (its V5_D64_* / V5_D128_* macros; `macros`
    overrides them the way -D flags do)."""
    macros = macros or {}
    out = {}
    for D in (64, 128):
        names = [f"V5_D{D}_{k}" for k in ("BR", "BC", "TM", "TN")]
        out[D] = v5_tiles(D, *(macros.get(n) or constant("v5", n) for n in names))
    return out


# ----------------------------------------------------------------------------------------- v6
def v6_smem(dtype_bytes: int, D: int, WM: int, B_c: int, stages: int) -> tuple[int, int]:
    """(B_r, dynamic shared memory) of kernels/v6.cu's launcher: Q_i plus `stages` buffers of K_j and V_j."""
    B_r = 16 * WM * constant("v6", "kWarps")
    return B_r, dtype_bytes * D * (B_r + 2 * stages * B_c)


# ----------------------------------------------------------------------------------------- v7
def v7_smem(D: int, NWG: int, B_c: int, stages: int) -> tuple[int, int]:
    """(B_r, dynamic shared memory) of kernels/v7.cu's struct Layout: Q_i, `stages` tiles of K_j and of V_j
    (16-bit elements), one mbarrier for Q_i and three per stage (K full, V full, empty), plus 1 KB to
    round the base up to the 1024-byte alignment of the 128-byte swizzle."""
    B_r = 64 * NWG
    return B_r, 2 * D * (B_r + 2 * stages * B_c) + 8 * (1 + 3 * stages) + 1024


def v7_tiles(D: int, macros: dict | None = None) -> dict:
    """Warpgroups, B_r, B_c, stages, threads and shared memory that kernels/v7.cu builds at head dim D
    (its V7_D<D>_* and V7_STAGES macros; `macros` overrides them the way -D flags do)."""
    macros = macros or {}
    get = lambda name: macros.get(name) or constant("v7", name)
    NWG, B_c, stages = get(f"V7_D{D}_WG"), get(f"V7_D{D}_BC"), get("V7_STAGES")
    B_r, smem = v7_smem(D, NWG, B_c, stages)
    smem += get("V7_SMEM_PAD")          # the steps' control: asked for at launch, never used
    return dict(D=D, warpgroups=NWG, B_r=B_r, B_c=B_c, stages=stages, threads=128 * NWG, smem=smem)


# ----------------------------------------------------------------------------------------- v8
def v8_smem(D: int, NWG: int, B_c: int, stages: int) -> tuple[int, int]:
    """(B_r, dynamic shared memory) of kernels/v8.cu's struct Layout: as v7's, but four mbarriers per stage
    (K full, V full, K empty, V empty) beside Q_i's."""
    B_r = 64 * NWG
    return B_r, 2 * D * (B_r + 2 * stages * B_c) + 8 * (1 + 4 * stages) + 1024


def v8_tiles(D: int, macros: dict | None = None) -> dict:
    """Consumer warpgroups, B_r, B_c, stages, threads (a producer warpgroup more when V8_SPECIALIZE is on)
    and shared memory that kernels/v8.cu builds at head dim D; `macros` overrides its V8_* macros as -D
    flags do. The warpgroup default depends on V8_SPECIALIZE (`#define V8_D64_WG (V8_SPECIALIZE ? 3 : 2)`),
    read from the file."""
    macros = macros or {}
    spec = int(macros.get("V8_SPECIALIZE", constant("v8", "V8_SPECIALIZE")))
    name = f"V8_D{D}_WG"
    if name in macros:
        NWG = int(macros[name])
    else:
        m = re.search(rf"#define {name} \(V8_SPECIALIZE \? (\d+) : (\d+)\)", _text("v8"))
        NWG = int(m.group(1) if spec else m.group(2)) if m else constant("v8", name)
    B_c = int(macros.get(f"V8_D{D}_BC", constant("v8", f"V8_D{D}_BC")))
    # the wide head dims have a stages macro of their own (their shared memory holds no third slot)
    slots = f"V8_D{D}_STAGES" if re.search(rf"#define V8_D{D}_STAGES\b", _text("v8")) else "V8_STAGES"
    stages = int(macros.get(slots, constant("v8", slots)))
    B_r, smem = v8_smem(D, NWG, B_c, stages)
    return dict(D=D, warpgroups=NWG, producer=bool(spec), B_r=B_r, B_c=B_c, stages=stages,
                threads=128 * (NWG + spec), smem=smem)


def variant_geometry(variant) -> dict | None:
    """Threads and shared memory of a flashattn.measure.variants.Variant's kernel at its head dim (v5 ... v8)."""
    D, macros = variant.D, variant.macros
    if variant.kernel == "v5":
        return v5_default_tiles(macros)[D]
    if variant.kernel == "v6":
        get = lambda k: macros.get(f"V6_D{D}_{k}") or constant("v6", f"V6_D{D}_{k}")
        B_r, smem = v6_smem(2, D, get("WM"), get("BC"), get("STAGES"))
        # the step macros, as kernels/v6.cu's launcher counts them: 16 bytes more per row when padded,
        # and a [B_r][B_c] tile for P when it goes through shared memory
        if macros.get("V6_SMEM_LAYOUT") == 1:
            smem += 16 * (B_r + 2 * get("STAGES") * get("BC"))
        if macros.get("V6_P_SMEM") == 1:
            smem += 2 * B_r * get("BC") + (16 * B_r if macros.get("V6_SMEM_LAYOUT") == 1 else 0)
        return dict(D=D, B_r=B_r, B_c=get("BC"), threads=32 * constant("v6", "kWarps"), smem=smem)
    if variant.kernel == "v7":
        return v7_tiles(D, macros)
    if variant.kernel == "v8":
        return v8_tiles(D, macros)
    return None


# ---------------------------------------------------------------------------- kernels by name
def template_args(name: str) -> list[str]:
    inner = name[name.index("<") + 1: name.rindex(">")]
    out, depth, cur = [], 0, ""
    for ch in inner:
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def launch_of(version: str, kernel: str) -> tuple[int, int] | None:
    """(threads per block, dynamic shared memory bytes) of one compiled kernel (a name from ptxas's report)
    at D = 64 for v0 ... v4 and at its own template arguments for v5 ... v8; None for a kernel not known."""
    if version == "v0" and any(k in kernel for k in ("scores_kernel", "softmax_kernel", "pv_kernel")):
        return 256, 0                                 # 16 x 16 output tiles; softmax: 8 warps of rows
    if version in ("v1", "v2") and f"flash_{version}_kernel" in kernel:
        return 32 * constant(version, "WARPS"), smem_bytes(smem_parts(version))
    if version in ("v3", "v4") and f"flash_{version}_kernel" in kernel:
        return 32 * constant(version, "WARPS"), 0     # static arrays: ptxas reports them
    if version == "v5" and "Tiles<" in kernel:
        t = v5_tiles(*(int(x) for x in kernel.split("Tiles<")[1].split(">")[0].split(",")))
        return t["threads"], t["smem"]
    if version == "v6" and "flash_fwd_mma<" in kernel:
        args = template_args(kernel)
        T, D, WM, B_c, stages = args[0], int(args[1]), int(args[2]), int(args[3]), int(args[6])
        return 32 * constant("v6", "kWarps"), v6_smem(4 if T == "float" else 2, D, WM, B_c, stages)[1]
    if version == "v7" and "flash_fwd_wgmma<" in kernel:   # <T, D, NWG, BC, CAUSAL, STAGES, MINB, TMA>
        args = template_args(kernel)
        D, NWG, B_c, stages = int(args[1]), int(args[2]), int(args[3]), int(args[5])
        return 128 * NWG, v7_smem(D, NWG, B_c, stages)[1]
    if version == "v8" and "flash_fwd_ws<" in kernel:   # <T, D, NWG, BC, CAUSAL, STAGES, SPECIALIZE, ...>
        args = template_args(kernel)
        D, NWG, B_c, stages = int(args[1]), int(args[2]), int(args[3]), int(args[5])
        spec = args[6] in ("true", "1")
        return 128 * (NWG + spec), v8_smem(D, NWG, B_c, stages)[1]
    return None


# ------------------------------------------------------------------------ bank and fragment maps
def bank_map(stride: int, d: int = 0, lanes: int = 32) -> list[int]:
    """Bank hit by lane c reading element [c][d] of a float array with row stride `stride`."""
    return [(c * stride + d) % 32 for c in range(lanes)]


def conflict_degree(stride: int, d: int = 0) -> int:
    """How many shared-memory wavefronts one warp-wide 4-byte read of column d needs (1 = conflict-free)."""
    banks = bank_map(stride, d)
    return max(banks.count(b) for b in set(banks))


def swizzle(row: int, chunk: int) -> int:
    """v6's shared-memory swizzle: 16-byte chunk `chunk` of row `row` is stored at chunk ^ (row % 8)."""
    return chunk ^ (row % 8)


def mma_accumulator_owner(rows=16, cols=8):
    """Lane that holds each element of an m16n8 fp32 accumulator (PTX ISA fragment layout)."""
    lane = np.zeros((rows, cols), dtype=int)
    for r in range(rows):
        for c in range(cols):
            lane[r, c] = (r % 8) * 4 + (c % 8) // 2
    return lane
