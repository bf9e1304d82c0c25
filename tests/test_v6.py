"""v6 (tensor cores, mma.sync): correctness of bf16/fp16 and TF32, causal masking, odd shapes, refusals.

Two kinds of tests:
  * CPU-only: a numpy emulation of ldmatrix and mma.sync (fragment layouts as tabulated in the PTX ISA)
    driven by the same lane -> address formulas as kernels/v6.cu. It checks that S = Q K^T and O = P V
    come out right through the swizzled tiles, that P can be reused from the accumulator registers, and
    that the shared-memory accesses are free of bank conflicts. Runs anywhere.
  * GPU: the compiled kernel against a float32-upcast reference (bf16/fp16, the flash-attention rule:
    error <= 2 x PyTorch's own low-precision error + 1e-5) and a float64 reference (TF32 mode).

compute-sanitizer covers v6 with every other kernel: tests/test_sanitizer.py.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    HALF_DTYPES,
    assert_refused,
    bad_inputs,
    every_half_case,
    poison_allocator,
    run_sanitized,
    sanitizer_cases,
)

import flashattn
from flashattn.measure import results, sweep
from flashattn.measure.variants import SETS
from flashattn.reference import attention_reference, relative_error, sdpa


# ================================================================ CPU emulation of the fragment maps
# PTX ISA fragment layouts, lane l: group g = l // 4, thread-in-group q = l % 4.
def a16(l, i):   # m16n8k16 A (16x16, row): element i of 8 -> (row, k)
    g, q = divmod(l, 4)
    return g + 8 * ((i // 2) % 2), 2 * q + i % 2 + 8 * (i // 4)


def b16(l, i):   # m16n8k16 B (16x8, col): element i of 4 -> (k, n)
    g, q = divmod(l, 4)
    return 2 * q + i % 2 + 8 * (i // 2), g


def a_tf32(l, i):   # m16n8k8 TF32 A (16x8): element i of 4 -> (row, k)
    g, q = divmod(l, 4)
    return g + 8 * (i % 2), q + 4 * (i // 2)


def b_tf32(l, i):   # m16n8k8 TF32 B (8x8): element i of 2 -> (k, n)
    g, q = divmod(l, 4)
    return q + 4 * i, g


def c_frag(l, i):   # accumulator (16x8) of both shapes: element i of 4 -> (row, col)
    g, q = divmod(l, 4)
    return g + 8 * (i // 2), 2 * q + i % 2


def from_fragments(acc: np.ndarray, WM: int, tiles: int) -> np.ndarray:
    """The [16 WM, 8 tiles] matrix held as accumulator fragments acc[slice, n8 tile, lane, element]."""
    out = np.zeros((16 * WM, 8 * tiles))
    for s in range(WM):
        for t in range(tiles):
            for l in range(32):
                for i in range(4):
                    r, c = c_frag(l, i)
                    out[16 * s + r, 8 * t + c] = acc[s, t, l, i]
    return out


def swizzled_tile(tile: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Store tile [R, D] the way load_tile does (thread idx -> row idx // CPR, chunk idx % CPR, stored at
    chunk (c ^ (r % 8))). Returns the shared memory as uint16 units and the byte address written by
    each consecutive thread, for the bank check of the cp.async stores."""
    R, D = tile.shape
    es = tile.itemsize
    cpr = D * es // 16
    raw = np.ascontiguousarray(tile).view(np.uint16).reshape(R, cpr, 8)   # 8 uint16 per 16-byte chunk
    mem = np.zeros((R * cpr, 8), np.uint16)
    writes = []
    for idx in range(R * cpr):
        r, c = divmod(idx, cpr)
        mem[r * cpr + (c ^ (r & 7))] = raw[r, c]
        writes.append((r * cpr + (c ^ (r & 7))) * 16)
    return mem.reshape(-1), writes


def check_ldmatrix_banks(addrs):
    for i in range(4):   # one phase per 8x8 matrix: 8 rows of 16 bytes must use 8 distinct bank groups
        groups = {(addrs[8 * i + r] // 16) % 8 for r in range(8)}
        assert len(groups) == 8, f"ldmatrix phase {i} has a bank conflict: {addrs[8 * i:8 * i + 8]}"


def ldmatrix_x4(mem16: np.ndarray, addrs, trans=False) -> np.ndarray:
    """PTX ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lanes 8i..8i+7 address the rows of matrix i; lane l
    receives in register i the pair (row l/4, cols 2(l%4), 2(l%4)+1), or with .trans (rows 2(l%4),
    2(l%4)+1, col l/4). Returns uint32 registers [32, 4], low half = first element."""
    check_ldmatrix_banks(addrs)
    regs = np.zeros((32, 4), np.uint64)
    for i in range(4):
        mat = np.stack([mem16[addrs[8 * i + r] // 2: addrs[8 * i + r] // 2 + 8] for r in range(8)])
        if trans:
            mat = mat.T
        for l in range(32):
            lo, hi = int(mat[l // 4, 2 * (l % 4)]), int(mat[l // 4, 2 * (l % 4) + 1])
            regs[l, i] = lo | (hi << 16)
    return regs


def halves(reg, dtype):
    return np.array([reg & 0xFFFF, reg >> 16], np.uint16).view(dtype).astype(np.float64)


def as_f32(reg):
    return float(np.array([reg], np.uint32).view(np.float32)[0])


def mma(a, b, c, tf32: bool, dtype=np.float16):
    """One warp-wide mma.sync: a [32, 4] and b [32, 2] registers, c [32, 4] floats (updated copy)."""
    if tf32:
        A, B = np.full((16, 8), np.nan), np.full((8, 8), np.nan)
        for l in range(32):
            for i in range(4):
                A[a_tf32(l, i)] = as_f32(a[l, i])
            for i in range(2):
                B[b_tf32(l, i)] = as_f32(b[l, i])
    else:
        A, B = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
        for l in range(32):
            for i in range(8):
                A[a16(l, i)] = halves(int(a[l, i // 2]), dtype)[i % 2]
            for i in range(4):
                B[b16(l, i)] = halves(int(b[l, i // 2]), dtype)[i % 2]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "a fragment element was never written"
    C = A @ B
    out = c.copy()
    for l in range(32):
        for i in range(4):
            out[l, i] += C[c_frag(l, i)]
    return out


def pack2(lo, hi, dtype):
    return int(np.array([lo, hi], dtype).view(np.uint32)[0])


def f32_bits(x):
    return int(np.array([x], np.float32).view(np.uint32)[0])


def emulate_warp(D, BC, WM, tf32, seed=0, stages=1):
    """Slice 0..WM-1 of warp 0: S = Q K^T and O = P V (with P := S) through the kernel's index math.
    stages > 1 (V6_*_STAGES): sK and sV hold `stages` pipeline buffers of BC keys, buffer b addressed
    from sK + b * BC * D as in the kernel; every buffer is checked on its own."""
    for j in range(stages):
        _emulate_buffer(D, BC, WM, tf32, seed, stages, j)


def _emulate_buffer(D, BC, WM, tf32, seed, stages, j):
    rng = np.random.default_rng(seed)
    dtype = np.float32 if tf32 else np.float16
    es = 4 if tf32 else 2
    Q = rng.integers(-2, 3, (16 * WM, D)).astype(dtype)   # small integers: every product is exact
    K_all = rng.integers(-2, 3, (stages * BC, D)).astype(dtype)   # all buffers, swizzled as one tile
    V_all = rng.integers(-2, 3, (stages * BC, D)).astype(dtype)
    K, V = K_all[j * BC:(j + 1) * BC], V_all[j * BC:(j + 1) * BC]   # what buffer j holds
    cpr = D * es // 16
    rowb = cpr * 16
    memQ, _ = swizzled_tile(Q)
    memK, writes = swizzled_tile(K_all)
    memV, _ = swizzled_tile(V_all)
    for w in range(0, len(writes), 8):   # cp.async: each 8 consecutive threads fill 128 distinct bytes
        assert len({(a // 16) % 8 for a in writes[w:w + 8]}) == 8

    lanes = range(32)
    x = [l & 7 for l in lanes]
    a_row = [x[l] + 8 * ((l >> 3) & 1) for l in lanes]
    a_chunk = [l >> 4 for l in lanes]
    b_row = [x[l] + 8 * (l >> 4) for l in lanes]
    b_chunk = [(l >> 3) & 1 for l in lanes]

    NT, DT = BC // 8, D // 8
    buf_off = j * BC * rowb   # sK + buf * BC * D
    s_acc = np.zeros((WM, NT, 32, 4))
    for ks in range(cpr // 2):
        qa = [ldmatrix_x4(memQ, [(s * 16 + a_row[l]) * rowb + (((2 * ks + a_chunk[l]) ^ x[l]) << 4)
                                 for l in lanes]) for s in range(WM)]
        for np_ in range(NT // 2):
            b = ldmatrix_x4(memK, [buf_off + (np_ * 16 + b_row[l]) * rowb + (((2 * ks + b_chunk[l]) ^ x[l]) << 4)
                                   for l in lanes])
            for s in range(WM):
                s_acc[s, 2 * np_] = mma(qa[s], b[:, 0:2], s_acc[s, 2 * np_], tf32)
                s_acc[s, 2 * np_ + 1] = mma(qa[s], b[:, 2:4], s_acc[s, 2 * np_ + 1], tf32)
    S = from_fragments(s_acc, WM, NT)
    S_ref = Q.astype(np.float64) @ K.astype(np.float64).T
    np.testing.assert_array_equal(S, S_ref)

    o = np.zeros((WM, DT, 32, 4))
    if not tf32:
        for kk in range(BC // 16):
            p = []
            for s in range(WM):
                pf = np.zeros((32, 4), np.uint64)
                for l in lanes:
                    t0, t1 = s_acc[s, 2 * kk, l], s_acc[s, 2 * kk + 1, l]
                    pf[l] = [pack2(t0[0], t0[1], dtype), pack2(t0[2], t0[3], dtype),
                             pack2(t1[0], t1[1], dtype), pack2(t1[2], t1[3], dtype)]
                p.append(pf)
            for dp in range(D // 16):
                b = ldmatrix_x4(memV, [buf_off + (kk * 16 + a_row[l]) * rowb + (((2 * dp + a_chunk[l]) ^ x[l]) << 4)
                                       for l in lanes], trans=True)
                for s in range(WM):
                    o[s, 2 * dp] = mma(p[s], b[:, 0:2], o[s, 2 * dp], tf32)
                    o[s, 2 * dp + 1] = mma(p[s], b[:, 2:4], o[s, 2 * dp + 1], tf32)
    else:
        memV_bytes = memV.view(np.uint8)
        for kk in range(BC // 8):
            p = []
            for s in range(WM):
                pf = np.zeros((32, 4), np.uint64)
                for l in lanes:
                    c = s_acc[s, kk, l]
                    pf[l] = [f32_bits(c[0]), f32_bits(c[2]), f32_bits(c[1]), f32_bits(c[3])]
                p.append(pf)
            for t in range(DT):
                bv = np.zeros((32, 2), np.uint64)
                addrs = []
                for l in lanes:
                    g, q = divmod(l, 4)
                    r0 = kk * 8 + 2 * q
                    chunk, within = 2 * t + (g >> 2), (g & 3) * 4
                    a0 = buf_off + r0 * rowb + ((chunk ^ (2 * q)) << 4) + within
                    a1 = buf_off + (r0 + 1) * rowb + ((chunk ^ (2 * q + 1)) << 4) + within
                    bv[l] = [int(memV_bytes[a0:a0 + 4].view(np.uint32)[0]),
                             int(memV_bytes[a1:a1 + 4].view(np.uint32)[0])]
                    addrs.append((a0, a1))
                for j in range(2):   # 32 four-byte loads per instruction: 32 distinct banks
                    assert len({(a[j] // 4) % 32 for a in addrs}) == 32, "TF32 V load has a bank conflict"
                for s in range(WM):
                    o[s, t] = mma(p[s], bv, o[s, t], tf32)
    O = from_fragments(o, WM, DT)
    np.testing.assert_array_equal(O, S_ref @ V.astype(np.float64))


@pytest.mark.parametrize("D,BC,WM,tf32,stages", [(64, 64, 2, False, 2), (128, 64, 2, False, 2),
                                                 (128, 32, 2, False, 3), (128, 48, 2, False, 2),
                                                 (128, 64, 1, False, 2), (64, 64, 1, True, 2),
                                                 (128, 32, 1, True, 2), (64, 64, 2, False, 3)])
def test_fragment_mappings_emulated(D, BC, WM, tf32, stages):
    emulate_warp(D, BC, WM, tf32, stages=stages)


# ================================================================ GPU tests
SHAPES = [(113, 203), (128, 217), (1023, 1024), (1024, 1023), (1, 1), (2048, 2048)]
BHS = [(1, 1), (2, 3)]
DTYPES = HALF_DTYPES


@pytest.fixture(scope="module")
def v6():
    return flashattn.load("v6")   # the raw binding: forward(q, k, v, causal), no Python-side checks


def attention_in(q, k, v, causal, dtype):
    """PyTorch attention with every step in `dtype` (flashattn.reference; fully masked rows give 0)."""
    return attention_reference(q, k, v, causal=causal, dtype=dtype)


def run_poisoned(v6, q, k, v, causal):
    """forward() with the output's future memory filled with NaN first (conftest.poison_allocator), so any
    element the kernel forgets to write stays NaN."""
    poison_allocator(q)
    return v6.forward(q, k, v, causal)


def check_low_precision(v6, B, H, M, N, D, dtype, causal, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, H, M, D, device="cuda", generator=g) * q_scale).to(dtype)
    k = torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype)
    out = run_poisoned(v6, q, k, v, causal)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.isfinite(out).all(), "non-finite output (unwritten or NaN element)"
    ref = attention_in(q, k, v, causal, torch.float32)
    ours = (out.float() - ref).abs().max().item()
    torch_err = (attention_in(q, k, v, causal, dtype).float() - ref).abs().max().item()
    assert ours <= 2 * torch_err + 1e-5, f"max abs error {ours:.3e} > 2 x PyTorch's {torch_err:.3e} + 1e-5"
    if causal and M > N:   # the first M - N rows see no key: defined as 0
        assert (out[:, :, :M - N] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("B,H", BHS)
@pytest.mark.parametrize("M,N", SHAPES)
@every_half_case
def test_low_precision_matches(v6, dtype, causal, D, M, N, B, H):
    seed = zlib.crc32(repr((dtype, causal, D, M, N, B, H)).encode())   # fixed across runs
    check_low_precision(v6, B, H, M, N, D, DTYPES[dtype], causal, seed)


@pytest.mark.gpu
@every_half_case
def test_large_logits(v6, dtype, D, causal):
    # q x 20: scores far beyond exp's range without the running max
    check_low_precision(v6, 2, 2, 300, 517, D, DTYPES[dtype], causal, seed=7 + D, q_scale=20.0)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(1, 1), (113, 203), (1024, 1023), (2048, 2048)])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tf32_mode(v6, causal, D, M, N):
    """fp32 inputs run as TF32 (10-bit mantissa, cvt.rna); tested bound: relative error <= 2e-3."""
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N + D + causal)
    q, k, v = (torch.randn(2, 3, L, D, device="cuda", generator=g) for L in (M, N, N))
    out = run_poisoned(v6, q, k, v, causal)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    ref = attention_in(q, k, v, causal, torch.float64)
    rel = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    assert rel <= 2e-3, f"TF32 relative error {rel:.2e}"
    if M == N == 1:
        assert rel < 1e-3


@pytest.mark.gpu
def test_tf32_fully_masked_rows_are_zero(v6):
    q, k, v = (torch.randn(1, 2, L, 64, device="cuda") for L in (200, 70, 70))
    out = v6.forward(q, k, v, True)
    assert (out[:, :, :130] == 0).all() and torch.isfinite(out).all()


@pytest.mark.gpu
def test_bad_inputs_refused_then_good_call_works(v6):
    good, cases = bad_inputs()
    q, k, v = good
    cases.update({"float64": tuple(t.double() for t in good),
                  "batch": (q, k.expand(2, 2, 33, 64).contiguous(), v.expand(2, 2, 33, 64).contiguous())})
    assert_refused(v6.forward, cases)
    out = v6.forward(q, k, v, False)
    ref = attention_in(q, k, v, False, torch.float32)
    assert (out.float() - ref).abs().max().item() < 2e-2


# ================================================================ the chapter's steps (V6_* step macros)
# Every step of `python -m flashattn.measure.sweep v6-steps` but the last (the committed build, tested above), built
# under the sweep's own module names so that a sweep after the tests reuses the builds. Steps share one
# build for both head dims, so the d64 names stand for both.
STEPS = {n.removeprefix("d64 "): v for n, v in SETS["v6-steps"].items() if n.startswith("d64 ")}
FINAL = list(STEPS)[-1]
STEP_SHAPES = [(2, 3, 113, 203, 1.0), (2, 3, 203, 113, 1.0), (1, 1, 1, 1, 1.0), (1, 2, 1023, 1025, 1.0),
               (3, 2, 17, 1, 1.0), (2, 2, 300, 517, 25.0)]   # (B, H, M, N, logit scale): 25 overflows exp alone
SANITIZE_STEP_SHAPES = [(1, 2, 64, 64), (2, 1, 17, 113), (1, 2, 130, 67)]


def build_step(name: str):
    return sweep.build(STEPS[name])


def test_steps_are_one_change_each_and_end_at_the_committed_build():
    chain = list(SETS["v6-steps"].items())
    for D in (64, 128):
        mine = [(n, v) for n, v in chain if v.D == D]
        assert len(mine) == len(STEPS) >= 6
        for (_, before), (name, after) in zip(mine, mine[1:]):
            changed = set(before.macros.items()) ^ set(after.macros.items())
            stages = {k for k, _ in changed if k.endswith("_STAGES")}   # one switch, set for both head dims
            assert len({k for k, _ in changed} - stages) + bool(stages) == 1, (name, changed)
            assert after.change and after.change != before.change
    text = (Path(__file__).resolve().parent.parent / "kernels" / "v6.cu").read_text()
    for macro, value in STEPS[FINAL].macros.items():   # the last step sets every switch to its default
        assert f"#define {macro} {value}\n" in text, macro


def test_steps_default_build_is_the_same_machine_code():
    """The last step spells every step macro out at its default; the file without -D flags must compile to
    the same instructions, kernel by kernel (so the step macros cost the committed kernel nothing)."""
    from flashattn.measure import sass
    if sass.tool_missing_reason():
        pytest.skip(sass.tool_missing_reason())
    def code(flags):
        return {f.name: [i.text for i in f.instructions] for f in sass.disassemble("v6", tuple(flags))}
    plain, spelled = code(()), code(STEPS[FINAL].flags)
    assert plain.keys() == spelled.keys() and len(plain) == 24
    assert [n for n in plain if plain[n] != spelled[n]] == []


def check_step(module, B, H, M, N, D, dtype, causal, seed, scale):
    """Float64 reference, relative error at most twice SDPA's in the same dtype (floor 1e-2 for bf16,
    1e-3 for fp16, as flashattn.measure.sweep), poisoned output."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g) for L in (M, N, N))
    q, k, v = (q * scale).to(dtype), k.to(dtype), v.to(dtype)
    out = run_poisoned(module, q, k, v, causal)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "non-finite output (unwritten or NaN element)"
    ref = attention_reference(q, k, v, causal=causal, dtype=torch.float64)
    # a row that sees no key (causal, M > N) can come back NaN from SDPA; 0 is the defined answer, and a
    # NaN yardstick would silently leave only the floor as the bound
    theirs = relative_error(torch.nan_to_num(sdpa(q, k, v, causal), nan=0.0), ref)
    ours = relative_error(out, ref)
    bound = max(sweep.FLOOR[str(dtype).removeprefix("torch.")], 2 * theirs)
    assert ours <= bound, f"relative error {ours:.3e} > {bound:.3e} (SDPA: {theirs:.3e})"
    if causal and M > N:
        assert (out[:, :, :M - N] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("step", [s for s in STEPS if s != FINAL])
def test_steps_match_float64(step):
    """Each step is a complete kernel: odd shapes, M != N both ways, large logits, both head dims, both
    masks, bf16 and fp16."""
    module = build_step(step)
    for B, H, M, N, scale in STEP_SHAPES:
        for D in (64, 128):
            for causal in (False, True):
                for dtype in DTYPES.values():
                    seed = zlib.crc32(repr((step, B, H, M, N, D, causal, dtype)).encode())
                    check_step(module, B, H, M, N, D, dtype, causal, seed, scale)


def sanitize_step(step: str) -> None:
    """What compute-sanitizer runs (`python tests/test_v6.py --sanitize-step STEP`): bf16 and fp16 share
    every address and barrier, so bf16 only."""
    sanitizer_cases(build_step(step).forward, "v6-steps", SANITIZE_STEP_SHAPES, [torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("step", [s for s in STEPS if s != FINAL])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_steps_sanitizer_clean(tool, step):
    build_step(step)   # outside the sanitizer: nvcc under it is slow
    out, ran = run_sanitized(tool, Path(__file__).resolve(), "--sanitize-step", step, tag="ran v6-steps ")
    assert len(ran) == len(SANITIZE_STEP_SHAPES) * 2 * 2, out[-4000:]


if __name__ == "__main__" and "--sanitize-step" in sys.argv:
    sanitize_step(sys.argv[sys.argv.index("--sanitize-step") + 1])


@pytest.mark.parametrize("D", [64, 128])
def test_steps_bank_model(D):
    """flashattn.measure.banks.bank_model, the chapter's prediction for the layout step: with plain rows a multiple
    of 128 bytes apart every fragment access of a warp piles onto a few banks; padding and the swizzle
    both make every access conflict-free; the swizzled address is the one geometry.swizzle (and the
    emulation above) uses."""
    from flashattn.measure import banks, geometry
    rows = {r["access"].split(" (")[0].split(",")[0]: r for r in banks.bank_model(D)}
    for r in rows.values():
        assert r["padded"] == r["swizzled"] == r["ideal"], r
    assert rows["Q_i or K_j fragment"]["plain"] == 8 and rows["P_ij store"]["plain"] == 8
    assert rows["V_j fragment"]["plain"] == 4
    assert rows["ldmatrix.x4 of Q_i or V_j"]["plain"] == 32
    assert rows["cp.async 16-byte copy into the tile"]["plain"] == 4
    for r in range(16):
        for c in range(8):
            assert banks.smem_address(2, r, c, 0, 2 * D) == r * 2 * D + 16 * geometry.swizzle(r, c)


@pytest.mark.parametrize("step", ["P via shared memory", "2 stages", FINAL])
def test_steps_recorded_sass_counts_hold(step):
    """The chapter's SASS columns come from results/h200/v6_steps.json; compiled here again (no GPU), each
    step's hot loop has the recorded instruction counts, and the claims the chapter makes of them hold:
    P through shared memory is the only step with STS in its loop, ldmatrix replaces the LDS, and the
    final step has one BAR/DEPBAR fewer than the step before."""
    from flashattn.measure import sass, step_sass
    if sass.tool_missing_reason():
        pytest.skip(sass.tool_missing_reason())
    doc = results.read(Path(__file__).resolve().parent.parent / "results" / "h200" / "v6_steps.json", "sweep")
    recorded = {r["name"]: r.get("sass_hot_loop") or {} for r in doc["rows"]}
    for D in (64, 128):
        variant = SETS["v6-steps"][f"d{D} {step}"]
        here = step_sass.hot_loops("v6", tuple(variant.flags), [D])[str(D)]
        for cls in ("HMMA", "LDS", "LDSM", "STS", "BAR/sync", "MUFU"):
            assert here[cls] == recorded[f"d{D} {step}"][cls], (step, D, cls)
        assert here["HMMA"] == 2 * 2 * (64 // 8) * (D // 16)       # 2 products x 2 slices x B_c/8 x D/16
        assert (here["STS"] > 0) == (step == "P via shared memory")
        assert (here["LDSM"] > 0) == (step != "P via shared memory")
    if step == FINAL:
        assert all(recorded[f"d{D} {FINAL}"]["BAR/sync"] == recorded[f"d{D} 2 stages"]["BAR/sync"] - 1
                   for D in (64, 128))
