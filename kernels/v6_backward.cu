// v6 backward: the FlashAttention-2 backward pass on tensor cores -- mma.sync m16n8k16, bf16/fp16 with
// fp32 accumulation, causal masking, head dims 64 and 128.
//
// What it computes. With S = Q K^T, P = softmax(S * scale) row by row (scale > 0, 1/sqrt(D) by default),
// O = P V and the incoming gradient dO:
//   dV = P^T dO,   dP = dO V^T,   dS = P o (dP - D_i)   with D_i = rowsum(dO_i o O_i),
//   dQ = scale * dS K,   dK = scale * dS^T Q.
// P is never stored by the forward: every tile recomputes it from Q, K and the forward's row-wise
// log-sum-exp, P_ij = exp(S_ij * scale - lse_i), which is the already-normalised softmax (no running max,
// no rescaling). D_i replaces rowsum(P_i o dP_i): both are the same number, but D_i needs only O and dO.
//
// Grouped-query attention (k, v with H_kv heads; query head h reads kv head h / group, group = H / H_kv):
// dK and dV of a kv head are sums over the group's query heads. A dK/dV block owns a key tile of one kv
// head and walks the query tiles of every query head of its group, one head after the other, so dK_j and
// dV_j keep accumulating in registers and are written once: no memory beyond dK and dV, no atomics, and
// one summation order (the deterministic mode stays bit-identical from run to run). The alternatives were
// dK, dV per query head and a sum over the group afterwards (group times their memory and a pass over
// it), or float32 atomics into a shared accumulator (not deterministic). What it costs: B * H_kv *
// ceil(N / B_c) blocks, group times fewer than query heads would give, which leaves SMs idle when that
// grid is small. Everything per query row (bwd_prep's D_i, dQ, bwd_dq) stays per query head, reading kv
// head bh / group.
//
// Kernels (one stream, in this order):
//   1. bwd_prep: D_i = rowsum(dO_i o O_i) in fp32; lse_i converted to base-2 units (lse_i * log2(e), a row
//      with no visible key (-inf) becomes +inf so that its P is exp2(-inf) = 0 and its gradients 0); in
//      atomic mode it also zeroes the fp32 dQ accumulator.
//   2. bwd_dkdv: one block per key tile K_j, V_j (B_c = 16 keys per warp) of one (batch, kv head); it loops
//      over the query tiles Q_i, dO_i (B_r = 64 rows) that see any of its keys (causal: it starts at the
//      first such tile; a window also ends after the last), of each query head of its group in turn. Per
//      tile and warp (its 16 keys x B_r queries), everything in the transposed form, so that the key
//      dimension is the m dimension of the mma:
//        S^T = K_j Q_i^T and dP^T = V_j dO_i^T      (A: K_j / V_j rows, ldmatrix; B: Q_i / dO_i, ldmatrix)
//        P^T = exp2(S^T * scale_log2 - lse2_i), dS^T = P^T o (dP^T - D_i), both packed to 16 bits
//        dV_j += P^T dO_i and dK_j += dS^T Q_i      (A: P^T / dS^T straight from the accumulator
//                                                    registers; B: dO_i / Q_i through ldmatrix.trans)
//      dK_j, dV_j stay in registers for the whole loop and are written once (dK times scale).
//      Atomic mode with layout 0: dS^T also goes to shared memory, and after one barrier each warp computes a
//      16-row slice of dQ_i += dS K_j (A: dS through ldmatrix.trans of the stored dS^T; B: K_j through
//      ldmatrix.trans) and adds it into the fp32 accumulator with red.global.add (.v2 on sm_90).
//   2'. bwd_dkdv_split, the atomic mode's default (V6B_D64_LAYOUT / V6B_D128_LAYOUT = 2; 0 = bwd_dkdv):
//      the same products, B_c = 128, B_r = 64, 8 warps, split over the warps like FlashAttention-2's sm80
//      backward: S^T, dP^T 32 keys x 32 queries per warp; P^T and dS^T to shared memory (stmatrix on
//      sm_90); dV_j, dK_j 32 keys x D/2 per warp; dQ_i 32 queries x D/4 per warp. Each warp reads fewer
//      shared-memory bytes per mma than in bwd_dkdv, where every warp reads all of Q_i and dO_i (twice) for
//      its 16 keys. Layout 1 is the split with 4-byte stores and bwd_dkdv's dQ split (the step between).
//      dK and dV are bit-identical in every layout (the same sums in the same order).
//      Layout 2 on sm_90 (V6B_DQ_BULK = 1, the default): dQ_i's contribution is not added element by
//      element. The warps store it into a float32 image of the tile's accumulator rows in shared memory,
//      and one thread hands the whole tile to the copy engine, cp.reduce.async.bulk .add.f32, one
//      instruction per tile instead of a red.global.add.v2 per two elements from every thread. Each red
//      held the registers of its address and data until the memory pipeline had read them, and the
//      instructions that reused those registers waited (Nsight Compute's long-scoreboard stall; the
//      chapter shows the samples).
//      On that path at D=64 the query tile is 128 rows (V6B_D64_BR = 128, FlashAttention-2's tile at this
//      head dim): each warp's S^T and dP^T are 32 keys x 64 queries, and dQ_i is split 4 x 2 (32 queries x
//      D/2 per warp), so every fragment a warp loads feeds twice the mma, and the two barriers, the row
//      terms and the loop's bookkeeping are paid once per 128 query rows instead of 64.
//   2''. deterministic mode: bwd_dkdv with 4 warps, no atomics; or, with V6B_DET_SPLIT = 1 (measured no
//      faster, off), bwd_dkdv_split with its dQ step compiled out (DQ_SUM = kDqNone).
//   3a. atomic mode: bwd_convert, dQ = scale * accumulator, rounded to the input dtype (and, after bulk
//      reductions, the accumulator's column swizzle undone: see acc_pair).
//   3b. deterministic mode: bwd_dq, one block per query tile (B_r = 64, 16 rows per warp) looping over the
//      key tiles like the forward: S = Q_i K_j^T, dP = dO_i V_j^T, dS = P o (dP - D_i), dQ_i += dS K_j in
//      registers, written once. It recomputes S and dP (two of the five matrix products a second time),
//      but every dQ element is summed in one fixed order: bit-identical results from run to run.
//
// Contract. q, o, do [B, H, M, D], k, v [B, H_kv, N, D] with H a multiple of H_kv, all bf16 or all fp16,
//   contiguous, 16-byte aligned, one CUDA device; lse float32 [B, H, M] from forward_lse (v6, v7 or v8)
//   with the same scale; dk, dv come out like k, v. D in {64, 128}; any M, N >= 1 (M != N allowed).
//   causal=True is bottom-right aligned exactly like the forward: query row i sees key j iff
//   j <= i + (N - M); a window (window_left, window_right), -1 leaving a side unbounded, too: row i sees
//   key j iff i + (N - M) - window_left <= j <= i + (N - M) + window_right, and causal sets window_right
//   to 0. A row that sees no key (M > N, or an empty window) has O = 0 and gets dQ = 0 and adds nothing to
//   dK, dV. Keys that no query sees get dK = dV = 0. Needs compute capability 8.0 or newer. dQ is summed in a
//   float32 accumulator: on sm_90 by one bulk reduction per tile (cp.reduce.async.bulk) by default, else
//   by red.global.add.v2.f32 there and two scalar atomics on older GPUs.
//
// Tiles (bf16/fp16):
//   bwd_dkdv_split: 8 warps, B_c = 128, B_r = 64. Shared memory: K_j, V_j (2 x 128 x D), Q_i and dO_i
//             double-buffered (4 x 64 x D; V6B_SPLIT_STAGES), P^T and dS^T (2 x 128 x 64), with
//             V6B_DQ_BULK dQ_i's image (64 x D floats), lse2 and D_i (2 x 2 x 64 floats): D=64 113 KB,
//             D=128 193 KB (without the dQ image 97 and 161 KB), one block per SM (registers allow no
//             more either). With B_r = 128 (D=64, bulk path): 32 + 64 + 64 + 32 + 2 = 194 KB (without
//             the dQ image, V6B_DET_SPLIT = 1, 162 KB); at D=128 the same tile would need
//             64 + 128 + 64 + 64 KB, more than the 227 KB a block may have.
//   bwd_dkdv, atomic mode: 8 warps, B_c = 128 keys, B_r = 64; deterministic mode (V6B_DET_SPLIT = 0):
//             4 warps, B_c = 64, B_r = 64 (V6B_D*_WARPS / V6B_D*_DET_WARPS). Shared memory: K_j, V_j
//             (2 x B_c x D), Q_i and dO_i double-buffered with cp.async (4 x 64 x D), dS^T (B_c x 64), lse2
//             and D_i (2 x 2 x 64 floats): 8 warps: D=64 81 KB, D=128 145 KB (one block per SM); 4 warps:
//             D=64 57 KB, D=128 105 KB (two).
//             Registers per thread: dV_j and dK_j accumulators D/2 each, S^T and dP^T B_r/2 each -- 192 at
//             D=128 before addresses and fragments, which is why a warp keeps 16 keys, not 32.
//   bwd_dq:   4 warps, B_r = 64 (16 rows per warp), B_c = 64; Q_i and dO_i resident, K_j, V_j
//             double-buffered: D=64 48 KB, D=128 96 KB.
//   Every tile row is stored with v6's XOR swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), so
//   each ldmatrix and ldmatrix.trans phase reads 8 distinct bank groups; the dS^T stores are 4-byte
//   writes that hit 32 distinct banks, and so do bwd_dkdv_split's stmatrix phases (all checked by the
//   numpy emulation in tests/test_backward.py).
//   Registers: every kernel sm_90 runs fits its warps' share of the register file without spills
//   (ptxas -v); on older GPUs the deterministic mode's bwd_dkdv spills a few bytes at D = 128, causal or
//   windowed.
//
// Why these defaults (the backward chapter has the runs): the atomic mode is the default, determinism
// costs time at most shapes; bwd_dkdv_split with stmatrix (layout 2) beat bwd_dkdv at every shape, the
// bulk dQ reduction beat the per-element red.global on sm_90, and the 128-row query tile at D=64 beat
// the 64-row one. bwd_dkdv keeps 16 keys per warp because that is what 255 registers allow at D=128;
// each of its warps re-reads all of Q_i and dO_i for those keys, which is why the split layout, which
// shares that work between warps as FlashAttention-2 does, replaced it as the default.
// Build switches (V6B_* below) rebuild every step the chapter compares; for the file with every switch
// at its default: python -m flashattn.measure.kernel_source v6_backward.
//
// Results: results/h200/bench_backward.json and bench_backward_repeat.json (python -m
// flashattn.measure.bench), the step comparisons results/h200/backward_layouts.json, backward_dq.json,
// backward_tile.json, backward_det.json and backward_heads.json (python -m flashattn.book.backward_steps
// --set ...) with their Nsight Compute records backward_*_ncu.json, the profile
// results/h200/flash_v6_backward_s2048_profile.*; the chapter is book/backward.ipynb
// (docs/backward_notes.md).
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <cmath>

// Warps of bwd_dkdv, 16 keys each, so B_c = 16 * warps (4 or 8); *_WARPS for its atomic mode (layout 0;
// the default layout 2 is bwd_dkdv_split, always 8 warps), *_DET_WARPS for the deterministic mode.
// 8 warps halve the dQ atomics per key, which is what the atomic mode pays for; without the dQ step,
// 2 blocks of 4 warps per SM ran faster than 1 block of 8 (the backward chapter).
#ifndef V6B_D64_WARPS
#define V6B_D64_WARPS 8
#endif
#ifndef V6B_D128_WARPS
#define V6B_D128_WARPS 8
#endif
// Atomic mode's dK/dV kernel per head dim: 0 = bwd_dkdv (a warp owns 16 keys x the whole head dim),
// 1 = bwd_dkdv_split (FlashAttention-2's split: 8 warps, B_c = 128, P^T and dS^T through shared memory),
// 2 = bwd_dkdv_split storing P^T and dS^T with stmatrix (sm_90) and splitting dQ 2 x 4 over the warps.
#ifndef V6B_D64_LAYOUT
#define V6B_D64_LAYOUT 2
#endif
#ifndef V6B_D128_LAYOUT
#define V6B_D128_LAYOUT 2
#endif
// bwd_dkdv_split: bit 1 computes S^T and dP^T in one k loop instead of one after the other, bit 2 the
// same for dV_j and dK_j (two independent mma chains for the scheduler to interleave). No faster
// (results/h200/backward_layouts.json), so it stays off.
#ifndef V6B_SPLIT_FUSE
#define V6B_SPLIT_FUSE 0
#endif
// bwd_dkdv_split without the causal mask: 1 orders the blocks head-fastest, as the causal kernel does.
// No difference from 0 beyond run-to-run spread (results/h200/backward_heads.json), so it stays off.
#ifndef V6B_SPLIT_HEADS_FIRST
#define V6B_SPLIT_HEADS_FIRST 0
#endif
// bwd_dkdv_split: query tiles (Q_i, dO_i, lse2, D_i) in flight, counting the one in use: 2 is a double
// buffer, 3 loads tile i + 2 while tile i is computed.
#ifndef V6B_SPLIT_STAGES
#define V6B_SPLIT_STAGES 2
#endif
// bwd_dkdv_split with layout 2 on sm_90: 1 stages dQ_i in shared memory and adds it into the accumulator
// with one bulk reduction (cp.reduce.async.bulk) per tile instead of a red.global per element pair from
// every thread. Layout 1 and other GPUs always take the red.global path.
#ifndef V6B_DQ_BULK
#define V6B_DQ_BULK 1
#endif
// Query rows per tile (B_r) of bwd_dkdv_split on that bulk path at D=64: 64 or 128 (FlashAttention-2's
// tile at this head dim). At D=128 a 128-row tile does not fit in shared memory, so B_r stays 64 there.
#ifndef V6B_D64_BR
#define V6B_D64_BR 128
#endif
// The deterministic mode's dK/dV kernel: 0 = bwd_dkdv with V6B_D*_DET_WARPS warps, 1 = bwd_dkdv_split without
// its dQ step (the atomic mode's layout and, on sm_90, its B_r). No faster than 0
// (results/h200/backward_det.json), so it stays off.
#ifndef V6B_DET_SPLIT
#define V6B_DET_SPLIT 0
#endif
#ifndef V6B_D64_DET_WARPS
#define V6B_D64_DET_WARPS 4
#endif
#ifndef V6B_D128_DET_WARPS
#define V6B_D128_DET_WARPS 4
#endif

namespace v6b {

constexpr int kThreads = 128;      // bwd_prep, bwd_convert, bwd_dq: 4 warps
constexpr int kBr = 64;            // query rows per tile (both kernels)
// How bwd_dkdv_split adds dQ_i's contribution: red.global per element pair, one bulk reduction per tile
// (V6B_DQ_BULK), or not at all (the deterministic mode, where bwd_dq sums dQ).
constexpr int kDqRed = 0, kDqBulk = 1, kDqNone = 2;

// ---------------------------------------------------------------- PTX wrappers (sm_80+) ----------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte (and 4-byte) global->shared copies; src_bytes = 0 writes zeros instead of reading, which is
// how rows past the end of a matrix become zeros without a branch.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 address the rows of matrix i. Lane l receives in
// register i row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i (.trans: column l/4, rows 2(l%4), +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The inverse of ldmatrix_x4 (sm_90): lanes 8i..8i+7 address the rows of matrix i, and register i of
// lane l holds row l/4, elements 2(l%4), 2(l%4)+1 of matrix i -- the packed accumulator layout of mma.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#endif
}

// D = A * B + D for one 16x8 tile (k = 16); fragment layouts of the PTX ISA (lane l: g = l/4, q = l%4).
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                   uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the special-function unit; ex2.approx(-inf) = +0, which the masking relies on.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Whether key j lies outside the window of query row i, the band of diagonals lo <= j - i <= hi: one
// unsigned compare for both edges (below lo, j - i - lo wraps around past every band width hi - lo;
// exact for any M, N < 2^31), so a window costs the mask no more than causal's one compare.
__device__ __forceinline__ bool outside_band(int j, int i, int lo, int hi) {
  return (unsigned)(j - i) - (unsigned)lo > (unsigned)hi - (unsigned)lo;
}

// Two floats -> one register of two 16-bit values (lower column in the low half: the mma A layout).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <typename T> __device__ __forceinline__ void store2(T* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack2<T>(a, b);
}
template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

// dst[0] += a, dst[1] += b in global memory, without a return value (a reduction, not an atomic that
// reads back). sm_90 has a vector form: one instruction, one L2 transaction for both.
__device__ __forceinline__ void red_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// The fp32 dQ accumulator [B*H*M][D] is scratch of our own, so its layout is ours to choose. With the
// bulk reduction below (V6B_DQ_BULK), whose shared-memory source must be a byte-exact image of the global
// rows, column pair cp (columns 2cp, 2cp + 1) of flat row r sits at pair cp ^ 4 (r % 8): a warp's dQ
// fragment (8 rows x 4 pairs per store) then spreads over all 32 banks instead of 8. bwd_convert undoes
// it. The red.global paths keep the plain layout.
__device__ __forceinline__ int acc_pair(long long row, int cp) { return cp ^ (((int)row & 7) << 2); }

// sm_90's bulk reduction: the copy engine adds `bytes` of fp32 from shared memory into global memory,
// asynchronously, in place of one red per element pair from every thread. The generic-proxy stores that
// filled the source must be fenced for the async proxy first; wait_read lets the source be overwritten.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(dst), "r"(src), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------- shared-memory tiles -----------------
//
// Rows of D 16-bit elements, CPR = D/8 chunks of 16 bytes; chunk c of row r is stored at chunk c ^ (r % 8).
// Thread tid copies chunk tid % CPR of rows tid / CPR, + THREADS / CPR, ...; rows >= `rows` are zeros.
template <int ROWS, int CPR, int THREADS = kThreads, typename T>
__device__ __forceinline__ void load_tile(T* smem_tile, const T* __restrict__ gmem, int row0, int rows,
                                          int tid) {
  constexpr int kD = CPR * 8;
  constexpr int kRowStep = THREADS / CPR;
  static_assert((ROWS * CPR) % THREADS == 0 && THREADS % CPR == 0, "tile must split evenly over the block");
  const int r0 = tid / CPR, c = tid % CPR;
  const uint32_t base = smem_addr(smem_tile);
  const T* src = gmem + (size_t)(row0 + r0) * kD + c * 8;
  const bool whole = row0 + ROWS <= rows;   // block-uniform
#pragma unroll
  for (int it = 0; it < ROWS * CPR / THREADS; ++it) {
    const int r = r0 + it * kRowStep;
    const bool valid = whole || row0 + r < rows;
    // an out-of-range row still needs a legal address: row 0 of this (batch, head)
    cp_async_16(base + (uint32_t)(r * CPR + (c ^ (r & 7))) * 16u, valid ? src + it * kRowStep * kD : gmem,
                valid);
  }
}

// lse2 and D_i of query rows [row0, row0 + BR) into shared memory: threads 0..BR-1 copy lse2, BR..2BR-1
// copy D_i, one float each (the threads after them have nothing to copy). Rows past M become 0, which with
// their zero Q and dO rows gives P * (dP - D) = 1 * (0 - 0) = 0: padded rows add nothing.
template <int BR = kBr>
__device__ __forceinline__ void load_row_terms(float* s_lse, float* s_d, const float* __restrict__ lse2,
                                               const float* __restrict__ Dvec, int row0, int M, int tid) {
  if (tid >= 2 * BR) return;
  const int r = tid % BR, row = row0 + r;
  const bool valid = row < M;
  const float* src = tid < BR ? lse2 : Dvec;
  float* dst = tid < BR ? s_lse : s_d;
  cp_async_4(smem_addr(dst + r), valid ? src + row : src, valid);
}

// dQ_i rows [q0, q0 + 16 MQ) x head-dim columns [8 t0, 8 (t0 + NT)) += dS K_j over the block's BC keys.
// A = dS [16 queries x 16 keys] through ldmatrix.trans of the stored dS^T [keys][B_r queries]: matrices
// (keys 0-7, queries 0-7), (keys 0-7, queries 8-15), (keys 8-15, queries 0-7), (keys 8-15, queries 8-15),
// transposed. B = K_j [keys][D] through ldmatrix.trans. row0 = the tile's first flat row (bh * M + i0),
// rows = how many of its BR rows exist. STAGE = false: red.global into the accumulator (plain layout,
// rows past the end skipped); true: the tile's image in sdQ ([B_r][D] fp32, acc_pair order), for one
// bulk reduction.
template <typename T, int D, int BC, int MQ, int NT, bool STAGE, int BR = kBr>
__device__ __forceinline__ void dq_add(const T* sdS, const T* sK, float* __restrict__ acc, float* sdQ, int q0,
                                       int t0, long long row0, int rows, int lane) {
  constexpr int ROWB = D * 2, SROWB = BR * 2;
  const int x = lane & 7, g = lane >> 2, q = lane & 3;
  const int a_row = x + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;
  const int b_row = x + 8 * (lane >> 4), b_chunk = (lane >> 3) & 1;
  float dq[MQ][NT][4];
#pragma unroll
  for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[mq][t][e] = 0.f;
  const uint32_t sdS_q = smem_addr(sdS) + (uint32_t)(b_row * SROWB);
  const uint32_t sK_t = smem_addr(sK) + (uint32_t)(a_row * ROWB);
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    uint32_t a[MQ][4];
#pragma unroll
    for (int mq = 0; mq < MQ; ++mq)
      ldmatrix_x4_trans(a[mq], sdS_q + kk * 16 * SROWB + (((q0 / 8 + 2 * mq + b_chunk) ^ x) << 4));
#pragma unroll
    for (int dp2 = 0; dp2 < NT / 2; ++dp2) {
      const int chunk = t0 + 2 * dp2 + a_chunk;
      uint32_t b[4];
      ldmatrix_x4_trans(b, sK_t + kk * 16 * ROWB + ((chunk ^ x) << 4));
#pragma unroll
      for (int mq = 0; mq < MQ; ++mq) {
        mma<T>(dq[mq][2 * dp2], a[mq], b[0], b[1]);
        mma<T>(dq[mq][2 * dp2 + 1], a[mq], b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int mq = 0; mq < MQ; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = q0 + 16 * mq + g + 8 * h;
      const long long row = row0 + r;
      if constexpr (STAGE) {
#pragma unroll
        for (int t = 0; t < NT; ++t)
          *reinterpret_cast<float2*>(sdQ + r * D + 2 * acc_pair(row, 4 * (t0 + t) + q)) =
              make_float2(dq[mq][t][2 * h], dq[mq][t][2 * h + 1]);
      } else if (r < rows) {
#pragma unroll
        for (int t = 0; t < NT; ++t)
          red_add2(acc + row * D + 8 * (t0 + t) + 2 * q, dq[mq][t][2 * h], dq[mq][t][2 * h + 1]);
      }
    }
}

// The key tile of one block of the dK/dV kernels: keys [n0, n0 + BC) of (batch, head) bh. heads_first:
// consecutive blocks take the same key tile of different heads (causal: the first key tiles, which see
// the most query tiles, start first, all heads at once, and the blocks running at one time add into the dQ
// rows of many heads); otherwise the key tiles of one head are consecutive.
struct KeyTile {
  int bh, n0;
};
template <int BC>
__device__ __forceinline__ KeyTile key_tile(bool heads_first, int BH, int n_blocks) {
  if (heads_first) return {(int)(blockIdx.x % BH), (int)(blockIdx.x / BH) * BC};
  return {(int)(blockIdx.x / n_blocks), (int)(blockIdx.x % n_blocks) * BC};
}
// key_tile's head, read again from %ctaid: the dK/dV kernels take it here for their stores instead of
// keeping it alive through their loop, which sits at the 255-register limit (with the head of the group
// walk in flight too, ptxas spilled at D = 128; the volatile read stops the compiler reusing the first).
__device__ __forceinline__ int key_tile_head(bool heads_first, int BH, int n_blocks) {
  unsigned cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  return heads_first ? (int)(cta % (unsigned)BH) : (int)(cta / (unsigned)n_blocks);
}
// A step of their walk over the queries: query tile `it` (rows it * B_r ...) of query head bh (b * H + h).
struct QueryTile {
  int bh, it;
};

// The query tiles (of B_R rows) that see any key of the B_C keys from n0: [begin, end). Key j is seen by
// rows j - hi ..= j - lo (CAUSAL: causal or a window, see bwd_dkdv; otherwise every row), so the tile's
// first key bounds them from below and its last key from above; an empty range when no row sees the
// tile.
struct QueryTiles {
  int begin, end;
};
template <int BR, int BC, bool CAUSAL>
__device__ __forceinline__ QueryTiles query_tiles(int n0, int M, int N, int m_tiles, int lo, int hi) {
  if (!CAUSAL) return {0, m_tiles};
  const long long first = (long long)n0 - hi, last = (long long)min(n0 + BC, N) - 1 - lo;
  return {first <= 0 ? 0 : first >= M ? m_tiles : (int)(first / BR),
          last < 0 ? 0 : (int)min((long long)m_tiles, last / BR + 1)};
}

// ---------------------------------------------------------------- 1. pre-pass -------------------------
// CPR threads per row (16-byte chunks), rows = B * H * M.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    bwd_prep(const T* __restrict__ O, const T* __restrict__ dO, const float* __restrict__ lse,
             float* __restrict__ Dvec, float* __restrict__ lse2, float* __restrict__ dq_acc, long long rows) {
  constexpr int CPR = D / 8;
  const long long row = (long long)blockIdx.x * (kThreads / CPR) + threadIdx.x / CPR;
  const int c = threadIdx.x % CPR;
  float sum = 0.f;
  if (row < rows) {
    const uint4 o4 = *reinterpret_cast<const uint4*>(O + row * D + c * 8);
    const uint4 d4 = *reinterpret_cast<const uint4*>(dO + row * D + c * 8);
    const T* o8 = reinterpret_cast<const T*>(&o4);
    const T* d8 = reinterpret_cast<const T*>(&d4);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum = fmaf(to_float<T>(o8[e]), to_float<T>(d8[e]), sum);
    if (dq_acc != nullptr) {
      float4* acc = reinterpret_cast<float4*>(dq_acc + row * D + c * 8);
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // the CPR lanes of a row are consecutive lanes of one warp (CPR divides 32)
#pragma unroll
  for (int off = CPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (row < rows && c == 0) {
    Dvec[row] = sum;
    const float l = lse[row];
    lse2[row] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
  }
}

// ---------------------------------------------------------------- 2. dK, dV (and dQ atomics) ----------
//
// Warp w owns keys [16w, 16w + 16) of the block's tile. Accumulator element e of n8 tile t sits at key
// row 16w + g + 8*(e/2) and column 8t + 2q + e%2 (a query for S^T/dP^T, a head-dim column for dK/dV).
// CAUSAL: the instance for causal=True and for any sliding window, in which row i sees key j iff
// lo <= j - i <= hi: a band of diagonals, lo = N - M - window_left, hi = N - M + window_right. The
// launcher clamps the window's sides to [0, N] and [0, M], past which they bound nothing, so lo >= -M and
// hi <= N (no bound on that side; causal is lo = -M, hi = N - M), and no sum below can overflow.
template <typename T, int D, int WARPS, bool CAUSAL, bool ATOMIC_DQ>
__global__ void __launch_bounds__(32 * WARPS, 8 / WARPS)
    bwd_dkdv(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
             const T* __restrict__ dO, const float* __restrict__ lse2, const float* __restrict__ Dvec,
             T* __restrict__ dK, T* __restrict__ dV, float* __restrict__ dq_acc, int BH_kv, int group, int M,
             int N, int n_blocks, float scale_log2, float scale, int lo, int hi) {
  constexpr int THREADS = 32 * WARPS, BC = 16 * WARPS, BR = kBr;
  constexpr int CPR = D / 8;            // 16-byte chunks per row of Q, K, V, dO
  constexpr int ROWB = CPR * 16;        // bytes per row
  constexpr int KSTEPS = D / 16;        // k16 steps over the head dim
  constexpr int NTQ = BR / 8;           // n8 tiles over the queries of a tile
  constexpr int DT = D / 8;             // n8 tiles over the head dim
  constexpr int SROWB = BR * 2;         // bytes per row of dS^T
  static_assert(SROWB == 128, "the dS^T swizzle assumes 8 chunks per row");
  // dQ phase: BR/16 query slices; the warps left over split the head dim
  constexpr int QS = BR / 16, WN = WARPS / QS, DQT = DT / WN;
  static_assert(QS * WN == WARPS && DQT % 2 == 0, "dQ work must split evenly over the warps");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);   // [B_c][D]
  T* sV = sK + BC * D;                      // [B_c][D]
  T* sQ = sV + BC * D;                      // 2 buffers of [B_r][D]
  T* sdO = sQ + 2 * BR * D;                 // 2 buffers of [B_r][D]
  T* sdS = sdO + 2 * BR * D;                // [B_c][B_r] (dS^T), atomic mode only
  float* sL = reinterpret_cast<float*>(sdS + BC * BR);   // 2 buffers of B_r lse2
  float* sDv = sL + 2 * BR;                               // 2 buffers of B_r D_i

  const KeyTile tile = key_tile<BC>(CAUSAL, BH_kv, n_blocks);
  const int bh_kv = tile.bh, n0 = tile.n0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;

  const T* Kh = K + (size_t)bh_kv * N * D;
  const T* Vh = V + (size_t)bh_kv * N * D;
  const QueryTiles range = query_tiles<BR, BC, CAUSAL>(n0, M, N, (M + BR - 1) / BR, lo, hi);
  const int it_begin = range.begin, it_end = range.end;
  // Grouped-query attention: the loop below walks the query tiles it_begin .. it_end - 1 of each query
  // head of the group (bh = b * H + h for h = h_kv * group .. h_kv * group + group - 1) in turn.
  const int bh_begin = bh_kv * group, bh_end = bh_begin + group;
  // the query tile k steps after tile it of head bh in that walk (bh_end and on: past the last)
  auto after = [&](int bh, int it, int k) {
    for (it += k; it >= it_end; it -= it_end - it_begin) ++bh;
    return QueryTile{bh, it};
  };

  float dv[DT][4], dk[DT][4];
#pragma unroll
  for (int t = 0; t < DT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dv[t][e] = dk[t][e] = 0.f;

  if (it_begin < it_end) {   // block-uniform
    const int x = lane & 7;
    const int a_row = x + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;   // A operands, and .trans B operands
    const int b_row = x + 8 * (lane >> 4), b_chunk = (lane >> 3) & 1;   // B operands, and .trans A (dS)
    // this warp's 16 rows of K_j / V_j as A operands
    const uint32_t sK_a = smem_addr(sK) + (uint32_t)((warp * 16 + a_row) * ROWB);
    const uint32_t sV_a = smem_addr(sV) + (uint32_t)((warp * 16 + a_row) * ROWB);

    // Q_i, dO_i, lse2 and D_i of query tile `it` of head bh into buffer b
    auto load_query_tile = [&](QueryTile t, int b) {
      const size_t bh = t.bh;
      load_tile<BR, CPR, THREADS>(sQ + b * BR * D, Q + bh * M * D, t.it * BR, M, tid);
      load_tile<BR, CPR, THREADS>(sdO + b * BR * D, dO + bh * M * D, t.it * BR, M, tid);
      load_row_terms(sL + b * BR, sDv + b * BR, lse2 + bh * M, Dvec + bh * M, t.it * BR, M, tid);
    };
    load_tile<BC, CPR, THREADS>(sK, Kh, n0, N, tid);
    load_tile<BC, CPR, THREADS>(sV, Vh, n0, N, tid);
    load_query_tile({bh_begin, it_begin}, 0);
    cp_async_commit();

    // 16 x B_r product acc = A B^T, A = this warp's 16 rows of sA (K_j or V_j), B = the B_r rows at sB.
    auto rows_times_tile = [&](float (&acc)[NTQ][4], uint32_t a_base, uint32_t b_base) {
#pragma unroll
      for (int t = 0; t < NTQ; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, a_base + (((2 * ks + a_chunk) ^ x) << 4));
#pragma unroll
        for (int np = 0; np < NTQ / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, b_base + np * 16 * ROWB + (((2 * ks + b_chunk) ^ x) << 4));
          mma<T>(acc[2 * np], a, b[0], b[1]);
          mma<T>(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    };
    // acc[16 x D] += A [16 x B_r] (packed accumulator pairs) * tile [B_r x D] (row-major at base, .trans)
    auto packed_times_tile = [&](float (&acc)[DT][4], const uint32_t (&pk)[NTQ][2], uint32_t base) {
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk) {
        const uint32_t a[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, base + kk * 16 * ROWB + (((2 * dp + a_chunk) ^ x) << 4));
          mma<T>(acc[2 * dp], a, b[0], b[1]);
          mma<T>(acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
    };

    int buf = 0;
    auto step = [&](const int bh, const int it) {
      // Tile it has landed for every thread, and every warp is done with the step before (its Q/dO buffer,
      // and the dS^T tile its dQ step read): the prefetch and this tile's dS^T stores may go ahead.
      cp_async_wait<0>();
      __syncthreads();
      const QueryTile next = after(bh, it, 1);
      if (next.bh < bh_end) load_query_tile(next, buf ^ 1);
      cp_async_commit();

      const int i0 = it * BR;
      const uint32_t sQ_b = smem_addr(sQ + buf * BR * D) + (uint32_t)(b_row * ROWB);
      const uint32_t sdO_b = smem_addr(sdO + buf * BR * D) + (uint32_t)(b_row * ROWB);
      const float* L = sL + buf * BR;
      const float* Dv = sDv + buf * BR;

      float s[NTQ][4], dp[NTQ][4];
      rows_times_tile(s, sK_a, sQ_b);    // S^T = K_j Q_i^T
      rows_times_tile(dp, sV_a, sdO_b);  // dP^T = V_j dO_i^T

      // ---- P^T and dS^T, masked where needed, packed to 16 bits ----
      // the tile's last key past its first query's window (causal: the diagonal), or its first key before
      // its last query's
      const bool tail = n0 + BC > N;
      const bool diag = CAUSAL && ((n0 + BC - 1) - i0 > hi || n0 - (min(i0 + BR, M) - 1) < lo);
      uint32_t p_pk[NTQ][2], ds_pk[NTQ][2];
#pragma unroll
      for (int t = 0; t < NTQ; ++t) {
        const float2 l2 = *reinterpret_cast<const float2*>(L + 8 * t + 2 * q);
        const float2 d2 = *reinterpret_cast<const float2*>(Dv + 8 * t + 2 * q);
        float p[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lse_e = (e & 1) ? l2.y : l2.x, d_e = (e & 1) ? d2.y : d2.x;
          p[e] = ex2(fmaf(s[t][e], scale_log2, -lse_e));
          if (tail || diag) {
            const int key = n0 + warp * 16 + g + 8 * (e >> 1);
            const int row = i0 + 8 * t + 2 * q + (e & 1);
            if (key >= N || (CAUSAL && outside_band(key, row, lo, hi))) p[e] = 0.f;
          }
          ds[e] = p[e] * (dp[t][e] - d_e);
        }
        p_pk[t][0] = pack2<T>(p[0], p[1]);
        p_pk[t][1] = pack2<T>(p[2], p[3]);
        ds_pk[t][0] = pack2<T>(ds[0], ds[1]);
        ds_pk[t][1] = pack2<T>(ds[2], ds[3]);
      }

      const uint32_t sdO_t = smem_addr(sdO + buf * BR * D) + (uint32_t)(a_row * ROWB);
      const uint32_t sQ_t = smem_addr(sQ + buf * BR * D) + (uint32_t)(a_row * ROWB);
      packed_times_tile(dv, p_pk, sdO_t);   // dV_j += P^T dO_i
      packed_times_tile(dk, ds_pk, sQ_t);   // dK_j += dS^T Q_i

      if constexpr (ATOMIC_DQ) {
        // dS^T rows of this warp into shared memory: key row r, queries 8t + 2q, +1 -> chunk t, byte 4q.
        unsigned char* sdSb = reinterpret_cast<unsigned char*>(sdS);
#pragma unroll
        for (int t = 0; t < NTQ; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + g + 8 * h;
            *reinterpret_cast<uint32_t*>(sdSb + r * SROWB + ((t ^ (r & 7)) << 4) + 4 * q) = ds_pk[t][h];
          }
        __syncthreads();
        // dQ_i[slice rows, head-dim part] += dS K_j over the block's keys
        dq_add<T, D, BC, 1, DQT, false>(sdS, sK, dq_acc, nullptr, 16 * (warp % QS), (warp / QS) * DQT,
                                        (long long)bh * M + i0, M - i0, lane);
      }
      buf ^= 1;
    };
    for (int bh = bh_begin; bh < bh_end; ++bh)
      for (int it = it_begin; it < it_end; ++it) step(bh, it);
  }

  // ---- dK_j (times scale) and dV_j straight from registers; also zeros for keys no query sees ----
  const int bh_out = key_tile_head(CAUSAL, BH_kv, n_blocks);   // = bh_kv
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = n0 + warp * 16 + g + 8 * h;
    if (key < N) {
      const size_t off = ((size_t)bh_out * N + key) * D + 2 * q;
#pragma unroll
      for (int t = 0; t < DT; ++t) {
        store2<T>(dK + off + 8 * t, dk[t][2 * h] * scale, dk[t][2 * h + 1] * scale);
        store2<T>(dV + off + 8 * t, dv[t][2 * h], dv[t][2 * h + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------- 2'. dK, dV, dQ atomics: split layout --
//
// The same products as bwd_dkdv (atomic mode), with the work of each step split over the 8 warps the
// way FlashAttention-2's sm80 backward splits it, so that a warp reads fewer shared-memory bytes per mma:
//   S^T, dP^T (B_c = 128 keys x B_r = 64 queries): warp w owns keys 32*(w/2) .. +32 and queries
//     32*(w%2) .. +32 -- per k16 step 2 ldmatrix of K_j (or V_j) and 2 of Q_i (or dO_i) for 8 mma, where
//     bwd_dkdv's 16 keys x 64 queries need 1 + 4 for 8.
//   P^T and dS^T go to shared memory ([B_c][B_r], 128-byte rows, the dS^T swizzle of bwd_dkdv), because
//   the next step needs all 64 queries of a key row and a warp computed only 32 of them.
//   dV_j += P^T dO_i and dK_j += dS^T Q_i: warp w owns keys 32*(w/2) .. +32 (the same keys as above) and
//     head-dim columns (D/2)*(w%2) .. +D/2 -- per k16 step 2 ldmatrix of P^T (dS^T) and D/32
//     ldmatrix.trans of dO_i (Q_i) for D/4 mma, where bwd_dkdv reads D/16 for D/8 (its A operand comes
//     from registers, but every warp reads all of dO_i and Q_i for only 16 keys).
//   dQ_i += dS K_j: layout 1 keeps bwd_dkdv's step (4 query slices x 2 halves of the head dim); layout 2
//     splits it 2 x 4 (32 queries x D/4 per warp) and stores P^T, dS^T with stmatrix (sm_90).
// Accumulators per thread: S^T, dP^T B_r/2 floats each, dK_j and dV_j D/2 each.
// Every operand sum runs in the order bwd_dkdv uses (k16 steps in the same order, query tiles in the same
// order), so dK and dV come out bit-identical to it and to the deterministic mode. CAUSAL, lo and hi:
// as in bwd_dkdv.
template <typename T, int D, int BR, int LAYOUT, int STAGES, int DQ_SUM, bool CAUSAL>
__global__ void __launch_bounds__(256, 1)
    bwd_dkdv_split(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                   const T* __restrict__ dO, const float* __restrict__ lse2, const float* __restrict__ Dvec,
                   T* __restrict__ dK, T* __restrict__ dV, float* __restrict__ dq_acc, int BH_kv, int group,
                   int M, int N, int n_blocks, float scale_log2, float scale, int lo, int hi) {
  constexpr int WARPS = 8, THREADS = 32 * WARPS, BC = 128;
  constexpr bool BULK_DQ = DQ_SUM == kDqBulk;
  constexpr int CPR = D / 8, ROWB = CPR * 16, KSTEPS = D / 16, DT = D / 8;
  constexpr int SROWB = BR * 2;         // bytes per row of P^T and dS^T
  static_assert(BR == 64 || (BR == 128 && LAYOUT == 2), "B_r = 128 is built with layout 2 only");
  constexpr int KW = 32, QW = BR / 2;   // S^T step: keys x queries per warp
  constexpr int QT = QW / 8;            // n8 tiles over a warp's queries
  constexpr int DH = D / 2, DHT = DH / 8;   // dK/dV step: head-dim columns per warp, their n8 tiles
  constexpr int QS = BR / 16, DQT = DT / 2;  // dQ step, layout 1: query slices, n8 tiles per warp
  constexpr int QG = BR / 32, DQT2 = DT * QG / WARPS;   // dQ step, layout 2: 32-query groups (2 or 4), n8 tiles
  static_assert(QG == 2 || QG == 4, "warp >> (QG / 2) below is warp / QG");
  static_assert(BC == KW * (WARPS / 2) && BR == QW * 2 && (LAYOUT == 2 || QS * 2 == WARPS), "warp split of the tile");
  static_assert(STAGES >= 2, "Q_i, dO_i need at least a double buffer");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);   // [B_c][D]
  T* sV = sK + BC * D;                      // [B_c][D]
  T* sQ = sV + BC * D;                      // STAGES buffers of [B_r][D]
  T* sdO = sQ + STAGES * BR * D;            // STAGES buffers of [B_r][D]
  T* sP = sdO + STAGES * BR * D;            // [B_c][B_r] (P^T)
  T* sdS = sP + BC * BR;                    // [B_c][B_r] (dS^T)
  float* sdQ = reinterpret_cast<float*>(sdS + BC * BR);   // BULK_DQ: [B_r][D] fp32, dQ_i's image
  float* sL = sdQ + (BULK_DQ ? BR * D : 0);               // STAGES buffers of B_r lse2
  float* sDv = sL + STAGES * BR;                          // STAGES buffers of B_r D_i

  const KeyTile tile = key_tile<BC>(CAUSAL || V6B_SPLIT_HEADS_FIRST, BH_kv, n_blocks);
  const int bh_kv = tile.bh, n0 = tile.n0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int wk = warp >> 1, wq = warp & 1;   // wq: query half in the S^T step, head-dim half in dK/dV

  const T* Kh = K + (size_t)bh_kv * N * D;
  const T* Vh = V + (size_t)bh_kv * N * D;
  const QueryTiles range = query_tiles<BR, BC, CAUSAL>(n0, M, N, (M + BR - 1) / BR, lo, hi);
  const int it_begin = range.begin, it_end = range.end;
  // Grouped-query attention: the loop below walks the query tiles it_begin .. it_end - 1 of each query
  // head of the group (bh = b * H + h for h = h_kv * group .. h_kv * group + group - 1) in turn.
  const int bh_begin = bh_kv * group, bh_end = bh_begin + group;
  // the query tile k steps after tile it of head bh in that walk (bh_end and on: past the last)
  auto after = [&](int bh, int it, int k) {
    for (it += k; it >= it_end; it -= it_end - it_begin) ++bh;
    return QueryTile{bh, it};
  };

  float dv[2][DHT][4], dk[2][DHT][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int t = 0; t < DHT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) dv[mi][t][e] = dk[mi][t][e] = 0.f;

  if (it_begin < it_end) {   // block-uniform
    const int x = lane & 7;
    const int a_row = x + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;
    const int b_row = x + 8 * (lane >> 4), b_chunk = (lane >> 3) & 1;
    const uint32_t sK_a = smem_addr(sK) + (uint32_t)((KW * wk + a_row) * ROWB);
    const uint32_t sV_a = smem_addr(sV) + (uint32_t)((KW * wk + a_row) * ROWB);
    const uint32_t sP_a = smem_addr(sP) + (uint32_t)((KW * wk + a_row) * SROWB);
    const uint32_t sdS_a = smem_addr(sdS) + (uint32_t)((KW * wk + a_row) * SROWB);

    // query tile `it` of head bh into buffer b: the walk's tiles take the buffers in turn, and the first
    // STAGES - 1 are in flight before the loop, one commit group each (K_j, V_j with the first)
    auto load_query_tile = [&](QueryTile t, int b) {
      const size_t bh = t.bh;
      load_tile<BR, CPR, THREADS>(sQ + b * BR * D, Q + bh * M * D, t.it * BR, M, tid);
      load_tile<BR, CPR, THREADS>(sdO + b * BR * D, dO + bh * M * D, t.it * BR, M, tid);
      load_row_terms<BR>(sL + b * BR, sDv + b * BR, lse2 + bh * M, Dvec + bh * M, t.it * BR, M, tid);
    };
    // BULK_DQ: query tile it's dQ image (complete in sdQ) added into the accumulator by the copy engine;
    // one thread issues it
    auto reduce_dq_tile = [&](int bh, int it) {
      const int rows = min(BR, M - it * BR);
      bulk_reduce_add_f32(dq_acc + ((size_t)bh * M + it * BR) * D, smem_addr(sdQ), (uint32_t)(rows * D * 4));
    };
    load_tile<BC, CPR, THREADS>(sK, Kh, n0, N, tid);
    load_tile<BC, CPR, THREADS>(sV, Vh, n0, N, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      const QueryTile t = after(bh_begin, it_begin, st);
      if (t.bh < bh_end) load_query_tile(t, st);
      cp_async_commit();
    }

    // k16 step ks of the [32 keys x QW queries] product acc = A B^T: A = 32 rows at a_base (K_j or V_j),
    // B = QW rows at b_base (Q_i or dO_i).
    auto keys_times_rows_step = [&](float (&acc)[2][QT][4], uint32_t a_base, uint32_t b_base, int ks) {
      uint32_t a[2][4], b[QT / 2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(a[mi], a_base + mi * 16 * ROWB + (((2 * ks + a_chunk) ^ x) << 4));
#pragma unroll
      for (int np = 0; np < QT / 2; ++np)
        ldmatrix_x4(b[np], b_base + np * 16 * ROWB + (((2 * ks + b_chunk) ^ x) << 4));
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int np = 0; np < QT / 2; ++np) {
          mma<T>(acc[mi][2 * np], a[mi], b[np][0], b[np][1]);
          mma<T>(acc[mi][2 * np + 1], a[mi], b[np][2], b[np][3]);
        }
    };
    // acc[32 keys x D/2] += A [32 keys x B_r] (P^T or dS^T at a_base) * tile [B_r x D] (this warp's half
    // of the head dim, row-major at base, read with .trans)
    // (its k16 step kk: queries 16 kk .. +16)
    auto keys_times_tile_step = [&](float (&acc)[2][DHT][4], uint32_t a_base, uint32_t base, int kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(a[mi], a_base + mi * 16 * SROWB + (((2 * kk + a_chunk) ^ x) << 4));
#pragma unroll
      for (int dp = 0; dp < DHT / 2; ++dp) {
        const int chunk = wq * DHT + 2 * dp + a_chunk;
        uint32_t b[4];
        ldmatrix_x4_trans(b, base + kk * 16 * ROWB + ((chunk ^ x) << 4));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma<T>(acc[mi][2 * dp], a[mi], b[0], b[1]);
          mma<T>(acc[mi][2 * dp + 1], a[mi], b[2], b[3]);
        }
      }
    };

    int buf = 0;
    auto step = [&](const int bh, const int it) {
      // tile it has landed (of the STAGES - 1 groups in flight, all but the newest STAGES - 2 are done),
      // and every warp is done with the step before: its Q/dO buffer, which the load below refills with
      // the tile STAGES - 1 steps on, and the P^T / dS^T (and dQ) tiles its dK/dV and dQ steps read
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      const QueryTile ahead = after(bh, it, STAGES - 1);
      if (ahead.bh < bh_end) load_query_tile(ahead, buf == 0 ? STAGES - 1 : buf - 1);
      cp_async_commit();
      // BULK_DQ: dQ_{i-1}'s image is complete (the step before: tile it - 1, or the previous head's last)
      if (BULK_DQ && tid == 0 && it > it_begin) reduce_dq_tile(bh, it - 1);
      if (BULK_DQ && tid == 0 && it == it_begin && bh > bh_begin) reduce_dq_tile(bh - 1, it_end - 1);

      const int i0 = it * BR;
      const uint32_t sQ_b = smem_addr(sQ + buf * BR * D) + (uint32_t)((QW * wq + b_row) * ROWB);
      const uint32_t sdO_b = smem_addr(sdO + buf * BR * D) + (uint32_t)((QW * wq + b_row) * ROWB);
      const float* L = sL + buf * BR + QW * wq;
      const float* Dv = sDv + buf * BR + QW * wq;

      float s[2][QT][4], dp[2][QT][4];   // S^T = K_j Q_i^T, dP^T = V_j dO_i^T
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int t = 0; t < QT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][t][e] = dp[mi][t][e] = 0.f;
      if constexpr ((V6B_SPLIT_FUSE & 1) != 0) {   // both products in one k loop: two independent mma chains
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
          keys_times_rows_step(s, sK_a, sQ_b, ks);
          keys_times_rows_step(dp, sV_a, sdO_b, ks);
        }
      } else {
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) keys_times_rows_step(s, sK_a, sQ_b, ks);
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) keys_times_rows_step(dp, sV_a, sdO_b, ks);
      }

      // ---- P^T and dS^T, masked where needed, packed, to shared memory ([key][query], 2 B_r-byte rows,
      //      16-byte chunk c of row r at chunk c ^ (r % 8)) ----
      const bool tail = n0 + BC > N;
      const bool diag = CAUSAL && ((n0 + BC - 1) - i0 > hi || n0 - (min(i0 + BR, M) - 1) < lo);
      unsigned char* sPb = reinterpret_cast<unsigned char*>(sP);
      unsigned char* sdSb = reinterpret_cast<unsigned char*>(sdS);
      uint32_t p_pk[2][QT][2], ds_pk[2][QT][2];   // [m16 tile][n8 tile][key row g, g + 8]
#pragma unroll
      for (int t = 0; t < QT; ++t) {
        const float2 l2 = *reinterpret_cast<const float2*>(L + 8 * t + 2 * q);
        const float2 d2 = *reinterpret_cast<const float2*>(Dv + 8 * t + 2 * q);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          float p[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float lse_e = (e & 1) ? l2.y : l2.x, d_e = (e & 1) ? d2.y : d2.x;
            p[e] = ex2(fmaf(s[mi][t][e], scale_log2, -lse_e));
            if (tail || diag) {
              const int key = n0 + KW * wk + 16 * mi + g + 8 * (e >> 1);
              const int row = i0 + QW * wq + 8 * t + 2 * q + (e & 1);
              if (key >= N || (CAUSAL && outside_band(key, row, lo, hi))) p[e] = 0.f;
            }
            ds[e] = p[e] * (dp[mi][t][e] - d_e);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            p_pk[mi][t][h] = pack2<T>(p[2 * h], p[2 * h + 1]);
            ds_pk[mi][t][h] = pack2<T>(ds[2 * h], ds[2 * h + 1]);
          }
        }
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      constexpr bool kStmatrix = LAYOUT == 2;
#else
      constexpr bool kStmatrix = false;
#endif
      if constexpr (kStmatrix) {
        // one stmatrix.x4 per 16 keys x 16 queries: matrix i = lane / 8 is key rows 8 * (i % 2) + 0..7,
        // queries 8 * (2 * tp + i / 2) + 0..7; lane l addresses row l % 8 of it
        const int i = lane >> 3, j = lane & 7;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int tp = 0; tp < QT / 2; ++tp) {
            const int r = KW * wk + 16 * mi + 8 * (i & 1) + j, chunk = QT * wq + 2 * tp + (i >> 1);
            const uint32_t off = (uint32_t)(r * SROWB + ((chunk ^ j) << 4));
            stmatrix_x4(smem_addr(sPb) + off, p_pk[mi][2 * tp][0], p_pk[mi][2 * tp][1], p_pk[mi][2 * tp + 1][0],
                        p_pk[mi][2 * tp + 1][1]);
            stmatrix_x4(smem_addr(sdSb) + off, ds_pk[mi][2 * tp][0], ds_pk[mi][2 * tp][1],
                        ds_pk[mi][2 * tp + 1][0], ds_pk[mi][2 * tp + 1][1]);
          }
      } else {
        // 4-byte stores: key row r, queries c, c + 1 at chunk (c / 8) ^ (r % 8), byte 2 * (c % 8)
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int t = 0; t < QT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = KW * wk + 16 * mi + g + 8 * h, chunk = QT * wq + t;
              const int off = r * SROWB + ((chunk ^ (r & 7)) << 4) + 4 * q;
              *reinterpret_cast<uint32_t*>(sPb + off) = p_pk[mi][t][h];
              *reinterpret_cast<uint32_t*>(sdSb + off) = ds_pk[mi][t][h];
            }
      }
      // BULK_DQ: the copy engine has read dQ_{i-1}'s image before anyone writes dQ_i's over it
      if (BULK_DQ && tid == 0) bulk_wait_read();
      __syncthreads();

      const uint32_t sdO_t = smem_addr(sdO + buf * BR * D) + (uint32_t)(a_row * ROWB);
      const uint32_t sQ_t = smem_addr(sQ + buf * BR * D) + (uint32_t)(a_row * ROWB);
      // dV_j += P^T dO_i, dK_j += dS^T Q_i
      if constexpr ((V6B_SPLIT_FUSE & 2) != 0) {
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) {
          keys_times_tile_step(dv, sP_a, sdO_t, kk);
          keys_times_tile_step(dk, sdS_a, sQ_t, kk);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) keys_times_tile_step(dv, sP_a, sdO_t, kk);
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) keys_times_tile_step(dk, sdS_a, sQ_t, kk);
      }

      // dQ_i += dS K_j. Layout 1: bwd_dkdv's split, warp w: queries 16 * (w % 4) .. +16, head-dim columns
      // (D/2) * (w/4) .. +D/2 -- per k16 step 1 + D/32 ldmatrix for D/16 mma. Layout 2: queries
      // 32 * (w % QG) .. +32, columns (D/4) * (w/2) .. +D/4 with B_r = 64 (2 + D/64 ldmatrix for D/8 mma)
      // or (D/2) * (w/4) .. +D/2 with B_r = 128 (2 + D/32 ldmatrix for D/4 mma).
      const long long row0 = (long long)bh * M + i0;
      if constexpr (DQ_SUM == kDqNone) {
        // the deterministic mode: bwd_dq sums dQ
      } else if constexpr (LAYOUT == 2)
        dq_add<T, D, BC, 2, DQT2, BULK_DQ, BR>(sdS, sK, dq_acc, sdQ, 32 * (warp & (QG - 1)), (warp >> (QG / 2)) * DQT2,
                                               row0, M - i0, lane);
      else
        dq_add<T, D, BC, 1, DQT, BULK_DQ>(sdS, sK, dq_acc, sdQ, 16 * (warp % QS), (warp / QS) * DQT, row0, M - i0,
                                          lane);
      if constexpr (BULK_DQ) fence_proxy_async_smem();   // the stores above, before the async proxy reads them
      buf = buf + 1 == STAGES ? 0 : buf + 1;
    };
    for (int bh = bh_begin; bh < bh_end; ++bh)
      for (int it = it_begin; it < it_end; ++it) step(bh, it);
    if constexpr (BULK_DQ) {   // the last tile's dQ, and nothing may be in flight when the block exits
      __syncthreads();
      if (tid == 0) {
        reduce_dq_tile(bh_end - 1, it_end - 1);
        bulk_wait_all();
      }
    }
  }

  const int bh_out = key_tile_head(CAUSAL || V6B_SPLIT_HEADS_FIRST, BH_kv, n_blocks);   // = bh_kv
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = n0 + KW * wk + 16 * mi + g + 8 * h;
      if (key < N) {
        const size_t off = ((size_t)bh_out * N + key) * D + DH * wq + 2 * q;
#pragma unroll
        for (int t = 0; t < DHT; ++t) {
          store2<T>(dK + off + 8 * t, dk[mi][t][2 * h] * scale, dk[mi][t][2 * h + 1] * scale);
          store2<T>(dV + off + 8 * t, dv[mi][t][2 * h], dv[mi][t][2 * h + 1]);
        }
      }
    }
}

// ---------------------------------------------------------------- 3a. dQ = scale * accumulator --------
template <typename T, int D, bool SWIZZLED>
__global__ void __launch_bounds__(kThreads)
    bwd_convert(const float* __restrict__ acc, T* __restrict__ dQ, long long n4, float scale) {
  const long long i = (long long)blockIdx.x * kThreads + threadIdx.x;   // one float4 of dQ each
  if (i >= n4) return;
  // SWIZZLED: columns 4c .. 4c + 3 are pairs 2c, 2c + 1, stored (acc_pair) as pairs 2c ^ s, (2c + 1) ^ s
  // with s a multiple of 4, so still one aligned float4
  const long long row = i / (D / 4);
  const int c = (int)(i % (D / 4));
  const float4 a = reinterpret_cast<const float4*>(acc)[SWIZZLED ? row * (D / 4) + (acc_pair(row, 2 * c) >> 1) : i];
  uint2 out;
  out.x = pack2<T>(a.x * scale, a.y * scale);
  out.y = pack2<T>(a.z * scale, a.w * scale);
  reinterpret_cast<uint2*>(dQ)[i] = out;
}

// ---------------------------------------------------------------- 3b. deterministic dQ ----------------
//
// One block per query tile of one (batch, head); warp w owns query rows [16w, 16w + 16) of the tile.
// Accumulator element e of n8 tile t: row 16w + g + 8*(e/2), column 8t + 2q + e%2 (a key for S and dP, a
// head-dim column for dQ). CAUSAL, lo and hi: as in bwd_dkdv.
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kThreads, 2)
    bwd_dq(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
           const T* __restrict__ dO, const float* __restrict__ lse2, const float* __restrict__ Dvec,
           T* __restrict__ dQ, int BH, int group, int M, int N, int m_blocks, float scale_log2, float scale,
           int lo, int hi) {
  constexpr int BR = kBr, BC = 64;
  constexpr int CPR = D / 8, ROWB = CPR * 16, KSTEPS = D / 16, NT = BC / 8, DT = D / 8;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);   // [B_r][D]
  T* sdO = sQ + BR * D;                     // [B_r][D]
  T* sK = sdO + BR * D;                     // 2 buffers of [B_c][D]
  T* sV = sK + 2 * BC * D;                  // 2 buffers of [B_c][D]

  int m_block, bh;
  if (CAUSAL) {   // longest query tiles first
    bh = blockIdx.x % BH;
    m_block = m_blocks - 1 - (int)(blockIdx.x / BH);
  } else {
    m_block = blockIdx.x % m_blocks;
    bh = blockIdx.x / m_blocks;
  }
  const int m0 = m_block * BR;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;

  const int bh_kv = bh / group;   // the kv head query head bh reads (grouped-query attention)
  const T* Qh = Q + (size_t)bh * M * D;
  const T* Kh = K + (size_t)bh_kv * N * D;
  const T* Vh = V + (size_t)bh_kv * N * D;
  const T* dOh = dO + (size_t)bh * M * D;

  // Key tiles [jt_begin, jt_end), as the forward bounds them: the tile's first row sees the lowest keys,
  // its last row the highest.
  const int m_last = min(M, m0 + BR) - 1;
  int jt_begin = 0, jt_end = (N + BC - 1) / BC;
  if (CAUSAL) {
    const long long first_key = (long long)m0 + lo, last_key = (long long)m_last + hi;
    jt_begin = first_key <= 0 ? 0 : (int)(first_key / BC);
    jt_end = last_key < 0 ? 0 : (int)((min((long long)N, last_key + 1) + BC - 1) / BC);
  }

  // this lane's two rows: lse2 and D_i (rows past M: 0, harmless, never written)
  float L[2], Dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + warp * 16 + g + 8 * h;
    L[h] = row < M ? lse2[(size_t)bh * M + row] : 0.f;
    Dr[h] = row < M ? Dvec[(size_t)bh * M + row] : 0.f;
  }

  float dq[DT][4];
#pragma unroll
  for (int t = 0; t < DT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[t][e] = 0.f;

  if (jt_begin < jt_end) {
    const int x = lane & 7;
    const int a_row = x + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;
    const int b_row = x + 8 * (lane >> 4), b_chunk = (lane >> 3) & 1;
    const uint32_t sQ_a = smem_addr(sQ) + (uint32_t)((warp * 16 + a_row) * ROWB);
    const uint32_t sdO_a = smem_addr(sdO) + (uint32_t)((warp * 16 + a_row) * ROWB);

    load_tile<BR, CPR>(sQ, Qh, m0, M, tid);
    load_tile<BR, CPR>(sdO, dOh, m0, M, tid);
    load_tile<BC, CPR>(sK, Kh, jt_begin * BC, N, tid);
    load_tile<BC, CPR>(sV, Vh, jt_begin * BC, N, tid);
    cp_async_commit();

    auto rows_times_tile = [&](float (&acc)[NT][4], uint32_t a_base, uint32_t b_base) {
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, a_base + (((2 * ks + a_chunk) ^ x) << 4));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, b_base + np * 16 * ROWB + (((2 * ks + b_chunk) ^ x) << 4));
          mma<T>(acc[2 * np], a, b[0], b[1]);
          mma<T>(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    };

    int buf = 0;
    for (int jt = jt_begin; jt < jt_end; ++jt) {
      cp_async_wait<0>();
      __syncthreads();
      if (jt + 1 < jt_end) {
        load_tile<BC, CPR>(sK + (buf ^ 1) * BC * D, Kh, (jt + 1) * BC, N, tid);
        load_tile<BC, CPR>(sV + (buf ^ 1) * BC * D, Vh, (jt + 1) * BC, N, tid);
      }
      cp_async_commit();

      const int j0 = jt * BC;
      const uint32_t sK_b = smem_addr(sK + buf * BC * D) + (uint32_t)(b_row * ROWB);
      const uint32_t sV_b = smem_addr(sV + buf * BC * D) + (uint32_t)(b_row * ROWB);
      float s[NT][4], dp[NT][4];
      rows_times_tile(s, sQ_a, sK_b);     // S = Q_i K_j^T
      rows_times_tile(dp, sdO_a, sV_b);   // dP = dO_i V_j^T

      const bool tail = j0 + BC > N;
      const bool diag = CAUSAL && ((j0 + BC - 1) - m0 > hi || j0 - m_last < lo);
      uint32_t ds_pk[NT][2];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          float p = ex2(fmaf(s[t][e], scale_log2, -L[h]));
          if (tail || diag) {
            const int row = m0 + warp * 16 + g + 8 * h;
            const int col = j0 + 8 * t + 2 * q + (e & 1);
            if (col >= N || (CAUSAL && outside_band(col, row, lo, hi))) p = 0.f;
          }
          ds[e] = p * (dp[t][e] - Dr[h]);
        }
        ds_pk[t][0] = pack2<T>(ds[0], ds[1]);
        ds_pk[t][1] = pack2<T>(ds[2], ds[3]);
      }

      // dQ_i += dS K_j: A = dS from the accumulator registers, B = K_j [keys][D] through ldmatrix.trans
      const uint32_t sK_t = smem_addr(sK + buf * BC * D) + (uint32_t)(a_row * ROWB);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        const uint32_t a[4] = {ds_pk[2 * kk][0], ds_pk[2 * kk][1], ds_pk[2 * kk + 1][0], ds_pk[2 * kk + 1][1]};
#pragma unroll
        for (int dp2 = 0; dp2 < D / 16; ++dp2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, sK_t + kk * 16 * ROWB + (((2 * dp2 + a_chunk) ^ x) << 4));
          mma<T>(dq[2 * dp2], a, b[0], b[1]);
          mma<T>(dq[2 * dp2 + 1], a, b[2], b[3]);
        }
      }
      buf ^= 1;
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + warp * 16 + g + 8 * h;
    if (row < M) {
      T* dst = dQ + ((size_t)bh * M + row) * D + 2 * q;
#pragma unroll
      for (int t = 0; t < DT; ++t) store2<T>(dst + 8 * t, dq[t][2 * h] * scale, dq[t][2 * h + 1] * scale);
    }
  }
}

// ---------------------------------------------------------------- launcher ----------------------------

template <typename K>
const char* set_smem(K kernel, size_t smem) {
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if ((size_t)optin < smem) return "v6 backward: this GPU has too little shared memory per block for this tile";
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

struct Args {
  const void *q, *k, *v, *o, *lse, *dout;
  void *dq, *dk, *dv;
  float *dvec, *lse2, *dq_acc;   // dq_acc: nullptr in deterministic mode
  int B, H, H_kv, M, N;   // q: H heads, k and v: H_kv
  float scale;
  int lo, hi;   // the window as the kernels take it (see bwd_dkdv)
  bool sm90;   // compute capability 9.0 or newer: the bulk reduction of V6B_DQ_BULK, and B_r = SM90_BR
  cudaStream_t stream;
};

template <typename T, int D, int WARPS, bool CAUSAL, bool ATOMIC_DQ>
const char* launch_dkdv(const Args& a, float scale_log2, float scale) {
  constexpr int BC = 16 * WARPS;
  const long long BH_kv = (long long)a.B * a.H_kv;   // one block per key tile of each kv head
  const int n_blocks = (a.N + BC - 1) / BC;
  if ((long long)n_blocks * BH_kv > 0x7fffffffLL) return "v6 backward: B * H_kv * ceil(N / B_c) must be below 2^31";
  constexpr size_t smem = (size_t)(2 * BC + 4 * kBr) * D * sizeof(T) + BC * kBr * sizeof(T) +
                          4 * kBr * sizeof(float);
  auto kernel = bwd_dkdv<T, D, WARPS, CAUSAL, ATOMIC_DQ>;
  if (const char* err = set_smem(kernel, smem)) return err;
  kernel<<<(unsigned)(n_blocks * BH_kv), 32 * WARPS, smem, a.stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      static_cast<const T*>(a.dout), a.lse2, a.dvec, static_cast<T*>(a.dk), static_cast<T*>(a.dv), a.dq_acc,
      (int)BH_kv, a.H / a.H_kv, a.M, a.N, n_blocks, scale_log2, scale, a.lo, a.hi);
  return nullptr;
}

template <typename T, int D, int BR, int LAYOUT, int STAGES, int DQ_SUM, bool CAUSAL>
const char* launch_dkdv_split(const Args& a, float scale_log2, float scale) {
  constexpr int BC = 128;
  const long long BH_kv = (long long)a.B * a.H_kv;   // one block per key tile of each kv head
  const int n_blocks = (a.N + BC - 1) / BC;
  if ((long long)n_blocks * BH_kv > 0x7fffffffLL) return "v6 backward: B * H_kv * ceil(N / B_c) must be below 2^31";
  constexpr size_t smem = (size_t)(2 * BC + 2 * STAGES * BR) * D * sizeof(T) + 2 * BC * BR * sizeof(T) +
                          (DQ_SUM == kDqBulk ? BR * D * sizeof(float) : 0) + 2 * STAGES * BR * sizeof(float);
  auto kernel = bwd_dkdv_split<T, D, BR, LAYOUT, STAGES, DQ_SUM, CAUSAL>;
  if (const char* err = set_smem(kernel, smem)) return err;
  kernel<<<(unsigned)(n_blocks * BH_kv), 256, smem, a.stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      static_cast<const T*>(a.dout), a.lse2, a.dvec, static_cast<T*>(a.dk), static_cast<T*>(a.dv), a.dq_acc,
      (int)BH_kv, a.H / a.H_kv, a.M, a.N, n_blocks, scale_log2, scale, a.lo, a.hi);
  return nullptr;
}

template <typename T, int D, int WARPS, int DET_WARPS, int LAYOUT, int SM90_BR, bool CAUSAL>
const char* run(const Args& a) {
  const long long BH = (long long)a.B * a.H, rows = BH * a.M;
  const float scale = a.scale, scale_log2 = 1.4426950408889634f * scale;
  const bool atomic = a.dq_acc != nullptr;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* dout = static_cast<const T*>(a.dout);

  constexpr int rows_per_block = kThreads / (D / 8);
  const long long prep_blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (prep_blocks > 0x7fffffffLL) return "v6 backward: B * H * M is too large";
  bwd_prep<T, D><<<(unsigned)prep_blocks, kThreads, 0, a.stream>>>(
      static_cast<const T*>(a.o), dout, static_cast<const float*>(a.lse), a.dvec, a.lse2, a.dq_acc, rows);

  // the bulk reduction (layout 2 on sm_90) stages dQ in the swizzled accumulator layout. Only sm_90 takes
  // B_r = SM90_BR (with layout 2: the bulk path, and the deterministic mode's split kernel), so that other
  // GPUs keep the tile that fits their shared memory.
  constexpr bool kBulk = LAYOUT == 2 && V6B_DQ_BULK != 0;
  constexpr int kBulkBr = kBulk ? SM90_BR : kBr, kDetBr = LAYOUT == 2 ? SM90_BR : kBr;
  constexpr int kStages = V6B_SPLIT_STAGES, kBulkSum = kBulk ? kDqBulk : kDqRed;
  const bool bulk = kBulk && a.sm90;
  const char* err_dkdv;
  if (!atomic) {
    if constexpr (LAYOUT != 0 && V6B_DET_SPLIT != 0)
      err_dkdv = a.sm90 ? launch_dkdv_split<T, D, kDetBr, LAYOUT, kStages, kDqNone, CAUSAL>(a, scale_log2, scale)
                        : launch_dkdv_split<T, D, kBr, LAYOUT, kStages, kDqNone, CAUSAL>(a, scale_log2, scale);
    else
      err_dkdv = launch_dkdv<T, D, DET_WARPS, CAUSAL, false>(a, scale_log2, scale);
  } else if constexpr (LAYOUT != 0) {
    err_dkdv = bulk ? launch_dkdv_split<T, D, kBulkBr, LAYOUT, kStages, kBulkSum, CAUSAL>(a, scale_log2, scale)
                    : launch_dkdv_split<T, D, kBr, LAYOUT, kStages, kDqRed, CAUSAL>(a, scale_log2, scale);
  } else {
    err_dkdv = launch_dkdv<T, D, WARPS, CAUSAL, true>(a, scale_log2, scale);
  }
  if (err_dkdv != nullptr) return err_dkdv;

  if (atomic) {
    const long long n4 = rows * D / 4;
    const unsigned blocks = (unsigned)((n4 + kThreads - 1) / kThreads);
    if (bulk)
      bwd_convert<T, D, true><<<blocks, kThreads, 0, a.stream>>>(a.dq_acc, static_cast<T*>(a.dq), n4, scale);
    else
      bwd_convert<T, D, false><<<blocks, kThreads, 0, a.stream>>>(a.dq_acc, static_cast<T*>(a.dq), n4, scale);
  } else {
    const int m_blocks = (a.M + kBr - 1) / kBr;
    if ((long long)m_blocks * BH > 0x7fffffffLL) return "v6 backward: B * H * ceil(M / 64) must be below 2^31";
    constexpr size_t smem_dq = (size_t)(2 * kBr + 4 * 64) * D * sizeof(T);
    auto dq = bwd_dq<T, D, CAUSAL>;
    if (const char* err = set_smem(dq, smem_dq)) return err;
    dq<<<(unsigned)(m_blocks * BH), kThreads, smem_dq, a.stream>>>(q, k, v, dout, a.lse2, a.dvec,
                                                                     static_cast<T*>(a.dq), (int)BH,
                                                                     a.H / a.H_kv, a.M, a.N, m_blocks,
                                                                     scale_log2, scale, a.lo, a.hi);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// banded: causal or a window that bounds some row (the CAUSAL instances).
template <typename T>
const char* dispatch(const Args& a, int D, bool banded) {
  if (D == 64)
    return banded ? run<T, 64, V6B_D64_WARPS, V6B_D64_DET_WARPS, V6B_D64_LAYOUT, V6B_D64_BR, true>(a)
                  : run<T, 64, V6B_D64_WARPS, V6B_D64_DET_WARPS, V6B_D64_LAYOUT, V6B_D64_BR, false>(a);
  if (D == 128)
    return banded ? run<T, 128, V6B_D128_WARPS, V6B_D128_DET_WARPS, V6B_D128_LAYOUT, kBr, true>(a)
                  : run<T, 128, V6B_D128_WARPS, V6B_D128_DET_WARPS, V6B_D128_LAYOUT, kBr, false>(a);
  return "v6 backward supports head_dim 64 and 128 only";
}

}  // namespace v6b

// dtype: 0 = bfloat16, 1 = float16. dvec, lse2: float [B*H*M] scratch; dq_acc: float [B*H*M*D] scratch
// (atomic mode) or nullptr (deterministic mode). k, v, dk and dv have H_kv heads, H a multiple of H_kv.
// window_left, window_right: the sliding window (-1: unbounded). Returns nullptr or a message.
const char* v6_backward(const void* q, const void* k, const void* v, const void* o, const void* lse,
                        const void* dout, void* dq, void* dk, void* dv, float* dvec, float* lse2, float* dq_acc,
                        int dtype, int B, int H, int H_kv, int M, int N, int D, bool causal, float scale,
                        int64_t window_left, int64_t window_right, cudaStream_t stream) {
  if (B < 1 || H < 1 || M < 1 || N < 1) return "v6 backward: B, H, M and N must all be >= 1";
  if (H_kv < 1 || H % H_kv != 0) return "v6 backward: q's heads must be a multiple of k's heads";
  if (!(scale > 0.f) || !std::isfinite(scale)) return "v6 backward: scale must be a finite number > 0";
  int dev = 0, major = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major < 8) return "v6 backward needs a GPU of compute capability 8.0 or newer (mma.sync, ldmatrix, cp.async)";
  // The window as the kernels take it, the band lo <= j - i <= hi (see bwd_dkdv), exactly as the forward
  // has it: causal sets right = 0; -1, or a side that reaches past every key (left >= N) or every row
  // (right >= M), is clamped to N or M, where it bounds nothing. A window that bounds no row runs the
  // unmasked instances.
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > N ? N : (int)window_left;
  const int right = window_right < 0 || window_right > M ? M : (int)window_right;
  const bool banded = left < N || right < M;
  const v6b::Args a{q, k, v, o, lse, dout, dq, dk, dv, dvec, lse2, dq_acc, B, H, H_kv, M, N, scale,
                    N - M - left, N - M + right, major >= 9, stream};
  switch (dtype) {
    case 0: return v6b::dispatch<__nv_bfloat16>(a, D, banded);
    case 1: return v6b::dispatch<__half>(a, D, banded);
    default: return "v6 backward: dtype must be bfloat16 or float16";
  }
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>     // torch::wrap_pybind_function, used by load_inline's module code
#include <torch/csrc/utils/pybind.h>   // at::Tensor <-> torch.Tensor for pybind11
#include <cmath>
#include <optional>

const char* v6_backward(const void* q, const void* k, const void* v, const void* o, const void* lse,
                        const void* dout, void* dq, void* dk, void* dv, float* dvec, float* lse2, float* dq_acc,
                        int dtype, int B, int H, int H_kv, int M, int N, int D, bool causal, float scale,
                        int64_t window_left, int64_t window_right, cudaStream_t stream);

// q, o, dout: [B, H, M, D]; k, v: [B, H_kv, N, D] with H a multiple of H_kv; all bfloat16 or all float16,
// contiguous, one CUDA device; lse: float32 [B, H, M] from forward_lse with the same q, k, v, causal,
// scale (None: 1/sqrt(D)) and window (a side -1: no bound). Returns (dq, dk, dv), dk and dv like k and v.
// deterministic=false: dQ summed with fp32 atomics (fastest); true: a separate dQ kernel, bit-identical
// from run to run. Messages carry no numbers (see v6.cu).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                                                        at::Tensor lse, at::Tensor dout, bool causal,
                                                        bool deterministic, std::optional<double> scale,
                                                        int64_t window_left, int64_t window_right) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "q must be bfloat16 or float16");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o},
                         {"dout", &dout}, {"lse", &lse}}) {
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == (t == &lse ? at::kFloat : dtype), name,
                t == &lse ? " must be float32" : " must have the same dtype as q");
    TORCH_CHECK(t->dim() == (t == &lse ? 3 : 4), name, t == &lse ? " must have rank 3 [B, H, M]"
                                                                 : " must have rank 4 [B, H, L, D]");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->numel() > 0, name, " has an empty dimension");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, name, " must be 16-byte aligned");
    for (int d = 0; d < t->dim(); ++d)
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 128, "q: v6 backward supports head_dim 64 and 128 only");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k must match q in batch and head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H_kv, N, D]");
  TORCH_CHECK(o.sizes() == q.sizes() && dout.sizes() == q.sizes(), "o and dout must have the shape of q");
  TORCH_CHECK(lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "lse must have shape [B, H, M]");
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(3)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const int B = q.size(0), H = q.size(1), H_kv = k.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const auto f32 = q.options().dtype(at::kFloat);
  auto dvec = at::empty({B, H, M}, f32), lse2 = at::empty({B, H, M}, f32);
  at::Tensor dq_acc;
  if (!deterministic) dq_acc = at::empty({B, H, M, D}, f32);
  const char* err = v6_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                dvec.data_ptr<float>(), lse2.data_ptr<float>(),
                                deterministic ? nullptr : dq_acc.data_ptr<float>(), dtype == at::kBFloat16 ? 0 : 1,
                                B, H, H_kv, M, N, D, causal, s, window_left, window_right,
                                c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {dq, dk, dv};
}
#endif
