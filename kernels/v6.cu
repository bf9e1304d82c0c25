// v6: FlashAttention-2 on tensor cores -- mma.sync, bf16/fp16 with fp32 accumulation, a TF32 mode for
// fp32 inputs, causal masking, head dims 64 and 128.
//
// What changed from v5: the two matrix products of every tile run on tensor cores through inline PTX
// (mma.sync.aligned.m16n8k16 for bf16/fp16, m16n8k8 for TF32) instead of FFMA on CUDA cores. The rest is
// the FlashAttention-2 forward design of the paper's sm80 code:
//   * a block owns B_r query rows (Q_i); each of its 4 warps owns whole 16-row slices of them, so the
//     online-softmax state m_i, l_i and the accumulator O_i live in that warp's registers;
//   * K_j and V_j tiles stream through shared memory, double-buffered with cp.async (16-byte copies,
//     zero-filled past the last key; one barrier per tile), stored with an XOR swizzle (16-byte chunk c
//     of row r is kept at chunk c ^ (r % 8)) so that every ldmatrix is free of bank conflicts;
//   * operands reach the tensor cores through ldmatrix.x4 (K: non-transposed, V: .trans);
//   * S_ij = Q_i K_j^T stays in registers; P_ij is computed there (exp2 with log2(e) * scale folded into
//     one FMA, row max reduced over the 4 lanes of a quad with shuffles) and reused directly as the A
//     operand of P_ij V_j: the accumulator layout of two neighbouring n8 tiles is the A layout of one
//     k16 slice, so P never touches shared memory (TF32: see "P reuse in TF32 mode" below);
//   * causal, and a sliding window: key tiles wholly outside a block's rows' window are never loaded (the
//     loop starts at the first tile the block's first row sees and ends after the last one its last row
//     sees); the per-element mask runs only on tiles that cross an edge of the window or the end of the
//     keys.
//
// Contract. q [B, H, M, D], k and v [B, H_kv, N, D] with H a multiple of H_kv, contiguous, one CUDA
//   device, 16-byte aligned. Grouped-query attention: query head h reads kv head h / (H / H_kv), and
//   H_kv = 1 is multi-query attention; with the flat index bh = b * H + h that is kv head bh / group.
//   scale > 0: the softmax scale, o = softmax(scale * q k^T) v (flashattn passes 1/sqrt(D) for
//   scale=None); the launcher folds log2(e) into it once (scale_log2).
//   dtype bf16 or fp16: fp32 accumulation, P rounded to the input dtype for the second product, output
//     in the input dtype.
//   dtype fp32: TF32 mode -- operands rounded to TF32 (cvt.rna), fp32 accumulation, fp32 output.
//     Expect the accuracy of TF32, not of fp32.
//   D in {64, 128}; any M, N >= 1 (M != N allowed); B * H * ceil(M / B_r) < 2^31.
//   causal=True is bottom-right aligned: query row i may attend key j iff j <= i + (N - M). When M > N
//     the first M - N query rows have no key at all; their output is defined as 0 (not NaN).
//   window (window_left, window_right), FlashAttention-2's window_size, aligned the same way: row i may
//     attend key j iff i + (N - M) - window_left <= j <= i + (N - M) + window_right, -1 leaving that side
//     unbounded; causal=True is the window (-1, 0) and sets window_right to 0. A row whose window holds
//     no key outputs 0 too.
//   Needs compute capability 8.0 or newer (mma.sync bf16/tf32, ldmatrix, cp.async); the launcher refuses
//     older GPUs. Build with -gencode=arch=compute_90,code=sm_90 (H100/H200) or _80/_86/_89 for Ampere
//     and Ada.
//
// Tiles (per template instance; override with -D at build time for a sweep, see V6_* macros below):
//   bf16/fp16 D=64 : B_r = 128 (2 m16 slices per warp), B_c = 64, Q kept as A fragments in registers.
//                    smem 16 KB Q + 2 x (8 KB K + 8 KB V) = 48 KB.
//   bf16/fp16 D=128: B_r = 128 (2 m16 slices per warp), B_c = 64 (FlashAttention-2's tile on H100), Q
//                    re-read from shared memory with ldmatrix every tile (128 O accumulators and 64 S
//                    accumulators leave no room for 64 Q registers). smem 32 KB Q + 2 x (16 + 16 KB) = 96 KB.
//   TF32 D=64      : B_r = 64 (1 slice per warp), B_c = 64, Q in registers. smem 16 + 64 = 80 KB.
//   TF32 D=128     : B_r = 64, B_c = 32, Q in registers. smem 32 + 64 = 96 KB.
//   Every instance runs 128 threads and fits 2 blocks per SM on sm_90 (<= 113 KB smem, <= 255 regs);
//   none spills (ptxas; results/compile/resources.json).
//   Why 2 m16 slices per warp: each K/V fragment then feeds two mma, which halves the shared-memory
//   traffic per mma; an SM reads far fewer shared-memory bytes per clock than its tensor cores want at
//   16 rows per warp. Register arithmetic per thread: O = WM*D/2, S = WM*B_c/2, Q = WM*D/4 (16-bit) or
//   WM*D/2 (TF32) 32-bit registers.
//   Why B_c = 64 fits at D=128: P is rounded and packed to 16 bits as soon as it is computed (S's fp32
//   registers die at the softmax, not during P V), and cp.async addresses are a per-thread base plus
//   constants, checked only on the last tile. With 64 keys per tile the mma chains have more independent
//   work between dependent products, and the per-tile costs (barrier, softmax bookkeeping, Q re-read) are
//   paid once per 64 keys.
//
// The chapter's steps: the V6_P_SMEM, V6_SMEM_LAYOUT, V6_LDMATRIX, V6_BARRIERS and V6_D*_STAGES macros
// below rebuild this file as it was before each change, one switch per step (python -m
// flashattn.measure.sweep v6-steps times them). For the file with every switch at its default and the
// branches resolved: python -m flashattn.measure.kernel_source v6.
//
// Training: forward_lse(q, k, v, causal, scale, window_left, window_right) returns (o, lse) with lse
// float32 [B, H, M], the natural log of row i's softmax denominator in units of the scaled scores,
// lse_i = m_i * scale + ln(l_i) (-inf for a row that sees no key). kernels/v6_backward.cu recomputes P
// from it. It is a separate template instance (WITH_LSE), so forward() runs the same machine code as
// before; o is bit-identical between the two.
//
// P reuse in TF32 mode: the m16n8k8 TF32 A fragment wants, in lane (g, q), columns q and q+4 of the
// k8 slice, while the accumulator of an n8 tile gives that lane columns 2q and 2q+1. Because the k index
// of an mma is only a summation index, the kernel permutes it: mma k-slot q <-> key 2q, k-slot q+4 <->
// key 2q+1, and reads V rows in the same permuted order. So P stays in registers here too, no shuffles.
//
// Results: results/h200/bench.json, bench_v6.json and bench_v6_repeat.json (python -m
// flashattn.measure.bench), the tile sweeps results/h200/v6_sweep*.json, the steps
// results/h200/v6_steps.json, the accuracy results/h200/v6_accuracy.json, the profiles
// results/h200/flash_v6_*_profile.*; the chapter is book/v6.ipynb (docs/v6_design.md, docs/v6_notes.md).
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <cmath>

// Tile choices for bf16/fp16 (TF32 is fixed in dispatch_d below):
//   WM     m16 slices per warp, so B_r = 64 * WM;
//   BC     keys per tile, B_c;
//   QKS    how many of Q_i's k steps (16 columns each) stay in registers as A fragments; the rest is
//          re-read from shared memory on every tile;
//   STAGES K/V buffers in the cp.async pipeline;
//   LAZY   1: skip the O_i rescale on tiles where no row's running max moved (exact); 0: rescale every
//          tile. Lazy won at D=128 and lost at D=64 (results/h200/v6_sweep_lazy.json), so bf16/fp16
//          D=64 rescales every tile.
#ifndef V6_D64_LAZY
#define V6_D64_LAZY 0
#endif
#ifndef V6_D128_LAZY
#define V6_D128_LAZY 1
#endif
#ifndef V6_D64_WM
#define V6_D64_WM 2
#endif
#ifndef V6_D64_BC
#define V6_D64_BC 64
#endif
#ifndef V6_D64_QKS
#define V6_D64_QKS 4
#endif
#ifndef V6_D64_STAGES
#define V6_D64_STAGES 2
#endif
#ifndef V6_D128_WM
#define V6_D128_WM 2
#endif
#ifndef V6_D128_BC
#define V6_D128_BC 64
#endif
#ifndef V6_D128_QKS
#define V6_D128_QKS 0
#endif
#ifndef V6_D128_STAGES
#define V6_D128_STAGES 2
#endif

// The chapter's steps (python -m flashattn.measure.sweep v6-steps), bf16/fp16 only; each default is the final
// kernel, so a build without -D flags is the committed one. TF32 keeps the default code in every step.
//   V6_P_SMEM       1: P_ij is stored to shared memory and reloaded as the A operand of P_ij V_j
//                   (the plain way to feed one mma's output to the next); 0: P_ij stays in registers.
//   V6_SMEM_LAYOUT  how rows of Q_i, K_j, V_j (and P_ij) sit in shared memory: 0 plain row-major,
//                   1 each row padded by 16 bytes, 2 the XOR swizzle described below.
//   V6_LDMATRIX     1: fragments are read with ldmatrix.x4; 0: each thread reads its own fragment
//                   elements with 32-bit loads (16-bit ones for V, whose fragment pairs keys).
//   V6_BARRIERS     1: one barrier per tile, the prefetch issued after it; 2: the prefetch issued first
//                   into the buffer freed by a second barrier at the end of the previous tile.
//   V6_D64_STAGES / V6_D128_STAGES = 1 (above) loads each tile after the previous one is consumed: the
//                   one-buffer loop always needs the two barriers.
#ifndef V6_P_SMEM
#define V6_P_SMEM 0
#endif
#ifndef V6_SMEM_LAYOUT
#define V6_SMEM_LAYOUT 2
#endif
#ifndef V6_LDMATRIX
#define V6_LDMATRIX 1
#endif
#ifndef V6_BARRIERS
#define V6_BARRIERS 1
#endif

namespace v6 {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// ---------------------------------------------------------------- PTX wrappers (sm_80+) ----------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy that bypasses L1. src_bytes = 0 writes 16 zero bytes instead of reading
// (the "zfill" form), which is how rows past the end of Q or K/V become zeros without a branch.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Four 8x8 matrices of 16-bit elements (8 rows of 16 bytes each). Lanes 8i..8i+7 give the row addresses
// of matrix i; afterwards lane l holds, in register i, row l/4 and elements 2(l%4), 2(l%4)+1 of matrix
// i (.trans: column l/4, rows 2(l%4) and 2(l%4)+1).
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

// The per-thread loads of the V6_LDMATRIX=0 step: each lane reads the fragment elements that ldmatrix.x4
// would have handed it. Rows are RSB bytes apart and counted from a tile row that is a multiple of 8, so
// the swizzle term of row r is r % 8; chunks are 16 bytes.
template <int L>
__device__ __forceinline__ int swz(int chunk, int x) { return L == 2 ? chunk ^ x : chunk; }

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
// Two 16-bit elements of different rows into one register (low half first), as a .trans fragment pairs
// two keys of one column.
__device__ __forceinline__ uint32_t lds16x2(uint32_t lo, uint32_t hi) {
  unsigned short a, b;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(a) : "r"(lo));
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(b) : "r"(hi));
  return (uint32_t)a | ((uint32_t)b << 16);
}
template <int RSB, int L>
__device__ __forceinline__ uint32_t lds_word(uint32_t tile, int row, int chunk, int word) {
  return lds32(tile + row * RSB + (swz<L>(chunk, row & 7) << 4) + 4 * word);
}
// A operand (Q_i, P_ij) of the 16 rows at `tile`, chunks c0, c0 + 1: {g, c0}, {g+8, c0}, {g, c0+1}, {g+8, c0+1}.
template <int RSB, int L>
__device__ __forceinline__ void lds_a(uint32_t (&r)[4], uint32_t tile, int c0, int g, int q) {
  r[0] = lds_word<RSB, L>(tile, g, c0, q);
  r[1] = lds_word<RSB, L>(tile, g + 8, c0, q);
  r[2] = lds_word<RSB, L>(tile, g, c0 + 1, q);
  r[3] = lds_word<RSB, L>(tile, g + 8, c0 + 1, q);
}
// B operands of two n8 tiles of K_j (16 keys at `tile`): {g, c0}, {g, c0+1}, then keys g+8.
template <int RSB, int L>
__device__ __forceinline__ void lds_b(uint32_t (&r)[4], uint32_t tile, int c0, int g, int q) {
  r[0] = lds_word<RSB, L>(tile, g, c0, q);
  r[1] = lds_word<RSB, L>(tile, g, c0 + 1, q);
  r[2] = lds_word<RSB, L>(tile, g + 8, c0, q);
  r[3] = lds_word<RSB, L>(tile, g + 8, c0 + 1, q);
}
// B operands of P_ij V_j from V_j (16 keys at `tile`), what ldmatrix .trans gives: register i holds keys
// 2q + 8(i % 2) and the one after, dimension 8(c0 + i / 2) + g.
template <int RSB, int L>
__device__ __forceinline__ void lds_v(uint32_t (&r)[4], uint32_t tile, int c0, int g, int q) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = 2 * q + 8 * (i & 1), chunk = c0 + (i >> 1);
    r[i] = lds16x2(tile + key * RSB + (swz<L>(chunk, key & 7) << 4) + 2 * g,
                   tile + (key + 1) * RSB + (swz<L>(chunk, (key + 1) & 7) << 4) + 2 * g);
  }
}

// D = A * B + D for one 16x8 tile. A: 4 registers, B: 2 registers, C/D: 4 floats, in the fragment
// layouts of the PTX ISA (lane l: group g = l/4, thread-in-group q = l%4).
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
template <>
__device__ __forceinline__ void mma<float>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Round-to-nearest (ties away) to TF32; the tensor core would otherwise just drop the low 13 bits.
__device__ __forceinline__ uint32_t to_tf32(uint32_t bits) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
  return r;
}
__device__ __forceinline__ uint32_t to_tf32(float x) { return to_tf32(__float_as_uint(x)); }

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

// Two floats -> one register of two 16-bit values; the lower column goes to the low half, as the mma
// fragment layout wants.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T> __device__ __forceinline__ void store2(T* dst, float a, float b);
template <> __device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}
template <> __device__ __forceinline__ void store2<__half>(__half* dst, float a, float b) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ void store2<float>(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

// ---------------------------------------------------------------- shared-memory tiles -----------------
//
// A tile is ROWS rows of D elements, row-major, cut into 16-byte chunks (CPR chunks per row: 8 or 16 for
// 16-bit types, 16 or 32 for fp32). Chunk c of row r is stored at chunk c ^ (r % 8) of that row. An
// ldmatrix phase reads one chunk from each of 8 consecutive rows; with rows a multiple of 128 bytes
// apart, the swizzle sends those 8 chunks to 8 different 16-byte bank groups.

// Issue the cp.async copies of rows [row0, row0 + ROWS) of a [rows, D] matrix; rows past `rows` are
// zero-filled. Consecutive threads take consecutive chunks: thread tid copies chunk c = tid % CPR of
// rows r0 = tid / CPR, r0 + kRowStep, ... . Only the row moves from one copy to the next, so the
// addresses are a per-thread base plus compile-time offsets, and the row check is needed only on a
// tile that crosses the end of the matrix (the last one).
template <int ROWS, int CPR, int L, typename T>
__device__ __forceinline__ void load_tile(T* smem_tile, const T* __restrict__ gmem, int row0, int rows,
                                          int tid) {
  constexpr int kElemsPerChunk = 16 / sizeof(T);
  constexpr int kD = CPR * kElemsPerChunk;
  constexpr int kRowStep = kThreads / CPR;
  static_assert((ROWS * CPR) % kThreads == 0 && kThreads % CPR == 0, "tile must split evenly over the block");
  const int r0 = tid / CPR, c = tid % CPR;
  const uint32_t base = smem_addr(smem_tile);
  const T* src = gmem + (size_t)(row0 + r0) * kD + c * kElemsPerChunk;
  const bool whole = row0 + ROWS <= rows;   // block-uniform
#pragma unroll
  for (int it = 0; it < ROWS * CPR / kThreads; ++it) {
    const int r = r0 + it * kRowStep;
    const bool valid = whole || row0 + r < rows;
    // An out-of-range row still needs a legal address; row 0 of this (batch, head) is one. Layouts
    // (V6_SMEM_LAYOUT): 2 swizzled, 1 one spare chunk per row, 0 plain.
    const uint32_t off = L == 2   ? (uint32_t)(r * CPR + (c ^ (r & 7))) * 16u
                         : L == 1 ? (uint32_t)(r * (CPR + 1) + c) * 16u
                                  : (uint32_t)(r * CPR + c) * 16u;
    cp_async_16(base + off, valid ? src + it * kRowStep * kD : gmem, valid);
  }
}

// ---------------------------------------------------------------- the kernel --------------------------
//
// One block = B_r = 16 * WM * 4 query rows of one (batch, head). Warp w owns rows [16*WM*w, 16*WM*(w+1))
// of the block as WM m16 slices. Per thread (lane l, g = l/4, q = l%4), accumulator element e of
// n8 tile t of slice s sits at row 16s + g + 8*(e/2), column 8t + 2q + e%2.
// CAUSAL: the instance for causal=True and for any sliding window, in which row i sees key j iff
// lo <= j - i <= hi: a band of diagonals, lo = N - M - window_left, hi = N - M + window_right. The
// launcher clamps the window's sides to [0, N] and [0, M], past which they bound nothing, so lo >= -M and
// hi <= N (no bound on that side; causal is lo = -M, hi = N - M), and no sum below can overflow.
template <typename T, int D, int WM, int BC, int QKS, bool CAUSAL, int STAGES, bool LAZY, bool WITH_LSE>
__global__ void __launch_bounds__(kThreads, 2)
    flash_fwd_mma(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                  T* __restrict__ O, float* __restrict__ LSE, int BH, int group, int M, int N, int m_blocks,
                  float scale_log2, int lo, int hi) {
  constexpr bool kTF32 = sizeof(T) == 4;
  constexpr int BR = 16 * WM * kWarps;
  constexpr int CPR = D * (int)sizeof(T) / 16;   // 16-byte chunks per row
  constexpr int ROWB = CPR * 16;                 // bytes per row
  constexpr int KSTEPS = CPR / 2;                // k steps over D: 32 bytes = k16 (16-bit) or k8 (TF32)
  constexpr int NT = BC / 8;                     // n8 tiles of S_ij per slice
  constexpr int DT = D / 8;                      // n8 tiles of O_i per slice
  static_assert(CPR >= 8, "the swizzle needs rows of at least 128 bytes");
  static_assert(BC % 16 == 0 && D % 16 == 0, "tile sizes must be multiples of 16");
  static_assert(QKS >= 0 && QKS <= KSTEPS, "QKS counts k steps of Q kept in registers");
  static_assert(STAGES >= 1, "at least one K/V buffer");
  // The step switches (see V6_P_SMEM above); TF32 always takes the final kernel's code.
  constexpr int LAYOUT = kTF32 ? 2 : V6_SMEM_LAYOUT;
  constexpr bool kLdmatrix = kTF32 || V6_LDMATRIX;
  constexpr bool kPSmem = !kTF32 && V6_P_SMEM;
  constexpr bool kTwoBarriers = STAGES == 1 || (!kTF32 && V6_BARRIERS == 2);
  constexpr int PAD = LAYOUT == 1 ? 16 / (int)sizeof(T) : 0;   // elements of padding per row
  constexpr int LD = D + PAD, RSB = LD * (int)sizeof(T);       // row stride in elements and bytes
  constexpr int RSBP = (BC + PAD) * (int)sizeof(T);            // rows of P_ij (V6_P_SMEM)
  static_assert(!kPSmem || LAYOUT != 2 || BC * sizeof(T) >= 128, "the swizzle needs rows of >= 128 bytes");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);   // [B_r][D]
  T* sK = sQ + BR * LD;                     // STAGES buffers of [B_c][D]
  T* sV = sK + STAGES * BC * LD;            // STAGES buffers of [B_c][D]
  T* sP = sV + STAGES * BC * LD;            // V6_P_SMEM only: [B_r][B_c]

  // Non-causal: consecutive blocks walk the query blocks of one head, so they share K/V in L2.
  // Causal: the longest query blocks (most key tiles) start first, all heads at once, so the short ones
  // fill the tail of the launch instead of extending it.
  int m_block, bh;
  if (CAUSAL) {
    bh = blockIdx.x % BH;
    m_block = m_blocks - 1 - (int)(blockIdx.x / BH);
  } else {
    m_block = blockIdx.x % m_blocks;
    bh = blockIdx.x / m_blocks;
  }
  const int m0 = m_block * BR;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;

  // Grouped-query attention: query head h reads kv head h / group, and with H = group * H_kv that is
  // (b * H + h) / group = b * H_kv + h / group in the flat index.
  const int bh_kv = bh / group;
  const T* Qh = Q + (size_t)bh * M * D;
  const T* Kh = K + (size_t)bh_kv * N * D;
  const T* Vh = V + (size_t)bh_kv * N * D;

  // Key tiles of B_c to visit: [jt_begin, jt_end). Causal or a window: the block's first row sees the
  // lowest keys and its last row the highest, so those two rows bound the tiles.
  const int m_last = min(M, m0 + BR) - 1;
  int jt_begin = 0, jt_end = (N + BC - 1) / BC;
  if (CAUSAL) {
    const long long first_key = (long long)m0 + lo, last_key = (long long)m_last + hi;
    jt_begin = first_key <= 0 ? 0 : (int)(first_key / BC);
    jt_end = last_key < 0 ? 0 : (int)((min((long long)N, last_key + 1) + BC - 1) / BC);
  }

  float o[WM][DT][4];
  float m_i[WM][2], l_i[WM][2];   // per slice and row half (g, g+8): running max (raw score) and sum
#pragma unroll
  for (int s = 0; s < WM; ++s) {
#pragma unroll
    for (int t = 0; t < DT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[s][t][e] = 0.f;
    m_i[s][0] = m_i[s][1] = -INFINITY;
    l_i[s][0] = l_i[s][1] = 0.f;
  }

  if (jt_begin < jt_end) {   // block-uniform: the barriers below are reached by every thread or none
    // Lane-constant parts of the ldmatrix addresses. Every row index used below is (multiple of 8) +
    // (lane & 7), so the swizzle term is always (lane & 7).
    const int x = lane & 7;
    const int a_row = x + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;   // Q (A operand) and V (.trans)
    const int b_row = x + 8 * (lane >> 4), b_chunk = (lane >> 3) & 1;   // K (B operand)
    const uint32_t sQ_addr = smem_addr(sQ) + (uint32_t)((warp * WM * 16 + a_row) * RSB);
    const uint32_t sQ_warp = smem_addr(sQ) + (uint32_t)(warp * WM * 16 * RSB);   // V6_LDMATRIX=0

    // The first QKS k steps of Q_i as A fragments, loaded once; the rest is re-read from shared memory
    // with ldmatrix on every tile (registers are what limits this at D = 128).
    uint32_t q_frag[WM][KSTEPS][4];   // only k steps < QKS are used; the rest is never allocated

    // Pipeline: tile j lives in buffer j % STAGES; STAGES - 1 tiles are in flight while one is read.
    // Every tile is one cp.async commit group (an empty one past the last tile keeps the count uniform);
    // Q_i travels with K_0, V_0.
    load_tile<BR, CPR, LAYOUT>(sQ, Qh, m0, M, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (jt_begin + st < jt_end) {
        load_tile<BC, CPR, LAYOUT>(sK + st * BC * LD, Kh, (jt_begin + st) * BC, N, tid);
        load_tile<BC, CPR, LAYOUT>(sV + st * BC * LD, Vh, (jt_begin + st) * BC, N, tid);
      }
      cp_async_commit();
    }

    // The first QKS k steps of Q_i into registers (call once Q_i has landed).
    auto load_q_frags = [&]() {
#pragma unroll
      for (int s = 0; s < WM; ++s)
#pragma unroll
        for (int ks = 0; ks < QKS; ++ks) {
          if constexpr (kLdmatrix)
            ldmatrix_x4(q_frag[s][ks], sQ_addr + s * 16 * RSB + (swz<LAYOUT>(2 * ks + a_chunk, x) << 4));
          else
            lds_a<RSB, LAYOUT>(q_frag[s][ks], sQ_warp + s * 16 * RSB, 2 * ks, g, q);
          if constexpr (kTF32)
#pragma unroll
            for (int r = 0; r < 4; ++r) q_frag[s][ks][r] = to_tf32(q_frag[s][ks][r]);
        }
    };

    // S = Q_i K_j^T for the K_j tile in buffer kbuf (raw scores; the scale is folded into the exponent
    // later).
    auto qk = [&](float (&acc)[WM][NT][4], int kbuf) {
      const uint32_t sK_tile = smem_addr(sK + kbuf * BC * LD);   // V6_LDMATRIX=0
      const uint32_t sK_addr = smem_addr(sK + kbuf * BC * LD) + (uint32_t)(b_row * RSB);
#pragma unroll
      for (int s = 0; s < WM; ++s)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[s][t][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a_tmp[WM][4];   // k steps past QKS
        if (ks >= QKS) {
#pragma unroll
          for (int s = 0; s < WM; ++s) {
            if constexpr (kLdmatrix)
              ldmatrix_x4(a_tmp[s], sQ_addr + s * 16 * RSB + (swz<LAYOUT>(2 * ks + a_chunk, x) << 4));
            else
              lds_a<RSB, LAYOUT>(a_tmp[s], sQ_warp + s * 16 * RSB, 2 * ks, g, q);
            if constexpr (kTF32)
#pragma unroll
              for (int r = 0; r < 4; ++r) a_tmp[s][r] = to_tf32(a_tmp[s][r]);
          }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          // Matrices: keys 16np+0..7 / chunk 2ks, same keys / chunk 2ks+1, keys +8..15 / 2ks, +8..15 /
          // 2ks+1 -> (b0, b1) of n8 tile 2np, then of tile 2np+1. K rows are the n dimension and are
          // contiguous in k, which is exactly the "col" B layout: no transpose needed.
          uint32_t b[4];
          if constexpr (kLdmatrix)
            ldmatrix_x4(b, sK_addr + np * 16 * RSB + (swz<LAYOUT>(2 * ks + b_chunk, x) << 4));
          else
            lds_b<RSB, LAYOUT>(b, sK_tile + np * 16 * RSB, 2 * ks, g, q);
          if constexpr (kTF32)
#pragma unroll
            for (int r = 0; r < 4; ++r) b[r] = to_tf32(b[r]);
#pragma unroll
          for (int s = 0; s < WM; ++s) {
            const uint32_t(&a)[4] = ks < QKS ? q_frag[s][ks] : a_tmp[s];
            mma<T>(acc[s][2 * np], a, b[0], b[1]);
            mma<T>(acc[s][2 * np + 1], a, b[2], b[3]);
          }
        }
      }
    };

    int buf = 0;   // == (jt - jt_begin) % STAGES
    for (int jt = jt_begin; jt < jt_end; ++jt) {
      // STAGES - 2 groups were committed after tile j's, so this waits for tile j only. The barrier then
      // publishes every thread's copies, and proves that every warp has finished tile j - 1: its buffer
      // is free for the prefetch below. One barrier per tile.
      if constexpr (kTwoBarriers) {
        // V6_BARRIERS=2 or one stage: the barrier at the end of tile j - 1 freed its buffer, so the
        // prefetch goes first; STAGES - 1 groups (this one included) were committed after tile j's.
        const int jn = jt + STAGES - 1, nbuf = buf == 0 ? STAGES - 1 : buf - 1;   // (j - 1) % STAGES
        if (jn < jt_end) {
          load_tile<BC, CPR, LAYOUT>(sK + nbuf * BC * LD, Kh, jn * BC, N, tid);
          load_tile<BC, CPR, LAYOUT>(sV + nbuf * BC * LD, Vh, jn * BC, N, tid);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
      } else {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int jn = jt + STAGES - 1, nbuf = buf == 0 ? STAGES - 1 : buf - 1;   // (j - 1) % STAGES
        if (jn < jt_end) {
          load_tile<BC, CPR, LAYOUT>(sK + nbuf * BC * LD, Kh, jn * BC, N, tid);
          load_tile<BC, CPR, LAYOUT>(sV + nbuf * BC * LD, Vh, jn * BC, N, tid);
        }
        cp_async_commit();
      }

      const int j0 = jt * BC;
      const uint32_t sV_addr = smem_addr(sV + buf * BC * LD) + (uint32_t)(a_row * RSB);
      const uint32_t sV_tile = smem_addr(sV + buf * BC * LD);   // V6_LDMATRIX=0
      if (QKS > 0 && jt == jt_begin) load_q_frags();
      float s_acc[WM][NT][4];
      qk(s_acc, buf);

      // ---- mask: keys past N, and (causal, window) keys outside the window; only tiles that need it ----
      // A tile crosses the window's right edge (causal: the diagonal) if its last key is past the first
      // row's, and its left edge if its first key is before the last row's.
      const bool tail = j0 + BC > N;
      const bool diag = CAUSAL && ((j0 + BC - 1) - m0 > hi || j0 - m_last < lo);
      if (tail || diag) {
#pragma unroll
        for (int s = 0; s < WM; ++s)
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = m0 + (warp * WM + s) * 16 + g + 8 * (e >> 1);
              const int col = j0 + t * 8 + 2 * q + (e & 1);
              if (col >= N || (CAUSAL && outside_band(col, row, lo, hi))) s_acc[s][t][e] = -INFINITY;
            }
      }

      // ---- online softmax, one row half (g or g+8) at a time ----
      float alpha[WM][2];   // exp2 of (old max - new max) per row: the O_i rescale factor
      // 16-bit types: P_ij rounded and packed as soon as it is computed, two keys per register (the
      // pair of columns 2q, 2q+1 of row half h of n8 tile t), so that S_ij's fp32 registers die here
      // rather than during P_ij V_j. TF32 keeps P_ij in s_acc.
      uint32_t p_pack[WM][NT][2];
#pragma unroll
      for (int s = 0; s < WM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = m_i[s][h];
#pragma unroll
          for (int t = 0; t < NT; ++t) mx = fmaxf(mx, fmaxf(s_acc[s][t][2 * h], s_acc[s][t][2 * h + 1]));
          // the four lanes of a quad hold the same row
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row that has seen only masked keys keeps max -inf; subtracting 0 instead of -inf keeps
          // every exponent at -inf (p = 0, alpha = 0) rather than NaN.
          const float m_base = mx == -INFINITY ? 0.f : mx * scale_log2;
          // An unchanged max gives alpha = 1 exactly (computing it could round to 1 +- 1 ulp).
          alpha[s][h] = mx == m_i[s][h] ? 1.f : ex2(m_i[s][h] * scale_log2 - m_base);
          m_i[s][h] = mx;
          float row_sum = 0.f;
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const float p0 = ex2(fmaf(s_acc[s][t][2 * h], scale_log2, -m_base));
            const float p1 = ex2(fmaf(s_acc[s][t][2 * h + 1], scale_log2, -m_base));
            row_sum += p0 + p1;
            if constexpr (kTF32) {
              s_acc[s][t][2 * h] = p0;
              s_acc[s][t][2 * h + 1] = p1;
            } else {
              p_pack[s][t][h] = pack2<T>(p0, p1);
            }
          }
          // l_i stays a per-lane partial sum (this lane's columns); the quad adds them up at the end.
          l_i[s][h] = l_i[s][h] * alpha[s][h] + row_sum;
        }
      // Rescale O_i only when some row of the warp found a new maximum. After the first few tiles
      // the running max rarely moves, so most tiles skip WM*D/2 multiplies per thread; alpha is
      // exactly 1 when the max is unchanged, so skipping changes no bit of the result. The vote keeps
      // the branch uniform across the warp.
      bool moved = false;
#pragma unroll
      for (int s = 0; s < WM; ++s) moved |= (alpha[s][0] != 1.f) | (alpha[s][1] != 1.f);
      if (!LAZY || __any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int s = 0; s < WM; ++s)
#pragma unroll
          for (int t = 0; t < DT; ++t) {
            o[s][t][0] *= alpha[s][0];
            o[s][t][1] *= alpha[s][0];
            o[s][t][2] *= alpha[s][1];
            o[s][t][3] *= alpha[s][1];
          }
      }

      // V6_P_SMEM: P_ij goes to this warp's rows of sP in the accumulator layout (row g or g + 8 of
      // slice s, keys 8t + 2q and 8t + 2q + 1: chunk t, word q) and comes back as A fragments below.
      // Only the warp itself reads its rows, so warp barriers suffice.
      const uint32_t sP_warp = smem_addr(sP) + (uint32_t)(warp * WM * 16 * RSBP);
      const uint32_t sP_addr = sP_warp + (uint32_t)(a_row * RSBP);
      if constexpr (kPSmem) {
        __syncwarp();   // every lane is done reading the previous tile's P_ij
#pragma unroll
        for (int s = 0; s < WM; ++s)
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              sts32(sP_warp + (s * 16 + g + 8 * h) * RSBP + (swz<LAYOUT>(t, g) << 4) + 4 * q, p_pack[s][t][h]);
        __syncwarp();   // this tile's P_ij is visible to the whole warp
      }

      // ---- O_i += P_ij V_j, P_ij straight from the accumulator registers ----
      if constexpr (!kTF32) {
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
          // A fragment of keys [16kk, 16kk+16): rows g / g+8, keys 2q.. (tile 2kk) and 8+2q.. (2kk+1).
          uint32_t p_frag[WM][4];
#pragma unroll
          for (int s = 0; s < WM; ++s) {
            if constexpr (kPSmem) {
              if constexpr (kLdmatrix)
                ldmatrix_x4(p_frag[s], sP_addr + s * 16 * RSBP + (swz<LAYOUT>(2 * kk + a_chunk, x) << 4));
              else
                lds_a<RSBP, LAYOUT>(p_frag[s], sP_warp + s * 16 * RSBP, 2 * kk, g, q);
            } else {
              p_frag[s][0] = p_pack[s][2 * kk][0];
              p_frag[s][1] = p_pack[s][2 * kk][1];
              p_frag[s][2] = p_pack[s][2 * kk + 1][0];
              p_frag[s][3] = p_pack[s][2 * kk + 1][1];
            }
          }
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            // .trans matrices: keys 0..7 / dims 16dp..+7, keys 8..15 / same dims, keys 0..7 / dims
            // +8..15, keys 8..15 / dims +8..15 -> (b0, b1) of n8 tile 2dp, then of tile 2dp+1.
            uint32_t b[4];
            if constexpr (kLdmatrix)
              ldmatrix_x4_trans(b, sV_addr + kk * 16 * RSB + (swz<LAYOUT>(2 * dp + a_chunk, x) << 4));
            else
              lds_v<RSB, LAYOUT>(b, sV_tile + kk * 16 * RSB, 2 * dp, g, q);
#pragma unroll
            for (int s = 0; s < WM; ++s) {
              mma<T>(o[s][2 * dp], p_frag[s], b[0], b[1]);
              mma<T>(o[s][2 * dp + 1], p_frag[s], b[2], b[3]);
            }
          }
        }
      } else {
        // TF32: k8 slice kk = n8 tile kk of S. k-slot q carries key 2q and k-slot q+4 key 2q+1 (see the
        // header), so a = {P[g][2q], P[g+8][2q], P[g][2q+1], P[g+8][2q+1]} = accumulators 0, 2, 1, 3,
        // and b0/b1 are V rows 2q and 2q+1, column g of the n8 tile. ldmatrix.trans moves 16-bit halves,
        // so V is read with plain 4-byte loads; with the swizzle they hit 32 different banks.
        const unsigned char* sVb = reinterpret_cast<const unsigned char*>(sV + buf * BC * D);
#pragma unroll
        for (int kk = 0; kk < BC / 8; ++kk) {
          uint32_t p_frag[WM][4];
#pragma unroll
          for (int s = 0; s < WM; ++s) {
            p_frag[s][0] = to_tf32(s_acc[s][kk][0]);
            p_frag[s][1] = to_tf32(s_acc[s][kk][2]);
            p_frag[s][2] = to_tf32(s_acc[s][kk][1]);
            p_frag[s][3] = to_tf32(s_acc[s][kk][3]);
          }
          const int r0 = kk * 8 + 2 * q;   // (r0 & 7) == 2q, (r0 + 1) & 7 == 2q + 1
#pragma unroll
          for (int t = 0; t < DT; ++t) {
            const int chunk = 2 * t + (g >> 2), within = (g & 3) * 4;
            const float v0 = *reinterpret_cast<const float*>(sVb + r0 * ROWB + ((chunk ^ (2 * q)) << 4) + within);
            const float v1 =
                *reinterpret_cast<const float*>(sVb + (r0 + 1) * ROWB + ((chunk ^ (2 * q + 1)) << 4) + within);
            const uint32_t b0 = to_tf32(v0), b1 = to_tf32(v1);
#pragma unroll
            for (int s = 0; s < WM; ++s) mma<T>(o[s][t], p_frag[s], b0, b1);
          }
        }
      }
      if constexpr (kTwoBarriers) __syncthreads();   // every warp is done with this tile's buffer
      buf = buf + 1 == STAGES ? 0 : buf + 1;
    }
  }

  // ---- O_i / l_i, written straight from registers (each quad writes 16 or 32 contiguous bytes) ----
  // The query head bh, for O and lse. Causal training forward before sm_90: read again from %ctaid here
  // instead of kept alive through the main loop (which holds bh_kv), at the 255-register limit there
  // (keeping bh cost 116 bytes of spills on sm_80 and sm_89; the volatile read stops the compiler from
  // reusing the first one). sm_90 keeps bh: it fits there.
  int bh_out = bh;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (CAUSAL && WITH_LSE) {
    unsigned cta;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    bh_out = (int)(cta % (unsigned)BH);
  }
#endif
  T* Oh = O + (size_t)bh_out * M * D;
#pragma unroll
  for (int s = 0; s < WM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_i[s][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv_l = l > 0.f ? 1.f / l : 0.f;   // l = 0 only for rows with no allowed key -> 0
      const int row = m0 + (warp * WM + s) * 16 + g + 8 * h;
      if (row < M) {
        T* dst = Oh + (size_t)row * D + 2 * q;
#pragma unroll
        for (int t = 0; t < DT; ++t) store2<T>(dst + t * 8, o[s][t][2 * h] * inv_l, o[s][t][2 * h + 1] * inv_l);
        // What the backward needs to recompute P_ij = exp(S_ij * scale - lse_i) without the running
        // max: lse_i = ln(sum_j exp(S_ij * scale)) = (m_i * scale_log2 + log2(l_i)) * ln(2). A row
        // with no visible key gets -inf (the backward treats it as "P = 0").
        if constexpr (WITH_LSE)
          if (q == 0)
            LSE[(size_t)bh_out * M + row] =
                l > 0.f ? (m_i[s][h] * scale_log2 + __log2f(l)) * 0.6931471805599453f : -INFINITY;
      }
    }
}

// ---------------------------------------------------------------- launcher ----------------------------

template <typename T, int D, int WM, int BC, int QKS, bool CAUSAL, int STAGES, bool LAZY, bool WITH_LSE>
const char* launch(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv,
                   int M, int N, float scale, int lo, int hi, cudaStream_t stream) {
  constexpr int BR = 16 * WM * kWarps;
  // Q_i + STAGES x (K_j, V_j), rows padded by 16 bytes in the V6_SMEM_LAYOUT=1 step, + P_ij for V6_P_SMEM
  constexpr bool kTF32 = sizeof(T) == 4;
  constexpr int PAD = !kTF32 && V6_SMEM_LAYOUT == 1 ? 16 / (int)sizeof(T) : 0;
  constexpr size_t smem = (size_t)(BR + 2 * STAGES * BC) * (D + PAD) * sizeof(T) +
                          (!kTF32 && V6_P_SMEM ? (size_t)BR * (BC + PAD) * sizeof(T) : 0);
  auto kernel = flash_fwd_mma<T, D, WM, BC, QKS, CAUSAL, STAGES, LAZY, WITH_LSE>;

  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if ((size_t)optin < smem) return "v6: this GPU has too little shared memory per block for this tile";
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);

  const int m_blocks = (M + BR - 1) / BR;
  const long long BH = (long long)B * H;
  const long long blocks = (long long)m_blocks * BH;
  if (blocks > 0x7fffffffLL) return "v6: B * H * ceil(M / B_r) must be below 2^31";
  const float scale_log2 = scale * 1.4426950408889634f;   // log2(e) * scale
  kernel<<<(unsigned)blocks, kThreads, smem, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                        static_cast<const T*>(v), static_cast<T*>(o),
                                                        lse, (int)BH, H / H_kv, M, N, m_blocks, scale_log2, lo,
                                                        hi);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// WITH_LSE: the instance that also writes lse (training); the forward-only instance stays as it was.
template <typename T, bool CAUSAL, bool WITH_LSE>
const char* dispatch_d(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                       int H_kv, int M, int N, int D, float scale, int lo, int hi, cudaStream_t stream) {
  constexpr bool kTF32 = sizeof(T) == 4;
  // TF32: one m16 slice per warp, all of Q_i in registers (16 k8 steps at D=128), two stages, lazy.
  if (D == 64) {
    if constexpr (kTF32) return launch<T, 64, 1, 64, 8, CAUSAL, 2, true, WITH_LSE>(q, k, v, o, lse, B, H, H_kv, M,
                                                                                         N, scale, lo, hi,
                                                                                         stream);
    else
      return launch<T, 64, V6_D64_WM, V6_D64_BC, V6_D64_QKS, CAUSAL, V6_D64_STAGES, (V6_D64_LAZY != 0),
                    WITH_LSE>(q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, stream);
  }
  if (D == 128) {
    if constexpr (kTF32) return launch<T, 128, 1, 32, 16, CAUSAL, 2, true, WITH_LSE>(q, k, v, o, lse, B, H, H_kv,
                                                                                         M, N, scale, lo, hi,
                                                                                         stream);
    else
      return launch<T, 128, V6_D128_WM, V6_D128_BC, V6_D128_QKS, CAUSAL, V6_D128_STAGES, (V6_D128_LAZY != 0),
                    WITH_LSE>(q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, stream);
  }
  return "v6 supports head_dim 64 and 128 only";
}

// banded: causal or a window that bounds some row (the CAUSAL instance, see flash_fwd_mma).
template <typename T>
const char* dispatch_causal(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H,
                            int H_kv, int M, int N, int D, bool banded, float scale, int lo, int hi,
                            cudaStream_t stream) {
  if (lse == nullptr)
    return banded ? dispatch_d<T, true, false>(q, k, v, o, nullptr, B, H, H_kv, M, N, D, scale, lo, hi, stream)
                  : dispatch_d<T, false, false>(q, k, v, o, nullptr, B, H, H_kv, M, N, D, scale, lo, hi, stream);
  return banded ? dispatch_d<T, true, true>(q, k, v, o, lse, B, H, H_kv, M, N, D, scale, lo, hi, stream)
                : dispatch_d<T, false, true>(q, k, v, o, lse, B, H, H_kv, M, N, D, scale, lo, hi, stream);
}

}  // namespace v6

// dtype: 0 = bfloat16, 1 = float16, 2 = float32 (TF32 mode). lse: nullptr (forward only) or float32
// [B, H, M]. k and v have H_kv heads, H a multiple of H_kv. window_left, window_right: the sliding window
// (-1: unbounded). Returns nullptr or a message.
const char* v6_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype, int B,
                       int H, int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                       int64_t window_right, cudaStream_t stream) {
  if (B < 1 || H < 1 || M < 1 || N < 1) return "v6: B, H, M and N must all be >= 1";
  if (H_kv < 1 || H % H_kv != 0) return "v6: q's heads must be a multiple of k's heads";
  if (!(scale > 0.f) || !std::isfinite(scale)) return "v6: scale must be a finite number > 0";
  if (D != 64 && D != 128) return "v6 supports head_dim 64 and 128 only";
  int dev = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major < 8)
    return "v6 needs a GPU of compute capability 8.0 or newer (mma.sync bf16/tf32, ldmatrix, cp.async)";
  // The window as the kernel takes it, the band lo <= j - i <= hi (see flash_fwd_mma): causal sets
  // right = 0; -1, or a side that reaches past every key (left >= N) or every row (right >= M), is
  // clamped to N or M, where it bounds nothing. A window that bounds no row runs the unmasked instance.
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > N ? N : (int)window_left;
  const int right = window_right < 0 || window_right > M ? M : (int)window_right;
  const int lo = N - M - left, hi = N - M + right;
  const bool banded = left < N || right < M;
  switch (dtype) {
    case 0: return v6::dispatch_causal<__nv_bfloat16>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi,
                                                       stream);
    case 1: return v6::dispatch_causal<__half>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi, stream);
    case 2: return v6::dispatch_causal<float>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi, stream);
    default: return "v6: dtype must be bfloat16, float16 or float32";
  }
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

const char* v6_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype, int B,
                       int H, int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                       int64_t window_right, cudaStream_t stream);

// q: [B, H, M, D], k and v: [B, H_kv, N, D] with H a multiple of H_kv, contiguous, all bfloat16, all
// float16 or all float32 (TF32 mode), on one CUDA device; D in {64, 128}.
// Messages carry no numbers: on the H200 host (host compiler GCC 13.3, torch 2.11) streaming an integer
// into a TORCH_CHECK message from an extension crashed the process; flashattn's Python checks, which
// run first, give the details.
static void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
              "q must be bfloat16, float16 or float32 (TF32 mode)");
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == dtype, name, " must have the same dtype as q");
    TORCH_CHECK(t->dim() == 4, name, " must have rank 4 [B, H, L, D]");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->numel() > 0, name, " has an empty dimension");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, name,
                " must be 16-byte aligned (the kernel copies 16-byte chunks)");
    for (int d = 0; d < 4; ++d)
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 128, "q: v6 supports head_dim 64 and 128 only");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k must match q in batch and head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H_kv, N, D]");
}

// Runs the kernel into o (and lse when it is defined); scale None means 1/sqrt(D), a window side -1 no
// bound.
static void run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o,
                        float* lse, bool causal, std::optional<double> scale, int64_t window_left,
                        int64_t window_right) {
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(3)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const auto dtype = q.scalar_type();
  const int B = q.size(0), H = q.size(1), H_kv = k.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const int code = dtype == at::kBFloat16 ? 0 : dtype == at::kHalf ? 1 : 2;
  const char* err = v6_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse, code, B, H, H_kv,
                               M, N, D, causal, s, window_left, window_right, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
}

// Returns o like q (same dtype).
at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal, std::optional<double> scale,
                   int64_t window_left, int64_t window_right) {
  check_qkv(q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = at::empty_like(q);
  run_forward(q, k, v, o, nullptr, causal, scale, window_left, window_right);
  return o;
}

// The training forward: (o, lse) with lse float32 [B, H, M], lse_i = ln(sum_j exp(scale * q_i . k_j))
// over the keys row i sees, -inf for a row that sees none. o is bit-identical to forward()'s.
std::tuple<at::Tensor, at::Tensor> forward_lse(at::Tensor q, at::Tensor k, at::Tensor v, bool causal,
                                               std::optional<double> scale, int64_t window_left,
                                               int64_t window_right) {
  check_qkv(q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = at::empty_like(q);
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  run_forward(q, k, v, o, lse.data_ptr<float>(), causal, scale, window_left, window_right);
  return {o, lse};
}
#endif
