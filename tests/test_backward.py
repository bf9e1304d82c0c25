"""v6 backward (kernels/v6_backward.cu) and v6's forward_lse: gradients, log-sum-exp, determinism.

  * CPU: the one operand layout the forward does not already use -- dS read as an mma A fragment through
    ldmatrix.trans from the dS^T tile the warps store -- emulated with tests/test_v6.py's numpy ldmatrix
    and mma, with the kernel's own address formulas (values and bank conflicts of stores and loads).
  * GPU: dQ, dK, dV against float64 autograd of flashattn.reference.attention_reference; our relative
    error must be at most twice the error of PyTorch's own backward (SDPA) in the same dtype. Odd shapes,
    M != N both ways, causal and not, several B and H, large logits, both dQ modes, poisoned memory.
  * CPU: the bulk dQ step's float32 image in shared memory (acc_pair's column order): every element once,
    conflict-free stores, and bwd_convert's read of it.
  * GPU: compute-sanitizer memcheck, racecheck and synccheck over tests/backward_sanitizer_target.py, for the
    default build and every other build of the atomic mode (flashattn.measure.variants, the backward-* sets).
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HALF_DTYPES, poison_allocator, run_sanitized
from test_v6 import a16, halves, ldmatrix_x4
from test_v7 import is_hopper

from flashattn.reference import attention_reference, sdpa, window_mask

ROOT = Path(__file__).resolve().parent.parent


# ================================================================ CPU: the dS^T tile and its .trans read
# B_r = 64 everywhere, and 128 in bwd_dkdv_split at D=64 (V6B_D64_BR): tile rows of 128 or 256 bytes
@pytest.mark.parametrize("BR", [64, 128])
def test_ds_transposed_tile_emulated(BR):
    """Warp w stores dS^T[key][query] from its accumulator registers (key row r = 16w + g + 8h, queries
    8t + 2q, +1 at chunk t ^ (r % 8), byte 4q); the dQ step then reads dS[query][key] A fragments with
    ldmatrix.trans (row b_row, chunk (2 * slice + b_chunk) ^ (lane % 8)). Checks both against the
    matrix and that the 4-byte stores hit 32 distinct banks."""
    rng = np.random.default_rng(1)
    BC = 64
    dsT = rng.integers(-8, 9, (BC, BR)).astype(np.float16)    # [key][query]
    mem = np.zeros(BC * BR, np.uint16)                          # 2 B_r-byte rows
    bits = dsT.view(np.uint16)
    for w in range(4):
        for t in range(BR // 8):
            for h in range(2):
                addrs = []
                for lane in range(32):
                    g, q = divmod(lane, 4)
                    r = 16 * w + g + 8 * h
                    byte = r * 2 * BR + ((t ^ (r & 7)) << 4) + 4 * q
                    mem[byte // 2] = bits[r, 8 * t + 2 * q]
                    mem[byte // 2 + 1] = bits[r, 8 * t + 2 * q + 1]
                    addrs.append(byte)
                assert len({(a // 4) % 32 for a in addrs}) == 32, "dS^T store has a bank conflict"
    for slice_ in range(BR // 16):
        for kk in range(BC // 16):
            addrs = []
            for lane in range(32):
                x, b_row, b_chunk = lane & 7, (lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1
                addrs.append((kk * 16 + b_row) * 2 * BR + (((2 * slice_ + b_chunk) ^ x) << 4))
            regs = ldmatrix_x4(mem, addrs, trans=True)   # also checks the 8 phases for bank conflicts
            for lane in range(32):
                for i in range(8):
                    row, k = a16(lane, i)
                    got = halves(int(regs[lane, i // 2]), np.float16)[i % 2]
                    assert got == dsT[kk * 16 + k, slice_ * 16 + row], (slice_, kk, lane, i)


@pytest.mark.parametrize("BR", [64, 128])
def test_split_layout_tiles_emulated(BR):
    """bwd_dkdv_split: warp w (keys 32(w/2) + 16mi + g + 8h, queries QW(w%2) + 8t + 2q, +1, with QW = B_r/2
    and QT = QW/8 n8 tiles) stores P^T (and dS^T, same addresses) at chunk (QT(w%2) + t) ^ (r % 8), byte
    4q of 2 B_r-byte key rows; the dK/dV step then reads its 32 key rows as mma A fragments with plain
    ldmatrix (row 32(w/2) + 16mi + a_row, chunk (2kk + a_chunk) ^ (lane % 8)). Checks every fragment
    against the matrix and the stores for bank conflicts (the dQ step's .trans read of the same tile is
    test_ds_transposed_tile_emulated's)."""
    rng = np.random.default_rng(2)
    BC, QW = 128, BR // 2
    QT = QW // 8
    pT = rng.integers(-8, 9, (BC, BR)).astype(np.float16)      # [key][query]
    bits = pT.view(np.uint16)
    mem = np.zeros(BC * BR, np.uint16)
    for w in range(8):
        wk, wq = divmod(w, 2)
        for mi in range(2):
            for t in range(QT):
                for h in range(2):
                    addrs = []
                    for lane in range(32):
                        g, q = divmod(lane, 4)
                        r, chunk = 32 * wk + 16 * mi + g + 8 * h, QT * wq + t
                        byte = r * 2 * BR + ((chunk ^ (r & 7)) << 4) + 4 * q
                        col = QW * wq + 8 * t + 2 * q
                        mem[byte // 2], mem[byte // 2 + 1] = bits[r, col], bits[r, col + 1]
                        addrs.append(byte)
                    assert len({(a // 4) % 32 for a in addrs}) == 32, "P^T store has a bank conflict"
    # layout 2 writes the same tile with stmatrix.x4: lane l addresses row l % 8 of matrix i = l / 8 (key
    # rows 16mi + 8(i % 2) + 0..7, queries 8(2tp + i / 2) + 0..7); register i of lane l holds that
    # matrix's row l / 4, elements 2(l % 4), +1 -- the accumulator pair of key row g + 8h, n8 tile t
    stm = np.zeros_like(mem)
    for w in range(8):
        wk, wq = divmod(w, 2)
        for mi in range(2):
            for tp in range(QT // 2):
                rows = []
                for lane in range(32):
                    i, j = divmod(lane, 8)
                    r, chunk = 32 * wk + 16 * mi + 8 * (i & 1) + j, QT * wq + 2 * tp + (i >> 1)
                    rows.append(r * 2 * BR + ((chunk ^ j) << 4))
                for i in range(4):   # one phase per matrix: its 8 rows must cover the 32 banks
                    assert len({(a // 4 + b) % 32 for a in rows[8 * i:8 * i + 8] for b in range(4)}) == 32
                for lane in range(32):
                    g, q = divmod(lane, 4)
                    for i in range(4):
                        h, t = i & 1, 2 * tp + (i >> 1)
                        r, col = 32 * wk + 16 * mi + g + 8 * h, QW * wq + 8 * t + 2 * q
                        dst = rows[8 * i + g] // 2 + 2 * q   # row g of matrix i, elements 2q, 2q + 1
                        stm[dst], stm[dst + 1] = bits[r, col], bits[r, col + 1]
    assert np.array_equal(stm, mem), "stmatrix addresses do not reproduce the 4-byte stores' tile"
    for wk in range(4):
        for mi in range(2):
            for kk in range(BR // 16):
                addrs = []
                for lane in range(32):
                    x, a_row, a_chunk = lane & 7, (lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4
                    addrs.append((32 * wk + 16 * mi + a_row) * 2 * BR + (((2 * kk + a_chunk) ^ x) << 4))
                regs = ldmatrix_x4(mem, addrs)
                for lane in range(32):
                    for i in range(8):
                        row, k = a16(lane, i)
                        got = halves(int(regs[lane, i // 2]), np.float16)[i % 2]
                        assert got == pT[32 * wk + 16 * mi + row, 16 * kk + k], (wk, mi, kk, lane, i)


def acc_pair(row: int, cp: int) -> int:
    """kernels/v6_backward.cu's acc_pair: where column pair cp of accumulator row `row` is kept."""
    return cp ^ ((row & 7) << 2)


@pytest.mark.parametrize("D,BR", [(64, 64), (128, 64), (64, 128)])
def test_bulk_dq_image_emulated(D, BR):
    """V6B_DQ_BULK: warp w stores its dQ fragment (queries 32(w%QG) + 16mq + g + 8h with QG = B_r/32 query
    groups, column pairs 4(t0 + t) + q with t0 = (w/QG) NT, NT = (D/8) QG/8 n8 tiles per warp) as 8-byte
    float2 at pair acc_pair(row, cp) of D-float rows of the tile's image; bwd_convert reads column quad c
    of a row as the float4 at pair acc_pair(row, 2c). Checks that every element lands once, that the
    convert's read gives back the matrix for a row base that is not a multiple of 8 (the flat row
    bh * M + i0), and that each store instruction takes the minimum of 2 shared-memory wavefronts (256
    bytes over 32 4-byte banks), where the plain layout takes 8."""
    QG = BR // 32
    NT = D // 8 * QG // 8
    for row0 in (0, 5):                                  # flat row of the tile's first query
        dq = np.arange(BR * D, dtype=np.float32).reshape(BR, D)
        image = np.full(BR * D, np.nan, np.float32)
        for w in range(8):
            for mq in range(2):
                for t in range(NT):
                    for h in range(2):
                        banks_plain, banks = [], []
                        for lane in range(32):
                            g, q = divmod(lane, 4)
                            r, cp = 32 * (w % QG) + 16 * mq + g + 8 * h, 4 * ((w // QG) * NT + t) + q
                            at = r * D + 2 * acc_pair(row0 + r, cp)
                            assert np.isnan(image[at:at + 2]).all(), "two stores to one place"
                            image[at:at + 2] = dq[r, 2 * cp:2 * cp + 2]
                            banks += [(at + e) % 32 for e in range(2)]
                            banks_plain += [(r * D + 2 * cp + e) % 32 for e in range(2)]
                        # wavefronts of one store: the largest number of distinct words on one bank
                        assert max(np.bincount(banks, minlength=32)) == 2, "dQ image store conflicts"
                        assert max(np.bincount(banks_plain, minlength=32)) == 8   # what the swizzle avoids
        assert not np.isnan(image).any()
        back = np.empty_like(dq)
        for r in range(BR):
            for c in range(D // 4):
                at = r * D + 2 * acc_pair(row0 + r, 2 * c)
                back[r, 4 * c:4 * c + 4] = image[at:at + 4]
        assert np.array_equal(back, dq)


# ================================================================ GPU helpers
DTYPES = HALF_DTYPES


@pytest.fixture(scope="module")
def fwd():
    from flashattn.autograd import forward_module
    return forward_module("v6")


@pytest.fixture(scope="module")
def bwd():
    from flashattn.autograd import backward_module
    return backward_module("v6")


def make_inputs(B, H, M, N, D, dtype, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, H, M, D, device="cuda", generator=g) * q_scale).to(dtype)
    k, v = (torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    do = torch.randn(B, H, M, D, device="cuda", generator=g).to(dtype)
    return q, k, v, do


def autograd_grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, do.to(out.dtype))


def rel_err(x, ref, floor):
    """||x - ref|| / max(||ref||, floor) in float64. The floor keeps exact-zero references (N = 1 gives
    dQ = dK = 0 exactly) from turning rounding noise into an infinite relative error."""
    diff = torch.linalg.vector_norm(x.double() - ref).item()
    return diff / max(torch.linalg.vector_norm(ref).item(), floor)


def ours(fwd, bwd, q, k, v, do, causal, deterministic):
    o, lse = fwd.forward_lse(q, k, v, causal)
    # dq, dk, dv and the fp32 dQ accumulator reuse NaN-filled blocks: an unwritten element shows up
    poison_allocator(q, k, v, q.float(), q.float())
    return bwd.backward(q, k, v, o, lse, do, causal, deterministic)


def check_grads(fwd, bwd, B, H, M, N, D, dtype, causal, deterministic, seed, q_scale=1.0):
    q, k, v, do = make_inputs(B, H, M, N, D, dtype, seed, q_scale)
    got = ours(fwd, bwd, q, k, v, do, causal, deterministic)
    torch.cuda.synchronize()
    return compare_grads(got, q, k, v, do, causal)


def compare_grads(got, q, k, v, do, causal, scale=None, window=(-1, -1)):
    """`got` = (dq, dk, dv) of attention(q, k, v) given do, against float64 autograd of the reference: each
    relative error at most twice PyTorch's own (SDPA, grouped-query heads by its enable_gqa, a sliding
    window by an explicit boolean mask) in the same dtype; every element written and finite; rows that see
    no key get dq = 0. Returns `got`."""
    M, N, dtype = q.shape[2], k.shape[2], q.dtype
    ref = autograd_grads(lambda a, b, c: attention_reference(a, b, c, causal=causal, scale=scale, window=window),
                         q.double(), k.double(), v.double(), do.double())
    torch_grads = autograd_grads(lambda a, b, c: sdpa(a, b, c, causal=causal, scale=scale, window=window), q, k, v,
                                 do)
    if not all(torch.isfinite(t).all() for t in torch_grads):   # SDPA's NaN for rows with no key (M > N)
        torch_grads = autograd_grads(lambda a, b, c: attention_reference(a, b, c, causal=causal, dtype=dtype,
                                                                         scale=scale, window=window), q, k, v, do)
    floor = 1e-3 * torch.linalg.vector_norm(do.double()).item()
    for name, g, r, t in zip(("dq", "dk", "dv"), got, ref, torch_grads):
        assert g.dtype == dtype and g.shape == r.shape
        assert torch.isfinite(g).all(), f"{name}: non-finite element (unwritten or NaN)"
        assert torch.isfinite(r).all()
        e_ours, e_torch = rel_err(g, r, floor), rel_err(t, r, floor)
        # Slack of half a unit of the dtype at the floor's scale: it matters only where the reference is
        # (near) zero -- N = 1 gives dQ = 0 exactly, and a kernel whose dP and D_i sum in different orders
        # leaves fp32 rounding noise there that PyTorch's kernel happens not to.
        slack = 0.5 * torch.finfo(dtype).eps * floor / max(torch.linalg.vector_norm(r).item(), floor)
        assert e_ours <= 2 * e_torch + slack, f"{name}: relative error {e_ours:.3e} > 2 x PyTorch's {e_torch:.3e}"
    mask = window_mask(M, N, causal, window, q.device)
    if mask is not None:   # rows with no visible key (causal with M > N, a window past the keys): zero gradient
        assert (got[0][:, :, ~mask.any(1)] == 0).all()
    return got


SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (1, 203), (203, 1), (1023, 1025), (1025, 1023), (128, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", ["atomic", "deterministic"])
def test_gradients_match(fwd, bwd, mode, dtype, causal, D, M, N):
    seed = zlib.crc32(repr((mode, dtype, causal, D, M, N)).encode())
    B, H = ((1, 1), (2, 3), (3, 2))[seed % 3]
    check_grads(fwd, bwd, B, H, M, N, D, DTYPES[dtype], causal, mode == "deterministic", seed)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_large_logits(fwd, bwd, dtype, causal, D):
    # q x 8: scaled scores of magnitude ~30, far past exp's range without the saved log-sum-exp
    check_grads(fwd, bwd, 2, 2, 300, 517, D, DTYPES[dtype], causal, False, seed=11 + D, q_scale=8.0)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_is_bit_identical(fwd, bwd, causal, D):
    q, k, v, do = make_inputs(2, 3, 1025, 777, D, torch.bfloat16, seed=D + causal)
    first = ours(fwd, bwd, q, k, v, do, causal, True)
    second = ours(fwd, bwd, q, k, v, do, causal, True)
    atomic = ours(fwd, bwd, q, k, v, do, causal, False)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # dK and dV never go through atomics: the same bits in both modes
    assert torch.equal(first[1], atomic[1]) and torch.equal(first[2], atomic[2])


# The forwards that train: v6 (also fp32, as TF32) and the Hopper kernels v7 and v8 (16-bit only), whose
# log-sum-exp feeds the same backward kernel.
LSE_CASES = [("v6", "bf16"), ("v6", "fp16"), ("v6", "fp32"), ("v7", "bf16"), ("v7", "fp16"), ("v8", "bf16"),
             ("v8", "fp16")]
needs_hopper = pytest.mark.skipif(not is_hopper(), reason="v7 and v8 need a GPU of compute capability 9.0")


def forward_of(version: str):
    if version != "v6" and not is_hopper():
        pytest.skip(f"{version} needs a GPU of compute capability 9.0")
    from flashattn.autograd import forward_module
    return forward_module(version)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(1, 1), (113, 203), (203, 113), (1025, 1023)])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("version,dtype", LSE_CASES)
def test_forward_lse(version, dtype, causal, D, M, N):
    fwd = forward_of(version)
    dt = {"fp32": torch.float32, **DTYPES}[dtype]
    q, k, v, _ = make_inputs(2, 3, M, N, D, dt, seed=M + N + D + causal, q_scale=4.0)
    poison_allocator(q, q[..., 0].float())
    o, lse = fwd.forward_lse(q, k, v, causal)
    assert torch.equal(o, fwd.forward(q, k, v, causal)), "forward_lse's output differs from forward's"
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    s = (q.double() @ k.double().transpose(-1, -2)) / D ** 0.5
    if causal:
        from flashattn.reference import causal_mask
        s = s.masked_fill(~causal_mask(M, N, q.device), float("-inf"))
    ref = torch.logsumexp(s, dim=-1)
    seen = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), seen) and (lse[~seen] == float("-inf")).all()
    # 16-bit inputs: exact products, fp32 sums; fp32 runs as TF32 (scores off by ~1e-3 relative)
    tol = 5e-3 if dt == torch.float32 else 1e-4
    assert (lse[seen].double() - ref[seen]).abs().max().item() <= tol * max(1.0, ref[seen].abs().max().item())


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("M,N", [(1, 203), (113, 203), (203, 113), (1025, 1023)])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("version", ["v7", "v8"])
def test_hopper_forward_trains(version, causal, D, M, N):
    """v7's and v8's forward_lse feeding v6's backward: gradients within twice PyTorch's error (the same
    check as v6's own, so a wrong lse, which rescales every P, cannot pass)."""
    from flashattn.autograd import backward_module
    seed = zlib.crc32(repr((version, causal, D, M, N)).encode())
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    check_grads(forward_of(version), backward_module(version), 2, 3, M, N, D, dtype, causal, False, seed)


@pytest.mark.gpu
def test_bad_inputs_refused(bwd, fwd):
    q, k, v, do = make_inputs(1, 2, 33, 40, 64, torch.bfloat16, seed=3)
    o, lse = fwd.forward_lse(q, k, v, False)
    good = dict(q=q, k=k, v=v, o=o, lse=lse, dout=do)
    bad = {"q": q.float(), "k": k[..., :32].contiguous(), "v": v[:, :1].contiguous(), "o": o.cpu(),
           "lse": lse.double(), "dout": do.transpose(2, 3).contiguous().transpose(2, 3)}
    for name, value in bad.items():
        args = dict(good, **{name: value})
        with pytest.raises(RuntimeError):
            bwd.backward(args["q"], args["k"], args["v"], args["o"], args["lse"], args["dout"], False, False)
    dq, dk, dv = bwd.backward(q, k, v, o, lse, do, False, False)   # still works afterwards
    assert torch.isfinite(dq).all() and dk.shape == k.shape


# the builds beside the default: every dK/dV layout, layout 2's dQ and pipeline steps, the query tile (B_r)
# at D=64, and the deterministic mode on the split kernel
BUILDS = ["v6_layout0", "v6_layout1", "v6_layout2", "v6_layout2_stages3", "v6_layout2_bulk",
          "v6_layout2_bulk_stages3", "v6_layout2_bulk_br128", "v6_det_split"]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N", [(17, 17), (113, 203), (203, 113), (1, 203), (1025, 1023)])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", BUILDS)
def test_all_dkdv_variants(fwd, variant, causal, D, M, N):
    """The atomic mode's builds (flashattn.measure.variants.backward, built side by side by variant_module,
    whichever is the default): gradients within the tolerance, and dK, dV bit-identical to the
    deterministic mode (same sums in the same order)."""
    from flashattn.book.backward_steps import variant_module
    seed = zlib.crc32(repr(("layout", variant, causal, D, M, N)).encode())
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    module = variant_module(variant)
    got = check_grads(fwd, module, 2, 3, M, N, D, dtype, causal, False, seed)
    q, k, v, do = make_inputs(2, 3, M, N, D, dtype, seed)
    det = ours(fwd, module, q, k, v, do, causal, True)
    assert torch.equal(got[1], det[1]) and torch.equal(got[2], det[2])


# ================================================================ GPU: compute-sanitizer
@pytest.mark.gpu
@pytest.mark.parametrize("variant", [None, *BUILDS])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_clean(fwd, bwd, tool, variant):
    """forward_lse and both backward modes under compute-sanitizer, the default build (None) and every
    other build of the atomic mode (built outside the sanitizer first)."""
    if variant is not None:
        from flashattn.book.backward_steps import variant_module
        variant_module(variant)
    out, ran = run_sanitized(tool, "backward_sanitizer_target.py", *(() if variant is None else ("--variant", variant)))
    from backward_sanitizer_target import cases
    assert len(ran) == len(list(cases())), out[-4000:]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("version", ["v7", "v8"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_hopper_forward_lse_sanitizer_clean(tool, version):
    """v7's and v8's forward_lse (TMA, mbarriers: synccheck too) feeding the default backward."""
    forward_of(version)   # built outside the sanitizer
    out, ran = run_sanitized(tool, "backward_sanitizer_target.py", "--forward", version)
    from backward_sanitizer_target import cases
    assert len(ran) == len(list(cases())), out[-4000:]
