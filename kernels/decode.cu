// decode: attention against a KV cache for generation -- split-KV ("flash-decoding") on mma.sync, with the
// log-sum-exp merge, grouped-query heads packed into one tile, and a paged cache.
//
// The problem. Generating a token runs attention for one (or a few) new query rows against every key
// and value already in the cache. The arithmetic is two matrix-vector products per head; the cost is
// reading K and V once. Per key and head at D = 128 the kernel reads 512 bytes and does 512 FLOPs, one
// FLOP per byte, two orders of magnitude below the H200's ridge (bf16 tensor-core FLOP/s over DRAM
// bytes/s; the chapter computes it from results/h200/ceilings.json), so the only number that matters is
// how close the kernel runs to the memory system's bandwidth. Two things stand in the way:
//   * parallelism: a forward kernel gives each block a tile of 128 query rows; with one row there is one
//     block per (sequence, head), often fewer blocks than the GPU has SMs (1 sequence x 32 heads = 32
//     blocks for 132 SMs);
//   * bytes in flight: an SM must keep tens of kilobytes of loads outstanding to cover the latency of
//     HBM at full bandwidth.
//
// The design (Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for long-context
// inference", 2023; FlashAttention-2's split-KV kernel):
//   * split the keys: block (sequence b, kv head h, split s) handles a contiguous range of key tiles and
//     writes its partial output O_s (normalized by its own row sums, float32) and its log-sum-exp lse_s;
//     a second kernel merges the splits exactly: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s
//     (or, built with DECODE_FUSED_MERGE, the last split block of each (sequence, kv head) merges them itself).
//     With one split the first kernel writes the output itself and no merge runs;
//   * grouped-query heads: the G = H_q / H_kv query heads that share a kv head are packed as extra rows of
//     one tile (row p = m * G + g for new token m and query head h * G + g), so K and V are read once per
//     group, not G times;
//   * the four warps of a block split each K/V tile between them (16 of its 64 keys each) and keep their
//     own running max m_i, sum l_i and accumulator O_i; they are merged once, through shared memory, at
//     the end. The 16 rows of the mma tile are mostly padding when M * G < 16 (one row in sixteen at
//     M = 1, G = 1): the tensor cores waste 15/16 of their work, which costs nothing here, since they
//     are idle waiting for memory either way;
//   * K_j and V_j stream through a two-stage cp.async ring (16-byte copies, zero-filled past the last
//     key, XOR-swizzled rows as in v6): while a block computes on one 64-key tile (32 KB at D = 128) the
//     next is in flight, and two blocks share an SM. Deeper rings, bulk row copies (cp.async.bulk),
//     an L2 prefetch hint and a third block per SM were all measured and all slower (DECODE_* below;
//     the chapter's variants table): with every SM's copies outstanding the memory system is saturated,
//     and more bytes in flight only lengthen its queues;
//   * paged cache: key j of sequence b lives in page block_table[b][j / page_size], row j % page_size;
//     with pages of whole tiles (a multiple of 64 rows) one lookup serves a tile and is made a tile
//     ahead, otherwise each thread looks its rows' pages up when it issues their copies. The three
//     layouts (contiguous, whole-tile pages, row pages) are three instances of the kernel.
//
// Contract. q [B, M, H_q, D]; k_cache, v_cache [B, max_len, H_kv, D] or, paged, [num_pages, page_size,
//   H_kv, D]; any strides with the last dimension contiguous and 16-byte aligned rows. bf16 or fp16,
//   fp32 accumulation; D in {64, 128}; H_q a multiple of H_kv. seqlens_k [B] int32 (empty: every sequence
//   has max_seqlen_k keys). Sequence b attends to keys [0, L_b). causal=True is bottom-right aligned: new row
//   m sees key j iff j <= L_b - M + m; a row that sees no key gets output 0. The Python entry point
//   (flashattn.attention_with_kvcache) checks every argument, appends new keys and values and picks
//   num_splits; the binding here checks only what keeps a direct call inside its tensors, and the kernel
//   clamps lengths to the cache and page numbers to the pool (what validate=False relies on).
//
// Records: results/h200/decode.json (one record, a `part` per table: the variants below, the split sweep,
// FlashAttention-4, cuDNN and FlashAttention-2 at the same shapes, paged caches, uneven lengths, and the
// kernels' own times under the profiler), results/h200/decode_*_profile.ncu-rep and
// decode_paged_profile*.json (Nsight Compute), results/h200/generation.json (the generation demo); the
// chapter is book/decoding.ipynb. Measured there: pages of 64 and 256 rows within 2% of the contiguous
// cache, once each copy's address stepped from the last instead of being multiplied out (the paged build
// had executed 225 M warp instructions where the contiguous one executed 139 M, and ran 30% slower).
// Missed: one sequence of 32k keys (16 new rows, 32 heads, 8 splits: one wave of blocks, each streaming
// 2 MB) takes 130 us in the split kernel against a floor of 112 us, 86% of the floor's speed, where
// batch8_16k's kernel, whose blocks stream four times as much, reaches 93%. A DECODE_TRACE build timed
// every block (results/h200/decode_timeline.json, flashattn.measure.decode_timeline): the blocks start
// within 0.1 us of each other, the first tile lands after about 4 us, the median block then streams for
// about 120 us (4.45 TB/s for the call's bytes at that pace; batch8_16k's blocks reach 4.59), the last
// block ends about 4 us after the median one stops streaming, and the merge about 4 us after that (the
// lab notes' table: medians of five traced calls). The streaming alone takes most of the 125 us
// target; fusing the merge into the last split's block, the step left, would save its launch gap and part
// of its 2.7 us, not enough by itself. That step is built (DECODE_FUSED_MERGE below, the fused merge's
// section), passes the tests and compute-sanitizer on the H200, and lost: at rows16_32k it took 139.5 us
// against the merge kernel's 135.7 in one interleaved run, and at the other split shapes it was within
// 1.2% of it (results/h200/decode_fused.json, decode_bench's `fused` part). The last block of a group
// merges its 16 rows after streaming its own keys, while the merge kernel spreads every group's rows over
// the whole GPU; we have not traced the fused build to confirm that this is where the time goes. It stays
// a build, off by default.
// Two more steps lost too (results/h200/decode_floor.json, decode_bench's `floor` part, one interleaved run,
// where the default took 135.4 us): splits that take every eighth tile instead of a contiguous run
// (DECODE_INTERLEAVE, 137.1 us), and the splits of a row block as one cluster merging through each other's
// shared memory, with no merge kernel (DECODE_CLUSTER_MERGE, 181.5 us): only 30 of the 32 clusters of 8
// found room at once, so the last two ran as a second wave that started 122-123 us after the first
// (results/h200/decode_timeline_cluster.json). The same run is why we stop here: it also timed reads of the
// same 536 MB that compute nothing. Our kernel with its arithmetic compiled out (DECODE_READ_ONLY) took
// 132.7 us, a plain 16-byte-load read 136.0, bulk-copy reads 144.8 and more, torch.sum 141.5. No read of
// those bytes on this H200 came within 6% of the 125 us target, and the full kernel is 2% behind the
// fastest of them.
//
// Compile-time settings (-D at build time, for the chapter's sweep):
//   DECODE_BC      keys per tile (a multiple of 64: each of the 4 warps takes BC / 4, a multiple of 16)
//   DECODE_STAGES  depth of the ring (>= 2)
//   DECODE_BULK    0: every thread copies 16-byte chunks (cp.async, sm_80+); 1: each thread copies whole
//                  rows with one bulk copy (cp.async.bulk, sm_90+) that completes on a per-stage mbarrier,
//                  into rows padded by 16 bytes instead of swizzled (a bulk copy writes its bytes in order)
//   DECODE_MIN_BLOCKS  blocks per SM the register allocation must allow (__launch_bounds__)
//   DECODE_L2_PREFETCH 0, 128 or 256: the .L2::NB qualifier of the 16-byte copies, which lets L2 fetch that
//                  many bytes around each request from memory at once
//   DECODE_PDL     1 (default): on sm_90, launch the merge kernel as a programmatic dependent of the split
//                  kernel; 0: an ordinary launch after it
//   DECODE_FUSED_MERGE 0 (default): the merge kernel combines the splits; 1: no merge kernel, the split block
//                  that finishes last of its (sequence, kv head, row block) merges them, counting arrivals on
//                  a zeroed int32 buffer that the caller owns (Params::counters; flashattn.decode keeps one)
//   DECODE_INTERLEAVE  0: split s takes a contiguous run of tiles_per_split tiles; 1: it takes tiles s,
//                  s + splits, s + 2 * splits, ... (a head's splits then read neighbouring tiles at any moment)
//   DECODE_CLUSTER_MERGE 1: with 2 to kMaxClusterSplits splits (on sm_90), a row block's splits are one
//                  thread-block cluster and merge in shared memory, with no merge kernel (the cluster merge's
//                  section); more splits keep the merge kernel
//   DECODE_READ_ONLY   1: timing only -- the tiles stream and nothing is computed (the output is 0): what the
//                  kernel's reads alone cost (decode_bench's `floor` part)
//   DECODE_TRACE   1: every block stamps the GPU's global timer as it starts, when its first tile has landed,
//                  after its last tile and as it leaves (the merge kernel's blocks: start and end; with
//                  DECODE_FUSED_MERGE the merging block's end comes after its merge), and the binding `trace`
//                  reads the stamps back (flashattn.measure.decode_timeline)
#include <cstdint>

namespace splitkv {
// One call's arguments, shared by both halves of the file (the binding fills it, the kernels read it).
struct Params {
  const void* q;                        // [B, M, H_q, D]
  const void* k;                        // [B, max_len, H_kv, D] or [num_pages, page_size, H_kv, D]
  const void* v;
  void* o;                              // [B, M, H_q, D], contiguous
  float* o_part;                        // [splits, B, M, H_q, D] (splits > 1)
  float* lse_part;                      // [splits, B, M, H_q]    (splits > 1)
  const int* seqlens_k;                 // [B] or nullptr: every sequence has max_len keys
                                        // (the binding sets max_len to max_seqlen_k then)
  const int* block_table;               // [B, pages_per_seq] or nullptr: contiguous cache
  int64_t q_stride[3];                  // batch, token, head (elements)
  int64_t k_stride[3];                  // batch (page when paged), row, head
  int64_t v_stride[3];
  int block_table_stride;
  int page_size;
  int num_pages;                        // pages in the pool: a page number outside it is clamped
  int B, M, H_q, H_kv, G, max_len;
  int row_blocks;                       // ceil(M * G / kRows)
  int tiles_per_split, splits;
  float scale_log2;                     // softmax scale * log2(e): scores go straight to exp2
  int* counters;                        // [B * H_kv * row_blocks] (DECODE_FUSED_MERGE, splits > 1): zero on
                                        // entry, left zero; last so the other fields keep their offsets
  int cluster;                          // set by the launcher: the splits of a (sequence, kv head, row block)
                                        // are one thread-block cluster and merge through its shared memory
};
}  // namespace splitkv

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <type_traits>

#ifndef DECODE_BC
#define DECODE_BC 64
#endif
#ifndef DECODE_STAGES
#define DECODE_STAGES 2
#endif
#ifndef DECODE_BULK
#define DECODE_BULK 0
#endif
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 2
#endif
#ifndef DECODE_L2_PREFETCH
#define DECODE_L2_PREFETCH 0
#endif
#ifndef DECODE_PDL
#define DECODE_PDL 1
#endif
#ifndef DECODE_FUSED_MERGE
#define DECODE_FUSED_MERGE 0
#endif
#ifndef DECODE_TRACE
#define DECODE_TRACE 0
#endif
#ifndef DECODE_INTERLEAVE
#define DECODE_INTERLEAVE 0
#endif
#ifndef DECODE_READ_ONLY
#define DECODE_READ_ONLY 0
#endif
#ifndef DECODE_CLUSTER_MERGE
#define DECODE_CLUSTER_MERGE 0
#endif

namespace splitkv {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;               // rows of the mma tile: packed (new token, query head of the group)
constexpr int kBarrierBytes = 128;      // the stages' mbarriers, then Q at a 128-byte boundary
// Where a tile's rows live: one cache slot per sequence; pages holding whole tiles (page_size a multiple
// of the tile), one lookup per tile; or smaller pages, one lookup per row.
enum Paging { kContiguous = 0, kTilePages = 1, kRowPages = 2 };


// ---------------------------------------------------------------- PTX wrappers (sm_80+) ----------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte global->shared copy around L1; src_bytes = 0 writes zeros (rows past the last key).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
#if DECODE_L2_PREFETCH == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#elif DECODE_L2_PREFETCH == 128
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}
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
__device__ __forceinline__ void mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// sm_90 bulk copies: an mbarrier counts arrivals and the bytes still expected; its phase flips when both
// reach zero, and waiters poll for the parity of the phase they expect.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
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
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Programmatic dependent launch (sm_90): the split kernel lets the merge kernel be launched while its own
// blocks still run, and the merge kernel waits at its top until the split kernel has finished and its
// writes are visible. What it saves is the gap between the two kernels, not work. A fused build has no
// merge kernel to let in.
__device__ __forceinline__ void launch_dependents() {
#if DECODE_PDL && !DECODE_FUSED_MERGE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_primary() {
#if DECODE_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The fused merge's arrival: add 1 to a counter in global memory, returning the count before, as one atomic
// that is both a release and an acquire at GPU scope (the fused merge's section says why it needs both).
__device__ __forceinline__ int arrive_acq_rel(int* counter) {
  int before;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
  return before;
}

// Thread-block clusters (sm_90; DECODE_CLUSTER_MERGE): a barrier of every thread of every block of the
// cluster, whose release/acquire pair makes each block's shared-memory stores before it visible to the
// others' loads after it, and loads from another block's shared memory (mapa turns this block's address of
// a variable into the address of the same variable in block `rank`).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ uint32_t remote(uint32_t addr, uint32_t rank) {
  uint32_t out = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ float ld_cluster(uint32_t addr) {
  float x = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
#endif
  return x;
}
__device__ __forceinline__ float4 ld_cluster4(uint32_t addr) {
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "r"(addr) : "memory");
#endif
  return x;
}

// 2^x on the special-function unit; ex2.approx(-inf) = +0, which the masking relies on.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// DECODE_TRACE: per block of the last call, its SM and four stamps of the global timer (ns); the merge
// kernel's blocks, from row kTraceRows / 2, two (start and end). Enough rows for the chapter's shapes.
constexpr int kTraceRows = 1 << 14;
constexpr int kTraceCols = 5;
#if DECODE_TRACE
__device__ unsigned long long g_trace[kTraceRows][kTraceCols];
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return id;
}
#define DECODE_STAMP(row, col)                          \
  if (threadIdx.x == 0 && (row) < kTraceRows) {         \
    if ((col) == 1) g_trace[row][0] = smid();           \
    g_trace[row][col] = global_ns();                    \
  }
#else
#define DECODE_STAMP(row, col)
#endif

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

// ---------------------------------------------------------------- the split kernel ---------------------
//
// Shared memory: Q (16 rows) and STAGES x (K_j, V_j) of BC rows, every row D 16-bit elements cut into
// 16-byte chunks, chunk c of row r stored at chunk c ^ (r % 8) (conflict-free ldmatrix, as in v6). After
// the last tile the K/V ring is reused to merge the four warps' partial results.

template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);    // byte offset
}
// K_j and V_j rows: swizzled (16-byte copies), or padded by one chunk (bulk copies write rows in order;
// the pad shifts each row by 4 banks, which keeps ldmatrix free of conflicts too).
template <int D, bool BULK>
__device__ __forceinline__ int kv_offset(int row, int chunk) {
  if constexpr (BULK) return row * (D * 2 + 16) + (chunk << 4);
  return swizzled<D>(row, chunk);
}
template <int D, bool BULK>
__host__ __device__ constexpr int kv_row_bytes() { return BULK ? D * 2 + 16 : D * 2; }

// DECODE_FUSED_MERGE: the split blocks of a (sequence, kv head, row block) merge their splits themselves
// (the fused merge's section, after the merge kernel whose row code it shares).
template <typename T, int D, typename RowOffset>
__device__ __forceinline__ void merge_if_last(const Params& p, int n_rows, RowOffset row_offset);
// DECODE_CLUSTER_MERGE: the splits of a (sequence, kv head, row block) are one cluster; each block leaves its
// normalized rows and their log-sum-exp in its shared memory (`part`, `part_lse`) and the cluster merges them
// (the cluster merge's section, after the fused merge).
template <typename T, int D, typename RowOffset>
__device__ __forceinline__ void merge_in_cluster(const Params& p, const float* part, const float* part_lse,
                                                 int n_rows, RowOffset row_offset);
// Where a block keeps its rows for the cluster merge: past the four warps' partial results in the ring.
template <int D>
__host__ __device__ constexpr int cluster_part_offset() {
  return (kWarps * kRows * (D + 4) + 2 * kWarps * kRows) * 4;
}

template <typename T, int D, int BC, int STAGES, int PAGING, bool CAUSAL, bool BULK>
__global__ void __launch_bounds__(kThreads, DECODE_MIN_BLOCKS) split_kernel(const Params p) {
  constexpr int kChunks = D / 8;                         // 16-byte chunks per row
  constexpr int kTileBytes = BC * kv_row_bytes<D, BULK>();
  constexpr int kKeysPerWarp = BC / kWarps;              // 16 or more, a multiple of 16
  constexpr int kNT = kKeysPerWarp / 8;                  // n8 tiles of S per warp
  constexpr int kRowStep = kThreads / kChunks;           // rows one pass of the block's copies covers
  static_assert(kKeysPerWarp % 16 == 0, "each warp takes a multiple of 16 keys of a tile");
  static_assert(BC % kRowStep == 0, "a tile is a whole number of copy passes");

  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);   // BULK: stage s's copies have landed
  unsigned char* sQ = smem + kBarrierBytes;
  unsigned char* sKV = sQ + kRows * D * 2;               // stage s: K at s * 2 * kTileBytes, V after it

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rb = blockIdx.x % p.row_blocks;
  const int bh = blockIdx.x / p.row_blocks;
  const int b = bh / p.H_kv, h = bh % p.H_kv;
  const int split = blockIdx.y;
  const int rows = p.M * p.G;
  [[maybe_unused]] const int trace_row = blockIdx.y * gridDim.x + blockIdx.x;
  DECODE_STAMP(trace_row, 1)
  const int row0 = rb * kRows;                           // first packed row of this block
  // clamped to the cache: with validate=False nothing else stops a bad length from reading past it
  const int L = p.seqlens_k ? min(max(p.seqlens_k[b], 0), p.max_len) : p.max_len;

  // Keys this block can see at all (the causal limit of its last row) and from where a row may not see
  // every key of a tile (the limit of its first row): tiles before that need no mask.
  const int m_first = row0 / p.G, m_last = (min(row0 + kRows, rows) - 1) / p.G;   // new tokens, first and last
  const int key_end = CAUSAL ? max(0, min(L, L - p.M + m_last + 1)) : L;
  const int mask_from = CAUSAL ? max(0, min(L, L - p.M + m_first + 1)) : L;
  const int n_tiles = (key_end + BC - 1) / BC;
  // This split's steps t_begin .. t_end - 1; step t reads key tile tile(t). By default a split takes a
  // contiguous run of tiles; DECODE_INTERLEAVE gives it every splits-th tile from its own index, so that at
  // any moment a head's splits read neighbouring tiles.
#if DECODE_INTERLEAVE
  const int t_begin = 0;
  const int t_end = split < n_tiles ? (n_tiles - 1 - split) / p.splits + 1 : 0;
  auto tile = [&](int t) { return split + t * p.splits; };
#else
  const int t_begin = split * p.tiles_per_split;
  const int t_end = min(t_begin + p.tiles_per_split, n_tiles);
  auto tile = [](int t) { return t; };
#endif

  // Where packed row r of this block reads q and writes its output: new token m, query head h * G + g.
  auto row_offset = [&](int r) -> int64_t {             // element offset of the row in [B, M, H_q, D]
    const int pr = row0 + r, m = pr / p.G, g = pr % p.G;
    return (static_cast<int64_t>(b) * p.M + m) * p.H_q + h * p.G + g;
  };

  if (t_begin >= t_end) {            // no key for this split: an empty partial (lse = -inf) or zeros
#if DECODE_CLUSTER_MERGE
    if (p.cluster) {                 // the cluster waits for every block, an empty one too
      float* part = reinterpret_cast<float*>(sKV + cluster_part_offset<D>());
      for (int r = tid; r < kRows; r += kThreads) part[kRows * D + r] = -CUDART_INF_F;
      merge_in_cluster<T, D>(p, part, part + kRows * D, min(kRows, rows - row0), row_offset);
      DECODE_STAMP(trace_row, 2)
      DECODE_STAMP(trace_row, 3)
      DECODE_STAMP(trace_row, 4)
      return;
    }
#endif
    if (p.splits > 1) {
      const int64_t part = split * static_cast<int64_t>(p.B) * p.M * p.H_q;
      for (int r = tid; r < kRows && row0 + r < rows; r += kThreads) p.lse_part[part + row_offset(r)] = -CUDART_INF_F;
    } else {
      T* o = static_cast<T*>(p.o);
      for (int i = tid; i < kRows * D; i += kThreads)
        if (row0 + i / D < rows) o[row_offset(i / D) * D + i % D] = from_float<T>(0.f);
    }
#if DECODE_FUSED_MERGE
    if (p.splits > 1) merge_if_last<T, D>(p, min(kRows, rows - row0), row_offset);   // an empty split counts too
#endif
    DECODE_STAMP(trace_row, 2)         // no tile: every stamp of this call, none left from an earlier one
    DECODE_STAMP(trace_row, 3)
    DECODE_STAMP(trace_row, 4)
    return;
  }

  // ---- Q: 16 packed rows (zeros past the last one), issued with the first K/V tile's copies
  const T* q = static_cast<const T*>(p.q);
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, pr = row0 + r;
    const bool valid = pr < rows;
    const T* src = q;
    if (valid) {
      const int m = pr / p.G, g = pr % p.G;
      src = q + b * p.q_stride[0] + m * p.q_stride[1] + (h * p.G + g) * p.q_stride[2] + c * 8;
    }
    cp_async_16(smem_addr(sQ + swizzled<D>(r, c)), src, valid);
  }

  // ---- the K/V ring. Thread tid copies chunk tid % kChunks of rows tid / kChunks + i * kRowStep.
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const int my_chunk = tid % kChunks, my_row = tid / kChunks;
  const uint32_t sKV_addr = smem_addr(sKV);
  // Where row 0 of tile t of (b, h) starts, in elements (`origin`). With pages of whole tiles (kTilePages)
  // a tile lies in one page, `tile_page`, whose number is read one iteration before the tile's copies are
  // issued (`page_ahead` below): read just in time it would be a dependent load in front of every tile's
  // copies. With smaller pages (kRowPages) every row looks its own page up when its copy is issued. Each
  // layout is its own instance of the kernel, so the contiguous and whole-tile loops carry no trace of the
  // others.
  auto page = [&](int n) -> int64_t {   // the pool's page holding page n of sequence b (clamped, as L is)
    return min(max(p.block_table[static_cast<int64_t>(b) * p.block_table_stride + n], 0), p.num_pages - 1);
  };
  auto origin = [&](const int64_t (&stride)[3], int64_t slot, int row) -> int64_t {   // row `row` of a slot
    return slot * stride[0] + static_cast<int64_t>(row) * stride[1] + h * stride[2];
  };
  // Key j (row r of its tile, whose row 0 is at `first`): one lookup per row with small pages.
  auto row_of = [&](const T* base, const int64_t (&stride)[3], int64_t first, int j, int r) -> const T* {
    if constexpr (PAGING == kRowPages)
      return base + page(j / p.page_size) * stride[0] + (j % p.page_size) * stride[1] + h * stride[2];
    return base + first + r * stride[1];
  };
  auto page_of_tile = [&](int t) -> int64_t {
    if constexpr (PAGING == kTilePages) return page(t * BC / p.page_size);
    return 0;
  };
  // A thread's rows of a tile are kRowStep apart: in one slot (a sequence, or a page of whole tiles) its
  // next row's address is the last one's plus a constant, computed once here. Without it each copy's
  // address was its row times the row stride, a 64-bit product per row per tile: in the whole-tile paged
  // instance (whose origin moves by page, not by a multiple of the stride, so the compiler cannot step
  // it) those products outnumbered every other instruction of the loop (Nsight Compute's source counters).
  const int64_t k_first = my_row * p.k_stride[1] + my_chunk * 8, v_first = my_row * p.v_stride[1] + my_chunk * 8;
  const int64_t k_step = kRowStep * p.k_stride[1], v_step = kRowStep * p.v_stride[1];
  auto load_tile = [&](int t, int stage, int64_t tile_page) {
    const uint32_t sK = sKV_addr + stage * 2 * kTileBytes, sV = sK + kTileBytes;
    // tile t's slot and first row in it: sequence b from row t * BC, or its page from the row it starts at
    const int64_t slot = PAGING == kTilePages ? tile_page : b;
    const int row = PAGING == kTilePages ? t * BC % p.page_size : t * BC;
    const int64_t k0 = origin(p.k_stride, slot, row), v0 = origin(p.v_stride, slot, row);
    if constexpr (BULK) {
      // rows i = tid, tid + 128, ... of the 2 * BC rows of K_j then V_j, one bulk copy each; rows past the
      // last key are zeroed by hand. Every thread arrives once per tile, announcing its bytes first.
      uint32_t bytes = 0;
      for (int i = tid; i < 2 * BC; i += kThreads) bytes += t * BC + i % BC < key_end ? D * 2 : 0;
      const uint32_t bar = smem_addr(full + stage);
      for (int i = tid; i < 2 * BC; i += kThreads) {
        const int r = i % BC, j = t * BC + r;
        const uint32_t dst = (i < BC ? sK : sV) + r * kv_row_bytes<D, BULK>();
        if (j >= key_end) {
          for (int c = 0; c < kChunks; ++c)
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst + 16 * c), "r"(0) : "memory");
        }
      }
      mbar_arrive_expect_tx(bar, bytes);
      for (int i = tid; i < 2 * BC; i += kThreads) {
        const int r = i % BC, j = t * BC + r;
        if (j < key_end)
          bulk_copy((i < BC ? sK : sV) + r * kv_row_bytes<D, BULK>(),
                    i < BC ? row_of(kbase, p.k_stride, k0, j, r) : row_of(vbase, p.v_stride, v0, j, r), D * 2, bar);
      }
    } else {
      const T* k_src = kbase + k0 + k_first;
      const T* v_src = vbase + v0 + v_first;
#pragma unroll
      for (int i = 0; i < BC / kRowStep; ++i) {
        const int r = my_row + i * kRowStep, j = t * BC + r;
        const bool valid = j < key_end;
        const int off = swizzled<D>(r, my_chunk);
        if constexpr (PAGING == kRowPages) {
          k_src = row_of(kbase, p.k_stride, 0, j, r) + my_chunk * 8;
          v_src = row_of(vbase, p.v_stride, 0, j, r) + my_chunk * 8;
        }
        cp_async_16(sK + off, valid ? k_src : kbase, valid);
        cp_async_16(sV + off, valid ? v_src : vbase, valid);
        k_src += k_step;
        v_src += v_step;
      }
    }
  };

  if constexpr (BULK) {
    if (tid == 0) {
      for (int s = 0; s < STAGES; ++s) mbar_init(smem_addr(full + s), kThreads);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the copy engine
    }
    __syncthreads();
  }

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {                 // prologue: Q rides with the first group
    if (t_begin + s < t_end) load_tile(tile(t_begin + s), s, page_of_tile(tile(t_begin + s)));
    cp_async_commit();
  }
  int64_t page_ahead = t_begin + STAGES - 1 < t_end ? page_of_tile(tile(t_begin + STAGES - 1)) : 0;
  launch_dependents();                 // the merge kernel may be launched now (DECODE_PDL)

  // ---- per-warp state: rows g = lane / 4 and g + 8 of the tile (mma accumulator layout)
  const int g = lane / 4, qd = lane % 4;
  float m_i[2] = {-CUDART_INF_F, -CUDART_INF_F};         // running max, in log2 units of the scaled scores
  float l_i[2] = {0.f, 0.f};                             // this lane's part of the running sum
  float o_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.f;
  uint32_t q_frag[D / 16][4];
  // Causal limits of this lane's two rows (exclusive), and the key offset of this warp within a tile.
  int row_end[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pr = row0 + g + 8 * i;
    row_end[i] = CAUSAL ? L - p.M + min(pr, rows - 1) / p.G + 1 : L;
  }
  const int warp_key0 = warp * kKeysPerWarp;
  // Lane-constant parts of the ldmatrix addresses: an A operand (and V .trans) reads rows lane % 16,
  // chunk + lane / 16; a K operand reads keys (lane / 16) * 8 + lane % 8, chunk + (lane / 8) % 2.
  const int a_row = lane % 16, a_chunk = lane / 16;
  const int b_row = (lane / 16) * 8 + lane % 8, b_chunk = (lane / 8) % 2;

  for (int t = t_begin; t < t_end; ++t) {
    const int i = t - t_begin;
    if constexpr (BULK) {
      if (t == t_begin) cp_async_wait<0>();              // Q
      mbar_wait(smem_addr(full + i % STAGES), (i / STAGES) & 1);
    } else {
      cp_async_wait<STAGES - 2>();
    }
    __syncthreads();                   // tile t is in; every warp is done with the stage refilled below
    if (t + STAGES - 1 < t_end) load_tile(tile(t + STAGES - 1), (i + STAGES - 1) % STAGES, page_ahead);
    cp_async_commit();
    if (t + STAGES < t_end) page_ahead = page_of_tile(tile(t + STAGES));   // its latency hides behind this tile
    if (t == t_begin) {
      DECODE_STAMP(trace_row, 2)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        ldmatrix_x4(q_frag[ks], smem_addr(sQ + swizzled<D>(a_row, 2 * ks + a_chunk)));
    }
    const unsigned char* sK = sKV + (i % STAGES) * 2 * kTileBytes;
    const unsigned char* sV = sK + kTileBytes;

    if (DECODE_READ_ONLY) continue;    // timing only: the tiles stream, nothing is computed (the output is 0)

    // S = Q_i K_j^T for this warp's keys, in registers
    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, smem_addr(sK + kv_offset<D, BULK>(warp_key0 + np * 16 + b_row, 2 * ks + b_chunk)));
        mma<T>(s[2 * np], q_frag[ks], kf[0], kf[1]);
        mma<T>(s[2 * np + 1], q_frag[ks], kf[2], kf[3]);
      }
    }

    // mask (only on tiles that reach past some row's last key), then the online softmax
    const bool needs_mask = (tile(t) + 1) * BC > mask_from;
    float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, key = tile(t) * BC + warp_key0 + n * 8 + 2 * qd + e % 2;
        float x = s[n][e] * p.scale_log2;
        if (needs_mask && key >= min(row_end[r], key_end)) x = -CUDART_INF_F;
        s[n][e] = x;
        tile_max[r] = fmaxf(tile_max[r], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m_i[r], tile_max[r]);
      // A row that has seen only masked keys keeps m = -inf; subtract 0 then, so exp2 gives 0, not NaN.
      const float base = m_new == -CUDART_INF_F ? 0.f : m_new;
      alpha[r] = ex2(m_i[r] - base);
      m_i[r] = m_new;
      l_i[r] *= alpha[r];
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        s[n][2 * r] = ex2(s[n][2 * r] - base);
        s[n][2 * r + 1] = ex2(s[n][2 * r + 1] - base);
        l_i[r] += s[n][2 * r] + s[n][2 * r + 1];
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o_acc[n][0] *= alpha[0];
      o_acc[n][1] *= alpha[0];
      o_acc[n][2] *= alpha[1];
      o_acc[n][3] *= alpha[1];
    }

    // O_i += P V_j: two neighbouring n8 tiles of S are the A fragment of one k16 slice of P
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp / 16; ++kk) {
      const uint32_t pf[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, smem_addr(sV + kv_offset<D, BULK>(warp_key0 + kk * 16 + a_row, 2 * dp + a_chunk)));
        mma<T>(o_acc[2 * dp], pf, vf[0], vf[1]);
        mma<T>(o_acc[2 * dp + 1], pf, vf[2], vf[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();                     // the ring is free: reuse it to merge the warps
  DECODE_STAMP(trace_row, 3)

  // ---- merge the four warps: each writes m, l and its unnormalized O; then 8 threads per row combine
  constexpr int kOStride = D + 4;                        // floats per row; the pad spreads the banks
  float* sO = reinterpret_cast<float*>(sKV);             // [warp][16][kOStride]
  float* sM = sO + kWarps * kRows * kOStride;            // [warp][16]
  float* sL = sM + kWarps * kRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_i[r] += __shfl_xor_sync(0xffffffffu, l_i[r], 1);
    l_i[r] += __shfl_xor_sync(0xffffffffu, l_i[r], 2);
    if (qd == 0) {
      sM[warp * kRows + g + 8 * r] = m_i[r];
      sL[warp * kRows + g + 8 * r] = l_i[r];
    }
  }
  float* my_o = sO + warp * kRows * kOStride;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    *reinterpret_cast<float2*>(my_o + g * kOStride + n * 8 + 2 * qd) = make_float2(o_acc[n][0], o_acc[n][1]);
    *reinterpret_cast<float2*>(my_o + (g + 8) * kOStride + n * 8 + 2 * qd) = make_float2(o_acc[n][2], o_acc[n][3]);
  }
  __syncthreads();

  constexpr int kPerThread = kRows * D / kThreads;       // 8 (D = 64) or 16 (D = 128) columns of one row
  const int r = tid / (D / kPerThread), c0 = (tid % (D / kPerThread)) * kPerThread;
  if (row0 + r < rows) {             // past the last packed row: nothing to write, but the fused merge's
                                     // barriers below need the whole block
    float m_max = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, sM[w * kRows + r]);
    float weight[kWarps], l_sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      weight[w] = m_max == -CUDART_INF_F ? 0.f : ex2(sM[w * kRows + r] - m_max);
      l_sum += weight[w] * sL[w * kRows + r];
    }
    const float inv_l = l_sum > 0.f ? 1.f / l_sum : 0.f;   // a row that saw no key: output 0
    float out[kPerThread];
#pragma unroll
    for (int c = 0; c < kPerThread; ++c) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) acc += weight[w] * sO[(w * kRows + r) * kOStride + c0 + c];
      out[c] = acc * inv_l;
    }
    const int64_t row = row_offset(r);
#if DECODE_CLUSTER_MERGE
    if (p.cluster) {                 // kept in shared memory for the cluster merge below
      float* part = reinterpret_cast<float*>(sKV + cluster_part_offset<D>());
#pragma unroll
      for (int c = 0; c < kPerThread; c += 4)
        *reinterpret_cast<float4*>(part + r * D + c0 + c) = make_float4(out[c], out[c + 1], out[c + 2], out[c + 3]);
      if (c0 == 0) part[kRows * D + r] = l_sum > 0.f ? (m_max + __log2f(l_sum)) * 0.6931471805599453f : -CUDART_INF_F;
    } else
#endif
    if (p.splits == 1) {
      T* o = static_cast<T*>(p.o) + row * D + c0;
#pragma unroll
      for (int c = 0; c < kPerThread; c += 2)
        *reinterpret_cast<uint32_t*>(o + c) = pack2<T>(out[c], out[c + 1]);
    } else {
      const int64_t part = split * static_cast<int64_t>(p.B) * p.M * p.H_q + row;
      float4* o = reinterpret_cast<float4*>(p.o_part + part * D + c0);
#pragma unroll
      for (int c = 0; c < kPerThread; c += 4) o[c / 4] = make_float4(out[c], out[c + 1], out[c + 2], out[c + 3]);
      // natural log of the row's sum of exp(scaled score): (m + log2 l) / log2(e)
      if (c0 == 0) p.lse_part[part] = l_sum > 0.f ? (m_max + __log2f(l_sum)) * 0.6931471805599453f : -CUDART_INF_F;
    }
  }
#if DECODE_FUSED_MERGE
  if (p.splits > 1) merge_if_last<T, D>(p, min(kRows, rows - row0), row_offset);
#endif
#if DECODE_CLUSTER_MERGE
  if (p.cluster) {
    const float* part = reinterpret_cast<const float*>(sKV + cluster_part_offset<D>());
    merge_in_cluster<T, D>(p, part, part + kRows * D, min(kRows, rows - row0), row_offset);
  }
#endif
  DECODE_STAMP(trace_row, 4)
}

// ---------------------------------------------------------------- the merge kernel ---------------------
//
// One warp per output row: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s. Lane s reads lse_s
// (32 splits at a time) and turns it into its weight, so the partial outputs' loads depend on nothing but
// a shuffle and DECODE_MERGE_UNROLL of them are in flight at once; one at a time, each split's load waited
// for the last. At rows16_32k's eight splits (2 MB) the merge kernel took 3.6 us the old way
// (results/h200/decode.json, anatomy) and 2.7 us this way (results/h200/logs/decode_anatomy_merge.log,
// another run; decode_bench's variant "merge reading one split at a time", DECODE_MERGE_UNROLL=1, is to
// time the two side by side and has not run yet). A split that saw no key has lse_s = -inf and weight 0,
// and its O_s was never written: it is read but never used.
#ifndef DECODE_MERGE_UNROLL
#define DECODE_MERGE_UNROLL 8
#endif
constexpr int kMergeUnroll = DECODE_MERGE_UNROLL;
// One warp merges output row `row` of the partials [splits, rows]. kThisGrid: the partials were written by
// the grid that reads them (the fused merge), so they are loaded at L2 (ld.global.cg); a read-only load
// (ld.global.nc), which the compiler may choose for data that looks constant, need not see stores made by
// other blocks of the same grid.
template <typename T, int D, bool kThisGrid>
__device__ __forceinline__ void merge_row(const float* o_part, const float* lse_part, T* o, int64_t rows, int splits,
                                          int64_t row, int lane) {
  constexpr int kPerLane = D / 32;                       // 2 or 4 columns
  using Vec = std::conditional_t<kPerLane == 4, float4, float2>;
  auto load = [](const auto* at) {
    if constexpr (kThisGrid) return __ldcg(at);
    else return *at;
  };
  float lse_max = -CUDART_INF_F;
  for (int s = lane; s < splits; s += 32) lse_max = fmaxf(lse_max, load(lse_part + s * rows + row));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, off));
  float acc[kPerLane] = {};
  float total = 0.f;
  if (lse_max != -CUDART_INF_F) {
    for (int s0 = 0; s0 < splits; s0 += 32) {
      const float my_w = s0 + lane < splits ? __expf(load(lse_part + (s0 + lane) * rows + row) - lse_max) : 0.f;
      total += my_w;
      const int n = min(32, splits - s0);
#pragma unroll kMergeUnroll
      for (int j = 0; j < n; ++j) {
        const float w = __shfl_sync(0xffffffffu, my_w, j);
        const Vec x = load(reinterpret_cast<const Vec*>(o_part + ((s0 + j) * rows + row) * D + lane * kPerLane));
        const float* xs = reinterpret_cast<const float*>(&x);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) acc[c] += w > 0.f ? w * xs[c] : 0.f;   // never 0 * garbage
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  T* dst = o + row * D + lane * kPerLane;
#pragma unroll
  for (int c = 0; c < kPerLane; c += 2)
    *reinterpret_cast<uint32_t*>(dst + c) = pack2<T>(acc[c] * inv, acc[c + 1] * inv);
}

template <typename T, int D>
__global__ void __launch_bounds__(128) merge_kernel(const float* __restrict__ o_part,
                                                    const float* __restrict__ lse_part, T* __restrict__ o,
                                                    int64_t rows, int splits) {
  wait_for_primary();
  DECODE_STAMP(kTraceRows / 2 + blockIdx.x, 1)
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= rows) return;
  merge_row<T, D, false>(o_part, lse_part, o, rows, splits, row, threadIdx.x % 32);
  DECODE_STAMP(kTraceRows / 2 + blockIdx.x, 2)
}

// ---------------------------------------------------------------- the fused merge ----------------------
//
// DECODE_FUSED_MERGE: no merge kernel. Every split block of a (sequence, kv head, row block) counts itself on
// that group's counter once its partial rows are written, and the block that arrives last, which alone knows
// that every partial is there, merges the group's rows with the merge kernel's row code (one warp per row)
// and sets the counter back to 0 for the next call. This is the last-block pattern of CUDA's
// threadFenceReduction sample (cuda-samples, Samples/2_Concepts_and_Techniques/threadFenceReduction): the
// merge starts the moment the last partial is written, with no second launch to wait for.
//
// Memory ordering: the last block must see every other block's partial stores.
//   * release: __syncthreads() orders all of this block's stores before thread 0's arrival, an atomic add
//     with .acq_rel semantics at GPU scope: its release half makes what precedes it (cumulatively: the whole
//     block's stores, through the barrier) visible to any thread that later acquires the counter;
//   * acquire: the last block's arrival reads the count the others released, and its acquire half orders the
//     block's later loads after their stores; __syncthreads_or() hands that ordering on to the other threads.
// This is the order of cooperative groups' grid sync (a barrier, one thread's ordered atomic, a barrier); a
// __threadfence() before and after a relaxed atomicAdd, the sample's form, is the same pair of fences. The
// partials are then loaded past L1 (merge_row's kThisGrid).
//
// The reset needs no ordering of its own: every block of the group has arrived, so nothing else touches the
// counter in this grid, and the next call's kernel starts after this one has finished.
template <typename T, int D, typename RowOffset>
__device__ __forceinline__ void merge_if_last(const Params& p, int n_rows, RowOffset row_offset) {
  __syncthreads();
  int last = 0;
  if (threadIdx.x == 0) last = arrive_acq_rel(p.counters + blockIdx.x) == p.splits - 1;
  if (!__syncthreads_or(last)) return;
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
  const int64_t rows = static_cast<int64_t>(p.B) * p.M * p.H_q;
  for (int r = threadIdx.x / 32; r < n_rows; r += kWarps)
    merge_row<T, D, true>(p.o_part, p.lse_part, static_cast<T*>(p.o), rows, p.splits, row_offset(r),
                          threadIdx.x % 32);
}

// ---------------------------------------------------------------- the cluster merge --------------------
//
// DECODE_CLUSTER_MERGE: no merge kernel and no partials in global memory. The launcher makes the splits of
// each (sequence, kv head, row block) one thread-block cluster (cluster dims 1 x splits, when splits is at
// most kMaxClusterSplits), so the blocks that share a row block are resident at once on one GPC and can read
// each other's shared memory. Each keeps its normalized rows O_s (float32) and lse_s where the ring was;
// after a cluster barrier, block s of the cluster merges rows s, s + splits, ... (one warp per row, the merge
// kernel's arithmetic, every split's values read from its block's shared memory); a second barrier keeps
// every block resident until the others have read it. An empty split leaves lse_s = -inf, weight 0.
constexpr int kMaxClusterSplits = 8;   // the portable cluster size
static_assert(!(DECODE_CLUSTER_MERGE && DECODE_FUSED_MERGE), "one way to merge the splits");
template <typename T, int D, typename RowOffset>
__device__ __forceinline__ void merge_in_cluster(const Params& p, const float* part, const float* part_lse,
                                                 int n_rows, RowOffset row_offset) {
  constexpr int kPerLane = D / 32;                       // 2 or 4 columns
  cluster_sync();                                        // every split's rows are in its shared memory
  const int splits = p.splits, rank = static_cast<int>(cluster_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t lse_addr = smem_addr(part_lse), part_addr = smem_addr(part);
  for (int r = rank + splits * warp; r < n_rows; r += splits * kWarps) {
    const float lse = lane < splits ? ld_cluster(remote(lse_addr + 4 * r, lane)) : -CUDART_INF_F;
    float lse_max = lse;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, off));
    const float my_w = lse_max == -CUDART_INF_F ? 0.f : __expf(lse - lse_max);
    float total = my_w;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
    float acc[kPerLane] = {};
    for (int s = 0; s < splits; ++s) {
      const float w = __shfl_sync(0xffffffffu, my_w, s);
      if (w == 0.f) continue;                            // an empty split: its rows were never written
      const uint32_t at = remote(part_addr + 4 * (r * D + lane * kPerLane), s);
      if constexpr (kPerLane == 4) {
        const float4 x = ld_cluster4(at);
        acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
      } else {
        acc[0] += w * ld_cluster(at), acc[1] += w * ld_cluster(at + 4);
      }
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    T* dst = static_cast<T*>(p.o) + row_offset(r) * D + lane * kPerLane;
#pragma unroll
    for (int c = 0; c < kPerLane; c += 2)
      *reinterpret_cast<uint32_t*>(dst + c) = pack2<T>(acc[c] * inv, acc[c + 1] * inv);
  }
  cluster_sync();                                        // no block leaves while another reads its rows
}

// ---------------------------------------------------------------- launch -------------------------------

// Whether a call with `splits` splits merges them in clusters (DECODE_CLUSTER_MERGE builds): then the binding
// allocates no partials.
constexpr bool cluster_merges(int splits) { return DECODE_CLUSTER_MERGE && splits > 1 && splits <= kMaxClusterSplits; }

template <typename T, int D, int PAGING, bool CAUSAL>
const char* launch(const Params& p, bool pdl, cudaStream_t stream) {
  constexpr int BC = DECODE_BC, STAGES = DECODE_STAGES;
  constexpr bool BULK = DECODE_BULK != 0;
  static_assert(STAGES >= 2, "the ring needs at least two stages");
  constexpr size_t kRing = size_t(STAGES) * 2 * BC * kv_row_bytes<D, BULK>();
  constexpr size_t kMerge = size_t(kWarps) * kRows * (D + 4) * 4 + 2 * kWarps * kRows * 4;
  static_assert(8 * STAGES <= kBarrierBytes, "room for one mbarrier per stage");
  constexpr size_t kClusterMerge = DECODE_CLUSTER_MERGE ? cluster_part_offset<D>() + (kRows * D + kRows) * 4 : 0;
  constexpr size_t kEnd = kMerge > kClusterMerge ? kMerge : kClusterMerge;   // what the ring is reused for
  constexpr size_t kSmem = kBarrierBytes + kRows * D * 2 + (kRing > kEnd ? kRing : kEnd);
  auto kernel = split_kernel<T, D, BC, STAGES, PAGING, CAUSAL, BULK>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const dim3 grid(static_cast<unsigned>(p.B) * p.H_kv * p.row_blocks, p.splits);
  if (DECODE_CLUSTER_MERGE && pdl && cluster_merges(p.splits)) {   // (pdl: an sm_90 device) a cluster per row block
    Params pc = p;
    pc.cluster = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = 1;
    cluster[0].val.clusterDim.y = static_cast<unsigned>(p.splits);
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
    err = cudaLaunchKernelEx(&config, kernel, pc);
    if (err == cudaSuccess) err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
  kernel<<<grid, kThreads, kSmem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if constexpr (!DECODE_FUSED_MERGE) {   // fused: the split kernel has merged already (and has no merge kernel)
    if (p.splits > 1) {
      const int64_t rows = static_cast<int64_t>(p.B) * p.M * p.H_q;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(static_cast<unsigned>((rows + 3) / 4));
      config.blockDim = dim3(128);
      config.stream = stream;
      cudaLaunchAttribute dependent[1];
      dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      dependent[0].val.programmaticStreamSerializationAllowed = 1;
      config.attrs = dependent;
      config.numAttrs = DECODE_PDL && pdl ? 1 : 0;
      err = cudaLaunchKernelEx(&config, merge_kernel<T, D>, static_cast<const float*>(p.o_part),
                               static_cast<const float*>(p.lse_part), static_cast<T*>(p.o), rows, p.splits);
      if (err == cudaSuccess) err = cudaGetLastError();
      if (err != cudaSuccess) return cudaGetErrorString(err);
    }
  }
  return nullptr;
}

template <typename T>
const char* dispatch(const Params& p, int D, bool causal, bool pdl, cudaStream_t stream) {
  const Paging paging = p.block_table == nullptr            ? kContiguous
                        : p.page_size % DECODE_BC == 0 ? kTilePages
                                                       : kRowPages;
#define DECODE_CAUSAL(DIM, PAGING) \
  return causal ? launch<T, DIM, PAGING, true>(p, pdl, stream) : launch<T, DIM, PAGING, false>(p, pdl, stream);
#define DECODE_CASE(DIM)                                   \
  if (D == DIM) {                                          \
    if (paging == kTilePages) DECODE_CAUSAL(DIM, kTilePages) \
    if (paging == kRowPages) DECODE_CAUSAL(DIM, kRowPages)   \
    DECODE_CAUSAL(DIM, kContiguous)                        \
  }
  DECODE_CASE(64)
  DECODE_CASE(128)
#undef DECODE_CASE
#undef DECODE_CAUSAL
  return "decode supports head_dim 64 and 128 only";
}

}  // namespace splitkv

size_t decode_tile_keys() { return DECODE_BC; }
bool decode_fused_merge() { return DECODE_FUSED_MERGE != 0; }
bool decode_cluster_merges(int splits) {   // on this device (clusters need sm_90)
  if (!splitkv::cluster_merges(splits)) return false;
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major >= 9;
}

// DECODE_TRACE builds: the stamps of the last call, [kTraceRows][kTraceCols] into `host`; otherwise no rows.
int decode_trace_rows() { return DECODE_TRACE ? splitkv::kTraceRows : 0; }
const char* decode_read_trace(unsigned long long* host) {
#if DECODE_TRACE
  const cudaError_t err = cudaMemcpyFromSymbol(host, splitkv::g_trace, sizeof(splitkv::g_trace));
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
#else
  (void)host;
  return "this build of decode.cu has no trace (build it with -DDECODE_TRACE=1)";
#endif
}

// dtype: 0 = bfloat16, 1 = float16. Returns nullptr or a message.
const char* decode_forward(splitkv::Params p, int dtype, int D, bool causal, cudaStream_t stream) {
  int dev = 0, major = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major < 8) return "decode needs a GPU of compute capability 8.0 or newer (mma.sync bf16, ldmatrix, cp.async)";
  switch (dtype) {
    case 0: return splitkv::dispatch<__nv_bfloat16>(p, D, causal, major >= 9, stream);
    case 1: return splitkv::dispatch<__half>(p, D, causal, major >= 9, stream);
    default: return "decode: dtype must be bfloat16 or float16";
  }
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>


size_t decode_tile_keys();
bool decode_fused_merge();
bool decode_cluster_merges(int splits);
int decode_trace_rows();
const char* decode_read_trace(unsigned long long* host);
const char* decode_forward(splitkv::Params p, int dtype, int D, bool causal, cudaStream_t stream);

// Keys per tile of this build: flashattn.decode sizes the splits in whole tiles.
int64_t tile_keys() { return static_cast<int64_t>(decode_tile_keys()); }

// A DECODE_TRACE build's stamps of the last call: int64 [rows, 5] on the CPU, per split-kernel block (row
// blockIdx.y * gridDim.x + blockIdx.x) its SM, then the global timer in ns at its start, when its first
// tile had landed, after its last tile and at its end; the merge kernel's blocks from row rows / 2 (SM,
// start, end). Stamps of blocks the last call did not have are left over from earlier calls.
at::Tensor trace() {
  const int rows = decode_trace_rows();
  auto out = at::zeros({rows, 5}, at::TensorOptions().dtype(at::kLong));
  if (rows == 0) return out;
  const char* err = decode_read_trace(reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()));
  TORCH_CHECK(err == nullptr, err);
  return out;
}

// q [B, M, H_q, D]; k_cache, v_cache [B, max_len, H_kv, D] or paged [pages, page_size, H_kv, D] with
// block_table [B, pages_per_seq] int32 (an empty tensor: not paged); seqlens_k [B] int32 (empty: every
// sequence has max_seqlen_k keys); max_seqlen_k: the largest length (sizes the splits); num_splits >= 1;
// counters: int32, at least B * H_kv * ceil(M * G / 16) of them, all zero, on q's device (read only by a
// DECODE_FUSED_MERGE build, which leaves them zero; no two calls that may run at once may share them).
// flashattn.attention_with_kvcache checks all of it first, with messages that name values; these checks
// only keep a direct call from reading out of bounds.
at::Tensor decode(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor seqlens_k, at::Tensor block_table,
                  int64_t max_seqlen_k, double scale, bool causal, int64_t num_splits, at::Tensor counters) {
  TORCH_CHECK(q.is_cuda() && k_cache.is_cuda() && v_cache.is_cuda(), "q, k_cache and v_cache must be CUDA tensors");
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4, "q, k_cache and v_cache must have rank 4");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "q must be bfloat16 or float16");
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              "k_cache and v_cache must have q's dtype");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "v_cache must have the shape of k_cache");
  const int64_t D = q.size(3);
  TORCH_CHECK(D == 64 || D == 128, "q: decode supports head_dim 64 and 128 only");
  TORCH_CHECK(k_cache.size(3) == D, "k_cache must have q's head_dim");
  for (const at::Tensor* t : {&q, &k_cache, &v_cache})
    TORCH_CHECK(t->stride(3) == 1 && t->stride(2) % 8 == 0 && t->stride(1) % 8 == 0 && t->stride(0) % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "q, k_cache and v_cache need a contiguous last dimension and 16-byte aligned rows");
  const bool paged = block_table.numel() > 0;
  TORCH_CHECK(!paged || (block_table.scalar_type() == at::kInt && block_table.dim() == 2 &&
                         block_table.size(0) == q.size(0) && block_table.stride(1) == 1 && block_table.is_cuda()),
              "block_table must be int32 [B, pages_per_seq] on the GPU");
  TORCH_CHECK(paged || k_cache.size(0) == q.size(0), "k_cache must have q's batch size");
  const bool lengths = seqlens_k.numel() > 0;
  TORCH_CHECK(!lengths || (seqlens_k.scalar_type() == at::kInt && seqlens_k.numel() == q.size(0) &&
                           seqlens_k.is_contiguous() && seqlens_k.is_cuda()),
              "seqlens_k must be int32 [B] on the GPU");
  TORCH_CHECK(q.size(2) % k_cache.size(2) == 0, "q's heads must be a multiple of k_cache's");
  TORCH_CHECK(max_seqlen_k >= 0, "max_seqlen_k must be >= 0");
  TORCH_CHECK(num_splits >= 1 && num_splits <= 65535, "num_splits must be in 1..65535");

  const c10::cuda::CUDAGuard guard(q.device());
  const int B = q.size(0), M = q.size(1), H_q = q.size(2), H_kv = k_cache.size(2);
  const int G = H_q / H_kv;
  const int row_blocks = (M * G + 15) / 16;
  const int64_t tile = tile_keys();
  const int64_t capacity = paged ? block_table.size(1) * k_cache.size(1) : k_cache.size(1);
  const int64_t n_tiles = (std::max<int64_t>(max_seqlen_k, 1) + tile - 1) / tile;
  const int64_t per_split = (n_tiles + num_splits - 1) / num_splits;
  const int64_t splits = (n_tiles + per_split - 1) / per_split;   // no split is empty for the longest sequence

  const bool counted = decode_fused_merge() && splits > 1;
  TORCH_CHECK(!counted || (counters.scalar_type() == at::kInt && counters.is_contiguous() &&
                           counters.device() == q.device() && counters.numel() >= int64_t(B) * H_kv * row_blocks),
              "counters must be int32 on q's device, contiguous, with at least B * H_kv * ceil(M * G / 16) elements");

  auto o = at::empty({B, M, H_q, D}, q.options());
  at::Tensor o_part, lse_part;
  if (splits > 1 && !decode_cluster_merges(static_cast<int>(splits))) {   // a cluster merges in shared memory
    o_part = at::empty({splits, B, M, H_q, D}, q.options().dtype(at::kFloat));
    lse_part = at::empty({splits, B, M, H_q}, q.options().dtype(at::kFloat));
  }
  splitkv::Params p{};
  p.q = q.data_ptr();
  p.k = k_cache.data_ptr();
  p.v = v_cache.data_ptr();
  p.o = o.data_ptr();
  p.o_part = o_part.defined() ? o_part.data_ptr<float>() : nullptr;
  p.lse_part = o_part.defined() ? lse_part.data_ptr<float>() : nullptr;
  p.seqlens_k = lengths ? seqlens_k.data_ptr<int>() : nullptr;
  p.block_table = paged ? block_table.data_ptr<int>() : nullptr;
  for (int d = 0; d < 3; ++d) {
    p.q_stride[d] = q.stride(d);
    p.k_stride[d] = k_cache.stride(d);
    p.v_stride[d] = v_cache.stride(d);
  }
  p.block_table_stride = paged ? block_table.stride(0) : 0;
  p.page_size = paged ? k_cache.size(1) : 0;
  p.num_pages = paged ? k_cache.size(0) : 0;
  p.B = B, p.M = M, p.H_q = H_q, p.H_kv = H_kv, p.G = G;
  // without per-sequence lengths every sequence has max_seqlen_k keys (an int cache_seqlens, or a full cache)
  p.max_len = static_cast<int>(lengths ? capacity : std::min<int64_t>(max_seqlen_k, capacity));
  p.row_blocks = row_blocks;
  p.tiles_per_split = static_cast<int>(per_split);
  p.splits = static_cast<int>(splits);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.counters = counted ? counters.data_ptr<int>() : nullptr;
  const char* err = decode_forward(p, dtype == at::kBFloat16 ? 0 : 1, static_cast<int>(D), causal,
                                   c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return o;
}
#endif
