// v8 backward: the FlashAttention backward pass on Hopper -- every matrix product on wgmma, Q_i, dO_i and their row
// terms by TMA in a multi-stage mbarrier pipeline fed by a producer warpgroup, setmaxnreg moving registers to the two
// consumer warpgroups. bf16/fp16 with fp32 accumulation, causal masking and sliding windows, grouped-query heads, head
// dims 64, 96 (on 128-wide tiles) and 128. Needs an sm_90a build (-gencode=arch=compute_90a,code=sm_90a) and a GPU of
// compute capability 9.0 (H100, H200). On an H200 every GPU test of tests/test_v8_backward.py and
// tests/test_backward_choice.py passes (1,216), and compute-sanitizer's memcheck, racecheck and synccheck are clean in
// both modes, for this default and the step builds V8B_STAGES=3, V8B_BR80=0 with and without it, and V8B_BR80=0
// V8B_EARLY_DV=1 (results/h200/logs/pytest_br80_default_0e647c9.log, sanitizer_br80_default_0e647c9.log; the default
// V8B_ROW_PREFETCH=4 and its step builds at 2bac294 and f2d19b2: pytest_varlen_2bac294.xml,
// pytest_default_f2d19b2.log, pytest_default_more_f2d19b2.log); before, for
// the builds V8B_EARLY_DV=1, 2 and V8B_STAGES=3 at B_r = 64 (pytest_v8b_early_dv_9bde8ce.log), V8B_BR80=1
// (pytest_br80_fadf861.log, the SASS of this default), and before them (*_l2order_*_wip.log, *_77b169c.log,
// pytest_backward_fixes_506e705.log; the first version's runs: *_f50ce76.log; the deterministic mode's block order of
// ac2747a ran its tests, pytest_v8b_deterministic_ac2747a.log, not the sanitizer; 4195698, which added D=96, ran the
// tests and the three tools at 64, 96 and 128 in both modes: pytest_d96_4195698.log, sanitizer_d96_4195698.log). D=96
// runs D=128's tiles on zero columns (tile_dim, flash_bwd_ws's DG); timed at (1, 32, 4096, 96) in
// results/h200/prefill_wide.json, where FlashAttention-4 took 0.82 to 0.83 of our time. Timed through autograd beside
// V6's backward, cuDNN and FlashAttention-4 in results/h200/bench_backward.json at 8188023, this file's defaults (README:
// "The backward pass against SDPA's backends and FlashAttention-4"), and profiled beside FlashAttention-4's in
// results/h200/flash_{v8,fa4}_backward_s8192_profile.ncu-rep (the first version), the _l2order_ and _early_dv_ reports
// (the steps), and flash_{v8,fa4}_backward_s2048_profile.ncu-rep (D=64); the chapter "The backward on Hopper" and its
// lab notes read them. flashattn trains v7 and v8 on it by default (attention(..., backward="v6_backward") picks V6's
// instead).
//
// What it computes (as kernels/v6_backward.cu, which it replaces for v7's and v8's training).
// With S = Q K^T, P = softmax(S * scale) row by row, O = P V and the incoming gradient dO:
//   dV = P^T dO,   dP = dO V^T,   dS = P o (dP - D_i)   with D_i = rowsum(dO_i o O_i),
//   dQ = scale * dS K,   dK = scale * dS^T Q,
// P recomputed per tile from the forward's log-sum-exp: P_ij = exp2(S_ij * scale * log2(e) - lse_i * log2(e)).
//
// What changed from v6's backward (same algorithm, same K/V-stationary walk, same pre-pass and dQ sum):
//   * the five products are wgmma (warpgroup-wide, async, operands from swizzled shared memory) instead
//     of mma.sync fed by ldmatrix: a consumer warpgroup owns 64 of the block's B_c = 128 keys and computes
//       S^T = K_j Q_i^T and dP^T = V_j dO_i^T, transposed (keys are the wgmma's M: 64 rows per warpgroup;
//         A = its 64 rows of K_j / V_j, B = Q_i / dO_i, both K-major, both straight from the TMA tiles),
//       dV_j += P^T dO_i and dK_j += dS^T Q_i with P^T, dS^T as the A operand *in registers*: the
//         accumulator of S^T is, fragment for fragment, the A operand of an m64 wgmma (the layout v8's
//         forward uses for P V), so P and dS never go through shared memory for these two; B = dO_i / Q_i
//         MN-major (the head dim is contiguous, imm-trans-b = 1), as V_j in the forward;
//       dQ_i += dS K_j needs dS with the queries as M, i.e. the other warpgroup's keys too: each warpgroup
//         stores its dS^T [64 keys][B_r queries] to shared memory (bf16/fp16, 128-byte swizzle, the
//         queries contiguous), the two meet at a named barrier, and each computes half of dQ_i's tile
//         from the whole dS: A = dS read M-major (imm-trans-a = 1) from that tile, B = K_j MN-major;
//   * Q_i, dO_i (2-D TMA boxes, 128-byte swizzle) and lse2_i, D_i (1-D bulk copies of B_r floats) arrive
//     in a ring of V8B_STAGES slots, each with a "full" mbarrier (transaction bytes) and an "empty" one
//     (each of the 256 consumer threads lets go of the slot after its last read of it); K_j, V_j arrive
//     once;
//   * a producer warpgroup whose first thread issues every copy (setmaxnreg.dec to 24 registers), two
//     consumer warpgroups at 240 (setmaxnreg.inc), as in v8's forward at D=128;
//   * within a step the products are issued as commit groups and waited for one at a time: S^T and dP^T
//     (two groups: P is computed while dP^T is still on the tensor cores), then dQ's and dV/dK's (two
//     groups: dQ_i leaves while dV_j, dK_j accumulate);
//   * dQ (V8B_DQ_BULK=1, the default): the consumers store their dQ_i fragments into a shared-memory image
//     of the fp32 accumulator's tile (padded to whole query tiles, so no row test: rows past M add zeros)
//     and arrive on an mbarrier; a second producer thread (warp 1) hands the whole tile to the copy engine,
//     one cp.reduce.async.bulk .add.f32 per step, as v6 on sm_90 and FlashAttention-3 do, then lets the
//     consumers overwrite the image. The tile holds dQ in the consumers' fragment order, which makes the
//     image's stores conflict-free; bwd_convert reads it back in that order, scales and rounds it.
//     V8B_DQ_BULK=0, the first version: 16 red.global.add.v2.f32 per consumer thread and step.
//   * the row terms are padded too: lse2 = +inf and D_i = 0 past M, so a 1-D bulk copy never reads past
//     the end and padded query rows get P = exp2(-inf) = 0 without a mask.
//   GQA, the causal / window band, the pre-pass and the conversion are v6's (one block per key tile of a kv
//   head walks the query tiles of every query head of its group in turn; dK_j, dV_j stay in registers and
//   are written once; no atomics for them). Masks: only the query tiles the band's edges cross (or every
//   tile of a key tile that runs past N) take the masked step, a template copy of the plain one (no branch
//   between a wgmma and its wait); a window's tiles come as masked, plain, masked.
//   Deterministic mode (deterministic=True, V8B_DQ_BULK builds): dK and dV are deterministic already
//   (each written once, from registers); for dQ the writer waits, per (query head, query tile), for a turn
//   counter to reach its key tile's place among those that visit the tile, adds, waits for the addition
//   to land and bumps the counter: the key tiles add in the order of their index, so every element sums in
//   one order. Turns only wait for lower blockIdx, which the GPU starts first (not a CUDA promise, and
//   FlashAttention-3's deterministic mode relies on it too), so they do not deadlock. Its banded kernel at
//   D = 128's tiles is an instance of its own, the row terms loaded after the waits (V8B_DET_ROW_PREFETCH): on
//   the H200 the mode costs 1.03x to 1.17x the default's time at the four target shapes through autograd
//   (results/h200/bench_backward.json at 8188023), 1.25x at (2, 16, 8192, 128) causal before.
//
// Packed batches (flashattn.attention_varlen's backward, flashattn.varlen_kernel): backward_varlen(q, k, v, o,
//   lse, dout, cu_seqlens_q, cu_seqlens_k, causal, deterministic, scale, window_left, window_right) takes
//   FlashAttention-2's varlen layout, q, o, dout [total_q, H, D], k, v [total_k, H_kv, D], lse float32 [H,
//   total_q], int32 lengths on the GPU, which the kernels read themselves: one launch each of bwd_prep_varlen,
//   flash_bwd_varlen and bwd_convert_varlen for the whole batch (built only with -DFLASHATTN_VARLEN=1; the
//   fixed-length kernels keep their machine code, flash_bwd_body being shared). On the H200 its tests, the
//   three sanitizer tools among them, passed (results/h200/logs/pytest_varlen_2bac294.xml), and at the batch
//   of flashattn.measure.varlen_bench it took 3,574 µs against 5,357 µs for this kernel run once per sequence
//   and 3,204 µs for FlashAttention-4's varlen backward (results/h200/varlen.json).
//
// Contract. q, o, dout [B, H, M, D], k, v [B, H_kv, N, D] with H a multiple of H_kv, all bf16 or all fp16,
//   contiguous, 16-byte aligned, one CUDA device; lse float32 [B, H, M] from forward_lse (v6, v7 or v8) with
//   the same scale; dk, dv come out like k, v. D in {64, 96, 128}; any M, N >= 1 (M != N allowed).
//   causal=True is bottom-right aligned as in the forward: query row i sees key j iff j <= i + (N - M); a
//   window (window_left, window_right), -1 leaving a side unbounded, too: row i sees key j iff i + (N - M)
//   - window_left <= j <= i + (N - M) + window_right, and causal sets window_right to 0. A row that sees no
//   key (M > N, or an empty window) gets dQ = 0 and adds nothing to dK, dV; keys no row sees get dK = dV
//   = 0. Needs compute capability 9.0.
//
// Tiles (per head dim; 3 warpgroups = 384 threads, one block per SM):
//   D=128: B_c = 128 keys; B_r = 80 queries without a band, 64 with one (FlashAttention-3's and -4's tiles
//          at this head dim; V8B_BR80 below). B_r = 64: K_j, V_j 2 x 32 KB; Q_i, dO_i 2 stages x 2 x 16 KB;
//          dS^T 2 buffers x 16 KB; lse2, D_i 2 x 2 x 256 B; dQ_i's image 32 KB; barriers: 193 KB + 1 KB to
//          align the base (3 stages: 226 KB; without the image 161 and 194 KB). dQ_i is split by columns:
//          consumer c computes dQ_i[:, 64c .. 64c + 63] (one 64-column panel of K_j). B_r = 80 turns dQ_i's
//          product round (dQ_i^T = K_j^T dS_i^T, consumer c computes head-dim rows 64c .. 64c + 63).
//   D=64 : B_c = 128, B_r = 128 (FlashAttention-3's tile at D=64). Shared memory: K_j, V_j 2 x 16 KB;
//          Q_i, dO_i 2 x 2 x 16 KB; dS^T 2 x 32 KB; row terms 2 x 2 x 512 B; the image 32 KB: 194 KB + 1 KB
//          (3 stages leave no room for the image: 195 KB without it). dQ_i is split
//          by rows: consumer c computes dQ_i[64c .. 64c + 63, :], panel c of the stored dS^T.
//          B_r = 64 at D=64 would leave each consumer 32 of dQ's 64 columns, half a 128-byte swizzle
//          atom of K_j as the B operand (a descriptor start inside an atom, nowhere else used in this
//          project), or both consumers adding a whole 64 x 64 partial dQ (twice the atomics); with B_r =
//          128 both splits are whole panels and each key tile's loop has half the steps.
//   Registers per consumer thread at the widest point (after S^T, dP^T): dK_j and dV_j D/2 floats each, S^T and dP^T
//   B_r/2 each -- 192 at both head dims with B_r = 64 or 128 (128 + 64 at D=128, 64 + 128 at D=64), 208 at B_r = 80;
//   later dQ's 32 floats (40 at B_r = 80) and the packed P^T, dS^T (B_r/4 + B_r/4). Registers: 168 at entry (65,536 /
//   384), producer 24, consumers 240 (24 + 2 x 240 = 504 = 3 x 168), the split of v8's forward at D=128; the consumers
//   fit their share with no spills and no stack frame (tests/test_v8_backward.py checks the split, the waits and what
//   runs between them in the SASS). The dS^T stores (B_r = 64, 128; B_r = 80 stores dS by stmatrix) are 4-byte
//   st.shared that hit 32 distinct banks per instruction (chunk t ^ (key % 8), byte 4q).
//
// Steps taken since the first version, each a switch below, timed on the H200 (the lab notes of "The backward
// on Hopper"): the order of the blocks (V8B_HEAD_GROUP, up to 5%), descriptors made once per tile
// (V8B_DESC_ADD, 0-3%), where dV_j is issued (V8B_EARLY_DV, within 1%), a third slot (V8B_STAGES, none
// faster) and B_r = 80 at D=128 without a mask (V8B_BR80, the default since the chapter's records were
// re-recorded with it: 7-13% less time where it applies, 2-3% in its first, inline version; 12% fewer
// instructions and the tensor pipe 65.6% -> 74.5% busy under Nsight Compute; its tests and the three
// sanitizer tools passed on the H200, results/h200/logs/pytest_br80_fadf861.log) and lse2_i's loads issued
// before a step's wgmmas where the registers allow (V8B_ROW_PREFETCH=3: 4% less time with the mask at D=128,
// the same elsewhere, results/h200/logs/rows_step_*.md; the default from cf241d2), then D_i's loaded after
// P^T's exponentials beside them (V8B_ROW_PREFETCH=4, the default since 2bac294: 3-5% less time than 3 at
// D=64 and with the mask at D=128, results/h200/logs/rows_step_2bac294.md; gradients bit for bit 3's and
// 0's). Next: fewer integer and uniform instructions per step, and causal scheduling.
//
// Results: results/h200/bench_backward.json and the chapter "The backward on Hopper" (see the top).
// How dQ_i's contribution leaves the block. 1 (default): the consumers store it to a shared-memory image of
// the accumulator's tile and a producer warp adds the whole tile with one bulk reduction
// (cp.reduce.async.bulk .add.f32), which also allows the deterministic mode; 0: every consumer thread adds
// its 32 floats with 16 red.global.add.v2.f32 (the first version). Where the image does not fit next to
// V8B_STAGES slots (D=64 with 3 stages) the kernel falls back to 0.
#ifndef V8B_DQ_BULK
#define V8B_DQ_BULK 1
#endif
#ifdef __CUDACC__
#include <cuda.h>            // CUtensorMap and its enums only: the encoder is fetched at run time
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <type_traits>

// Q_i / dO_i / row-term slots in shared memory (at least 2: the producer fills slot u + 1 while the
// consumers compute on slot u). 3 fits at both head dims (226 KB at D=128 with dQ's image, 195 KB at D=64,
// where the image no longer fits: Layout below), 4 does not. On the H200 3 was as fast as 2 at D=128 and
// 8-9% slower at D=64, where it loses the image (results/h200/logs/backward_stages_9bde8ce.log).
#ifndef V8B_STAGES
#define V8B_STAGES 2
#endif
// A clock read between P^T's exponentials and the wait for dP^T (a point ptxas schedules nothing across,
// v8's V8_CLOCK_FENCE): without it ptxas hoists that wait above most of the exponentials, and only a
// few of the B_r / 2 per thread run while dP^T is on the tensor cores (the chapter counts them); with it
// all do. Not measured yet (v8's forward found the same fence no faster there, where part of the softmax
// already overlapped); 0 builds the kernel without it (at D = 64 it spills 4 to 8 bytes beside the default
// V8B_ROW_PREFETCH=3, so its tests build it with the row terms loaded after the waits, V8B_ROW_PREFETCH=0).
#ifndef V8B_EXP_FENCE
#define V8B_EXP_FENCE 1
#endif
// The order of the blocks: G kv heads at a time, the key tiles of a group's heads interleaved (heads fastest
// inside the group), group after group. The blocks that run at one time read the Q_i, dO_i and dQ
// accumulator rows of the heads they cover, 8 MiB per kv head at N = 8192 and D = 128: all heads of a large
// batch do not fit in L2, a few do. V8B_HEAD_GROUP -1 (default): G is the most kv heads whose Q, dO and dQ
// accumulator rows fit in half the L2 (l2_head_group below; the other half is left to K_j, V_j, dK_j and dV_j);
// 0: all heads in one group, so consecutive blocks take the same key tile of different heads (the first key
// tiles, which see the most query tiles under the causal mask, start first: the first version's order);
// 1: key tiles first, one head after another; G > 1: G heads. Key tile j of a head always has a higher
// blockIdx than key tile j - 1 of that head, which the deterministic mode's turns rely on. On the H200 the
// default was the fastest order or within 3% of it at the four target shapes, 5% faster than 0 at (2, 16,
// 8192, 128) non-causal, where the DRAM traffic fell from 2.30 TB/s to 0.24 TB/s under Nsight Compute
// (results/h200/logs/backward_order_l2_wip.log, the lab notes of "The backward on Hopper"). The deterministic
// mode suffers from it: its turns let the key tiles of one head add into a query tile only one after another,
// and with few heads at a time most of the running blocks are key tiles of the same head (that they wait on
// each other is our reading, not measured). At (2, 16, 8192, 128) causal it took 1.50x the default's time
// with the L2's group (results/h200/bench_backward.txt at 35a068a) where it took 1.06x with all heads (the
// same record at 77b169c). With all heads in one group it took 1.09x there, but 1.36x non-causal, where the
// L2's group had given 1.03x (results/h200/logs/bench_backward_all_heads_ce8b6f5.txt; the 35a068a record).
// Our reading: a causal key tile j starts at its diagonal query tile, where key tiles 0 .. j - 1 add before it
// and arrive last, so it waits unless other heads fill the GPU. A banded deterministic call takes all heads in
// one group; a non-banded one the L2's.
#ifndef V8B_HEAD_GROUP
#define V8B_HEAD_GROUP -1
#endif
// How a product's shared-memory descriptors are made. 1 (default): one per operand tile, with each k step's
// offset added to its start-address field (opdesc below); 0: make_desc for every wgmma from the operand's
// address (the first version), whose mask and shifts ptxas cannot fold across the k steps, so that a step
// spent more instructions on descriptors than on P^T and dS^T (the chapter's lab notes count them). On the
// H200 1 took 0% to 3% less time than 0 at the four target shapes
// (results/h200/logs/backward_descriptors_916a455.log).
#ifndef V8B_DESC_ADD
#define V8B_DESC_ADD 1
#endif
// V8B_UNIFORM_WG, a candidate (0 by default): the warpgroup index read from lane 0 through a shuffle (CUTLASS's
// canonical_warp_group_idx), so that ptxas knows it is one value per warp and keeps the descriptors made from it
// in uniform registers; 0 (threadIdx.x / 128) leaves them in ordinary registers, copied over (R2UR) before every
// wgmma: 96 copies among the 1,236 SASS instructions of a step at D = 128, 1,027 instructions with 1 (python -m
// flashattn.measure.sass v8_backward). Not faster for that: in two runs on the H200 (python -m
// flashattn.book.backward_hopper_live uniform; results/h200/logs/uniform_16c90d8.md, uniform_run2_1dc6db5.md) 1
// took 3% less time at (4, 12, 2048, 64) and 1-2% less at (2, 16, 8192, 128) causal, 2-3% more at the other two
// shapes, the same both times. Why fewer instructions do not make it faster is not profiled.
#ifndef V8B_UNIFORM_WG
#define V8B_UNIFORM_WG 0
#endif

// When dV_j += P^T dO_i is issued. Otherwise nothing of the consumers' is on the tensor cores while they
// compute dS^T, store it and meet at the named barrier.
//   0: with dK_j, after dQ_i (the first version);
//   1: as soon as P^T is packed, before the wait for dP^T, so that it runs behind dP^T through the whole
//      dS^T phase;
//   2 (default): once dS^T is stored, before the named barrier (FlashAttention-3's and -4's place).
// D=128 only: at D=64 (B_r = 128) the registers are too few. With 1 the packed P^T beside S^T and dP^T
// (B_r / 4 + B_r / 2 + B_r / 2) do not fit the 240: ptxas spills and waits after every wgmma; with 2 the
// banded kernel spills 8 to 32 bytes (with and without V8B_EXP_FENCE). D=64 issues dV_j with dK_j. 1 spills
// at B_r = 80 too (V8B_BR80, the unbanded D=128 kernel: B_r / 4 = 20 packed P^T registers beside S^T and
// dP^T), so it was measured, and is tested, at B_r = 64 (-DV8B_BR80=0).
// On the H200 the three took the same time within 1% at the four target shapes (2 fastest at D=128 by 1%,
// results/h200/logs/backward_dv_9bde8ce.log, where 2 also ran at D=64); under Nsight Compute 1 cut the
// barrier stalls (1.56 -> 0.88 cycles per issued instruction) and not the kernel's duration (4.61 -> 4.63
// ms): the lab notes.
#ifndef V8B_EARLY_DV
#define V8B_EARLY_DV 2
#endif

// The query tile at D=128 without a band (no causal mask, no window). 0: B_r = 64, dQ_i = dS K_j with the
// queries as M (above; the first versions). 1 (default): B_r = 80, FlashAttention-3's and -4's tile there
// (hopper/flash_bwd_launch_template.h): a step covers 25% more queries for the same K_j, V_j, and dQ_i's
// product is turned round, dQ_i^T = K_j^T dS_i^T, so that its M is the head dim (64 per warpgroup) and B_r
// only sets N (wgmma's M is 64 per warpgroup, and 80 is not a multiple of it). dS_i then goes to shared
// memory as [queries][keys] (the K-major B operand, as Q_i is for S^T), stored from the dS^T accumulator by
// stmatrix .trans, and dQ_i^T's fragments go into the image row-major, XOR-swizzled (dq_image_float). The
// banded instances keep B_r = 64, as FlashAttention-3 and -4 do. Shared memory at B_r = 80: K_j, V_j 2 x 32 KB,
// Q_i, dO_i 2 stages x 2 x 20 KB, dS 2 x 20 KB, row terms 2 x 2 x 320 B, dQ_i^T's image 40 KB: 226.3 KB with the 1
// KB to align (3 stages leave no room for the image: 40 red.global per consumer thread and step). Registers
// at the widest point: dK_j, dV_j 64 floats each, S^T, dP^T 40 each, 208 of the 240 (192 at B_r = 64).
#ifndef V8B_BR80
#define V8B_BR80 1
#endif

// Where a step reads its row terms from the slot. 0: lse2_i right after the wait for S^T, D_i right after the
// wait for dP^T, each LDS just before its first use (the waits' "memory" clobber keeps the compiler from
// issuing them earlier), so the FFMAs of P^T wait for them: in Nsight Compute's stall sampling
// (results/h200/logs/br80_stalls_9ceb6de.csv) the consumers' largest stall outside the waits for the tensor
// cores. 1: lse2_i's B_r / 4 floats loaded into registers once S^T and dP^T are issued; 2: D_i's too, after
// P^T's exponentials, into the registers lse2_i's left free. Neither was faster, and in the stall samples
// (results/h200/logs/rows{0,2}_stalls_a755b71.csv) the FFMAs wait as long as before, now all at the first: a
// load issued among the step's wgmmas, which read their operands from shared memory too, comes back no sooner
// (the samples show the wait, not its cause). 3: lse2_i's loaded before any wgmma of the step is issued; at
// D = 64 the FFMAs' short-scoreboard stall is then gone (results/h200/logs/d64_rows{0,3}_stalls_357157b.csv),
// though the time is not shorter there; the banded B_r = 64 tile at D = 128 is faster
// (results/h200/logs/rows_step_*.md, python -m flashattn.book.backward_hopper_live rows). The B_r = 80 tile
// has no room for the 20 registers across the issue (it spills), so it keeps 0. 4 (default): 3's lse2_i and
// 2's D_i, which at D = 64 the FADDs of dS^T wait for on the short scoreboard as the FFMAs of P^T waited for
// lse2_i (11% of the step's samples, results/h200/logs/d64_rows3_stalls_357157b.csv): 3% to 5% less time than
// 3 at D = 64 and in the banded D = 128 kernel in two runs (rows_step_2bac294.md, rows_step_f2d19b2.md; not
// profiled, so why it pays where 3 alone did not is open); B_r = 80 keeps 0 here too.
#ifndef V8B_ROW_PREFETCH
#define V8B_ROW_PREFETCH 4
#endif
// The same choice for the deterministic mode's banded kernel at D = 128's tiles (D = 96 and 128), its own
// instance (the kernels take the placement as a template argument; the default mode's keep theirs). With the
// mask at (2, 16, 8192, 128) the deterministic mode took 2,781 µs with 0, 2,869 with 3 and 2,946 with 4,
// against 2,339 for the default mode (4), in which 0 is 7% slower (rows_step_f2d19b2.md): the early row terms
// that help one mode cost the other (results/h200/logs/rows_deterministic_2651b6f.md; not profiled, so why is
// open). With this instance the mode took 2,717 µs against 2,906 with 4 (rows_deterministic_8188023.md). At
// D = 64 and without the mask 4 was the fastest, or level, in both modes, so those keep one kernel for both.
#ifndef V8B_DET_ROW_PREFETCH
#define V8B_DET_ROW_PREFETCH 0
#endif

// FLASHATTN_VARLEN=1 (the packed batches of flashattn.attention_varlen, flashattn.varlen_kernel): also compile
// backward_varlen's instances (flash_bwd_varlen, bwd_prep_varlen, bwd_convert_varlen).
#ifndef FLASHATTN_VARLEN
#define FLASHATTN_VARLEN 0
#endif

namespace v8b {

constexpr int kThreads = 128;   // bwd_prep, bwd_convert: 4 warps

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
}__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
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
// A plain 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared memory,
// completing on `bar` like a TMA box: the row terms lse2_i and D_i of a query tile.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Named barrier 1 (0 is __syncthreads): the two consumer warpgroups meet there once per query tile, when
// both halves of dS^T are in shared memory.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Stores by ordinary instructions (the generic proxy) become visible to wgmma's operand reads (the async
// proxy) only after this fence: dS^T, written with st.shared, is read by the dQ wgmma.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// setmaxnreg: a whole warpgroup changes its per-thread register allotment (a multiple of 8, 24 to 256).
// dec returns registers to the SM's pool; inc blocks until the pool has them.
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
// wgmma's ordering instructions. fence: registers written by ordinary instructions (the accumulators,
// P^T and dS^T) are ready for the next wgmma; commit: close the group of wgmma issued so far; wait<n>: at
// most n groups still in flight.
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
// encoded in 16-byte units. Every tile base is 1024-byte aligned, so the "base offset" field stays 0.
//   K-major (the k index contiguous: K_j, V_j, Q_i, dO_i as S^T's and dP^T's operands): SBO = 1024, the
//     distance between 8-row atoms; LBO unused (1); a k16 step inside a 64-column panel is a start
//     address 32, 64 or 96 bytes further on, the next panel R x 128 bytes further.
//   MN-major (the m or n index contiguous: dO_i, Q_i, K_j as B of dV, dK, dQ; dS^T as A of dQ): LBO = the
//     distance between 64-wide panels of that index, SBO = 1024, the distance between groups of 8 k rows;
//     a k16 step is 16 rows = 2048 bytes further on.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// The descriptor of the operand `off` bytes into the tile at `tile` (leading byte offset `lbo`, SBO 1024).
// V8B_DESC_ADD: the tile's descriptor (the same expression for every k step, so ptxas makes it once) plus
// off / 16 in the start-address field; exact because no shared-memory address reaches 256 KB, so the sum
// never carries out of the field's 14 bits.
__device__ __forceinline__ uint64_t opdesc(uint32_t tile, uint32_t off, uint32_t lbo) {
#if V8B_DESC_ADD
  return make_desc(tile, lbo, 1024) + (off >> 4);
#else
  return make_desc(tile + off, lbo, 1024);
#endif
}

#define BWD_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                       "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define BWD_ACC64(d) BWD_ACC8(d, 0), BWD_ACC8(d, 8), BWD_ACC8(d, 16), BWD_ACC8(d, 24)
#define BWD_ACC128(d) BWD_ACC64(d), BWD_ACC8(d, 32), BWD_ACC8(d, 40), BWD_ACC8(d, 48), BWD_ACC8(d, 56)
#define BWD_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                   "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define BWD_REGS40 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                   "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
                   "%38, %39}"
#define BWD_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                   "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
                   "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
                   "%56, %57, %58, %59, %60, %61, %62, %63}"

// One warpgroup-wide product D (64 x N, fp32, N / 2 registers per thread) += A (64 x 16) B (16 x N).
// Accumulator register 4t + i of lane (g = lane / 4, q = lane % 4) of warp w holds row 16w + g + 8(i / 2),
// column 8t + 2q + (i % 2). Written out per N and element type (the asm text must be a literal):
//   ss<TA, TB>: A and B from shared memory; TA / TB = 0 K-major, 1 MN-major (imm-trans-a / -b); the first
//               k step passes accumulate = 0 (D = A B, the registers' old values ignored);
//   rs:         A (64 x 16) from registers (4 per thread, the mma.sync A fragment), B MN-major; accumulates.
template <int N, typename T> struct Wgmma;
#define BWD_WGMMA_N64(CTYPE, PTXTYPE)                                                                        \
  template <> struct Wgmma<64, CTYPE> {                                                                      \
    template <int TA, int TB>                                                                                \
    static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                              \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTXTYPE "." PTXTYPE " " BWD_REGS32           \
                   ", %32, %33, p, 1, 1, %35, %36;\n}\n"                                                     \
                   : BWD_ACC64(d)                                                                            \
                   : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));                                     \
    }                                                                                                        \
    static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {          \
      asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." PTXTYPE "." PTXTYPE " " BWD_REGS32          \
                   ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                              \
                   : BWD_ACC64(d)                                                                            \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                    \
    }                                                                                                        \
  };
#define BWD_WGMMA_N128(CTYPE, PTXTYPE)                                                                       \
  template <> struct Wgmma<128, CTYPE> {                                                                     \
    template <int TA, int TB>                                                                                \
    static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                              \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTXTYPE "." PTXTYPE " " BWD_REGS64          \
                   ", %64, %65, p, 1, 1, %67, %68;\n}\n"                                                     \
                   : BWD_ACC128(d)                                                                           \
                   : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));                                     \
    }                                                                                                        \
    static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {          \
      asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." PTXTYPE "." PTXTYPE " " BWD_REGS64         \
                   ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                              \
                   : BWD_ACC128(d)                                                                           \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                    \
    }                                                                                                        \
  };
// V8B_BR80: S^T, dP^T and dQ_i^T with N = B_r = 80 (shared-memory operands only)
#define BWD_WGMMA_N80(CTYPE, PTXTYPE)                                                                        \
  template <> struct Wgmma<80, CTYPE> {                                                                      \
    template <int TA, int TB>                                                                                \
    static __device__ __forceinline__ void ss(float (&d)[40], uint64_t a, uint64_t b, int accumulate) {      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                              \
                   "wgmma.mma_async.sync.aligned.m64n80k16.f32." PTXTYPE "." PTXTYPE " " BWD_REGS40           \
                   ", %40, %41, p, 1, 1, %43, %44;\n}\n"                                                     \
                   : BWD_ACC64(d), BWD_ACC8(d, 32)                                                           \
                   : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));                                     \
    }                                                                                                        \
  };
BWD_WGMMA_N64(__nv_bfloat16, "bf16")
BWD_WGMMA_N64(__half, "f16")
BWD_WGMMA_N80(__nv_bfloat16, "bf16")
BWD_WGMMA_N80(__half, "f16")
BWD_WGMMA_N128(__nv_bfloat16, "bf16")
BWD_WGMMA_N128(__half, "f16")

// A clock read whose value is stored never (`never` is false at run time, a predicate rather than a branch:
// ptxas keeps no wgmma in flight across a branch that may diverge); ptxas does not move instructions
// across it, so what comes before stays before (V8B_EXP_FENCE).
__device__ __forceinline__ void schedule_fence(void* sink, bool never) {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c)::"memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.u64 [%0], %1;\n}\n" ::"l"(sink), "l"(c),
               "r"((int)never)
               : "memory");
}

// 2^x on the special-function unit; ex2.approx(-inf) = +0, which the masking relies on.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
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
template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

// dst[0] += a, dst[1] += b in global memory, without a return value (a reduction, not an atomic that
// reads back): one instruction, one L2 transaction for both.
__device__ __forceinline__ void red_add2(float* dst, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
}

// V8B_BR80 without the image: one float, as red_add2.
__device__ __forceinline__ void red_add1(float* dst, float a) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(dst), "f"(a) : "memory");
}

// V8B_BR80: four 8 x 8 tiles of 16-bit values from the accumulator fragment layout (register i of lane (g, q)
// holds row g, columns 2q, 2q + 1 of tile i), each stored transposed: row c of tile i, 16 bytes, goes to
// the address lane 8i + c gives, so those 16 bytes are column c of the fragment.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// V8B_DQ_BULK: the copy engine adds `bytes` of fp32 from shared memory into global memory (one bulk
// group per call). wait_read: the source may be overwritten; wait_all: the additions are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// The deterministic mode's turn counter per (query head, query tile): read with acquire, bumped with
// release, both at GPU scope; the proxy fences order them with the copy engine's global accesses.
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---------------------------------------------------------------- tiles and shared memory --------------
//
// Every tile 1024-byte aligned, each a stack of 64-column panels of [rows][128 bytes] (one TMA box per
// panel; the 128-byte swizzle allows at most 128 bytes per box row): K_j, V_j; STAGES x Q_i, STAGES x
// dO_i; 2 x dS^T ([B_r / 64 panels][B_c keys][64 queries]); STAGES x lse2_i, STAGES x D_i (B_r floats
// each); the mbarriers (K/V; full and empty per stage).
// The head dim the tiles have for tensors of head dim d: whole 64-column panels (96 -> 128).
__host__ __device__ constexpr int tile_dim(int d) { return (d + 63) / 64 * 64; }

template <int D, int STAGES, bool BANDED = false>
struct Layout {
  static constexpr int BC = 128, NWG = 2, THREADS = 128 * (NWG + 1);
  static constexpr int BR = D == 64 ? 128 : V8B_BR80 != 0 && !BANDED ? 80 : 64;
  // dQ_i's tile [B_r][D] splits into two m64 x n64 halves: by rows (B_r = 128, D = 64) or by columns
  // (B_r = 64, D = 128), so that every wgmma operand is whole 64-wide panels. V8B_BR80 (B_r = 80, D = 128):
  // each warpgroup computes 64 head-dim rows of dQ_i^T = K_j^T dS_i^T, 64 x 80.
  static constexpr bool SPLIT_ROWS = BR == 128, DQ_T = BR == 80;
  static_assert(BR * D == 64 * 128 || (DQ_T && D == 128), "dQ_i's tile must split into two consumer halves");
  static constexpr uint32_t KV_BYTES = BC * D * 2, QO_BYTES = BR * D * 2, DS_BYTES = BC * BR * 2;
  static constexpr uint32_t ROW_BYTES = BR * 4;
  static constexpr uint32_t K_OFF = 0, V_OFF = KV_BYTES, Q_OFF = 2 * KV_BYTES;
  static constexpr uint32_t DO_OFF = Q_OFF + STAGES * QO_BYTES, DS_OFF = DO_OFF + STAGES * QO_BYTES;
  static constexpr uint32_t LSE_OFF = DS_OFF + 2 * DS_BYTES, DVEC_OFF = LSE_OFF + STAGES * ROW_BYTES;
  // V8B_DQ_BULK: dQ_i's image, B_r x D floats, where it fits (227 KB per block, with the 1 KB to align)
  static constexpr uint32_t DQ_OFF = DVEC_OFF + STAGES * ROW_BYTES, DQ_IMAGE = BR * D * 4;
  static constexpr uint32_t NBARS = 1 + 2 * STAGES + 2;   // K/V; full, empty per stage; dQ image full, empty
  static constexpr bool DQ_BULK = V8B_DQ_BULK != 0 && DQ_OFF + DQ_IMAGE + 8 * NBARS + 1024 <= 227 * 1024;
  static constexpr uint32_t BAR_OFF = DQ_OFF + (DQ_BULK ? DQ_IMAGE : 0);
  static constexpr uint32_t BYTES = BAR_OFF + 8 * NBARS;
  static constexpr size_t DYNAMIC = BYTES + 1024;   // room to round the base up to 1024 bytes
  // what one stage's full barrier waits for: Q_i, dO_i, lse2_i, D_i
  static constexpr uint32_t STAGE_TX = 2 * QO_BYTES + 2 * ROW_BYTES;
};

// V8B_DQ_BULK: the fp32 accumulator's tile of query tile i (B_r rows x D, contiguous in global memory)
// holds dQ_i in the consumers' fragment order, so that its shared-memory image, which the bulk reduction
// copies byte for byte, is stored without bank conflicts (each warp store: 32 lanes x 8 contiguous bytes):
// float pair ((w * 16 + 2t + h) * 32 + lane) holds the pair of consumer warp w (warpgroup * 4 + warp in
// it) for n8 group t, row half h. Element (r, c) of the tile, as bwd_convert reads it back:
// V8B_BR80 (B_r = 80): the consumers hold dQ_i^T, whose fragment pairs are two query rows of one column,
// so the image is the tile row-major with each row's columns XOR-ed by a multiple of 8, ((r / 2) % 4) * 8:
// a store instruction's 32 lanes (columns g + 8h of 16 consecutive, rows 8t + 2q + e) hit 32 banks, and
// four columns from a multiple of 4 stay four consecutive floats.
template <int D, int BR>
__host__ __device__ constexpr int dq_image_float(int r, int c) {
  if (BR == 80) return r * D + (c ^ (((r >> 1) & 3) << 3));
  constexpr bool split_rows = D == 64;   // Layout::SPLIT_ROWS: the consumers split dQ_i by rows at D = 64
  const int cwg = split_rows ? r / 64 : c / 64, rr = split_rows ? r % 64 : r, cc = split_rows ? c : c % 64;
  const int wq = rr / 16, g = rr % 8, h = (rr / 8) % 2, t = cc / 8, q = (cc % 8) / 2;
  return (((cwg * 4 + wq) * 16 + 2 * t + h) * 32 + 4 * g + q) * 2 + c % 2;
}

// The register split (v8's at D=128): 168 per thread at entry (65,536 / 384 down to a multiple of 8); the
// producer keeps 24 and the two consumer warpgroups share what it gives back.
struct Registers {
  static constexpr int ENTRY = 65536 / 384 / 8 * 8, PRODUCER = 24, CONSUMER = 240;
  static_assert(PRODUCER + 2 * CONSUMER <= 3 * ENTRY, "the split must fit the launch allotment");
};

// A packed batch (VARLEN: backward_varlen, the gradients of forward_varlen_lse): sequence b's queries are tokens
// cu_q[b] .. cu_q[b + 1] - 1 of q, o and dout ([total_q][H][D]), its keys tokens cu_k[b] .. cu_k[b + 1] - 1 of
// k and v ([total_k][H_kv][D]); lse is [H][total_q]. The row terms and the dQ accumulator keep, per query head,
// `rows` padded rows, sequence b's from padded_start(cu_q[b], b, B_r) on: a whole number of query tiles per
// sequence, so that a tile's bulk copies and its dQ image never reach into the next sequence's rows. The
// window's sides as the caller gave them (-1: no bound; causal has set the right one to 0), clamped by each
// block to its own sequence.
struct Varlen {
  const int* cu_q;
  const int* cu_k;
  int batch, H_kv, total_q, total_k;
  long long rows;
  int window_left, window_right;
};

// Sequence b's first padded row: its first token plus b tiles, rounded down to a tile. The next sequence's
// start is at least ceil(M_b / B_r) tiles further on (strictly more than 0 for an empty one), and
// padded_start(total_q, B, B_r) bounds them all: the rows per head.
__host__ __device__ constexpr long long padded_start(long long token, long long b, int BR) {
  return (token + b * BR) / BR * BR;
}

// The last b in [0, B) with start(b) <= x, for start nondecreasing and start(0) <= x: the sequence that holds
// token (or padded row) x. log2(B) reads of the lengths.
template <typename Start>
__device__ __forceinline__ int last_at_most(int B, long long x, Start start) {
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (start(mid) <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// ---------------------------------------------------------------- 1. pre-pass -------------------------
// Padded row `row` of the row terms: D_i = rowsum(dO_i o O_i) in fp32 and lse2_i = lse_i * log2(e) (-inf, a
// row with no visible key, becomes +inf: P = exp2(-inf) = 0); a padding row (valid false) gets D_i = 0, lse2_i
// = +inf. Also zeroes the row of the fp32 dQ accumulator. CPR threads per row (16-byte chunks), c this
// thread's; o, d_o, lse_i point at the row's source (read only when valid).
// DG: the head dim of O and dO; the accumulator has the tiles' D = tile_dim(DG) columns.
template <typename T, int DG>
__device__ __forceinline__ void prep_row(const T* __restrict__ o, const T* __restrict__ d_o,
                                         const float* __restrict__ lse_i, bool valid, bool in_range, long long row,
                                         int c, float* __restrict__ Dvec, float* __restrict__ lse2,
                                         float* __restrict__ dq_acc) {
  constexpr int D = tile_dim(DG);
  constexpr int CPR = D / 8;
  float sum = 0.f;
  if (valid && c * 8 < DG) {
    const uint4 o4 = *reinterpret_cast<const uint4*>(o + c * 8);
    const uint4 d4 = *reinterpret_cast<const uint4*>(d_o + c * 8);
    const T* o8 = reinterpret_cast<const T*>(&o4);
    const T* d8 = reinterpret_cast<const T*>(&d4);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum = fmaf(to_float<T>(o8[e]), to_float<T>(d8[e]), sum);
  }
  if (in_range) {
    float4* acc = reinterpret_cast<float4*>(dq_acc + row * D + c * 8);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // the CPR lanes of a row are consecutive lanes of one warp (CPR divides 32)
#pragma unroll
  for (int off = CPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (in_range && c == 0) {
    Dvec[row] = sum;   // 0 for padded rows
    const float l = valid ? *lse_i : -INFINITY;
    lse2[row] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
  }
}

// Rows r = bh * M_pad + i of the padded row terms (rows i >= M are padding) from O, dO [B*H*M][DG] and lse
// [B*H*M].
template <typename T, int DG>
__global__ void __launch_bounds__(kThreads)
    bwd_prep(const T* __restrict__ O, const T* __restrict__ dO, const float* __restrict__ lse,
             float* __restrict__ Dvec, float* __restrict__ lse2, float* __restrict__ dq_acc, long long rows, int M,
             int M_pad) {
  constexpr int CPR = tile_dim(DG) / 8;
  const long long row = (long long)blockIdx.x * (kThreads / CPR) + threadIdx.x / CPR;
  const long long bh = row / M_pad;
  const int i = (int)(row % M_pad);
  const long long src = bh * M + i;   // the row in the unpadded [B*H*M] tensors
  prep_row<T, DG>(O + src * DG, dO + src * DG, lse + src, row < rows && i < M, row < rows, row,
                  threadIdx.x % CPR, Dvec, lse2, dq_acc);
}

// VARLEN: rows r = h * va.rows + p, padded row p of query head h, from O, dO [total_q][H][DG] and lse
// [H][total_q]; p belongs to the sequence whose padded rows start at or before it.
template <typename T, int DG, int BR>
__global__ void __launch_bounds__(kThreads)
    bwd_prep_varlen(const T* __restrict__ O, const T* __restrict__ dO, const float* __restrict__ lse,
                    float* __restrict__ Dvec, float* __restrict__ lse2, float* __restrict__ dq_acc, const Varlen va,
                    int B, int H) {
  constexpr int CPR = tile_dim(DG) / 8;
  const long long row = (long long)blockIdx.x * (kThreads / CPR) + threadIdx.x / CPR, rows = H * va.rows;
  const long long h = row / va.rows, p = row % va.rows;
  const int b = last_at_most(B, p, [&](int s) { return padded_start(va.cu_q[s], s, BR); });
  const long long i = p - padded_start(va.cu_q[b], b, BR), token = va.cu_q[b] + i;
  const long long src = token * H + h;   // [total_q][H] row of O and dO
  prep_row<T, DG>(O + src * DG, dO + src * DG, lse + h * va.total_q + token,
                  row < rows && i < va.cu_q[b + 1] - va.cu_q[b], row < rows, row, threadIdx.x % CPR, Dvec, lse2,
                  dq_acc);
}

// ---------------------------------------------------------------- 2. dK, dV and dQ's additions ------
//
// One block per key tile K_j, V_j (B_c = 128 keys) of one (batch, kv head), by default heads fastest
// (blockIdx.x = tile * B * H_kv + bh_kv; V8B_HEAD_GROUP): the first key tiles, which see the most query tiles
// under the causal mask, start first, and the blocks running at one time add into the dQ rows of many heads.
// The block walks the query tiles that see any of its keys of each query head of its group, one step per
// (head, query tile), in the same order in the producer and in the consumers.
// BANDED: the instance for causal=True and for any sliding window, in which row i sees key j iff lo <= j -
// i <= hi, a band of diagonals: lo = N - M - window_left, hi = N - M + window_right (causal: window_right =
// 0). The launcher clamps the window's sides to [0, N] and [0, M], past which they bound nothing, so lo >=
// -M and hi <= N (causal: lo = -M, hi = N - M), as v6's backward and v8's forward take it.
// DG: the head dim of q, k, v and their gradients; the tiles have D = tile_dim(DG) columns (DG = 96 runs D =
// 128: the maps fill columns 96 .. 127 of every tile with zeros, which add nothing to S^T and dP^T and give
// dK_j and dV_j zero columns that are not stored).
// VARLEN (flash_bwd_varlen): a packed batch. BH_kv is H_kv and N / B_c the batch's key tiles, which set the
// grid; each block finds its sequence and reads its M, N, band and token offsets from va (M_pad, lo, hi are
// then its own), and a block in the gap after a sequence's tiles has nothing to do. The maps are the packed
// [total][H][D] tensors, whose rows past a sequence's end are the next sequence's: its keys there are masked
// like keys >= N, its query rows there have lse2 = +inf in the padded row terms (P = 0, so they add nothing)
// and their dQ rows are padding.
// The fixed-length kernel (flash_bwd_ws) compiles to the machine code it had before the packed batches.
// ROW_PREFETCH: where the row terms are loaded (V8B_ROW_PREFETCH; the deterministic mode's, V8B_DET_ROW_PREFETCH).
template <typename T, int DG, bool BANDED, int STAGES, bool VARLEN, int ROW_PREFETCH>
__device__ __forceinline__ void flash_bwd_body(const CUtensorMap& tmQ, const CUtensorMap& tmK, const CUtensorMap& tmV,
                                               const CUtensorMap& tmdO, const float* __restrict__ lse2,
                                               const float* __restrict__ Dvec, float* __restrict__ dq_acc,
                                               int* __restrict__ dq_turn, T* __restrict__ dK, T* __restrict__ dV,
                                               int BH_kv, int group, int M, int N, int M_pad, float scale_log2,
                                               float scale, int lo, int hi, int head_group, const Varlen& va) {
  static_assert(STAGES >= 2, "the producer fills one slot while the consumers compute on another");
  constexpr int D = tile_dim(DG);
  using L = Layout<D, STAGES, BANDED>;
  constexpr int BR = L::BR, BC = L::BC, PANELS = D / 64;
  constexpr int NT = BR / 8;   // n8 column groups (query columns) of S^T and dP^T per thread row
  constexpr int DT = D / 8;    // n8 column groups of dK_j, dV_j
  static_assert(DG % 8 == 0, "rows of whole 16-byte chunks");

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  unsigned char* const gbase = smem_raw + (base - smem_addr(smem_raw));   // the same byte, generic address
  const uint32_t sK = base + L::K_OFF, sV = base + L::V_OFF;
  auto sQ = [&](int s) { return base + L::Q_OFF + s * L::QO_BYTES; };
  auto sdO = [&](int s) { return base + L::DO_OFF + s * L::QO_BYTES; };
  auto sdS = [&](int b) { return base + L::DS_OFF + b * L::DS_BYTES; };
  const uint32_t bar_kv = base + L::BAR_OFF;
  auto full = [&](int s) { return bar_kv + 8u * (1 + s); };
  auto empty = [&](int s) { return bar_kv + 8u * (1 + STAGES + s); };
  const uint32_t dq_full = bar_kv + 8u * (1 + 2 * STAGES), dq_empty = dq_full + 8u;   // V8B_DQ_BULK

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // warpgroup, warp inside it; V8B_UNIFORM_WG: lane 0's warpgroup, so that ptxas knows it is one per warp
  const int wg = V8B_UNIFORM_WG ? __shfl_sync(0xffffffffu, warp >> 2, 0) : warp >> 2, wq = warp & 3;

  // The block's key tile (V8B_HEAD_GROUP: group grp of HG kv heads, `width` of them in the last group) and
  // the query tiles it visits (the same for every query head of the kv head's group).
  const int n_kt = (N + BC - 1) / BC, block = (int)blockIdx.x;
  const int HG = head_group <= 0 || head_group > BH_kv ? BH_kv : head_group;
  const int grp = block / (HG * n_kt), rem = block - grp * HG * n_kt, width = min(HG, BH_kv - grp * HG);
  const int bh_kv = grp * HG + rem % width;
  int n0 = (rem / width) * BC;
  // VARLEN: bh_kv is the kv head, and n0 / B_c a key tile of the whole batch, sequence b's tiles numbered from
  // padded_start(cu_k[b], b, B_c) / B_c on (a gap of at most one tile after each sequence's, as for the query
  // rows): sequence b, its key tile, its first query and key tokens, and its first padded row in each query
  // head's row terms and accumulator.
  int q_tok = 0, k_tok = 0;
  long long seq_rows = 0;
  if constexpr (VARLEN) {
    const int tile = n0 / BC;
    auto first_tile = [&](int s) { return padded_start(va.cu_k[s], s, BC) / BC; };
    const int b = last_at_most(va.batch, tile, first_tile);
    n0 = (int)(tile - first_tile(b)) * BC;
    q_tok = va.cu_q[b];
    M = va.cu_q[b + 1] - q_tok;
    k_tok = va.cu_k[b];
    N = va.cu_k[b + 1] - k_tok;
    if (n0 >= N) return;   // block-uniform, before any barrier: the gap after the sequence's tiles
    const int left = va.window_left < 0 || va.window_left > N ? N : va.window_left;
    const int right = va.window_right < 0 || va.window_right > M ? M : va.window_right;
    lo = N - M - left;
    hi = N - M + right;
    M_pad = (M + BR - 1) / BR * BR;
    seq_rows = padded_start(q_tok, b, BR);
  }
  const int m_tiles = M_pad / BR;
  // The first row of query head gi's (of the kv head's group) row terms and dQ accumulator; query tile `it`
  // is it * B_r rows further on. Grouped-query attention: head b * H + h, h = h_kv * group + gi, is bh_kv *
  // group + gi in the flat index.
  auto head_rows = [&](int gi) -> size_t {
    if constexpr (VARLEN) return (size_t)(bh_kv * group + gi) * va.rows + seq_rows;
    else return (size_t)(bh_kv * group + gi) * M_pad;
  };
  // Where key `key` of the tile's sequence starts in dK and dV
  auto kv_offset = [&](int key) -> size_t {
    if constexpr (VARLEN) return ((size_t)(k_tok + key) * va.H_kv + bh_kv) * DG;
    else return ((size_t)bh_kv * N + key) * DG;
  };
  // Query tile `it` of query head gi (of the kv head's group), 64 columns from column c, into dst
  auto load_rows = [&](uint32_t dst, const CUtensorMap* map, int c, int it, int gi, uint32_t bar) {
    if constexpr (VARLEN)   // (column, head, token)
      tma_load_3d(dst, map, c, bh_kv * group + gi, q_tok + it * BR, bar);
    else
      tma_load_3d(dst, map, c, it * BR, bh_kv * group + gi, bar);
  };
  auto load_keys = [&](uint32_t dst, const CUtensorMap* map, int c, uint32_t bar) {
    if constexpr (VARLEN)
      tma_load_3d(dst, map, c, bh_kv, k_tok + n0, bar);
    else
      tma_load_3d(dst, map, c, n0, bh_kv, bar);
  };
  // The query tiles [it_begin, it_end) that see any key of the tile: key j is seen by rows j - hi ..= j - lo,
  // so the tile's first key bounds them from below (causal: that is all) and its last key from above.
  int it_begin = 0, it_end = m_tiles;
  if (BANDED) {
    const long long first = (long long)n0 - hi, last = (long long)min(n0 + BC, N) - 1 - lo;
    it_begin = first <= 0 ? 0 : first >= M ? m_tiles : (int)(first / BR);
    it_end = last < 0 ? 0 : (int)min((long long)m_tiles, last / BR + 1);
  }
  // Inside them, the tiles [plain_begin, plain_end) none of whose elements needs a mask: none when the key
  // tile runs past N (keys >= N must get P = 0); banded, those whose first row (i0) sees the tile's last
  // key, i0 >= n0 + B_c - 1 - hi, and whose last row (min(i0 + B_r, M) - 1) its first, <= n0 - lo. Rows past
  // M need no mask: their lse2 is +inf. The others are masked: the band's upper edge crosses the first ones
  // (causal: the diagonal), its lower edge (a window's left side) the last ones.
  int plain_begin = it_begin, plain_end = it_end;
  if (n0 + BC > N) {
    plain_begin = plain_end = it_end;
  } else if (BANDED) {
    const long long x = (long long)n0 + BC - 1 - hi, y = (long long)n0 - lo;
    plain_begin = x <= 0 ? 0 : (int)min((long long)m_tiles, (x + BR - 1) / BR);
    plain_end = y >= M - 1 ? m_tiles : y + 1 <= 0 ? 0 : (int)((y + 1) / BR);
    plain_begin = min(max(plain_begin, it_begin), it_end);
    plain_end = min(max(plain_end, plain_begin), it_end);
  }

  // Keys [n0, min(n0 + B_c, N)) of dK and dV from threads `first`, `first` + `count`, ... (a tile no query
  // sees: its gradients are 0).
  auto write_zeros = [&](int first, int count) {
    for (int idx = first; idx < BC * DG / 8; idx += count) {
      const int key = n0 + idx / (DG / 8);
      if (key < N) {
        const size_t off = kv_offset(key) + (idx % (DG / 8)) * 8;
        *reinterpret_cast<uint4*>(dK + off) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(dV + off) = make_uint4(0, 0, 0, 0);
      }
    }
  };
  if (it_begin >= it_end) {   // block-uniform: a window no row's band reaches (never for causal)
    write_zeros(tid, L::THREADS);
    return;
  }

  if (tid == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 128 * L::NWG);   // every consumer thread
    }
    if constexpr (L::DQ_BULK) {
      mbar_init(dq_full, 128 * L::NWG);   // every consumer thread has stored its part of the image
      mbar_init(dq_empty, 1);             // the dQ writer's copy engine has read it
    }
    // make the initialised barriers visible to the copy engine (the async proxy)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- the producer: warpgroup 0, one thread issues every copy ----------------
    setmaxnreg_dec<Registers::PRODUCER>();
    if (tid == 0) {
      mbar_arrive_expect_tx(bar_kv, 2 * L::KV_BYTES);
#pragma unroll
      for (int p = 0; p < PANELS; ++p) {
        load_keys(sK + p * BC * 128, &tmK, p * 64, bar_kv);
        load_keys(sV + p * BC * 128, &tmV, p * 64, bar_kv);
      }
      // step u: query tile `it` of query head gi of the kv head's group into slot u % STAGES, once the
      // consumers let go of step u - STAGES
      int u = 0;
      for (int gi = 0; gi < group; ++gi) {
        for (int it = it_begin; it < it_end; ++it, ++u) {
          const int s = u % STAGES;
          if (u >= STAGES) mbar_wait(empty(s), ((u / STAGES) - 1) & 1);
          mbar_arrive_expect_tx(full(s), L::STAGE_TX);
#pragma unroll
          for (int p = 0; p < PANELS; ++p) {
            load_rows(sQ(s) + p * BR * 128, &tmQ, p * 64, it, gi, full(s));
            load_rows(sdO(s) + p * BR * 128, &tmdO, p * 64, it, gi, full(s));
          }
          const size_t row = head_rows(gi) + (size_t)it * BR;
          bulk_load(base + L::LSE_OFF + s * L::ROW_BYTES, lse2 + row, L::ROW_BYTES, full(s));
          bulk_load(base + L::DVEC_OFF + s * L::ROW_BYTES, Dvec + row, L::ROW_BYTES, full(s));
        }
      }
    } else if (L::DQ_BULK && tid == 32) {
      // ---- the dQ writer (warp 1's first thread): step u's image into the accumulator's tile, in the
      // consumers' order. Deterministic mode (dq_turn): the key tiles that reach query tile `it` add into
      // it one after another, lowest first, so every dQ element sums in one order whatever the timing; a
      // key tile waits for the count of those before it, which have lower blockIdx: the GPU starts blocks
      // in index order (CUDA does not promise it; FlashAttention-3's deterministic mode relies on it too).
      const int j = n0 / BC;
      int u = 0;
      for (int gi = 0; gi < group; ++gi) {
        for (int it = it_begin; it < it_end; ++it, ++u) {
          mbar_wait(dq_full, u & 1);
          float* const tile = dq_acc + (head_rows(gi) + (size_t)it * BR) * D;
          // one turn per query tile, in the rows' order (VARLEN: head_rows is a multiple of B_r)
          int* const turn = dq_turn == nullptr ? nullptr
                            : dq_turn + (VARLEN ? head_rows(gi) / BR : (size_t)(bh_kv * group + gi) * m_tiles) + it;
          if (turn != nullptr) {
            // the first key tile that reaches the tile's first row: keys lo <= j - i from row it * B_r on
            const long long first_key = BANDED ? (long long)it * BR + lo : 0;
            const int mine = j - (first_key <= 0 ? 0 : (int)(first_key / BC));
            while (load_acquire(turn) != mine) {
            }
            fence_proxy_async_global();   // the earlier tiles' additions, before the copy engine's
          }
          bulk_reduce_add_f32(tile, base + L::DQ_OFF, L::DQ_IMAGE);
          bulk_wait_read();
          mbar_arrive(dq_empty);   // the image is free once read: the consumers need not wait for the L2
          if (turn != nullptr) {   // the next key tile's turn only once this one's additions have landed
            bulk_wait_all();
            fence_proxy_async_global();
            add_release(turn, 1);
          }
        }
      }
      bulk_wait_all();   // nothing of the block's may be in flight when it exits
    }
    return;
  }

  // ---------------- the consumers: warpgroups 1 and 2, 64 keys each ----------------
  setmaxnreg_inc<Registers::CONSUMER>();
  const int cwg = wg - 1;
  const int g = lane >> 2, q = lane & 3;
  const int key_row0 = 64 * cwg + 16 * wq;   // first of this warp's 16 key rows in the tile

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  constexpr int DV_AT = D == 128 ? V8B_EARLY_DV : 0;   // V8B_EARLY_DV: D=64 issues dV_j with dK_j
  float s_acc[BR / 2], dp[BR / 2];   // S^T, then P^T in place; dP^T
  float dq[L::DQ_T ? BR / 2 : 32];   // this warpgroup's half of dQ_i's tile: 64 x 64, or 64 x B_r of dQ_i^T
  uint32_t p_pack[NT][2], ds_pack[NT][2];

  // S^T = K_j Q_i^T and dP^T = V_j dO_i^T for this warpgroup's 64 keys: D / 16 k steps each, A = its rows
  // of K_j / V_j (64 x 128 bytes into every panel), B = Q_i / dO_i; two commit groups.
  auto issue_sdp = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t panel = kk / 4, within = (kk % 4) * 32;
      Wgmma<BR, T>::template ss<0, 0>(s_acc, opdesc(sK + cwg * 64 * 128, panel * BC * 128 + within, 16),
                                      opdesc(sQ(st), panel * BR * 128 + within, 16), kk > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t panel = kk / 4, within = (kk % 4) * 32;
      Wgmma<BR, T>::template ss<0, 0>(dp, opdesc(sV + cwg * 64 * 128, panel * BC * 128 + within, 16),
                                      opdesc(sdO(st), panel * BR * 128 + within, 16), kk > 0);
    }
    wgmma_commit();
  };
  // dV_j += P^T dO_i: A = P^T from registers (fragments of keys x 16 queries: rows g / g + 8, queries 2q..
  // (n8 group 2kk) and 8 + 2q.. (2kk + 1)), B = dO_i MN-major. No commit: DV_AT decides its group.
  auto issue_dv = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      const uint32_t a[4] = {p_pack[2 * kk][0], p_pack[2 * kk][1], p_pack[2 * kk + 1][0], p_pack[2 * kk + 1][1]};
      Wgmma<D, T>::rs(dv, a, opdesc(sdO(st), kk * 16 * 128, BR * 128));
    }
  };
  // dQ's half: A = dS (queries x all B_c keys) read M-major from the stored dS^T, B = K_j MN-major; then
  // (DV_AT == 0) dV_j and dK_j += dS^T Q_i with dS^T from registers, as P^T for dV_j. Two commit groups.
  // L::DQ_T: dQ_i^T's 64 head-dim rows of my panel, A = K_j^T (that panel of K_j read M-major), B = dS
  // K-major from the stored [queries][keys] tile, 64 keys per panel.
  auto issue_grads = [&](int st, int buf) {
    if constexpr (L::DQ_T) {
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        Wgmma<BR, T>::template ss<1, 0>(dq, opdesc(sK + cwg * BC * 128, kk * 16 * 128, BC * 128),
                                        opdesc(sdS(buf), (kk / 4) * BR * 128 + (kk % 4) * 32, 16), kk > 0);
    } else {
      const uint32_t a_base = sdS(buf) + (L::SPLIT_ROWS ? cwg * BC * 128 : 0);   // dS^T panel of my queries
      const uint32_t b_base = sK + (L::SPLIT_ROWS ? 0 : cwg * BC * 128);         // K_j panel of my columns
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        Wgmma<64, T>::template ss<1, 1>(dq, opdesc(a_base, kk * 16 * 128, BC * 128),
                                        opdesc(b_base, kk * 16 * 128, BC * 128), kk > 0);
    }
    wgmma_commit();
    if constexpr (DV_AT == 0) issue_dv(st);
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      const uint32_t a[4] = {ds_pack[2 * kk][0], ds_pack[2 * kk][1], ds_pack[2 * kk + 1][0], ds_pack[2 * kk + 1][1]};
      Wgmma<D, T>::rs(dk, a, opdesc(sQ(st), kk * 16 * 128, BR * 128));
    }
    wgmma_commit();
  };

  // V8B_BR80 (L::DQ_T): dS as [queries][keys] into the tile at ds_tile, panel cwg (my 64 keys) of [B_r rows][128
  // bytes], the 16-byte chunk of keys 8c .. 8c + 7 of query row x at chunk c ^ (x % 8). Tiles (t, h) = (2p + i /
  // 2, i % 2) per instruction; lane l gives row l % 8 of tile l / 8: query 8t + l % 8, chunk 2 wq + h. A tile's
  // 8 rows are 8 distinct chunks: one wavefront per tile.
  auto store_ds_queries_by_keys = [&](const unsigned char* ds_tile) {
    const int i = lane >> 3, x0 = lane & 7;
    const uint32_t panel = smem_addr(ds_tile) + cwg * (BR * 128);
#pragma unroll
    for (int pp = 0; pp < NT / 2; ++pp) {
      const int x = 8 * (2 * pp + (i >> 1)) + x0;
      stmatrix_x4_trans(panel + x * 128 + (((2 * wq + (i & 1)) ^ x0) << 4), ds_pack[2 * pp][0], ds_pack[2 * pp][1],
                        ds_pack[2 * pp + 1][0], ds_pack[2 * pp + 1][1]);
    }
  };
  // V8B_BR80: dq[4t + i] is dQ_i^T's row (head-dim column) c, column (query) x: into the image (dq_image_float),
  // or one red.global per float without it.
  auto dq_transposed_out = [&](const size_t rows0, const int it) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int x = 8 * t + 2 * q + (i & 1), c = 64 * cwg + 16 * wq + g + 8 * (i >> 1);
        if constexpr (L::DQ_BULK)
          reinterpret_cast<float*>(gbase + L::DQ_OFF)[dq_image_float<D, BR>(x, c)] = dq[4 * t + i];
        else
          red_add1(dq_acc + (rows0 + (size_t)it * BR + x) * D + c, dq[4 * t + i]);
      }
    if constexpr (L::DQ_BULK) {
      fence_proxy_async_smem();
      mbar_arrive(dq_full);
    }
  };

  // One step: query tile `it` of the query head whose rows start at rows0 (head_rows), the u-th of the block.
  // MASKED (a template choice, so that no branch sits between a wgmma and its wait: ptxas keeps no wgmma in
  // flight across a branch that may diverge): keys >= N and (banded) keys outside a row's band get P = 0.
  auto step = [&](const size_t rows0, const int it, const int u, auto masked) {
    constexpr bool MASKED = decltype(masked)::value;
    const int st = u % STAGES, buf = u & 1;
    const float* lse_s = reinterpret_cast<const float*>(gbase + L::LSE_OFF + st * L::ROW_BYTES);
    const float* dvec_s = reinterpret_cast<const float*>(gbase + L::DVEC_OFF + st * L::ROW_BYTES);

    // A row term's pair for thread columns 8t + 2q, +1: from the slot, or (ROW_PREFETCH) from row_pairs,
    // loaded earlier: lse2_i's, then D_i's. 3 and 4 spill at B_r = 80, which keeps 0. LSE_AT: where lse2_i's
    // pairs are loaded (0 at their use, 1 once S^T and dP^T are issued, 3 before them); D_EARLY: D_i's
    // follow into the same registers after P^T's exponentials (2, and 4 beside 3's lse2_i).
    constexpr int ROWS = ROW_PREFETCH >= 3 && L::DQ_T ? 0 : ROW_PREFETCH;
    constexpr int LSE_AT = ROWS == 2 ? 1 : ROWS == 4 ? 3 : ROWS;
    constexpr bool D_EARLY = ROWS == 2 || ROWS == 4;
    auto slot_pair = [&](const float* terms, const int t) {
      return *reinterpret_cast<const float2*>(terms + 8 * t + 2 * q);
    };
    float2 row_pairs[NT];   // no registers unless ROWS != 0
    auto load_pairs = [&](const float* terms) {
#pragma unroll
      for (int t = 0; t < NT; ++t) row_pairs[t] = slot_pair(terms, t);
    };
    mbar_wait(full(st), (u / STAGES) & 1);
    if constexpr (LSE_AT == 3) load_pairs(lse_s);
    wgmma_fence();
    issue_sdp(st);
    if constexpr (LSE_AT == 1) load_pairs(lse_s);

    // Per key row (g, g + 8): measured from this thread's first query column (i0 + 2q), element (t, e)
    // sits 8t + e further on and is masked iff 8t + e < first[h] or 8t + e > last[h] -- compares with a
    // constant per element. Key j is seen by rows j - hi ..= j - lo (banded; otherwise by every row), and a
    // key >= N by none. Both limits are clamped to [-1, B_r + 8], where they already mask all or nothing.
    int first[2] = {0, 0}, last[2] = {0, 0};
    if constexpr (MASKED) {
      auto clamp = [](long long x) { return (int)(x < -1 ? -1 : x > BR + 8 ? BR + 8 : x); };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = n0 + key_row0 + g + 8 * h;
        const long long col0 = (long long)it * BR + 2 * q;
        first[h] = clamp(key >= N ? (long long)M_pad + BR : BANDED ? (long long)key - hi - col0 : -1);
        last[h] = clamp(BANDED ? (long long)key - lo - col0 : (long long)BR + 8);
      }
    }

    // P^T = exp2(S^T * scale_log2 - lse2_i) while dP^T is still on the tensor cores. Columns are queries:
    // thread columns 8t + 2q, +1 read lse2 pairs from the stage's row terms.
    wgmma_wait<1>();
    pin(s_acc);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float2 l2 = LSE_AT != 0 ? row_pairs[t] : slot_pair(lse_s, t);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = i & 1;
        float x = s_acc[4 * t + i];
        if constexpr (MASKED) x = 8 * t + e < first[i >> 1] || 8 * t + e > last[i >> 1] ? -INFINITY : x;
        s_acc[4 * t + i] = ex2(fmaf(x, scale_log2, -(e ? l2.y : l2.x)));
      }
    }
    pin(s_acc);   // keep the exponentials ahead of the wait below (in the PTX; V8B_EXP_FENCE in the SASS)
    if constexpr (DV_AT == 1) {
      // P^T packed now, and dV_j += P^T dO_i on the tensor cores behind dP^T: a third group
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) p_pack[t][h] = pack2<T>(s_acc[4 * t + 2 * h], s_acc[4 * t + 2 * h + 1]);
      wgmma_fence();
      issue_dv(st);
      wgmma_commit();
    }
    if constexpr (D_EARLY) load_pairs(dvec_s);
    if constexpr (V8B_EXP_FENCE != 0) schedule_fence(dq_acc, M < 0);
    wgmma_wait<DV_AT == 1 ? 1 : 0>();   // dP^T (dV_j may still run)
    pin(dp);

    // dS^T = P^T o (dP^T - D_i); both packed to 16 bits as A fragments, and dS^T also into shared memory
    // for dQ: key row r (128 bytes per row of a 64-query panel), query pair 8t + 2q in panel t / 8, chunk
    // (t % 8) ^ (r % 8) -- the 128-byte swizzle the descriptor reads, TMA's own -- byte 4q; per store
    // instruction the 8 rows g x 4 lanes q hit 32 distinct banks.
    unsigned char* const ds_tile = gbase + L::DS_OFF + buf * L::DS_BYTES;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float2 d2 = D_EARLY ? row_pairs[t] : slot_pair(dvec_s, t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = s_acc[4 * t + 2 * h], p1 = s_acc[4 * t + 2 * h + 1];
        const float ds0 = p0 * (dp[4 * t + 2 * h] - d2.x), ds1 = p1 * (dp[4 * t + 2 * h + 1] - d2.y);
        if constexpr (DV_AT != 1) p_pack[t][h] = pack2<T>(p0, p1);
        ds_pack[t][h] = pack2<T>(ds0, ds1);
        if constexpr (!L::DQ_T) {
          const int r = key_row0 + g + 8 * h;   // r % 8 == g
          *reinterpret_cast<uint32_t*>(ds_tile + (t / 8) * (BC * 128) + r * 128 + (((t % 8) ^ g) << 4) + 4 * q) =
              ds_pack[t][h];
        }
      }
    }
    if constexpr (L::DQ_T) store_ds_queries_by_keys(ds_tile);
    if constexpr (DV_AT == 2) {
      wgmma_fence();
      issue_dv(st);
      wgmma_commit();
    }
    // both warpgroups' dS^T halves stored and visible to the tensor cores before either reads the whole
    fence_proxy_async_smem();
    named_bar_sync(1, 256);
    // V8B_DQ_BULK: the writer has handed the previous step's dQ image to the copy engine, which has read
    // it (waited for here, before dQ_i's products; dV_j may be in flight across the wait loop, and ptxas
    // keeps it so: tests/test_v8_backward.py counts the waits)
    if (L::DQ_BULK && u > 0) mbar_wait(dq_empty, (u - 1) & 1);

    wgmma_fence();
    issue_grads(st, buf);
    // dQ's half done (and dV_j; dK_j may still run): out to the accumulator, no row test (padded rows)
    wgmma_wait<1>();
    pin(dq);
    if constexpr (L::DQ_BULK && !L::DQ_T) {   // into the image, in fragment order
      float2* img = reinterpret_cast<float2*>(gbase + L::DQ_OFF) + (cwg * 4 + wq) * 16 * 32 + lane;
#pragma unroll
      for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) img[(2 * t + h) * 32] = make_float2(dq[4 * t + 2 * h], dq[4 * t + 2 * h + 1]);
      fence_proxy_async_smem();   // the stores, before the copy engine reads them
      mbar_arrive(dq_full);
    } else if constexpr (!L::DQ_T) {
      const int r0 = it * BR + (L::SPLIT_ROWS ? 64 * cwg : 0) + 16 * wq + g;
      float* dst = dq_acc + (rows0 + r0) * D + (L::SPLIT_ROWS ? 0 : 64 * cwg) + 2 * q;
#pragma unroll
      for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) red_add2(dst + (size_t)h * 8 * D + 8 * t, dq[4 * t + 2 * h], dq[4 * t + 2 * h + 1]);
    } else {
      dq_transposed_out(rows0, it);   // V8B_BR80
    }
    wgmma_wait<0>();
    pin(dk);
    pin(dv);
    // Q_i, dO_i and the row terms of slot st are free. Every consumer thread arrives for its own reads: an
    // arrival releases only what its own thread did before it, and with one lane per warp arriving (after
    // the named barrier above) racecheck reported the next copy into the slot as racing with the other
    // lanes' reads of D_i on the masked path, where the arrival sat in a branch.
    mbar_arrive(empty(st));
  };

  using Masked = std::true_type;
  using Plain = std::false_type;
  mbar_wait(bar_kv, 0);
  int u = 0;
  for (int gi = 0; gi < group; ++gi) {
    const size_t rows0 = head_rows(gi);
    // the branch sits between steps, where no wgmma is in flight: two copies of the step, not three loops
#pragma unroll 1
    for (int it = it_begin; it < it_end; ++it, ++u) {
      if (it >= plain_begin && it < plain_end)
        step(rows0, it, u, Plain{});
      else
        step(rows0, it, u, Masked{});
    }
  }

  // ---- dK_j (times scale) and dV_j straight from registers, keys < N only ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = n0 + key_row0 + g + 8 * h;
    if (key < N) {
      const size_t off = kv_offset(key) + 2 * q;
#pragma unroll
      for (int t = 0; t < DT; ++t) {
        if (8 * t >= DG) continue;   // the zero padding
        const float* k2 = dk + 4 * t + 2 * h;
        const float* v2 = dv + 4 * t + 2 * h;
        *reinterpret_cast<uint32_t*>(dK + off + 8 * t) = pack2<T>(k2[0] * scale, k2[1] * scale);
        *reinterpret_cast<uint32_t*>(dV + off + 8 * t) = pack2<T>(v2[0], v2[1]);
      }
    }
  }
}

// The fixed-length batch: q, o, dout [B*H][M][DG], k, v [B*H_kv][N][DG] (the maps), one block per key tile of
// each (batch, kv head).
template <typename T, int DG, bool BANDED, int STAGES, int ROW_PREFETCH>
__global__ void __launch_bounds__(Layout<tile_dim(DG), STAGES>::THREADS, 1)
    flash_bwd_ws(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                 const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                 const float* __restrict__ lse2, const float* __restrict__ Dvec, float* __restrict__ dq_acc,
                 int* __restrict__ dq_turn, T* __restrict__ dK, T* __restrict__ dV, int BH_kv, int group, int M,
                 int N, int M_pad, float scale_log2, float scale, int lo, int hi, int head_group) {
  flash_bwd_body<T, DG, BANDED, STAGES, false, ROW_PREFETCH>(tmQ, tmK, tmV, tmdO, lse2, Dvec, dq_acc, dq_turn, dK, dV, BH_kv, group,
                                               M, N, M_pad, scale_log2, scale, lo, hi, head_group, Varlen{});
}

// VARLEN: a packed batch, q, o, dout [total_q][H][DG] and k, v [total_k][H_kv][DG] (the maps): blocks for
// `tiles` key tiles of each of the BH_kv = H_kv kv heads, the batch's tiles with a gap after each sequence's.
template <typename T, int DG, bool BANDED, int STAGES, int ROW_PREFETCH>
__global__ void __launch_bounds__(Layout<tile_dim(DG), STAGES>::THREADS, 1)
    flash_bwd_varlen(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                     const float* __restrict__ lse2, const float* __restrict__ Dvec, float* __restrict__ dq_acc,
                     int* __restrict__ dq_turn, T* __restrict__ dK, T* __restrict__ dV, int BH_kv, int group,
                     int tiles, float scale_log2, float scale, int head_group, const Varlen va) {
  flash_bwd_body<T, DG, BANDED, STAGES, true, ROW_PREFETCH>(tmQ, tmK, tmV, tmdO, lse2, Dvec, dq_acc, dq_turn, dK, dV, BH_kv, group,
                                              0, tiles * Layout<tile_dim(DG), STAGES, BANDED>::BC, 0, scale_log2,
                                              scale, 0, 0, head_group, va);
}

// ---------------------------------------------------------------- 3. dQ = scale * accumulator --------
// IMAGE (V8B_DQ_BULK): the accumulator's tiles hold dQ in fragment order (dq_image_float); a float4 of
// four consecutive columns (4c .. 4c + 3) is still four consecutive floats there (lanes q, q + 1).
// DG: dQ's head dim; the accumulator has D = tile_dim(DG) columns. Float4 i of dQ, columns 4c .. 4c + 3 of
// accumulator row src (a multiple of B_r starts every tile).
template <typename T, int DG, bool IMAGE, int BR>
__device__ __forceinline__ void convert_chunk(const float* __restrict__ acc, T* __restrict__ dQ, long long i,
                                              long long src, int c, float scale) {
  constexpr int D = tile_dim(DG);
  const long long at = IMAGE ? (src - src % BR) * D + dq_image_float<D, BR>((int)(src % BR), 4 * c) : src * D + 4 * c;
  const float4 a = *reinterpret_cast<const float4*>(acc + at);
  uint2 out;
  out.x = pack2<T>(a.x * scale, a.y * scale);
  out.y = pack2<T>(a.z * scale, a.w * scale);
  reinterpret_cast<uint2*>(dQ)[i] = out;
}
// dQ [B*H][M][DG]: row bh * M + r comes from accumulator row bh * M_pad + r.
template <typename T, int DG, bool IMAGE, int BR>
__global__ void __launch_bounds__(kThreads)
    bwd_convert(const float* __restrict__ acc, T* __restrict__ dQ, long long n4, int M, int M_pad, float scale) {
  const long long i = (long long)blockIdx.x * kThreads + threadIdx.x;   // one float4 of dQ each
  if (i >= n4) return;
  const long long row = i / (DG / 4);
  convert_chunk<T, DG, IMAGE, BR>(acc, dQ, i, (row / M) * M_pad + row % M, (int)(i % (DG / 4)), scale);
}
// VARLEN: dQ [total_q][H][DG]: token t of query head h, in sequence b, comes from accumulator row h * va.rows
// + padded_start(cu_q[b], b) + t - cu_q[b].
template <typename T, int DG, bool IMAGE, int BR>
__global__ void __launch_bounds__(kThreads)
    bwd_convert_varlen(const float* __restrict__ acc, T* __restrict__ dQ, long long n4, const Varlen va, int B,
                       int H, float scale) {
  const long long i = (long long)blockIdx.x * kThreads + threadIdx.x;
  if (i >= n4) return;
  const long long row = i / (DG / 4), token = row / H, h = row % H;
  const int b = last_at_most(B, token, [&](int s) { return (long long)va.cu_q[s]; });
  const long long src = h * va.rows + padded_start(va.cu_q[b], b, BR) + (token - va.cu_q[b]);
  convert_chunk<T, DG, IMAGE, BR>(acc, dQ, i, src, (int)(i % (DG / 4)), scale);
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
// swizzle, zero fill out of bounds (rows past L of a head read as zeros, never the next head's).
// PACKED (VARLEN): [L][BH][D], a packed batch's [total][H][D], as the map (D, H, total), boxes of 64 columns x
// 1 head x `box_rows` tokens: in shared memory the same rows x 128 bytes; tokens past the total read as zeros,
// a box that crosses into the next sequence reads its tokens (flash_bwd_body says why that is harmless).
template <typename T, bool PACKED = false>
bool make_map(CUtensorMap* map, const void* ptr, int BH, int L, int D, int box_rows) {
  const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)(PACKED ? BH : L), (cuuint64_t)(PACKED ? L : BH)};
  const cuuint64_t strides[2] = {(cuuint64_t)D * sizeof(T), (cuuint64_t)(PACKED ? BH : L) * D * sizeof(T)};
  const cuuint32_t box[3] = {64, PACKED ? 1u : (cuuint32_t)box_rows, PACKED ? (cuuint32_t)box_rows : 1u};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encoder()(map, type, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Query rows per tile at head dim D (Layout's B_r), and M rounded up to whole tiles: the padded length of
// the row terms and of the dQ accumulator.
inline int query_tile(int D, bool banded) {
  return D == 64 ? Layout<64, V8B_STAGES>::BR
                 : banded ? Layout<128, V8B_STAGES, true>::BR : Layout<128, V8B_STAGES, false>::BR;
}
inline long long padded_rows(int M, int D, bool banded) {
  return ((long long)M + query_tile(D, banded) - 1) / query_tile(D, banded) * query_tile(D, banded);
}

// V8B_HEAD_GROUP -1: the most kv heads (at least one) whose rows that every key tile of the head reads or adds
// to -- Q and dO in the input dtype, the dQ accumulator in fp32, for each of the `group` query heads that
// share the kv head -- take at most half of an L2 of l2 bytes (0 heads if l2 is 0: all heads, the first
// version's order). At N = 8192 and D = 128 a kv head's rows take 8 MiB (bf16).
inline int l2_head_group(long long l2, int group, long long M_pad, int D, size_t elem) {
  const long long per_head = (long long)group * M_pad * D * (2 * (long long)elem + 4);
  const long long heads = l2 / 2 / per_head;
  return l2 <= 0 ? 0 : heads < 1 ? 1 : heads > 0x7fffffffLL ? 0x7fffffff : (int)heads;
}
inline long long l2_bytes() {
  int dev = 0, bytes = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev);
  return bytes;
}

struct Args {
  const void *q, *k, *v, *o, *lse, *dout;
  void *dq, *dk, *dv;
  float* workspace;   // dq_acc [rows * D], lse2 and D_i [rows] each, turns int [rows / B_r] (rows: below)
  int B, H, H_kv, M, N;   // VARLEN: M = N = 1 (unused: the grid and the padding depend on the totals alone)
  float scale;
  int lo, hi;   // the band as the kernel takes it (see flash_bwd_ws); VARLEN: each block its own
  bool deterministic;
  cudaStream_t stream;
  Varlen va;    // VARLEN: the lengths, window and totals (va.rows set by run)
};

// The padded rows of the row terms and the accumulator: B * H * M_pad, or (VARLEN) H * padded_start(total_q, B).
inline long long padded_rows_all(const Args& a, int D, bool banded, bool varlen) {
  return varlen ? (long long)a.H * padded_start(a.va.total_q, a.B, query_tile(D, banded))
                : (long long)a.B * a.H * padded_rows(a.M, D, banded);
}

// The kernel a call launches: the default mode's row-term placement (V8B_ROW_PREFETCH), or the deterministic
// mode's (V8B_DET_ROW_PREFETCH, banded at D = 128's tiles with the bulk dQ path; elsewhere the same instance).
template <typename T, int DG, bool BANDED, int STAGES, bool VARLEN>
constexpr auto bwd_kernel(bool deterministic) {
  constexpr int ROWS = V8B_ROW_PREFETCH;
  constexpr int DET_ROWS =
      tile_dim(DG) == 128 && BANDED && Layout<tile_dim(DG), STAGES, BANDED>::DQ_BULK ? V8B_DET_ROW_PREFETCH : ROWS;
  if constexpr (VARLEN)
    return deterministic ? flash_bwd_varlen<T, DG, BANDED, STAGES, DET_ROWS> : flash_bwd_varlen<T, DG, BANDED, STAGES, ROWS>;
  else
    return deterministic ? flash_bwd_ws<T, DG, BANDED, STAGES, DET_ROWS> : flash_bwd_ws<T, DG, BANDED, STAGES, ROWS>;
}

// DG: the tensors' head dim, D the tiles' (flash_bwd_ws). VARLEN: a packed batch (flash_bwd_varlen).
template <typename T, int DG, bool BANDED, bool VARLEN>
const char* run(const Args& a) {
  constexpr int STAGES = V8B_STAGES, D = tile_dim(DG);
  using L = Layout<D, STAGES, BANDED>;
  // VARLEN: the grid's kv heads are H_kv, each with the batch's key tiles (flash_bwd_body)
  const long long BH = (long long)a.B * a.H, BH_kv = VARLEN ? a.H_kv : (long long)a.B * a.H_kv;
  const long long M_pad = padded_rows(a.M, D, BANDED), rows = padded_rows_all(a, D, BANDED, VARLEN);
  Varlen va = a.va;
  va.rows = rows / a.H;
  float* dq_acc = a.workspace;
  float* lse2 = dq_acc + rows * D;
  float* dvec = lse2 + rows;
  int* turns = reinterpret_cast<int*>(dvec + rows);   // the deterministic mode's, one per (head, query tile)
  const float scale_log2 = a.scale * 1.4426950408889634f;   // log2(e) * scale

  // Everything that can refuse the call, before anything is queued on the stream
  constexpr int rows_per_block = kThreads / (D / 8);
  const long long prep_blocks = (rows + rows_per_block - 1) / rows_per_block;
  const long long n4 = (VARLEN ? (long long)a.H * va.total_q : BH * a.M) * DG / 4;
  const long long convert_blocks = (n4 + kThreads - 1) / kThreads;
  if (prep_blocks > 0x7fffffffLL || M_pad > 0x7fffffffLL || convert_blocks > 0x7fffffffLL)
    return VARLEN ? "v8 backward: H * total_q is too large" : "v8 backward: B * H * M is too large";
  const long long n_blocks = VARLEN ? padded_start(va.total_k, a.B, L::BC) / L::BC : (a.N + L::BC - 1) / L::BC;
  if (n_blocks * BH_kv > 0x7fffffffLL)
    return VARLEN ? "v8 backward: H_kv * (total_k / 128 + B) must be below 2^31"
                  : "v8 backward: B * H_kv * ceil(N / 128) must be below 2^31";
  if (a.deterministic && !L::DQ_BULK)
    return "v8 backward: deterministic=True needs the bulk dQ reduction (V8B_DQ_BULK=1), which this build "
           "does not have at this head dim";
  const auto kernel = bwd_kernel<T, DG, BANDED, STAGES, VARLEN>(a.deterministic);
  constexpr size_t smem = L::DYNAMIC;
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if ((size_t)optin < smem) return "v8 backward: this GPU has too little shared memory per block for this tile";
  cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if (encoder() == nullptr) return "v8 backward: the driver has no cuTensorMapEncodeTiled (needs CUDA 12.0 or newer)";
  CUtensorMap tmQ, tmK, tmV, tmdO;
  // VARLEN: (D, H, total_q) and (D, H_kv, total_k)
  const int heads_q = VARLEN ? a.H : (int)BH, heads_k = VARLEN ? a.H_kv : (int)BH_kv;
  const int len_q = VARLEN ? va.total_q : a.M, len_k = VARLEN ? va.total_k : a.N;
  if (!make_map<T, VARLEN>(&tmQ, a.q, heads_q, len_q, DG, L::BR) ||
      !make_map<T, VARLEN>(&tmdO, a.dout, heads_q, len_q, DG, L::BR) ||
      !make_map<T, VARLEN>(&tmK, a.k, heads_k, len_k, DG, L::BC) ||
      !make_map<T, VARLEN>(&tmV, a.v, heads_k, len_k, DG, L::BC))
    return "v8 backward: cuTensorMapEncodeTiled refused a tensor (pointers must be 16-byte aligned)";

  // 1. row terms, zeroed accumulator (and the deterministic mode's turns)
  if (a.deterministic) {
    err = cudaMemsetAsync(turns, 0, (size_t)(rows / L::BR) * sizeof(int), a.stream);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  const T* o = static_cast<const T*>(a.o);
  const T* dout = static_cast<const T*>(a.dout);
  const float* lse = static_cast<const float*>(a.lse);
  if constexpr (VARLEN)
    bwd_prep_varlen<T, DG, L::BR><<<(unsigned)prep_blocks, kThreads, 0, a.stream>>>(o, dout, lse, dvec, lse2, dq_acc,
                                                                                   va, a.B, a.H);
  else
    bwd_prep<T, DG><<<(unsigned)prep_blocks, kThreads, 0, a.stream>>>(o, dout, lse, dvec, lse2, dq_acc, rows, a.M,
                                                                      (int)M_pad);

  // 2. dK, dV and dQ's additions (VARLEN: a kv head's rows are the whole batch's)
  const int head_group = BANDED && a.deterministic ? 0   // all heads in one group (the header says why)
                         : V8B_HEAD_GROUP >= 0 ? V8B_HEAD_GROUP
                         : l2_head_group(l2_bytes(), a.H / a.H_kv, VARLEN ? va.rows : M_pad, D, sizeof(T));
  int* const dq_turn = a.deterministic ? turns : nullptr;
  const unsigned blocks = (unsigned)(n_blocks * BH_kv);
  if constexpr (VARLEN)
    kernel<<<blocks, L::THREADS, smem, a.stream>>>(
        tmQ, tmK, tmV, tmdO, lse2, dvec, dq_acc, dq_turn, static_cast<T*>(a.dk), static_cast<T*>(a.dv), (int)BH_kv,
        a.H / a.H_kv, (int)n_blocks, scale_log2, a.scale, head_group, va);
  else
    kernel<<<blocks, L::THREADS, smem, a.stream>>>(
        tmQ, tmK, tmV, tmdO, lse2, dvec, dq_acc, dq_turn, static_cast<T*>(a.dk), static_cast<T*>(a.dv), (int)BH_kv,
        a.H / a.H_kv, a.M, a.N, (int)M_pad, scale_log2, a.scale, a.lo, a.hi, head_group);
  err = cudaGetLastError();
  if (err != cudaSuccess) return cudaGetErrorString(err);

  // 3. dQ = scale * accumulator, in the input dtype
  if constexpr (VARLEN)
    bwd_convert_varlen<T, DG, L::DQ_BULK, L::BR><<<(unsigned)convert_blocks, kThreads, 0, a.stream>>>(
        dq_acc, static_cast<T*>(a.dq), n4, va, a.B, a.H, a.scale);
  else
    bwd_convert<T, DG, L::DQ_BULK, L::BR><<<(unsigned)convert_blocks, kThreads, 0, a.stream>>>(
        dq_acc, static_cast<T*>(a.dq), n4, a.M, (int)M_pad, a.scale);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// banded: causal or a window that bounds some row (the BANDED instances). VARLEN: a packed batch.
template <typename T, bool VARLEN = false>
const char* dispatch(const Args& a, int D, bool banded) {
  if (D == 64) return banded ? run<T, 64, true, VARLEN>(a) : run<T, 64, false, VARLEN>(a);
  if (D == 96) return banded ? run<T, 96, true, VARLEN>(a) : run<T, 96, false, VARLEN>(a);   // on D = 128's tiles
  if (D == 128) return banded ? run<T, 128, true, VARLEN>(a) : run<T, 128, false, VARLEN>(a);
  return "v8 backward supports head_dim 64, 96 and 128 only";
}

// What both entry points refuse before anything is queued: the heads, the scale, the head dim and the GPU.
inline const char* check_call(int H, int H_kv, int D, float scale) {
  if (H_kv < 1 || H % H_kv != 0) return "v8 backward: q's heads must be a multiple of k's heads";
  if (!(scale > 0.f) || !std::isfinite(scale)) return "v8 backward: scale must be a finite number > 0";
  if (D != 64 && D != 96 && D != 128) return "v8 backward supports head_dim 64, 96 and 128 only";
  int dev = 0, major = 0, minor = 0;
  const cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0)
    return "v8 backward needs a Hopper GPU of compute capability 9.0 (H100/H200): it is built for sm_90a (wgmma, TMA)";
  return nullptr;
}

}  // namespace v8b

// Bytes of float32 scratch the launcher needs: the dQ accumulator and the two row terms, each padded to
// whole query tiles (B_r rows), and one int per query tile (the deterministic mode's turns); 0 for a head
// dim it does not take. Enough for either instance (V8B_BR80: the banded one pads to 64 rows, the other to 80).
size_t v8_backward_workspace_bytes(int B, int H, int M, int D) {
  if (D != 64 && D != 96 && D != 128) return 0;
  D = v8b::tile_dim(D);   // the accumulator has the tiles' columns (96 -> 128)
  const long long padded = std::max(v8b::padded_rows(M, D, false), v8b::padded_rows(M, D, true));
  const int tile = std::min(v8b::query_tile(D, false), v8b::query_tile(D, true));
  const size_t rows = (size_t)B * H * (size_t)padded;
  return rows * (D + 2) * sizeof(float) + rows / tile * sizeof(int);
}

// dtype: 0 = bfloat16, 1 = float16. workspace: v8_backward_workspace_bytes of float32 scratch. k, v, dk and dv
// have H_kv heads, H a multiple of H_kv. window_left, window_right: the sliding window (-1: unbounded).
// deterministic: dQ's additions in one order (V8B_DQ_BULK builds only). Returns nullptr or a message.
const char* v8_backward(const void* q, const void* k, const void* v, const void* o, const void* lse,
                        const void* dout, void* dq, void* dk, void* dv, float* workspace, int dtype, int B, int H,
                        int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                        int64_t window_right, bool deterministic, cudaStream_t stream) {
  if (B < 1 || H < 1 || M < 1 || N < 1) return "v8 backward: B, H, M and N must all be >= 1";
  if (const char* refused = v8b::check_call(H, H_kv, D, scale)) return refused;
  // The window as the kernel takes it, the band lo <= j - i <= hi (see flash_bwd_ws), exactly as the
  // forward has it: causal sets right = 0; -1, or a side that reaches past every key (left >= N) or every
  // row (right >= M), is clamped to N or M, where it bounds nothing. A window that bounds no row runs the
  // unmasked instances.
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > N ? N : (int)window_left;
  const int right = window_right < 0 || window_right > M ? M : (int)window_right;
  const bool banded = left < N || right < M;
  const v8b::Args a{q, k, v, o, lse, dout, dq, dk, dv, workspace, B, H, H_kv, M, N, scale,
                    N - M - left, N - M + right, deterministic, stream};
  switch (dtype) {
    case 0: return v8b::dispatch<__nv_bfloat16>(a, D, banded);
    case 1: return v8b::dispatch<__half>(a, D, banded);
    default: return "v8 backward: dtype must be bfloat16 or float16";
  }
}

// A packed batch of B sequences (backward_varlen): q, o, dout [total_q][H][D], k, v [total_k][H_kv][D], lse
// float32 [H][total_q], cu_q and cu_k int32 [B + 1] on the GPU (read by the kernels only: the grid depends on
// the totals alone, so no longest length is needed). workspace: v8_backward_varlen_workspace_bytes. Returns
// nullptr or a message.
size_t v8_backward_varlen_workspace_bytes(int B, int H, int total_q, int D) {
  if (D != 64 && D != 96 && D != 128) return 0;
  D = v8b::tile_dim(D);
  long long rows = 0;
  for (bool banded : {false, true})
    rows = std::max(rows, (long long)H * v8b::padded_start(total_q, B, v8b::query_tile(D, banded)));
  const int tile = std::min(v8b::query_tile(D, false), v8b::query_tile(D, true));
  return (size_t)rows * (D + 2) * sizeof(float) + (size_t)rows / tile * sizeof(int);
}

const char* v8_backward_varlen(const void* q, const void* k, const void* v, const void* o, const void* lse,
                               const void* dout, void* dq, void* dk, void* dv, float* workspace, const int* cu_q,
                               const int* cu_k, int dtype, int B, int H, int H_kv, int total_q, int total_k,
                               int D, bool causal, float scale, int64_t window_left, int64_t window_right,
                               bool deterministic, cudaStream_t stream) {
#if FLASHATTN_VARLEN
  if (B < 1 || H < 1 || total_q < 1 || total_k < 1) return "v8 backward: B, H, total_q and total_k must all be >= 1";
  if (const char* refused = v8b::check_call(H, H_kv, D, scale)) return refused;
  // Each block clamps the window to its own sequence; here only the instance, as v8_forward_varlen picks it:
  // the banded one for causal and any window (a side past 2^31 bounds no sequence of int32 lengths).
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > INT32_MAX ? -1 : (int)window_left;
  const int right = window_right < 0 || window_right > INT32_MAX ? -1 : (int)window_right;
  const bool banded = left >= 0 || right >= 0;
  v8b::Args a{q, k, v, o, lse, dout, dq, dk, dv, workspace, B, H, H_kv, 1, 1, scale, 0, 0, deterministic, stream};
  a.va = v8b::Varlen{cu_q, cu_k, B, H_kv, total_q, total_k, 0, left, right};
  switch (dtype) {
    case 0: return v8b::dispatch<__nv_bfloat16, true>(a, D, banded);
    case 1: return v8b::dispatch<__half, true>(a, D, banded);
    default: return "v8 backward: dtype must be bfloat16 or float16";
  }
#else
  return "v8 backward: backward_varlen needs a build with -DFLASHATTN_VARLEN=1";
#endif
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
// Only the headers the binding uses: <torch/extension.h> would double this half's build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>     // torch::wrap_pybind_function, used by load_inline's module code
#include <torch/csrc/utils/pybind.h>   // at::Tensor <-> torch.Tensor for pybind11
#include <cmath>
#include <optional>

size_t v8_backward_workspace_bytes(int B, int H, int M, int D);
const char* v8_backward(const void* q, const void* k, const void* v, const void* o, const void* lse,
                        const void* dout, void* dq, void* dk, void* dv, float* workspace, int dtype, int B, int H,
                        int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                        int64_t window_right, bool deterministic, cudaStream_t stream);
size_t v8_backward_varlen_workspace_bytes(int B, int H, int total_q, int D);
const char* v8_backward_varlen(const void* q, const void* k, const void* v, const void* o, const void* lse,
                               const void* dout, void* dq, void* dk, void* dv, float* workspace, const int* cu_q,
                               const int* cu_k, int dtype, int B, int H, int H_kv, int total_q, int total_k,
                               int D, bool causal, float scale, int64_t window_left, int64_t window_right,
                               bool deterministic, cudaStream_t stream);

// What both bindings ask of every tensor before anything else: q bfloat16 or float16 and the others alike (lse
// float32), on q's CUDA device, of the layout's rank, contiguous, 16-byte aligned, every dimension below 2^31.
// packed: the varlen layout ([total, heads, head_dim], lse [H, total_q]), where a batch may hold no token.
static void check_tensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                          const at::Tensor& lse, const at::Tensor& dout, bool packed) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "q must be bfloat16 or float16 (v8 has no fp32 mode)");
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o},
                         {"dout", &dout}, {"lse", &lse}}) {
    const bool is_lse = t == &lse;
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == (is_lse ? at::kFloat : dtype), name,
                is_lse ? " must be float32" : " must have the same dtype as q");
    const int rank = (packed ? 3 : 4) - (is_lse ? 1 : 0);
    TORCH_CHECK(t->dim() == rank, name, " must have rank ", rank,
                is_lse ? (packed ? " [H, total_q]" : " [B, H, M]")
                       : (packed ? " [total_tokens, heads, head_dim]" : " [B, H, L, D]"));
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(packed || t->numel() > 0, name, " has an empty dimension");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    TORCH_CHECK(t->numel() == 0 || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, name,
                " must be 16-byte aligned (TMA reads 16-byte aligned tensors)");
    for (int d = 0; d < t->dim(); ++d)
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
}

// q, o, dout: [B, H, M, D]; k, v: [B, H_kv, N, D] with H a multiple of H_kv; all bfloat16 or all float16,
// contiguous, 16-byte aligned, one CUDA device of compute capability 9.0; D in {64, 96, 128}; lse: float32
// [B, H, M] from forward_lse with the same q, k, v, causal, scale (None: 1/sqrt(D)) and window (a side -1:
// no bound). Returns (dq, dk, dv), dk and dv like k and v. The parameters are kernels/v6_backward.cu's, so
// that either file serves flashattn.autograd. deterministic=true: the key tiles add into each dQ tile in
// one order (bit-identical from run to run); refused by a V8B_DQ_BULK=0 build, whose float32 atomics
// have no order. Messages carry no numbers (see v6.cu).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                                                        at::Tensor lse, at::Tensor dout, bool causal,
                                                        bool deterministic, std::optional<double> scale,
                                                        int64_t window_left, int64_t window_right) {
  TORCH_CHECK(!deterministic || V8B_DQ_BULK != 0,
              "deterministic: this build of the v8 backward (V8B_DQ_BULK=0) sums dQ with float32 atomics in no "
              "fixed order; build it with V8B_DQ_BULK=1, or train with v6's backward (kernels/v6_backward.cu)");
  const auto dtype = q.scalar_type();
  check_tensors(q, k, v, o, lse, dout, false);
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 96 || q.size(3) == 128,
              "q: v8 backward supports head_dim 64, 96 and 128 only");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k must match q in batch and head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H_kv, N, D]");
  TORCH_CHECK(o.sizes() == q.sizes(), "o must have the shape of q [B, H, M, D]");
  TORCH_CHECK(dout.sizes() == q.sizes(), "dout must have the shape of q [B, H, M, D]");
  TORCH_CHECK(lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "lse must have shape [B, H, M]");
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(3)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const int B = q.size(0), H = q.size(1), H_kv = k.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const int64_t floats = (int64_t)(v8_backward_workspace_bytes(B, H, M, D) / sizeof(float));
  auto workspace = at::empty({floats}, q.options().dtype(at::kFloat));
  const char* err = v8_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                workspace.data_ptr<float>(), dtype == at::kBFloat16 ? 0 : 1, B, H, H_kv, M, N, D,
                                causal, s, window_left, window_right, deterministic,
                                c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {dq, dk, dv};
}

// The gradients of a packed batch (a build with -DFLASHATTN_VARLEN=1; flashattn.varlen_kernel), in one launch
// of each kernel: q, o, dout [total_q, H, D], k, v [total_k, H_kv, D], lse float32 [H, total_q] from
// forward_varlen_lse with the same lengths, causal, scale and window; cu_seqlens_q and cu_seqlens_k int32
// [B + 1] on q's device. The lengths stay on the GPU: nothing here reads them (flashattn.attention_varlen
// checks their values unless validate=False), and the grid depends on the totals alone, so the longest
// lengths are not asked for. Returns (dq, dk, dv).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_varlen(at::Tensor q, at::Tensor k, at::Tensor v,
                                                               at::Tensor o, at::Tensor lse, at::Tensor dout,
                                                               at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                                                               bool causal, bool deterministic,
                                                               std::optional<double> scale, int64_t window_left,
                                                               int64_t window_right) {
  TORCH_CHECK(!deterministic || V8B_DQ_BULK != 0,
              "deterministic: this build of the v8 backward (V8B_DQ_BULK=0) sums dQ with float32 atomics in no "
              "fixed order; build it with V8B_DQ_BULK=1");
  const auto dtype = q.scalar_type();
  check_tensors(q, k, v, o, lse, dout, true);
  TORCH_CHECK(q.size(1) > 0 && k.size(1) > 0, "q and k must have heads");
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 96 || q.size(2) == 128,
              "q: v8 backward supports head_dim 64, 96 and 128 only");
  TORCH_CHECK(k.size(2) == q.size(2), "k must match q in head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [total_k, H_kv, D]");
  TORCH_CHECK(o.sizes() == q.sizes(), "o must have the shape of q [total_q, H, D]");
  TORCH_CHECK(dout.sizes() == q.sizes(), "dout must have the shape of q [total_q, H, D]");
  TORCH_CHECK(lse.size(0) == q.size(1) && lse.size(1) == q.size(0), "lse must have shape [H, total_q]");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"cu_seqlens_q", &cu_seqlens_q},
                         {"cu_seqlens_k", &cu_seqlens_k}}) {
    TORCH_CHECK(t->is_cuda() && t->device() == q.device(), name, " must be a CUDA tensor on the device of q");
    TORCH_CHECK(t->scalar_type() == at::kInt, name, " must be int32");
    TORCH_CHECK(t->dim() == 1 && t->size(0) >= 2, name, " must be 1-D with batch + 1 >= 2 entries");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
  }
  TORCH_CHECK(cu_seqlens_k.size(0) == cu_seqlens_q.size(0), "cu_seqlens_k must have as many entries as cu_seqlens_q");
  TORCH_CHECK(cu_seqlens_q.size(0) - 1 < (int64_t{1} << 31), "cu_seqlens_q: the batch must be below 2^31");
  TORCH_CHECK(window_left >= -1 && window_right >= -1, "window_left and window_right must be -1 (no bound) or >= 0");
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(2)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const int B = cu_seqlens_q.size(0) - 1, H = q.size(1), H_kv = k.size(1), total_q = q.size(0), total_k = k.size(0),
            D = q.size(2);
  const c10::cuda::CUDAGuard guard(q.device());
  // no query or no key in the whole batch: every gradient is 0, nothing to launch
  if (total_q == 0 || total_k == 0) return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const int64_t floats = (int64_t)(v8_backward_varlen_workspace_bytes(B, H, total_q, D) / sizeof(float));
  auto workspace = at::empty({floats}, q.options().dtype(at::kFloat));
  const char* err = v8_backward_varlen(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                       dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                       workspace.data_ptr<float>(), cu_seqlens_q.data_ptr<int>(),
                                       cu_seqlens_k.data_ptr<int>(), dtype == at::kBFloat16 ? 0 : 1, B, H, H_kv,
                                       total_q, total_k, D, causal, s, window_left, window_right, deterministic,
                                       c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {dq, dk, dv};
}
#endif
