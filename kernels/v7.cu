// v7: the FlashAttention forward on Hopper's own instructions -- wgmma for both products, TMA for the
// tiles, mbarriers for their completion. bf16/fp16, fp32 accumulation, causal masking, head dims 64
// and 128. Needs an sm_90a build (-gencode=arch=compute_90a,code=sm_90a) and a GPU of compute
// capability 9.0 (H100, H200).
//
// What changed from v6 (same algorithm, FlashAttention-2's loop order and online softmax):
//   * the matrix products run on wgmma.mma_async instead of mma.sync. A warpgroup (4 consecutive warps,
//     the first one's index a multiple of 4) issues one m64nNk16 product over 64 query rows; a block has
//     one or more consumer warpgroups, each owning 64 rows of Q_i. S_ij = Q_i K_j^T reads both operands
//     straight from shared memory through matrix descriptors, so nothing is ldmatrix'ed into registers.
//     O_i += P_ij V_j takes P_ij from registers as the A operand (the accumulator of S_ij repeats the
//     m16n8 accumulator layout per 8 columns, which is the A layout of a k16 slice: v6's trick carries
//     over unchanged) and V_j from shared memory read "MN-major" (V is [keys, D] row-major, and the
//     descriptor's transpose bit makes the tensor core read it as B = V with D contiguous);
//   * K_j, V_j and Q_i arrive by the tensor memory accelerator (cp.async.bulk.tensor.3d) from
//     CUtensorMaps made on the host (cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion, so
//     no -lcuda), passed as __grid_constant__ parameters. The map is 3-D, [B*H][L][D], so a tail tile
//     of one head is zero-filled by TMA rather than read from the next head. TMA writes each tile in the
//     128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8) inside every 8-row x 128-byte
//     atom): v6's swizzle, now done by the copy engine, and the layout wgmma's descriptors read;
//   * one thread issues all copies; each stage has a "full" mbarrier for K_j, one for V_j (the copy
//     engine completes them by byte count) and an "empty" mbarrier on which every consumer warp arrives
//     once it is done with the stage. K_j is waited for before S_ij, V_j only before P_ij V_j. No warp
//     specialization yet (that is v8): the copying thread is also a consumer, and it refills the stage
//     of tile j - 1 while its warpgroup's S_ij product runs.
//
// Contract. q [B, H, M, D], k and v [B, H_kv, N, D] with H a multiple of H_kv, contiguous, one CUDA
//   device, 16-byte aligned. Grouped-query attention: query head h reads kv head h / (H / H_kv), and
//   H_kv = 1 is multi-query attention; with the flat index bh = b * H + h that is kv head bh / group,
//   which is also the head coordinate of K's and V's tensor maps ([B * H_kv][N][D]).
//   scale > 0: the softmax scale, o = softmax(scale * q k^T) v (flashattn passes 1/sqrt(D) for
//   scale=None); the launcher folds log2(e) into it once (scale_log2).
//   dtype bf16 or fp16: fp32 accumulation, P rounded to the input dtype for the second product, output
//     in the input dtype. D in {64, 128}; any M, N >= 1 (M != N allowed); B * H * ceil(M / B_r) < 2^31.
//   causal=True is bottom-right aligned: query row i may attend key j iff j <= i + (N - M). Rows with no
//     key at all (the first M - N rows when M > N) are 0, not NaN.
//   window (window_left, window_right), FlashAttention-2's window_size, aligned the same way: row i may
//     attend key j iff i + (N - M) - window_left <= j <= i + (N - M) + window_right, -1 leaving that side
//     unbounded; causal=True is the window (-1, 0) and sets window_right to 0. As with causal, only the
//     key tiles some row of the block sees are loaded, and only tiles crossing an edge are masked.
//   Needs compute capability 9.0 exactly (sm_90a instructions); the launcher refuses anything else.
//   Training: forward_lse(q, k, v, causal, scale, window_left, window_right) returns (o, lse), lse float32
//     [B, H, M] = m_i * scale + ln(l_i) (-inf for a row that sees no key), what kernels/v6_backward.cu
//     needs; o is bit-identical to forward's. Its kernels are compiled only with -DFLASHATTN_LSE=1
//     (flashattn.autograd.forward_module), so the forward-only build and its machine code are as they were.
//
// Tiles (per template instance; override with -D at build time, see the V7_* macros below):
//   D=64 : 2 warpgroups (B_r = 128, 256 threads), B_c = 128, 2 stages. smem 16 KB Q_i + 2 x (16 KB K_j +
//          16 KB V_j) = 80 KB (+1 KB to align the base to 1024 bytes): 2 blocks per SM.
//   D=128: 3 warpgroups (B_r = 192, 384 threads), B_c = 128, 2 stages. smem 48 KB Q_i + 2 x (32 + 32 KB)
//          = 176 KB: 1 block per SM, 12 warps.
//   Registers per thread: O_i D/2, S_ij B_c/2 fp32, P_ij B_c/4 packed. D=64 stays within 128 registers,
//   so two 256-thread blocks fit the 64K register file; D=128 within the 168 that 384 threads allow; no
//   spills, no stack frame (ptxas; results/compile/resources.json).
//
// Why TMA (the chapter's steps, V7_TMA and V7_STAGES below): with plain cp.async loads every thread both
// copies and computes, so every thread waits for the stage to be empty and the warpgroups run in
// lockstep (one's softmax cannot hide another's wgmma), and the copy addresses cost registers, so D=64
// drops to one block per SM. With TMA one thread issues a whole tile and the warpgroups drift apart. A
// third stage lost at both head dims: at D=64 it leaves room for one block per SM, at D=128 it forces
// 2 warpgroups. For the file with every switch at its default: python -m flashattn.measure.kernel_source v7.
//
// Results: results/h200/bench_v7.json (python -m flashattn.measure.bench v7 ...), the variants
// results/h200/v7_sweep.json (python -m flashattn.measure.sweep v7), the profiles
// results/h200/flash_v7_*_profile.*; the chapter is book/v7.ipynb.
#ifdef __CUDACC__
#include <cuda.h>            // CUtensorMap and its enums only: the encoder is fetched at run time
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <type_traits>

// Tile choices (override with -D for a sweep):
//   V7_D*_WG      consumer warpgroups per block, so B_r = 64 * WG;
//   V7_D*_BC      keys per tile, B_c (a multiple of 16, at most 256: one wgmma's N for S_ij);
//   V7_D*_MINB    the second __launch_bounds__ argument: blocks per SM the register budget must allow;
//   V7_STAGES     K/V stages in shared memory.
#ifndef V7_D64_WG
#define V7_D64_WG 2
#endif
#ifndef V7_D64_BC
#define V7_D64_BC 128
#endif
#ifndef V7_D64_MINB
#define V7_D64_MINB 1
#endif
#ifndef V7_D128_WG
#define V7_D128_WG 3
#endif
#ifndef V7_D128_BC
#define V7_D128_BC 128
#endif
#ifndef V7_D128_MINB
#define V7_D128_MINB 1
#endif
#ifndef V7_STAGES
#define V7_STAGES 2
#endif
// V7_TMA 1: tiles arrive by TMA (one thread issues them). 0: the chapter's first step, wgmma fed by plain
// cp.async copies that every thread issues into the same swizzled layout (v6's loads).
// FLASHATTN_LSE=1 (the training build, flashattn.autograd.forward_module): also compile the instances of
// forward_lse, which write the row-wise log-sum-exp for the backward (kernels/v6_backward.cu).
#ifndef FLASHATTN_LSE
#define FLASHATTN_LSE 0
#endif
#ifndef V7_TMA
#define V7_TMA 1
#endif
// V7_SMEM_PAD: bytes of dynamic shared memory asked for at launch on top of the tiles' and never used, a
// control for the chapter's steps: it lowers the blocks per SM without changing a single instruction.
#ifndef V7_SMEM_PAD
#define V7_SMEM_PAD 0
#endif

namespace v7 {

// ---------------------------------------------------------------- PTX wrappers (sm_90a) ---------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier: a 64-bit shared-memory word counting arrivals and (for TMA) expected bytes; its phase bit
// flips when both reach zero. Waiters poll for the phase they expect ("parity").
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// One box of a 3-D tensor map (coordinates innermost first: column, row, head) into shared memory;
// completes on `bar` by the box's byte count, zero-filling whatever lies outside the tensor.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// 16-byte global->shared copy; src_bytes = 0 writes zeros instead (rows past the end of Q, K or V).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) and read next by wgmma (the async
// proxy) needs this fence in each writing thread before the barrier that publishes it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Rows [row0, row0 + ROWS) of a [rows, D] matrix into a panel-split, 128-byte-swizzled tile -- the
// layout TMA writes -- by NTHREADS threads, 16 bytes per copy; rows past `rows` become zeros.
template <int ROWS, int D, int NTHREADS, typename T>
__device__ __forceinline__ void copy_tile(uint32_t dst, const T* __restrict__ src, int row0, int rows, int tid) {
  constexpr int CPR = D / 8;   // 16-byte chunks per row
#pragma unroll
  for (int idx = tid; idx < ROWS * CPR; idx += NTHREADS) {
    const int r = idx / CPR, c = idx % CPR;
    const uint32_t off = (c / 8) * ROWS * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4);
    const bool valid = row0 + r < rows;
    cp_async_16(dst + off, src + (size_t)(valid ? row0 + r : 0) * D + c * 8, valid);
  }
}

// wgmma's ordering instructions. fence: registers written by ordinary instructions (the accumulators,
// P) are ready for the next wgmma; commit: close the group of wgmma issued so far; wait<n>: at most n
// groups still in flight.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// The compiler sees a wgmma's accumulators as written when the asm statement issues, not when the
// tensor core finishes. Passing them through an empty asm after the wait pins every later read behind it.
template <int R>
__device__ __forceinline__ void pin(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (mode 1 in bits 62-63). Addresses and offsets are
// encoded in 16-byte units. The tile bases are 1024-byte aligned, so the "base offset" field stays 0
// and a k step inside an atom is just a start address 32, 64 or 96 bytes further on.
//   K-major (Q, K: a row's 64 elements are 128 contiguous bytes): SBO = 1024, the distance between
//     8-row atoms; LBO is not used by swizzled K-major layouts (set to 1).
//   MN-major (V for P V: the N index d is contiguous): LBO = distance between 64-column panels, SBO =
//     1024, the distance between groups of 8 k rows (keys).
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

#define V7_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// One warpgroup-wide product D (64 x N, fp32, N / 2 registers per thread) += A (64 x 16) B (16 x N).
// Accumulator register 4t + i of lane (g = lane / 4, q = lane % 4) of warp w holds row 16w + g + 8(i / 2),
// column 8t + 2q + (i % 2). Written out per N and type because the asm text must be a literal.
template <int N, typename T> struct Wgmma;
#define V7_ACC64(d) V7_ACC8(d, 0), V7_ACC8(d, 8), V7_ACC8(d, 16), V7_ACC8(d, 24)
#define V7_ACC128(d) V7_ACC8(d, 0), V7_ACC8(d, 8), V7_ACC8(d, 16), V7_ACC8(d, 24), V7_ACC8(d, 32), V7_ACC8(d, 40), V7_ACC8(d, 48), V7_ACC8(d, 56)
template <> struct Wgmma<64, __nv_bfloat16> {
  // S-style: A (64 x 16) and B (N x 16) both from shared memory, both K-major.
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : V7_ACC64(d)
        : "l"(a), "l"(b), "r"(accumulate));
  }
  // P V-style: A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1); accumulates.
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : V7_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <> struct Wgmma<64, __half> {
  // S-style: A (64 x 16) and B (N x 16) both from shared memory, both K-major.
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : V7_ACC64(d)
        : "l"(a), "l"(b), "r"(accumulate));
  }
  // P V-style: A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1); accumulates.
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : V7_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <> struct Wgmma<128, __nv_bfloat16> {
  // S-style: A (64 x 16) and B (N x 16) both from shared memory, both K-major.
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : V7_ACC128(d)
        : "l"(a), "l"(b), "r"(accumulate));
  }
  // P V-style: A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1); accumulates.
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : V7_ACC128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <> struct Wgmma<128, __half> {
  // S-style: A (64 x 16) and B (N x 16) both from shared memory, both K-major.
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : V7_ACC128(d)
        : "l"(a), "l"(b), "r"(accumulate));
  }
  // P V-style: A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1); accumulates.
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : V7_ACC128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};

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

// Two floats -> one register of two 16-bit values, lower column in the low half (the A fragment order).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ---------------------------------------------------------------- the kernel ---------------------------
//
// Shared memory, every tile 1024-byte aligned: Q_i, then STAGES x K_j, then STAGES x V_j, then the
// mbarriers. A tile of R rows and D columns is D / 64 panels of [R rows][64 columns] = R x 128 bytes
// (one TMA box each: the 128-byte swizzle allows at most 128 bytes per box row).

template <int D, int NWG, int BC, int STAGES>
struct Layout {
  static constexpr int BR = 64 * NWG;
  static constexpr int PANELS = D / 64;
  static constexpr uint32_t Q_BYTES = BR * D * 2, KV_BYTES = BC * D * 2;
  static constexpr uint32_t K_OFF = Q_BYTES, V_OFF = K_OFF + STAGES * KV_BYTES;
  static constexpr uint32_t BAR_OFF = V_OFF + STAGES * KV_BYTES;
  static constexpr uint32_t BYTES = BAR_OFF + 8 * (1 + 3 * STAGES);
  static constexpr size_t DYNAMIC = BYTES + 1024;   // room to round the base up to 1024 bytes
};

// WITH_LSE (training, forward_lse): also write lse_i = ln(sum_j exp(S_ij * scale)), float32 [B*H][M], for
// the backward (kernels/v6_backward.cu); LSE and the window come last, so the forward-only instance keeps
// its parameter layout and machine code.
// CAUSAL: the instance for causal=True and for any sliding window, in which row i sees key j iff
// lo <= j - i <= hi: a band of diagonals, lo = N - M - window_left, hi = N - M + window_right. The
// launcher clamps the window's sides to [0, N] and [0, M], past which they bound nothing, so lo >= -M and
// hi <= N (no bound on that side; causal is lo = -M, hi = N - M), and no sum below can overflow.
template <typename T, int D, int NWG, int BC, bool CAUSAL, int STAGES, int MINB, bool TMA, bool WITH_LSE>
__global__ void __launch_bounds__(128 * NWG, MINB)
    flash_fwd_wgmma(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV, const T* __restrict__ Q, const T* __restrict__ K,
                    const T* __restrict__ V, T* __restrict__ O, int BH, int group, int M, int N, int m_blocks,
                    float scale_log2, float* __restrict__ LSE, int lo, int hi) {
  using L = Layout<D, NWG, BC, STAGES>;
  constexpr int BR = L::BR, PANELS = D / 64;
  constexpr int NT = BC / 8;   // n8 column groups of S_ij per thread row
  constexpr int DT = D / 8;    // n8 column groups of O_i

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + L::K_OFF, sV = base + L::V_OFF;
  const uint32_t bar_q = base + L::BAR_OFF;
  auto bar_k = [&](int s) { return bar_q + 8u * (1 + s); };
  auto bar_v = [&](int s) { return bar_q + 8u * (1 + STAGES + s); };
  auto bar_empty = [&](int s) { return bar_q + 8u * (1 + 2 * STAGES + s); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3;   // warpgroup, warp inside it
  const int g = lane >> 2, q = lane & 3;

  // Causal: the blocks with the most key tiles (last row blocks) go first, as in v6.
  int m_block, bh;
  if (CAUSAL) {
    bh = blockIdx.x % BH;
    m_block = m_blocks - 1 - (int)(blockIdx.x / BH);
  } else {
    m_block = blockIdx.x % m_blocks;
    bh = blockIdx.x / m_blocks;
  }
  const int m0 = m_block * BR;
  const int warp_row0 = m0 + wg * 64 + wq * 16;   // first of this warp's 16 rows
  T* Oh = O + (size_t)bh * M * D;
  // Grouped-query attention: query head h reads kv head h / group, and with H = group * H_kv that is
  // (b * H + h) / group = b * H_kv + h / group in the flat index.
  const int bh_kv = bh / group;

  // Key tiles kt0 .. kt0 + n_tiles - 1; the loop counts them from 0 (stages and phases run from there).
  int kt0 = 0, n_tiles = (N + BC - 1) / BC;
  if (CAUSAL) {
    // the block's first row m0 sees keys from m0 + lo on, its last row min(m0 + BR, M) - 1 up to that
    // row + hi
    const long long first_key = (long long)m0 + lo, last_key = (long long)min(m0 + BR, M) - 1 + hi;
    kt0 = first_key <= 0 ? 0 : (int)(first_key / BC);
    n_tiles = last_key < 0 ? 0 : max(0, (int)((min((long long)N, last_key + 1) + BC - 1) / BC) - kt0);
  }
  if (n_tiles == 0) {   // block-uniform: no row of this block sees a key, its output is 0
    for (int idx = tid; idx < BR * D / 8; idx += 128 * NWG) {
      const int row = m0 + idx / (D / 8);
      if (row < M) *reinterpret_cast<uint4*>(Oh + (size_t)row * D + (idx % (D / 8)) * 8) = make_uint4(0, 0, 0, 0);
    }
    if constexpr (WITH_LSE)   // and its lse -inf: the backward reads that as P = 0
      for (int r = tid; r < BR && m0 + r < M; r += 128 * NWG) LSE[(size_t)bh * M + m0 + r] = -INFINITY;
    return;
  }

  auto load_kv = [&](int t) {   // TMA: thread 0 only; plain loads: every thread, one commit group per tile
    const int s = t % STAGES;
    if constexpr (!TMA) {
      if (t < n_tiles) {
        copy_tile<BC, D, 128 * NWG>(sK + s * L::KV_BYTES, K + (size_t)bh_kv * N * D, (kt0 + t) * BC, N, tid);
        copy_tile<BC, D, 128 * NWG>(sV + s * L::KV_BYTES, V + (size_t)bh_kv * N * D, (kt0 + t) * BC, N, tid);
      }
      cp_async_commit();   // an empty group past the last tile keeps the wait_group count uniform
      return;
    }
    mbar_arrive_expect_tx(bar_k(s), L::KV_BYTES);
#pragma unroll
    for (int p = 0; p < PANELS; ++p)
      tma_load_3d(sK + s * L::KV_BYTES + p * BC * 128, &tmK, p * 64, (kt0 + t) * BC, bh_kv, bar_k(s));
    mbar_arrive_expect_tx(bar_v(s), L::KV_BYTES);
#pragma unroll
    for (int p = 0; p < PANELS; ++p)
      tma_load_3d(sV + s * L::KV_BYTES + p * BC * 128, &tmV, p * 64, (kt0 + t) * BC, bh_kv, bar_v(s));
  };

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_k(s), TMA ? 1 : 128 * NWG);   // plain loads: every thread arrives
      mbar_init(bar_v(s), 1);
      mbar_init(bar_empty(s), 4 * NWG);   // lane 0 of every consumer warp
    }
    // make the initialised barriers visible to the copy engine (the async proxy)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if constexpr (TMA) {
    if (tid == 0) {
      mbar_arrive_expect_tx(bar_q, L::Q_BYTES);
#pragma unroll
      for (int p = 0; p < PANELS; ++p) tma_load_3d(sQ + p * BR * 128, &tmQ, p * 64, m0, bh, bar_q);
      for (int t = 0; t < STAGES && t < n_tiles; ++t) load_kv(t);
    }
  } else {
    // Q_i's copies join tile 0's group, which the first wait below covers
    copy_tile<BR, D, 128 * NWG>(sQ, Q + (size_t)bh * M * D, m0, M, tid);
    for (int t = 0; t < STAGES; ++t) load_kv(t);
  }

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};

  // This warpgroup's 64 rows of Q_i start 64 * 128 bytes into each panel.
  const uint32_t q_base = sQ + wg * 64 * 128;
  if constexpr (TMA) mbar_wait(bar_q, 0);

  for (int jt = 0; jt < n_tiles; ++jt) {
    const int s = jt % STAGES;
    const uint32_t parity = (jt / STAGES) & 1;
    const uint32_t k_base = sK + s * L::KV_BYTES, v_base = sV + s * L::KV_BYTES;

    // Refill the stage that tile j - 1 used with tile j - 1 + STAGES, once every warp has let go of it.
    // With two or more stages this runs while this warpgroup's S_ij product is on the tensor cores; with
    // one stage the refill is tile j itself and must come first.
    auto refill = [&] {
      if constexpr (TMA) {
        if (tid == 0 && jt >= 1 && jt - 1 + STAGES < n_tiles) {
          mbar_wait(bar_empty((jt - 1) % STAGES), ((jt - 1) / STAGES) & 1);
          load_kv(jt - 1 + STAGES);
        }
      } else if (jt >= 1) {   // every thread copies its share, so every thread waits for the stage
        if (jt - 1 + STAGES < n_tiles) mbar_wait(bar_empty((jt - 1) % STAGES), ((jt - 1) / STAGES) & 1);
        load_kv(jt - 1 + STAGES);
      }
    };
    if constexpr (STAGES == 1) refill();

    // ---- S_ij = Q_i K_j^T: D / 16 k steps, all from shared memory ----
    float s_acc[BC / 2];
    if constexpr (!TMA) {
      // This thread's copies of tile j have landed (the groups of later tiles may still be in flight);
      // fence them for the async proxy, then arrive, so the wait below publishes every thread's share.
      cp_async_wait<(STAGES >= 2 ? STAGES - 2 : 0)>();
      fence_proxy_async();
      mbar_arrive(bar_k(s));
    }
    mbar_wait(bar_k(s), parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t panel = kk / 4, within = (kk % 4) * 32;
      Wgmma<BC, T>::ss(s_acc, make_desc(q_base + panel * BR * 128 + within, 16, 1024),
                       make_desc(k_base + panel * BC * 128 + within, 16, 1024), kk > 0);
    }
    wgmma_commit();

    if constexpr (STAGES > 1) refill();
    wgmma_wait<0>();
    pin(s_acc);

    // ---- mask: keys past N, and (causal, window) keys outside the window; only tiles that need it ----
    // A tile crosses the window's right edge (causal: the diagonal) if its last key is past the warp's
    // first row's, and its left edge if its first key is before the warp's last row's.
    const int j0 = (kt0 + jt) * BC;
    const bool tail = j0 + BC > N;
    const bool diag = CAUSAL && ((j0 + BC - 1) - warp_row0 > hi || j0 - min(warp_row0 + 15, M - 1) < lo);
    if (tail || diag) {
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp_row0 + g + 8 * (e >> 1);
          const int col = j0 + t * 8 + 2 * q + (e & 1);
          if (col >= N || (CAUSAL && outside_band(col, row, lo, hi))) s_acc[4 * t + e] = -INFINITY;
        }
    }

    // ---- online softmax, one row half (g or g + 8) at a time; P packed to 16 bits at once ----
    uint32_t p_pack[NT][2];
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m_i[h];
#pragma unroll
      for (int t = 0; t < NT; ++t) mx = fmaxf(mx, fmaxf(s_acc[4 * t + 2 * h], s_acc[4 * t + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of a quad share a row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // a row that has seen only masked keys keeps max -inf: subtract 0 so that p = 0, not NaN
      const float m_base = mx == -INFINITY ? 0.f : mx * scale_log2;
      alpha[h] = mx == m_i[h] ? 1.f : ex2(m_i[h] * scale_log2 - m_base);
      m_i[h] = mx;
      float row_sum = 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float p0 = ex2(fmaf(s_acc[4 * t + 2 * h], scale_log2, -m_base));
        const float p1 = ex2(fmaf(s_acc[4 * t + 2 * h + 1], scale_log2, -m_base));
        row_sum += p0 + p1;
        p_pack[t][h] = pack2<T>(p0, p1);
      }
      l_i[h] = l_i[h] * alpha[h] + row_sum;   // a per-lane partial sum; the quad adds up at the end
    }
#pragma unroll
    for (int t = 0; t < DT; ++t) {
      o[4 * t + 0] *= alpha[0];
      o[4 * t + 1] *= alpha[0];
      o[4 * t + 2] *= alpha[1];
      o[4 * t + 3] *= alpha[1];
    }

    // ---- O_i += P_ij V_j: P from registers, V_j MN-major from shared memory ----
    if constexpr (TMA) mbar_wait(bar_v(s), parity);   // plain loads: V_j came with K_j
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      // A fragment of keys [16kk, 16kk + 16): rows g / g + 8, keys 2q.. (n8 group 2kk) and 8 + 2q.. (2kk + 1)
      const uint32_t a[4] = {p_pack[2 * kk][0], p_pack[2 * kk][1], p_pack[2 * kk + 1][0], p_pack[2 * kk + 1][1]};
      Wgmma<D, T>::rs(o, a, make_desc(v_base + kk * 16 * 128, BC * 128, 1024));
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin(o);
    if (lane == 0) mbar_arrive(bar_empty(s));   // this warp is done reading stage s
  }

  // ---- O_i / l_i, straight from registers ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_i[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;   // l = 0 only for rows with no allowed key -> 0
    const int row = warp_row0 + g + 8 * h;
    if (row < M) {
      T* dst = Oh + (size_t)row * D + 2 * q;
#pragma unroll
      for (int t = 0; t < DT; ++t)
        *reinterpret_cast<uint32_t*>(dst + t * 8) = pack2<T>(o[4 * t + 2 * h] * inv_l, o[4 * t + 2 * h + 1] * inv_l);
      // lse_i = (m_i * scale_log2 + log2(l_i)) * ln(2), as v6 writes it; -inf for a row with no visible key
      if (WITH_LSE && q == 0)
        LSE[(size_t)bh * M + row] = l > 0.f ? (m_i[h] * scale_log2 + __log2f(l)) * 0.6931471805599453f : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------- launcher ----------------------------

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled lives in the driver library; asking the runtime for it avoids linking -lcuda.
inline EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// [BH][L][D] as a 3-D map (innermost first), boxes of 64 columns x `box_rows` rows x 1 head, 128-byte
// swizzle, zero fill out of bounds.
template <typename T>
bool make_map(CUtensorMap* map, const void* ptr, int BH, int L, int D, int box_rows) {
  const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)L, (cuuint64_t)BH};
  const cuuint64_t strides[2] = {(cuuint64_t)D * sizeof(T), (cuuint64_t)L * D * sizeof(T)};
  const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      sizeof(T) == 2 && std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encoder()(map, type, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, int D, int NWG, int BC, bool CAUSAL, int STAGES, int MINB, bool TMA, bool WITH_LSE>
const char* launch(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv, int M,
                   int N, float scale, int lo, int hi, cudaStream_t stream) {
  using L = Layout<D, NWG, BC, STAGES>;
  constexpr size_t smem = L::DYNAMIC + V7_SMEM_PAD;
  auto kernel = flash_fwd_wgmma<T, D, NWG, BC, CAUSAL, STAGES, MINB, TMA, WITH_LSE>;

  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if ((size_t)optin < smem) return "v7: this GPU has too little shared memory per block for this tile";
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);

  const int m_blocks = (M + L::BR - 1) / L::BR;
  const long long BH = (long long)B * H;
  const long long blocks = (long long)m_blocks * BH;
  if (blocks > 0x7fffffffLL) return "v7: B * H * ceil(M / B_r) must be below 2^31";
  if (encoder() == nullptr) return "v7: the driver has no cuTensorMapEncodeTiled (needs CUDA 12.0 or newer)";
  CUtensorMap tmQ, tmK, tmV;
  if (!make_map<T>(&tmQ, q, (int)BH, M, D, L::BR) || !make_map<T>(&tmK, k, B * H_kv, N, D, BC) ||
      !make_map<T>(&tmV, v, B * H_kv, N, D, BC))
    return "v7: cuTensorMapEncodeTiled refused a tensor (pointers must be 16-byte aligned)";
  const float scale_log2 = scale * 1.4426950408889634f;   // log2(e) * scale
  kernel<<<(unsigned)blocks, 128 * NWG, smem, stream>>>(tmQ, tmK, tmV, static_cast<const T*>(q),
                                                         static_cast<const T*>(k), static_cast<const T*>(v),
                                                         static_cast<T*>(o), (int)BH, H / H_kv, M, N, m_blocks,
                                                         scale_log2, lse, lo, hi);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, bool CAUSAL, bool WITH_LSE>
const char* dispatch_d(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv,
                       int M, int N, int D, float scale, int lo, int hi, cudaStream_t stream) {
  if (D == 64)
    return launch<T, 64, V7_D64_WG, V7_D64_BC, CAUSAL, V7_STAGES, V7_D64_MINB, (V7_TMA != 0), WITH_LSE>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, stream);
  if (D == 128)
    return launch<T, 128, V7_D128_WG, V7_D128_BC, CAUSAL, V7_STAGES, V7_D128_MINB, (V7_TMA != 0), WITH_LSE>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, stream);
  return "v7 supports head_dim 64 and 128 only";
}

// lse == nullptr: the forward-only instance; otherwise the one that also writes lse (training), compiled
// only with -DFLASHATTN_LSE=1 (flashattn.autograd.forward_module passes it), so that a forward-only build
// compiles no more kernels than before. banded: causal or a window that bounds some row (the CAUSAL
// instance, see flash_fwd_wgmma).
template <typename T>
const char* dispatch_lse(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv,
                         int M, int N, int D, bool banded, float scale, int lo, int hi, cudaStream_t stream) {
  if (lse == nullptr)
    return banded ? dispatch_d<T, true, false>(q, k, v, o, nullptr, B, H, H_kv, M, N, D, scale, lo, hi, stream)
                  : dispatch_d<T, false, false>(q, k, v, o, nullptr, B, H, H_kv, M, N, D, scale, lo, hi, stream);
#if FLASHATTN_LSE
  return banded ? dispatch_d<T, true, true>(q, k, v, o, lse, B, H, H_kv, M, N, D, scale, lo, hi, stream)
                : dispatch_d<T, false, true>(q, k, v, o, lse, B, H, H_kv, M, N, D, scale, lo, hi, stream);
#else
  return "v7: forward_lse needs a build with -DFLASHATTN_LSE=1";
#endif
}

}  // namespace v7

// dtype: 0 = bfloat16, 1 = float16. lse: nullptr, or float [B*H*M] for forward_lse. k and v have H_kv heads,
// H a multiple of H_kv. window_left, window_right: the sliding window (-1: unbounded). Returns nullptr or a
// message.
const char* v7_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype, int B,
                       int H, int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                       int64_t window_right, cudaStream_t stream) {
  if (B < 1 || H < 1 || M < 1 || N < 1) return "v7: B, H, M and N must all be >= 1";
  if (H_kv < 1 || H % H_kv != 0) return "v7: q's heads must be a multiple of k's heads";
  if (!(scale > 0.f) || !std::isfinite(scale)) return "v7: scale must be a finite number > 0";
  if (D != 64 && D != 128) return "v7 supports head_dim 64 and 128 only";
  int dev = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0)
    return "v7 needs a Hopper GPU of compute capability 9.0 (H100/H200): it is built for sm_90a (wgmma, TMA)";
  const bool bf16 = dtype == 0;
  if (dtype != 0 && dtype != 1) return "v7: dtype must be bfloat16 or float16";
  // The window as the kernel takes it, the band lo <= j - i <= hi (see flash_fwd_wgmma): causal sets
  // right = 0; -1, or a side that reaches past every key (left >= N) or every row (right >= M), is
  // clamped to N or M, where it bounds nothing. A window that bounds no row runs the unmasked instance.
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > N ? N : (int)window_left;
  const int right = window_right < 0 || window_right > M ? M : (int)window_right;
  const int lo = N - M - left, hi = N - M + right;
  const bool banded = left < N || right < M;
  return bf16 ? v7::dispatch_lse<__nv_bfloat16>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi, stream)
              : v7::dispatch_lse<__half>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi, stream);
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
// Only the headers the binding uses: <torch/extension.h> would double this half's build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>     // torch::wrap_pybind_function, used by load_inline's module code
#include <torch/csrc/utils/pybind.h>   // at::Tensor <-> torch.Tensor for pybind11
#include <cmath>
#include <optional>

const char* v7_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype, int B,
                       int H, int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                       int64_t window_right, cudaStream_t stream);

// q: [B, H, M, D], k and v: [B, H_kv, N, D] with H a multiple of H_kv, contiguous, all bfloat16 or all
// float16, on one CUDA device of compute capability 9.0; D in {64, 128}; scale None means 1/sqrt(D), a
// window side -1 no bound. Returns o like q, and with_lse: lse float32 [B, H, M] too. Messages carry no
// numbers (see v6.cu).
static std::tuple<at::Tensor, at::Tensor> run_forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal,
                                                      std::optional<double> scale, int64_t window_left,
                                                      int64_t window_right, bool with_lse) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "q must be bfloat16 or float16 (v7 has no fp32 mode)");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == dtype, name, " must have the same dtype as q");
    TORCH_CHECK(t->dim() == 4, name, " must have rank 4 [B, H, L, D]");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->numel() > 0, name, " has an empty dimension");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, name,
                " must be 16-byte aligned (TMA reads 16-byte aligned tensors)");
    for (int d = 0; d < 4; ++d)
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 128, "q: v7 supports head_dim 64 and 128 only");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k must match q in batch and head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H_kv, N, D]");
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(3)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const int B = q.size(0), H = q.size(1), H_kv = k.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = at::empty_like(q);
  at::Tensor lse;
  if (with_lse) lse = at::empty({B, H, M}, q.options().dtype(at::kFloat));
  const char* err = v7_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                               with_lse ? lse.data_ptr<float>() : nullptr, dtype == at::kBFloat16 ? 0 : 1, B, H,
                               H_kv, M, N, D, causal, s, window_left, window_right,
                               c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {o, lse};
}

at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal, std::optional<double> scale,
                   int64_t window_left, int64_t window_right) {
  return std::get<0>(run_forward(q, k, v, causal, scale, window_left, window_right, false));
}

// Training: (o, lse), lse float32 [B, H, M] = ln(sum_j exp(scale * S_ij)), -inf for a row that sees no key.
std::tuple<at::Tensor, at::Tensor> forward_lse(at::Tensor q, at::Tensor k, at::Tensor v, bool causal,
                                               std::optional<double> scale, int64_t window_left,
                                               int64_t window_right) {
  return run_forward(q, k, v, causal, scale, window_left, window_right, true);
}
#endif
