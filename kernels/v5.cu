// v5: register-tiled fp32 FlashAttention-2 on CUDA cores (FFMA), no tensor cores.
//
// What changed from v4: v4 spends most of its time on shared-memory traffic and index work, about one
// float loaded from shared memory per FFMA. v5 treats both products of a tile like an SGEMM: every
// thread owns a TM x TN register tile of S_ij = Q_i K_j^T and the same TM rows of O_i, and per 4-deep
// step of the inner dimension it loads TM + TN float4s (16-byte LDS.128, broadcast or conflict-free
// across the warp) and runs 4*TM*TN FFMAs on them. With the D=64 default 8 x 8 tile that is 256 FFMA
// per 16 LDS.128 (a 4 x 8 tile: 128 per 12), so the shared-memory pipe stays well below the FFMA pipes'
// rate and the loop is bound by FFMA issue, as an SGEMM is.
//
// Work split (for one block = one query tile Q_i of B_r rows, one (batch, head) pair):
//   * threads form NRG = B_r/TM row groups x WC = B_c/TN column groups; tid = rg * WC + cg, so the WC
//     threads that share query rows are WC consecutive lanes of one warp (WC is 4, 8 or 16). Row maxima
//     are reduced with __shfl_xor_sync over those lanes; row sums are kept as per-thread partials
//     (rescaled by the same alpha on every lane) and reduced once, at the end.
//   * thread (rg, cg) owns query rows rg + i*NRG (i < TM), score columns cg + j*WC (j < TN) and output
//     columns cg*4 + h*4*WC + {0..3} (h < D/(4*WC)). Interleaved ownership is what makes the shared
//     loads conflict-free: the lanes of a warp touch neighbouring rows / neighbouring float4s.
//   * the softmax statistics m_i, l_i and O_i stay in registers for the whole sweep over K/V tiles.
//
// Shared memory (floats; row strides padded so that 16-byte accesses of neighbouring rows start 4 banks
// apart, and so that the scalar P stores of one warp hit 32 different banks):
//   Q_i  [B_r][D+4]      loaded once
//   K_j  [B_c][D+4]      row-major, as in global memory, so cp.async can copy 16-byte chunks directly
//   V_j  [B_c][D]        row-major; a warp reads one contiguous row segment per load
//   P_ij [B_r][B_c+pad]  pad = WC mod 32; the A operand of P_ij V_j
// Default tiles, chosen by the tile sweep (python -m flashattn.measure.sweep v5):
//   D=64 : B_r=128, B_c=64, TM=8, TN=8, 128 threads, 105,472 B -> 2 blocks per SM. It beat the 64x64
//          tile of 4x8 with 3 blocks per SM, the arithmetic's first choice: halving the shared-memory
//          loads per FFMA was worth more than the extra resident warps.
//   D=128: B_r=128, B_c=64, TM=8, TN=4, 256 threads, 175,104 B -> 1 block per SM.
//   Short sequences at D=64 also get a 64 x 64 tile of 4 x 8 (3 blocks per SM), which the launcher runs
//   when its wave count says it finishes first (V5_D64_SMALL below): few 128-row tiles leave SMs idle
//   in the last wave.
//   SDPA's float32 kernel is faster at D=128: it runs its products on the tensor cores (CUTLASS's
//   3xTF32), which no FFMA tile here catches up with.
//
// Overlap: one K buffer and one V buffer form a two-stage cp.async pipeline across the two halves of a
// tile: V_j is fetched while S_ij = Q_i K_j^T and the softmax run, and K_{j+1} is fetched while
// O_i += P_ij V_j runs. Each copy has half a tile of arithmetic to hide behind, far more than an L2 or
// DRAM round trip, and it needs half the shared memory of separate double buffers for K and V; that
// saving is what lets two or three blocks share a multiprocessor.
//
// Softmax: scores are kept unscaled; p = exp2((s - m) * log2(e)/sqrt(D)) with ex2.approx (one MUFU
// instruction). The running max m_i is in score units; the one division per row happens after the
// last tile. Masked columns (past N) get -inf before the max, so their p is exactly 0; the row max is
// finite after the first tile because every tile holds at least one real key; m = -inf is still
// guarded so that -inf - -inf never produces NaN.
//
// Contract: q [B, H, M, D], k and v [B, H, N, D], o like q; contiguous float32 with 16-byte aligned
// data pointers (what PyTorch allocates); D = 64 or 128 (the Python layer sends other D to v2); any
// M, N >= 1 with M != N allowed; non-causal; global offsets computed in 64 bits. Needs sm_80+ (cp.async).
// Build switches: tile shapes -DV5_D64_BR=... -DV5_D64_BC=... -DV5_D64_TM=... -DV5_D64_TN=... (and
// V5_D128_*); -DV5_ONLY_D=64 or 128 compiles one head dim only (the tile sweep uses it); the chapter's
// steps are V5_CP_ASYNC, V5_EXP2, V5_BLOCKED_PV and V5_INTERLEAVE below. For the file with every switch
// at its default and the branches resolved: python -m flashattn.measure.kernel_source v5.
//
// Results: results/h200/bench.json and bench_v5.json (python -m flashattn.measure.bench), the tile
// sweep results/h200/v5_sweep.json and v5_explore.json, the steps results/h200/v5_steps.json (python -m
// flashattn.measure.sweep v5-steps), the profiles results/h200/flash_v5_*_profile.* and
// results/h200/sdpa_vs_v5_d128.*; the chapter is book/v5.ipynb (docs/v5_design.md has the design notes).
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "v5 uses cp.async and needs compute capability 8.0 or newer"
#endif

#ifndef V5_D64_BR
#define V5_D64_BR 128
#endif
#ifndef V5_D64_BC
#define V5_D64_BC 64
#endif
#ifndef V5_D64_TM
#define V5_D64_TM 8
#endif
#ifndef V5_D64_TN
#define V5_D64_TN 8
#endif
#ifndef V5_D128_BR
#define V5_D128_BR 128
#endif
#ifndef V5_D128_BC
#define V5_D128_BC 64
#endif
#ifndef V5_D128_TM
#define V5_D128_TM 8
#endif
#ifndef V5_D128_TN
#define V5_D128_TN 4
#endif
// Short sequences at D=64: a grid of few 128-row query tiles leaves SMs idle in its last (or only) wave.
// V5_D64_SMALL=1 (default) compiles a second D=64 instance with the tile below (3 blocks per SM) and the
// launcher picks the instance its wave count predicts to finish first (small_tile_first); 0 compiles the
// 128-row tile alone. V5_D64S_SPEED is the small tile's throughput per SM in thousandths of the big
// one's, from the tile sweep (results/h200/v5_sweep.json); results/h200/v5_explore.json has both
// instances timed from short to long sequences.
#ifndef V5_D64_SMALL
#define V5_D64_SMALL 1
#endif
#ifndef V5_D64S_BR
#define V5_D64S_BR 64
#endif
#ifndef V5_D64S_BC
#define V5_D64S_BC 64
#endif
#ifndef V5_D64S_TM
#define V5_D64S_TM 4
#endif
#ifndef V5_D64S_TN
#define V5_D64S_TN 8
#endif
#ifndef V5_D64S_SPEED
#define V5_D64S_SPEED 929
#endif
// How many 4-deep steps of the inner dimension one trip of the product loops covers. Full unrolling
// (16 for D=64) makes the loop body long enough to strain the instruction cache; 4 already gives the
// scheduler 500+ independent instructions to interleave.
#ifndef V5_UNROLL
#define V5_UNROLL 4
#endif
// 1: P_ij V_j is summed per tile and then added to O_i (see the PV loop); 0: straight into O_i.
#ifndef V5_BLOCKED_PV
#define V5_BLOCKED_PV 1
#endif
// The chapter's steps, one macro each; step k = step k-1 with one more macro set to 1 (the default build
// has all of them at 1): register tiles alone (all 0); + interleaving; + cp.async; + exp2; + V5_BLOCKED_PV.
// 1: global->shared copies with cp.async, in the background behind half a tile of arithmetic;
// 0: the same copies, at the same places, through registers (LDG then STS): each thread waits for its load.
#ifndef V5_CP_ASYNC
#define V5_CP_ASYNC 1
#endif
// 1: p = 2^((s - m) * log2(e)/sqrt(D)) with one ex2.approx; 0: p = expf((s - m)/sqrt(D)), the accurate
// library exponential (a range reduction, the MUFU.EX2 and a fix-up of the result).
#ifndef V5_EXP2
#define V5_EXP2 1
#endif
// 1: thread (rg, cg) owns rows rg + i*NRG and columns cg + j*WC (interleaved, see the work split above);
// 0: the compact block rows rg*TM + i, columns cg*TN + j, output columns cg*4*DV + 4h (the lanes of a
// warp then read rows TM or TN apart, which the padding does not spread over the banks).
#ifndef V5_INTERLEAVE
#define V5_INTERLEAVE 1
#endif
// Blocks per SM promised to the register allocator (__launch_bounds__); 0 = as many as shared memory
// allows, at most 4.
#ifndef V5_MIN_BLOCKS
#define V5_MIN_BLOCKS 0
#endif

namespace v5 {

constexpr int kSmemPerSM = 233472;        // sm_90: 228 KB usable by blocks
constexpr int kSmemReservedPerBlock = 1024;

template <int D_, int BR_, int BC_, int TM_, int TN_>
struct Tiles {
  static constexpr int D = D_, BR = BR_, BC = BC_, TM = TM_, TN = TN_;
  static constexpr int WC = BC / TN;           // lanes sharing a query row
  static constexpr int NRG = BR / TM;          // row groups
  static constexpr int THREADS = WC * NRG;
  static constexpr int DV = D / (4 * WC);      // float4 output columns per thread
  static constexpr int QS = D + 4;             // row strides in floats (see the header for the padding)
  static constexpr int KS = D + 4;
  static constexpr int VS = D;
  static constexpr int PS = BC + ((WC - BC % 32) % 32 + 32) % 32;   // PS = WC (mod 32)
  static constexpr int Q_FLOATS = BR * QS, K_FLOATS = BC * KS, V_FLOATS = BC * VS, P_FLOATS = BR * PS;
  static constexpr int SMEM_BYTES = 4 * (Q_FLOATS + K_FLOATS + V_FLOATS + P_FLOATS);
  static constexpr int SMEM_BLOCKS = kSmemPerSM / (SMEM_BYTES + kSmemReservedPerBlock);
  static constexpr int MIN_BLOCKS =
      V5_MIN_BLOCKS > 0 ? V5_MIN_BLOCKS : (SMEM_BLOCKS < 1 ? 1 : (SMEM_BLOCKS > 4 ? 4 : SMEM_BLOCKS));

  static_assert(BR % TM == 0 && BC % TN == 0, "B_r must be a multiple of TM and B_c of TN");
  static_assert(WC == 4 || WC == 8 || WC == 16, "the lanes sharing a row (B_c/TN) must be 4, 8 or 16");
  static_assert(D % (4 * WC) == 0, "each thread needs whole float4 columns of O_i");
  static_assert(BC % 4 == 0, "P_ij is read in float4 steps along B_c");
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 1024 threads");
  static_assert(SMEM_BYTES <= 227 * 1024, "tile does not fit in one block's shared memory");
};

// ---- small PTX helpers -------------------------------------------------------------------------------

// 16-byte global->shared copy that bypasses L1 (cp.async.cg). src_bytes = 0 writes 16 zero bytes
// and reads nothing: used for rows past M or N, so padded K rows give finite scores (masked later)
// and padded V rows are exact zeros (0 * garbage could be NaN).
#if V5_CP_ASYNC
__device__ __forceinline__ void cp_async16(float* smem_dst, const float* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
#else
// The step before cp.async: the 16 bytes pass through registers, so the store waits for the load.
// Nothing is in flight afterwards, so committing and waiting have nothing to do; the barriers that
// follow each wait in the kernel still order the stores before the reads.
__device__ __forceinline__ void cp_async16(float* smem_dst, const float* gmem_src, bool valid) {
  *reinterpret_cast<float4*>(smem_dst) =
      valid ? *reinterpret_cast<const float4*>(gmem_src) : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ void cp_async_commit() {}
__device__ __forceinline__ void cp_async_wait_all() {}
#endif

// 2^x in one MUFU.EX2 (about 2 ulp; subnormal results flush to 0, which only affects p < 2^-126).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float4 lds128(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ float lane_of(const float4& f, int c) {   // c is a compile-time constant
  return c == 0 ? f.x : c == 1 ? f.y : c == 2 ? f.z : f.w;
}

// Copies rows [0, ROWS) of a row-major [*, D] global tile into shared memory with row stride STRIDE;
// rows >= valid_rows are zero-filled (valid_rows >= 1, so `src` itself is always a real address, and
// the zero-filling copies point there instead of past the end of the tensor).
// The global tile is contiguous, so 16-byte chunk `idx` sits at float offset idx*4 in global memory
// and at idx*4 + row*(STRIDE - D) in shared memory: consecutive threads copy consecutive chunks, and
// the per-chunk address arithmetic stays one multiply-add.
template <int ROWS, int D, int STRIDE, int THREADS>
__device__ __forceinline__ void load_tile_async(float* dst, const float* src, int valid_rows) {
  constexpr int CHUNKS = D / 4;   // 16-byte chunks per row
  constexpr int TOTAL = ROWS * CHUNKS;
  constexpr int TRIPS = (TOTAL + THREADS - 1) / THREADS;
#pragma unroll
  for (int t = 0; t < TRIPS; ++t) {
    const int idx = threadIdx.x + t * THREADS;
    if (TOTAL % THREADS == 0 || idx < TOTAL) {
      const int r = idx / CHUNKS;
      const bool valid = r < valid_rows;
      cp_async16(dst + idx * 4 + r * (STRIDE - D), src + (valid ? idx * 4 : 0), valid);
    }
  }
}

// ---- the kernel ----------------------------------------------------------------------------------------

template <class T, int UNROLL>
__global__ void __launch_bounds__(T::THREADS, T::MIN_BLOCKS)
flash_v5_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                float* __restrict__ o, int M, int N, int num_q_tiles, float score_scale) {
  constexpr int D = T::D, BR = T::BR, BC = T::BC, TM = T::TM, TN = T::TN;
  constexpr int WC = T::WC, DV = T::DV;
  constexpr int QS = T::QS, KS = T::KS, VS = T::VS, PS = T::PS;

  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;
  float* Ks = Qs + T::Q_FLOATS;
  float* Vs = Ks + T::K_FLOATS;
  float* Ps = Vs + T::V_FLOATS;

  const int cg = threadIdx.x % WC;   // column group: score columns cg + j*WC, output columns cg*4 + h*4*WC
  const int rg = threadIdx.x / WC;   // row group: query rows rg + i*NRG
  // Owned row i is row_base + i*ROW_STEP, score column c is col_base + c*COL_STEP, output float4 h
  // starts at out_base + h*OUT_STEP (V5_INTERLEAVE says which of the two ownerships).
#if V5_INTERLEAVE
  constexpr int ROW_STEP = T::NRG, COL_STEP = WC, OUT_STEP = 4 * WC;
  const int row_base = rg, col_base = cg, out_base = cg * 4;
#else
  constexpr int ROW_STEP = 1, COL_STEP = 1, OUT_STEP = 4;
  const int row_base = rg * TM, col_base = cg * TN, out_base = cg * 4 * DV;
#endif
  // Query tiles of one (batch, head) are consecutive block indices, so blocks running at the same time
  // mostly read the same K and V, which then come from L2.
  const int q_tile = blockIdx.x % num_q_tiles;
  const int bh = blockIdx.x / num_q_tiles;
  const int row0 = q_tile * BR;

  const float* Qg = q + ((size_t)bh * M + row0) * D;
  const float* Kg = k + (size_t)bh * N * D;
  const float* Vg = v + (size_t)bh * N * D;

  load_tile_async<BR, D, QS, T::THREADS>(Qs, Qg, M - row0);
  load_tile_async<BC, D, KS, T::THREADS>(Ks, Kg, N);
  cp_async_commit();

  float o_acc[TM][4 * DV];
  float m_i[TM], l_i[TM];   // running max (score units) and this thread's share of the row sum
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m_i[i] = -INFINITY;
    l_i[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 4 * DV; ++c) o_acc[i][c] = 0.f;
  }

  const int num_kv_tiles = (N + BC - 1) / BC;
  for (int j = 0; j < num_kv_tiles; ++j) {
    const int kv0 = j * BC;

    // K_j (and Q_i on the first trip) has landed for everyone; everyone is done reading V_{j-1}.
    cp_async_wait_all();
    __syncthreads();
    load_tile_async<BC, D, VS, T::THREADS>(Vs, Vg + (size_t)kv0 * D, N - kv0);
    cp_async_commit();

    // S_ij = Q_i K_j^T. Per 4-deep step: TN float4s of K (one per owned column; neighbouring lanes
    // read neighbouring rows, 4 banks apart: conflict-free) and TM float4s of Q (one address per row
    // group: a broadcast), then 4*TM*TN FFMA.
    float s[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int c = 0; c < TN; ++c) s[i][c] = 0.f;
#pragma unroll UNROLL
    for (int d = 0; d < D; d += 4) {
      float4 kf[TN];
#pragma unroll
      for (int c = 0; c < TN; ++c) kf[c] = lds128(Ks + (col_base + c * COL_STEP) * KS + d);
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const float4 qf = lds128(Qs + (row_base + i * ROW_STEP) * QS + d);
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          s[i][c] = fmaf(qf.x, kf[c].x, s[i][c]);
          s[i][c] = fmaf(qf.y, kf[c].y, s[i][c]);
          s[i][c] = fmaf(qf.z, kf[c].z, s[i][c]);
          s[i][c] = fmaf(qf.w, kf[c].w, s[i][c]);
        }
      }
    }

    // Keys past N (only in the last tile) must not take part: -inf gives p = 0 exactly.
    if (kv0 + BC > N) {
#pragma unroll
      for (int c = 0; c < TN; ++c)
        if (kv0 + col_base + c * COL_STEP >= N)
#pragma unroll
          for (int i = 0; i < TM; ++i) s[i][c] = -INFINITY;
    }

    // Online softmax for the TM owned rows; P_ij goes to shared memory as the A operand of P_ij V_j.
    float alpha_i[TM];   // exp(m_old - m_new): how much O_i and l_i shrink
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      float mx = s[i][0];
#pragma unroll
      for (int c = 1; c < TN; ++c) mx = fmaxf(mx, s[i][c]);
#pragma unroll
      for (int off = WC / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_i[i], mx);
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;   // a row with no finite score yet
#if V5_EXP2
      const float alpha = exp2_approx((m_i[i] - m_ref) * score_scale);   // 0 on the first tile
#else
      const float alpha = expf((m_i[i] - m_ref) * score_scale);
#endif
      m_i[i] = m_new;
      float* p_row = Ps + (row_base + i * ROW_STEP) * PS + col_base;
      float row_sum = 0.f;
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        // (s - m) first, then the scale: the subtraction is exact for the scores near the max that
        // dominate the sum, so only one rounding (of the product) reaches the exponent.
#if V5_EXP2
        const float p = exp2_approx((s[i][c] - m_ref) * score_scale);
#else
        const float p = expf((s[i][c] - m_ref) * score_scale);
#endif
        row_sum += p;
        p_row[c * COL_STEP] = p;
      }
      l_i[i] = fmaf(l_i[i], alpha, row_sum);
      alpha_i[i] = alpha;
    }

    // V_j has landed; P_ij is complete; everyone is done reading K_j, so K_{j+1} may overwrite it.
    cp_async_wait_all();
    __syncthreads();
    if (j + 1 < num_kv_tiles) {
      load_tile_async<BC, D, KS, T::THREADS>(Ks, Kg + (size_t)(kv0 + BC) * D, N - kv0 - BC);
      cp_async_commit();
    }

    // O_i = alpha * O_i + P_ij V_j. Per 4-deep step along B_c: TM float4s of P (broadcast per row
    // group), then for each of the 4 keys DV float4s of V (the WC lanes of a row read WC consecutive
    // float4s of one V row: conflict-free), each used for TM*4 FFMA.
    // P_ij V_j is summed into a fresh accumulator and added to O_i once per tile. Summing all N
    // products into one float makes the rounding error grow with N (like sqrt(N) for random data);
    // blocking the sum by tiles makes it grow like sqrt(B_c) + sqrt(N / B_c) instead. It costs no
    // instruction (the rescale of O_i becomes one FFMA instead of one FMUL), only TM*D/WC registers;
    // -DV5_BLOCKED_PV=0 restores the plain sum for tiles that would spill.
#if V5_BLOCKED_PV
    float pv[TM][4 * DV];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int c = 0; c < 4 * DV; ++c) pv[i][c] = 0.f;
#else
    auto& pv = o_acc;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int c = 0; c < 4 * DV; ++c) o_acc[i][c] *= alpha_i[i];
#endif
#pragma unroll UNROLL
    for (int c4 = 0; c4 < BC; c4 += 4) {
      float4 pf[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) pf[i] = lds128(Ps + (row_base + i * ROW_STEP) * PS + c4);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int h = 0; h < DV; ++h) {
          const float4 vf = lds128(Vs + (c4 + kk) * VS + out_base + h * OUT_STEP);
#pragma unroll
          for (int i = 0; i < TM; ++i) {
            const float p = lane_of(pf[i], kk);
            pv[i][4 * h + 0] = fmaf(p, vf.x, pv[i][4 * h + 0]);
            pv[i][4 * h + 1] = fmaf(p, vf.y, pv[i][4 * h + 1]);
            pv[i][4 * h + 2] = fmaf(p, vf.z, pv[i][4 * h + 2]);
            pv[i][4 * h + 3] = fmaf(p, vf.w, pv[i][4 * h + 3]);
          }
        }
      }
    }
#if V5_BLOCKED_PV
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int c = 0; c < 4 * DV; ++c) o_acc[i][c] = fmaf(o_acc[i][c], alpha_i[i], pv[i][c]);
#endif
  }

  // O_i / l_i: finish the row sums across the WC lanes of the row, one reciprocal per row. Rows past
  // M were computed from zero-filled Q rows and are dropped here.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    float l = l_i[i];
#pragma unroll
    for (int off = WC / 2; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    const float inv_l = l == 0.f ? 0.f : 1.f / l;
    const int row = row0 + row_base + i * ROW_STEP;
    if (row < M) {
      float* o_row = o + ((size_t)bh * M + row) * D + out_base;
#pragma unroll
      for (int h = 0; h < DV; ++h)
        *reinterpret_cast<float4*>(o_row + h * OUT_STEP) =
            make_float4(o_acc[i][4 * h + 0] * inv_l, o_acc[i][4 * h + 1] * inv_l,
                        o_acc[i][4 * h + 2] * inv_l, o_acc[i][4 * h + 3] * inv_l);
    }
  }
}

using Tiles64 = Tiles<64, V5_D64_BR, V5_D64_BC, V5_D64_TM, V5_D64_TN>;
using Tiles128 = Tiles<128, V5_D128_BR, V5_D128_BC, V5_D128_TM, V5_D128_TN>;
using Tiles64Small = Tiles<64, V5_D64S_BR, V5_D64S_BC, V5_D64S_TM, V5_D64S_TN>;

// Whether the Small tile should finish first: waves of resident blocks times the rows an SM holds per
// wave, divided by the tile's relative throughput (V5_D64S_SPEED for Small, 1 for Big).
template <class Big, class Small>
bool small_tile_first(int B, int H, int M) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1)
    return false;
  const auto cost = [&](int rows, int per_sm) {
    const long long blocks = (long long)((M + rows - 1) / rows) * B * H, slots = (long long)sms * per_sm;
    return (double)((blocks + slots - 1) / slots) * rows * per_sm;
  };
  return cost(Small::BR, Small::MIN_BLOCKS) * 1000.0 / V5_D64S_SPEED < cost(Big::BR, Big::MIN_BLOCKS);
}

template <class T>
const char* prepare(const void* kernel) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::SMEM_BYTES);
  if (err == cudaSuccess)   // ask for the largest shared-memory carveout so several blocks fit per SM
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <class T>
const char* launch(const float* q, const float* k, const float* v, float* o, int B, int H, int M, int N,
                   cudaStream_t stream) {
  if (M > INT_MAX - T::BR || N > INT_MAX - T::BC) return "v5: M and N must stay below 2^31 - 64";
  const long long num_q_tiles = (M + T::BR - 1) / T::BR;
  const long long blocks = num_q_tiles * B * H;
  if (blocks > INT_MAX) return "v5: B * H * ceil(M / B_r) exceeds the grid limit of 2^31 - 1 blocks";
  const auto kernel = flash_v5_kernel<T, V5_UNROLL>;
  if (const char* err = prepare<T>(reinterpret_cast<const void*>(kernel))) return err;
  // log2(e) / sqrt(D) for exp2, 1 / sqrt(D) for expf
  const float score_scale = (float)((V5_EXP2 ? 1.4426950408889634 : 1.0) / sqrt((double)T::D));
  kernel<<<(unsigned)blocks, T::THREADS, T::SMEM_BYTES, stream>>>(q, k, v, o, M, N, (int)num_q_tiles,
                                                                   score_scale);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Static and run-time facts about one head dim's kernel, for the tile sweep and the book:
// {B_r, B_c, TM, TN, threads, dynamic smem bytes, registers, local (spill) bytes, blocks per SM}.
template <class T>
const char* info(long long* out) {
  const auto kernel = flash_v5_kernel<T, V5_UNROLL>;
  if (const char* err = prepare<T>(reinterpret_cast<const void*>(kernel))) return err;
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel));
  int blocks = 0;
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, T::THREADS, T::SMEM_BYTES);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const long long values[9] = {T::BR, T::BC, T::TM, T::TN, T::THREADS, T::SMEM_BYTES,
                               attr.numRegs, (long long)attr.localSizeBytes, blocks};
  for (int i = 0; i < 9; ++i) out[i] = values[i];
  return nullptr;
}

}  // namespace v5

#if !defined(V5_ONLY_D) || V5_ONLY_D == 64
#define V5_HAS_D64 1
#else
#define V5_HAS_D64 0
#endif
#if !defined(V5_ONLY_D) || V5_ONLY_D == 128
#define V5_HAS_D128 1
#else
#define V5_HAS_D128 0
#endif

static const char* unsupported_head_dim(int D) {
  static thread_local char message[160];
  snprintf(message, sizeof message,
           "v5 is compiled for head_dim 64 and 128 only (got D=%d); flashattn.forward sends other "
           "head dims to v2",
           D);
  return message;
}

// v5 keeps everything on chip: no workspace (the parameter keeps the launcher signature of v0-v4).
size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D) { return 0; }

const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int D,
                                    cudaStream_t stream) {
  if (B < 1 || H < 1 || M < 1 || N < 1) return "v5 needs B, H, M, N >= 1";
  if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)o) % 16 != 0)
    return "v5 copies 16-byte chunks: q, k, v and o must start at 16-byte aligned addresses "
           "(a tensor sliced at an odd offset is not; pass a .clone())";
#if V5_HAS_D64
#if V5_D64_SMALL
  if (D == 64 && v5::small_tile_first<v5::Tiles64, v5::Tiles64Small>(B, H, M))
    return v5::launch<v5::Tiles64Small>(q, k, v, o, B, H, M, N, stream);
#endif
  if (D == 64) return v5::launch<v5::Tiles64>(q, k, v, o, B, H, M, N, stream);
#endif
#if V5_HAS_D128
  if (D == 128) return v5::launch<v5::Tiles128>(q, k, v, o, B, H, M, N, stream);
#endif
  return unsupported_head_dim(D);
}

const char* flash_attention_v5_info(int D, long long* out) {
#if V5_HAS_D64
  if (D == 64) return v5::info<v5::Tiles64>(out);
#endif
#if V5_HAS_D128
  if (D == 128) return v5::info<v5::Tiles128>(out);
#endif
  return unsupported_head_dim(D);
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
// Only the headers the binding uses: <torch/extension.h> would double this file's build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>     // torch::wrap_pybind_function, used by load_inline's module code
#include <torch/csrc/utils/pybind.h>   // at::Tensor <-> torch.Tensor for pybind11
#include <vector>

size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D);
const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int D,
                                    cudaStream_t stream);
const char* flash_attention_v5_info(int D, long long* out);

// q: [B, H, M, D], k and v: [B, H, N, D], contiguous float32 on one CUDA device, D in {64, 128}.
// Returns o like q.
// Messages carry no numbers: on the H200 host (host compiler GCC 13.3, torch 2.11) streaming an integer
// into a TORCH_CHECK message from an extension crashed the process; flashattn's Python checks, which
// run first, give the details.
// `causal` keeps one signature, forward(q, k, v, causal), across every version's binding.
at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal) {
  TORCH_CHECK(!causal, "causal=True is not implemented by this kernel (flashattn.INFO says which versions take it)");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == at::kFloat, name, " must be float32");
    TORCH_CHECK(t->dim() == 4, name, " must have rank 4 [B, H, L, D]");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->numel() > 0, name, " has an empty dimension");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    for (int d = 0; d < 4; ++d)   // the launcher takes int sizes
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k must match q in batch, heads and head_dim");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H, N, D]");
  const int B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = at::empty_like(q);
  auto workspace = at::empty({(int64_t)flash_attention_workspace_bytes(B, H, M, N, D)},
                                q.options().dtype(at::kByte));
  const char* error = flash_attention_forward(q.data_ptr<float>(), k.data_ptr<float>(),
                                              v.data_ptr<float>(), o.data_ptr<float>(),
                                              workspace.data_ptr(), B, H, M, N, D,
                                              c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == nullptr, error);
  return o;
}

// [B_r, B_c, TM, TN, threads, shared bytes, registers, spill bytes, blocks/SM] of the head-dim-D kernel
// on the current device (`python -m flashattn.measure.sweep` records these next to each tile shape's latency).
std::vector<int64_t> kernel_info(int64_t D) {
  long long out[9] = {};
  const char* error = flash_attention_v5_info((int)D, out);
  TORCH_CHECK(error == nullptr, error);
  return std::vector<int64_t>(out, out + 9);
}
#endif
