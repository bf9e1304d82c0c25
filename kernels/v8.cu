// v8: v7 plus FlashAttention-3's scheduling -- warp specialization, a register split between the roles,
// ping-pong between consumer warpgroups, the softmax of one tile overlapped with the products of the
// next, and persistent blocks. bf16/fp16, fp32 accumulation, causal masking, head dims 64, 128, 192 and
// 256.
// Needs an sm_90a build (-gencode=arch=compute_90a,code=sm_90a) and a GPU of compute capability 9.0
// (H100, H200).
//
// What changed from v7 (same products, same TMA tiles and swizzle, same online softmax):
//   * warp specialization (V8_SPECIALIZE): the block gets one extra warpgroup, the producer, whose
//     first thread only issues TMA copies -- Q_i once, then K_j and V_j into a ring of STAGES slots,
//     each slot waiting on its "empty" mbarrier before it is refilled. K and V now have separate full
//     and empty barriers, and the producer issues K_{j+1} before V_j, the order in which the consumers
//     need them. The consumer warpgroups never copy and never wait for each other to refill a slot;
//   * setmaxnreg (V8_SETMAXNREG): the producer needs a handful of registers, so it gives most of its
//     share back (setmaxnreg.dec) and the consumers take it (setmaxnreg.inc). The register file is the
//     budget: 128 x (producer + NWG x consumer) <= 65,536. It only works with a register cap at entry
//     (__launch_bounds__(threads, 1)) and with each role in one branch of a single if/else;
//   * ping-pong (V8_PINGPONG): consumer warpgroups take turns issuing their products, ordered by named
//     barriers (bar.sync on its own id, bar.arrive on the next warpgroup's), so while one warpgroup's
//     products run on the tensor cores the other does its softmax on the FMA and SFU units;
//   * intra-warpgroup overlap (V8_OVERLAP): the loop issues S_{i,j+1} = Q_i K_{j+1}^T, rescales O_i for
//     tile j while that runs, issues O_i += P_ij V_j, waits only for the first product (wgmma.wait_group
//     1) and runs the softmax of tile j + 1 while P_ij V_j is still on the tensor cores; packing P to
//     16 bits waits for the second (its registers are the A operand in flight), so P stays fp32 in the
//     S accumulators meanwhile. ptxas keeps no wgmma in flight across a branch, so the mask is a
//     template choice (a loop over the tiles that need none, then one over those that do) rather than
//     v7's run-time test; it still schedules part of the softmax after the second wait, to start packing
//     P early (tests/test_v8.py reads the SASS);
//   * persistent blocks (V8_PERSISTENT): one block per SM loops over work items (Q_i row blocks). The
//     trace build (V8_TRACE below) showed each block of the non-persistent kernel waiting before its
//     first product (Q_i and K_0 in flight) and writing O_i after its last; in a persistent block the
//     producer fetches the next item's Q_i (once every S of the item is done: the Q_i-empty barrier) and
//     K/V tiles while the consumers finish, and the K/V ring and the ping-pong turns carry on from item
//     to item. Causal items come longest first, taken in a snake order (V8_SNAKE), which evens out the
//     blocks' sums of key tiles where plain bands (block c: items c, G + c, ...) did not, and in groups of
//     heads whose keys and values the L2 holds (V8_HEAD_GROUP), where that keeps the balance.
//   Causal: tiles wholly above the diagonal are never loaded nor computed (the key-tile count ends at
//   the block's last visible key, as in v7) and only the tiles that cross it (or the end of N) are
//   masked; the row blocks with the most key tiles go first. A sliding window also starts the tiles at
//   the block's first visible key, and masks the tiles its left edge crosses in a loop of their own.
//   V8_SPECIALIZE=0 (the others then default to 0) is v7's loop on v8's barriers: every warpgroup
//   computes and thread 0 also copies; v7's tiles (2 warpgroups and two blocks per SM at D=64, 3 at
//   D=128).
//
// Contract. q [B, H, M, D], k and v [B, H_kv, N, D] with H a multiple of H_kv, contiguous, one CUDA
//   device, 16-byte aligned. Grouped-query attention: query head h reads kv head h / (H / H_kv), and
//   H_kv = 1 is multi-query attention; with the flat index bh = b * H + h that is kv head bh / group,
//   which is also the head coordinate of K's and V's tensor maps ([B * H_kv][N][D]).
//   scale > 0: the softmax scale, o = softmax(scale * q k^T) v (flashattn passes 1/sqrt(D) for
//   scale=None); the launcher folds log2(e) into it once (scale_log2).
//   dtype bf16 or fp16: fp32 accumulation, P rounded to the input dtype for the second product, output
//     in the input dtype. D in {64, 96, 128, 192, 256}; any M, N >= 1 (M != N allowed);
//     B * H * ceil(M / B_r) < 2^31.
//   causal=True is bottom-right aligned: query row i may attend key j iff j <= i + (N - M). Rows with no
//     key at all (the first M - N rows when M > N) are 0, not NaN.
//   window (window_left, window_right), FlashAttention-2's window_size, aligned the same way: row i may
//     attend key j iff i + (N - M) - window_left <= j <= i + (N - M) + window_right, -1 leaving that side
//     unbounded; causal=True is the window (-1, 0) and sets window_right to 0.
//   Needs compute capability 9.0 exactly (sm_90a instructions); the launcher refuses anything else.
//   Training: forward_lse(q, k, v, causal, scale, window_left, window_right) returns (o, lse), lse float32
//     [B, H, M] = m_i * scale + ln(l_i) (-inf for a row that sees no key), what kernels/v6_backward.cu
//     needs; o is bit-identical to forward's. Its kernels are compiled only with -DFLASHATTN_LSE=1
//     (flashattn.autograd.forward_module), so the forward-only build and its machine code are as they were.
//   Packed batches (flashattn.attention_varlen): forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
//     max_seqlen_q, causal, scale, window_left, window_right) takes FlashAttention-2's varlen layout: q and o
//     [total_q, H, D], k and v [total_k, H_kv, D], sequence b owning tokens cu_seqlens_q[b] ..
//     cu_seqlens_q[b + 1] - 1 of q and cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k and v (int32, on the
//     GPU: the kernel reads them, so one launch serves the batch and nothing is copied to the host). A work
//     item is (sequence, query head, row block). A one-block pre-pass (fwd_order_varlen, V8_VARLEN_ORDER)
//     lists the batch's row blocks, largest work first, and the persistent blocks take their items in that
//     order; V8_VARLEN_ORDER=0 spans the longest sequence's row blocks (max_seqlen_q) for every sequence,
//     the items past a sequence's end doing nothing. Each item takes its M and N, and its band, from its
//     sequence: causal and the window are aligned per sequence, as above. The tiles are the same; a Q_i box
//     may run into the next sequence's rows (never stored) and the last key tile into its keys (masked: the
//     mask's end of N is the sequence's). forward_varlen_lse also returns lse float32 [H, total_q],
//     FlashAttention-2's varlen layout. Its kernels (flash_fwd_varlen, and the pre-pass) are compiled only
//     with -DFLASHATTN_VARLEN=1 (flashattn.varlen_kernel) and share flash_fwd_ws's code (flash_fwd_body,
//     VARLEN a template constant): the other kernels' machine code is as it was (tests/test_v8.py). Checked
//     on an H200 (tests/test_varlen.py) and timed beside FlashAttention-4 and cuDNN in
//     results/h200/varlen.json.
//
// Tiles (per template instance; override with -D at build time, see the V8_* macros below):
//   D=64 : 3 consumer warpgroups + 1 producer (B_r = 192, 512 threads), B_c = 128, 2 stages. smem 24 KB
//          Q_i + 2 x (16 KB K_j + 16 KB V_j) = 88 KB (+1 KB to align the base): 1 block per SM.
//          Registers: 128 at entry (65,536 / 512); producer 32, consumers 160 (32 + 3 x 160 = 512).
//   D=128: 2 consumer warpgroups + 1 producer (B_r = 128, 384 threads), B_c = 128, 2 stages. smem 32 KB
//          Q_i + 2 x (32 + 32 KB) = 160 KB: 1 block per SM. Registers: 168 at entry (65,536 / 384,
//          down to a multiple of 8); producer 24, consumers 240 (24 + 2 x 240 = 504 = 3 x 168).
//   D=192: D=128's block (B_r = 128, 384 threads, the same register split), B_c = 112, 2 stages: smem
//          48 KB Q_i + 2 x (42 + 42 KB) = 216 KB. B_c = 128 would need 240 KB.
//   D=256: the same block, B_c = 80, 2 stages: smem 64 KB Q_i + 2 x (40 + 40 KB) = 224 KB, the most that
//          fits with the barriers and the alignment under the 227 KB a block may opt in to. The tiles at
//          both dims are FlashAttention-3's (hopper/tile_size.h: 128 x 112 and 128 x 80 "hit the limit of
//          smem"); a row block of 192 would leave no room for two stages.
//          D=192 and D=256: checked against float64 and under compute-sanitizer on an H200
//          (tests/test_v8_head_dims.py; results/h200/logs/*_head_dims_wip.log) and timed beside cuDNN,
//          FlashAttention-2 and FlashAttention-4 in results/h200/prefill_wide.json;
//          forward only (the backward kernels take 64 and 128). In their SASS ptxas leaves few of a tile's
//          exponentials inside the window in which P_j V_j is in flight (tests/test_v8.py counts them; at
//          D=128 the causal kernel keeps a good share there): the softmax of the wide dims is barely
//          overlapped, and the clock fence that holds it in the window (V8_CLOCK_FENCE) has not been timed
//          at these dims.
//   D=96:  D=128's block on zero-padded tiles (B_c = 160 without a mask, V8_D96_BC; 128 with one). A
//          128-byte-swizzled panel is 64 columns, so 96 columns would be a panel and a half of another swizzle
//          (another descriptor for every wgmma); instead the tensor maps keep the tensors' own 96 columns and the
//          second panel's box reads columns 96 .. 127 as zeros (TMA's out-of-bounds fill): they add 0 to S_ij,
//          O_i's columns there are 0 and are not stored (flash_fwd_body's DG). The price is D=128's arithmetic, a
//          third more than 96 needs; the instances of the other dims compile to the SASS they had (DG = D folds
//          every guard away) and every kernel keeps its name (flash_fwd_ws<T, 96, ...> is the new one). Checked
//          against float64 and under compute-sanitizer on an H200 (results/h200/logs/pytest_d96_4195698.log,
//          sanitizer_d96_4195698.log; with B_c = 160, pytest_head_dims_af827b5.xml, pytest_varlen_d96_af827b5.xml);
//          timed at (1, 32, 4096, 96) in results/h200/prefill_wide.json (commit af827b5), where FlashAttention-4,
//          which computes 96 as it is, took 0.95 of our time without a mask and 0.91 with the causal one.
//   Per consumer thread: O_i D/2, S_ij B_c/2 fp32, P_ij B_c/4 packed, all three live at once with the
//   overlap (D=128: 64 + 64 + 32; D=192: 96 + 56 + 28; D=256: 128 + 40 + 20, of 240 registers); the
//   consumers fit their share with no spills and no stack frame (tests/test_v8.py checks the split in the
//   SASS at every head dim). V8_D128_BC=176 is FlashAttention-3's key tile at D=128 (32 KB + 2 x (44 +
//   44 KB) = 208 KB of shared memory).
//
// Why these defaults (the chapter's sweep): specialization alone lost to v7's loop, and setmaxnreg did
// not win it back; ping-pong and the overlap brought v8 level with v7; persistent blocks were the first
// step ahead of it. Three stages (and B_c = 176) at D=128 were faster than the default in each of three
// separate runs (results/h200/v8_defaults.json: scripts/record_h200.sh OUT v8-defaults), by about 2%;
// timed again after the descriptor step, three stages were no faster (results/h200/logs/
// forward_candidates_descriptors_*.md) and no key tile was the fastest at every shape (forward_candidates_
// key_tile_*af827b5.md), so D=128 keeps two stages and B_c = 128.
// Instrumentation: V8_TRACE=1 builds forward_trace, whose clock stamps flashattn/book/trace.py reads; all
// of it is in the trace section below, whose macros expand to nothing otherwise.
// For the file with every switch at its default and the trace gone:
// python -m flashattn.measure.kernel_source v8.
//
// Results: results/h200/bench_v8.json (python -m flashattn.measure.bench v8 ...), the steps and
// variants results/h200/v8_sweep.json (python -m flashattn.measure.sweep v8), the persistent candidates
// results/h200/v8_candidates.json and v8_candidates_run1.json, the traces results/h200/v8_trace.json and
// v8_trace_nonpersistent.json, the profiles results/h200/flash_v8_*_profile.*; the chapter is
// book/v8.ipynb (docs/v8_notes.md).
#ifdef __CUDACC__
#include <cuda.h>            // CUtensorMap and its enums only: the encoder is fetched at run time
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

// Steps of the chapter (each 0 or 1; -D at build time). V8_SPECIALIZE=0 turns the others off by default.
#ifndef V8_SPECIALIZE
#define V8_SPECIALIZE 1
#endif
#ifndef V8_SETMAXNREG
#define V8_SETMAXNREG V8_SPECIALIZE
#endif
#ifndef V8_PINGPONG
#define V8_PINGPONG V8_SPECIALIZE
#endif
#ifndef V8_OVERLAP
#define V8_OVERLAP V8_SPECIALIZE
#endif
// Descriptors (the instructions that feed the tensor cores). Each switch: 0 off, 2 in every kernel, 1 (default)
// in the kernels where it was measured faster. At D = 128 the unmasked loop is 535 SASS instructions per key
// tile and warp with both off, 489 with V8_DESC_ADD, 473 with both (16 wgmmas, 64 exponentials; python -m
// flashattn.measure.sass v8 -D V8_DESC_ADD=0 -D V8_UNIFORM_WG=0). Nsight Compute at (2, 16, 8192, 128)
// counted 578.5 M instructions with both off, 513.1 M with both on and 485.5 M for FlashAttention-4
// (results/h200/logs/ncu_inst_16c90d8.md).
//   V8_DESC_ADD   a product's shared-memory descriptors made once per operand tile, each k step's offset
//                 added to the start-address field (kernels/v8_backward.cu's V8B_DESC_ADD); off, every
//                 wgmma's descriptor is made from its address, whose mask and shifts ptxas does not fold
//                 across the k steps. 1: at D = 64 and 128 (the wide dims were not timed with it);
//   V8_UNIFORM_WG the warpgroup index read from lane 0 through a shuffle (CUTLASS's canonical_warp_group_idx),
//                 so that ptxas knows it is one value per warp and keeps Q_i's descriptors, which depend on
//                 it, in uniform registers; off (threadIdx.x / 128), they sit in 16 ordinary registers and
//                 are copied over (R2UR) before every wgmma. 1: the causal (and windowed) kernel at D = 128.
//   Two runs (python -m flashattn.measure.forward_candidates --set descriptors; results/h200/logs/
//   forward_candidates_descriptors_16c90d8.md, _run2_1dc6db5.md), against both off: V8_DESC_ADD alone took
//   0.9% to 2.7% less time without a mask at D = 128, 0.3% to 1.1% more with it, within 0.5% at D = 64; both
//   together took 0.7% to 1.2% less at the four larger causal shapes at D = 128 (within 0.3% at the two
//   small ones) and 2.2% more at D = 64 causal. Hence the defaults, each kernel taking its faster build. In
//   the unmasked loop at D = 128 ptxas now schedules no exponential inside the window of P_ij V_j (41 and
//   43 before): that kernel's softmax overlaps only the other warpgroup's products, and it is still faster.
// Tile choices (override with -D for a sweep):
//   V8_D*_WG      consumer warpgroups per block, so B_r = 64 * WG (without specialization, v7's counts;
//                 2 at D=192 and 256 either way: Q_i of B_r = 192 would leave no room for two stages);
//   V8_D*_BC      keys per tile, B_c (64 or 128; FlashAttention-3 uses 176 at D=128; 112 at D=192 and
//                 80 at D=256: one wgmma's N for S_ij, and a multiple of 16 for P V's k steps);
//                 V8_D128_BC sets D=128's unmasked kernel, V8_D96_BC D=96's (160: the fastest of 128, 144,
//                 160 and 176 there, 5% less time than 128 in two runs; at D=128 none was the fastest at every
//                 shape, 144 taking 2% less time at (2, 16, 8192) and 6% more at (16, 16, 1024), so 128 stays:
//                 results/h200/logs/forward_candidates_key_tile_{af827b5,run2_af827b5}.md), and
//                 V8_D128_CAUSAL_BC the banded kernel of both;
//   V8_STAGES     K/V slots in shared memory (at least 2) at D=64 and 128;
//   V8_D192_STAGES, V8_D256_STAGES  the same at D=192 and 256, where Q_i and two stages of the default
//                 B_c already fill shared memory: they stay at 2 when a sweep raises V8_STAGES.
#ifndef V8_D64_WG
#define V8_D64_WG (V8_SPECIALIZE ? 3 : 2)
#endif
#ifndef V8_D64_BC
#define V8_D64_BC 128
#endif
#ifndef V8_D128_WG
#define V8_D128_WG (V8_SPECIALIZE ? 2 : 3)
#endif
#ifndef V8_D128_BC
#define V8_D128_BC 128
#endif
#ifndef V8_D128_CAUSAL_BC
#define V8_D128_CAUSAL_BC 128
#endif
#ifndef V8_D96_BC
#define V8_D96_BC 160
#endif
#ifndef V8_D192_WG
#define V8_D192_WG 2
#endif
#ifndef V8_D192_BC
#define V8_D192_BC 112
#endif
#ifndef V8_D256_WG
#define V8_D256_WG 2
#endif
#ifndef V8_D256_BC
#define V8_D256_BC 80
#endif
#ifndef V8_STAGES
#define V8_STAGES 2
#endif
#ifndef V8_D192_STAGES
#define V8_D192_STAGES 2
#endif
#ifndef V8_D256_STAGES
#define V8_D256_STAGES 2
#endif
// Scheduling across blocks:
//   V8_PERSISTENT     (on with the producer) grid = one block per SM, each looping over work items (a
//                     Q_i block of one head): the producer loads the next item's Q_i and first K/V
//                     tiles while the consumers finish the last P V and write O_i, and the ping-pong
//                     turns run on across items. V8_D64_PERSISTENT / V8_D128_PERSISTENT /
//                     V8_D192_PERSISTENT / V8_D256_PERSISTENT per head dim,
//                     V8_D64_CAUSAL_PERSISTENT for the causal D=64 kernel (persistent with the snake
//                     order below; with plain bands it was slower than one block per item);
//   V8_SNAKE          (causal, persistent) a block takes items c, 2G - 1 - c, 2G + c, ... (G blocks)
//                     rather than c, G + c, ...: items come longest first, so the mirror evens out the
//                     blocks' sums of key tiles.
// Candidates measured against the default (each off unless set):
//   V8_D64_CAUSAL_WG  consumer warpgroups of the causal D=64 kernel (default: V8_D64_WG);
//   V8_CLOCK_FENCE    a clock read after the overlapped softmax: ptxas no longer schedules part of it
//                     after the wait for P_ij V_j (found by the trace build, whose stamps do the same);
//   V8_MAX_CHAINS     the row max of S_ij in this many independent chains of fmaxf, joined at the end
//                     (FlashAttention-4's fmax_reduce keeps 4), rather than one chain through all B_c / 4
//                     of a row's pairs; bit-identical (max is exact in any order). Within 0.5% of the default
//                     either way in the same two runs;
//   V8_VARLEN_PREFETCH (with V8_VARLEN_ORDER) the consumers prefetch into L1 the pre-pass's record of the
//                     item after next while an item runs (each record is a line of its own in L2, where the
//                     lengths V8_VARLEN_ORDER=0 reads stay in one line of L1). 0.1% to 0.3% slower on all
//                     four batches of varlen_order (varlen_order_e9f1e8c.md), so the wait it was to save is
//                     not there, or not on the critical path. A programmatic dependent launch of the forward
//                     after the pre-pass measured nothing either (varlen_order_2651b6f.md) and is gone.
#ifndef V8_PERSISTENT
#define V8_PERSISTENT V8_SPECIALIZE
#endif
#ifndef V8_D64_PERSISTENT
#define V8_D64_PERSISTENT V8_PERSISTENT
#endif
#ifndef V8_D128_PERSISTENT
#define V8_D128_PERSISTENT V8_PERSISTENT
#endif
#ifndef V8_D192_PERSISTENT
#define V8_D192_PERSISTENT V8_PERSISTENT
#endif
#ifndef V8_D256_PERSISTENT
#define V8_D256_PERSISTENT V8_PERSISTENT
#endif
#ifndef V8_D64_CAUSAL_PERSISTENT
#define V8_D64_CAUSAL_PERSISTENT V8_D64_PERSISTENT
#endif
#ifndef V8_SNAKE
#define V8_SNAKE 1
#endif
// V8_HEAD_GROUP     (causal and windows, fixed length) the order of the items: longest first inside groups
//                     of heads, group after group, so that the blocks running at once read keys and values
//                     the L2 still holds. -1 (default): all heads when their K and V fit in half the L2,
//                     else the smallest group of kv heads whose blocks stay about as balanced as all heads'
//                     (head_group, in the launcher); 0: all heads in one group, the row block with the most
//                     key tiles of every head first (the first version's order: at (16, 16, 1024, 128) the
//                     132 blocks running at once read the keys of 132 heads, 66 MB, more than the L2 holds);
//                     G > 0: G kv heads per group. At head dims 64 and 128 (96, 192 and 256 keep all heads:
//                     not measured there). On the H200, causal, with FlashAttention-4 in the same run
//                     (python -m flashattn.measure.forward_candidates --set head_group,
//                     results/h200/logs/forward_candidates_head_group_54fc96b.md): (16, 16, 1024, 128) 199.5
//                     µs with all heads, 166.2 with the default's groups of one kv head (FlashAttention-4:
//                     169.5); (2, 16, 8192, 128) 859.5 -> 835.5; (1, 32, 4096, 128) 235.0 -> 230.1; (4, 32 /
//                     8, 4096, 128) 888.4 -> 878.5. Groups whose items alias with the grid (4 kv heads at
//                     8192; at (1, 32 / 8, 8192, 128) one kv head's 4 query heads) leave the busiest block
//                     1.7x the mean and took 1.5x as long: the launcher checks the balance for that.
// V8_VARLEN_ORDER   (packed batches) 1: a pre-pass lists the batch's row blocks, longest work first, and
//                     the persistent blocks take them round-robin (fwd_order_varlen). 0: the items of a
//                     fixed-length launch as large as the longest sequence, B x H x ceil(max_seqlen_q /
//                     B_r), in its order; most are empty when lengths differ, and the real ones fall to
//                     the blocks unevenly: on the H200 the varlen batch of flashattn.measure.varlen_bench
//                     took 1,595 µs with 0 and 1,123 with 1, causal (FlashAttention-4: 1,116), and 0.98x
//                     0's time without the mask (python -m flashattn.measure.varlen_order,
//                     results/h200/logs/varlen_order_fdc458f.md).
#ifndef V8_VARLEN_ORDER
#define V8_VARLEN_ORDER 1
#endif
#ifndef V8_HEAD_GROUP
#define V8_HEAD_GROUP -1
#endif
#ifndef V8_D64_CAUSAL_WG
#define V8_D64_CAUSAL_WG V8_D64_WG
#endif
#ifndef V8_CLOCK_FENCE
#define V8_CLOCK_FENCE 0
#endif
#ifndef V8_VARLEN_PREFETCH
#define V8_VARLEN_PREFETCH 0
#endif
#ifndef V8_UNIFORM_WG
#define V8_UNIFORM_WG 1
#endif
#ifndef V8_DESC_ADD
#define V8_DESC_ADD 1
#endif
#ifndef V8_MAX_CHAINS
#define V8_MAX_CHAINS 1
#endif
// FLASHATTN_LSE=1 (the training build, flashattn.autograd.forward_module): also compile the instances of
// forward_lse, which write the row-wise log-sum-exp for the backward (kernels/v6_backward.cu).
#ifndef FLASHATTN_LSE
#define FLASHATTN_LSE 0
#endif
// FLASHATTN_VARLEN=1 (the packed batches of flashattn.attention_varlen, flashattn.varlen_kernel): also compile
// the instances of forward_varlen (and, with FLASHATTN_LSE, of forward_varlen_lse), flash_fwd_varlen.
#ifndef FLASHATTN_VARLEN
#define FLASHATTN_VARLEN 0
#endif
// V8_TRACE=1: the instrumented build (the trace section below).
#ifndef V8_TRACE
#define V8_TRACE 0
#endif

namespace v8 {

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

// Named barriers 1..15 (0 is __syncthreads): bar.sync waits until `count` threads have reached the barrier
// either way; bar.arrive counts this warp in without waiting. The ping-pong hands a turn over with them.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
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

// The descriptor of the operand `off` bytes into the tile at `tile` (leading byte offset `lbo`). ADD (V8_DESC_ADD):
// the tile's descriptor, the same expression for every k step (ptxas makes it once), plus off / 16 in the
// start-address field; exact, as no shared-memory address reaches 256 KB, so the sum never carries out of
// the field's 14 bits.
template <bool ADD>
__device__ __forceinline__ uint64_t opdesc(uint32_t tile, uint32_t off, uint32_t lbo) {
  if constexpr (ADD) return make_desc(tile, lbo, 1024) + (off >> 4);
  else return make_desc(tile + off, lbo, 1024);
}

#define V8_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// One warpgroup-wide product D (64 x N, fp32, N / 2 registers per thread) += A (64 x 16) B (16 x N).
// Accumulator register 4t + i of lane (g = lane / 4, q = lane % 4) of warp w holds row 16w + g + 8(i / 2),
// column 8t + 2q + (i % 2). Written out per N because the asm text must be a literal; one macro per N
// makes the bf16 and the fp16 specialization from the same text.
template <int N, typename T> struct Wgmma;
#define V8_ACC64(d) V8_ACC8(d, 0), V8_ACC8(d, 8), V8_ACC8(d, 16), V8_ACC8(d, 24)
#define V8_ACC128(d) V8_ACC8(d, 0), V8_ACC8(d, 8), V8_ACC8(d, 16), V8_ACC8(d, 24), V8_ACC8(d, 32), V8_ACC8(d, 40), V8_ACC8(d, 48), V8_ACC8(d, 56)
// S-style: A (64 x 16) and B (N x 16) both from shared memory, both K-major.
// P V-style: A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1); accumulates.
#define WGMMA_N64(CTYPE, PTX)                                                                                     \
template <> struct Wgmma<64, CTYPE> {                                                                                \
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {                \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC64(d)                                                                                                \
        : "l"(a), "l"(b), "r"(accumulate));                                                                          \
  }                                                                                                                  \
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {                    \
    asm volatile(                                                                                                    \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n" \
        : V8_ACC64(d)                                                                                                \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                                       \
  }                                                                                                                  \
};
WGMMA_N64(__nv_bfloat16, "bf16")
WGMMA_N64(__half, "f16")
// S-style: A (64 x 16) and B (N x 16) both from shared memory, both K-major.
// P V-style: A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1); accumulates.
#define WGMMA_N128(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<128, CTYPE> {                                                                               \
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {                \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC128(d)                                                                                               \
        : "l"(a), "l"(b), "r"(accumulate));                                                                          \
  }                                                                                                                  \
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {                    \
    asm volatile(                                                                                                    \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n" \
        : V8_ACC128(d)                                                                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                                       \
  }                                                                                                                  \
};
WGMMA_N128(__nv_bfloat16, "bf16")
WGMMA_N128(__half, "f16")

#define V8_ACC176(d) V8_ACC128(d), V8_ACC8(d, 64), V8_ACC8(d, 72), V8_ACC8(d, 80)
// S only (B_c = 176, D = 128's wider key tile): A (64 x 16) and B (176 x 16) from shared memory, K-major.
#define WGMMA_N176(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<176, CTYPE> {                                                                               \
  static __device__ __forceinline__ void ss(float (&d)[88], uint64_t a, uint64_t b, int accumulate) {                \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n176k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC176(d)                                                                                               \
        : "l"(a), "l"(b), "r"(accumulate));                                                                          \
  }                                                                                                                  \
};
WGMMA_N176(__nv_bfloat16, "bf16")
WGMMA_N176(__half, "f16")
#define V8_ACC144(d) V8_ACC128(d), V8_ACC8(d, 64)
// S only (B_c = 144, a candidate at D = 128): A (64 x 16) and B (144 x 16) from shared memory, K-major.
#define WGMMA_N144(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<144, CTYPE> {                                                                            \
  static __device__ __forceinline__ void ss(float (&d)[72], uint64_t a, uint64_t b, int accumulate) {             \
    asm volatile(                                                                                                 \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"                                                              \
        "wgmma.mma_async.sync.aligned.m64n144k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, %72, %73, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC144(d)                                                                                            \
        : "l"(a), "l"(b), "r"(accumulate));                                                                       \
  }                                                                                                               \
};
WGMMA_N144(__nv_bfloat16, "bf16")
WGMMA_N144(__half, "f16")
#define V8_ACC160(d) V8_ACC128(d), V8_ACC8(d, 64), V8_ACC8(d, 72)
// S only (B_c = 160, a candidate at D = 128): A (64 x 16) and B (160 x 16) from shared memory, K-major.
#define WGMMA_N160(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<160, CTYPE> {                                                                            \
  static __device__ __forceinline__ void ss(float (&d)[80], uint64_t a, uint64_t b, int accumulate) {             \
    asm volatile(                                                                                                 \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"                                                              \
        "wgmma.mma_async.sync.aligned.m64n160k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, %80, %81, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC160(d)                                                                                            \
        : "l"(a), "l"(b), "r"(accumulate));                                                                       \
  }                                                                                                               \
};
WGMMA_N160(__nv_bfloat16, "bf16")
WGMMA_N160(__half, "f16")

// The wide head dims: their key tiles (B_c = 112 at D = 192, 80 at D = 256, the widest that fit two stages
// of K_j and V_j next to Q_i in shared memory) for S, and N = D for P V.
#define V8_ACC80(d) V8_ACC8(d, 0), V8_ACC8(d, 8), V8_ACC8(d, 16), V8_ACC8(d, 24), V8_ACC8(d, 32)
// S only (B_c = 80, D = 256's key tile): A (64 x 16) and B (80 x 16) from shared memory, K-major.
#define WGMMA_N80(CTYPE, PTX)                                                                                     \
template <> struct Wgmma<80, CTYPE> {                                                                                \
  static __device__ __forceinline__ void ss(float (&d)[40], uint64_t a, uint64_t b, int accumulate) {                \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n80k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC80(d)                                                                                                \
        : "l"(a), "l"(b), "r"(accumulate));                                                                          \
  }                                                                                                                  \
};
WGMMA_N80(__nv_bfloat16, "bf16")
WGMMA_N80(__half, "f16")
#define V8_ACC112(d) V8_ACC8(d, 0), V8_ACC8(d, 8), V8_ACC8(d, 16), V8_ACC8(d, 24), V8_ACC8(d, 32), V8_ACC8(d, 40), V8_ACC8(d, 48)
// S only (B_c = 112, D = 192's key tile): A (64 x 16) and B (112 x 16) from shared memory, K-major.
#define WGMMA_N112(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<112, CTYPE> {                                                                               \
  static __device__ __forceinline__ void ss(float (&d)[56], uint64_t a, uint64_t b, int accumulate) {                \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n112k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, %56, %57, p, 1, 1, 0, 0;\n}\n" \
        : V8_ACC112(d)                                                                                               \
        : "l"(a), "l"(b), "r"(accumulate));                                                                          \
  }                                                                                                                  \
};
WGMMA_N112(__nv_bfloat16, "bf16")
WGMMA_N112(__half, "f16")
#define V8_ACC192(d) V8_ACC128(d), V8_ACC8(d, 64), V8_ACC8(d, 72), V8_ACC8(d, 80), V8_ACC8(d, 88)
// P V only (N = D = 192): A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1).
#define WGMMA_N192(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<192, CTYPE> {                                                                               \
  static __device__ __forceinline__ void rs(float (&d)[96], const uint32_t (&a)[4], uint64_t b) {                    \
    asm volatile(                                                                                                    \
        "wgmma.mma_async.sync.aligned.m64n192k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, {%96, %97, %98, %99}, %100, 1, 1, 1, 1;\n" \
        : V8_ACC192(d)                                                                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                                       \
  }                                                                                                                  \
};
WGMMA_N192(__nv_bfloat16, "bf16")
WGMMA_N192(__half, "f16")
#define V8_ACC256(d) V8_ACC128(d), V8_ACC8(d, 64), V8_ACC8(d, 72), V8_ACC8(d, 80), V8_ACC8(d, 88), V8_ACC8(d, 96), V8_ACC8(d, 104), V8_ACC8(d, 112), V8_ACC8(d, 120)
// P V only (N = D = 256): A (64 x 16) from registers, B from shared memory MN-major (imm-trans-b = 1).
#define WGMMA_N256(CTYPE, PTX)                                                                                    \
template <> struct Wgmma<256, CTYPE> {                                                                               \
  static __device__ __forceinline__ void rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {                   \
    asm volatile(                                                                                                    \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX "." PTX " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n" \
        : V8_ACC256(d)                                                                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                                       \
  }                                                                                                                  \
};
WGMMA_N256(__nv_bfloat16, "bf16")
WGMMA_N256(__half, "f16")

// ---------------------------------------------------------------- trace (V8_TRACE) ------------------
// The instrumentation, all of it here. With V8_TRACE=1 one lane of the producer and of every consumer
// warpgroup writes clock64 stamps at its events per key tile into a buffer (forward_trace), which
// flashattn/book/trace.py reads with these same indices: [items][TRACE_ROLES][1 + tiles][TRACE_WORDS] of
// 64-bit words, role 0 the producer, 1.. the consumer warpgroups; row 0 a header, row 1 + t the stamps
// of key tile t. Otherwise every macro below expands to nothing and the kernel is compiled as if they
// were not there.
#if V8_TRACE || V8_CLOCK_FENCE
__device__ __forceinline__ uint64_t clock_now() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c)::"memory");
  return c;
}
// A predicated store, not a branch: ptxas keeps no wgmma in flight across a branch that may diverge, so
// an `if (lane == 0)` here would change the schedule being measured.
__device__ __forceinline__ void trace_store(unsigned long long* p, uint64_t v, bool on) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.u64 [%0], %1;\n}\n" ::"l"(p), "l"(v),
               "r"((int)on)
               : "memory");
}
#endif

#if V8_TRACE
constexpr bool kTraceBuild = true;
enum TraceShape { TRACE_ROLES = 4, TRACE_WORDS = 10 };
enum TraceHeader { H_SMID, H_GT0, H_CLK0, H_GT1, H_CLK1, H_TILES, H_M_BLOCK, H_BH, H_Q, H_END };
enum TraceConsumer { C_KWAIT, C_KREADY, C_VREADY, C_TURNWAIT, C_TURN, C_S_ISSUED, C_S_DONE, C_SOFTMAX_END,
                     C_PV_ISSUED, C_PV_DONE };
enum TraceProducer { P_KWAIT, P_K_ISSUED, P_VWAIT, P_V_ISSUED };
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return id;
}
// The kernel's extra parameters, and the launcher's arguments for them (a Trace `tr`).
#define V8_TRACE_PARAMS , unsigned long long* trace, int trace_items, int trace_tiles
#define V8_TRACE_ARGS(tr) , (tr).buffer, (tr).items, (tr).tiles
// The kernels' own trace parameters, passed on to their shared code.
#define V8_TRACE_FORWARD , trace, trace_items, trace_tiles
// In a role's code: its row of the buffer for `item`, and whether this thread writes (`on`).
#define V8_TRACE_ROW(role, item, on)                                                                     \
  unsigned long long* const trace_row =                                                                  \
      trace + ((size_t)(item) * TRACE_ROLES + (role)) * (1 + trace_tiles) * TRACE_WORDS;                \
  const bool traced = (int)(item) < trace_items && (on)
#define V8_STAMP(t, ev) trace_store(trace_row + (1 + (t)) * TRACE_WORDS + (ev), clock_now(), traced)
#define V8_HEAD(field, value) trace_store(trace_row + (field), (uint64_t)(value), traced)
// What every traced row starts with: where and when it ran, and which item it is.
#define V8_HEADS()                                                                                       \
  do {                                                                                                   \
    V8_HEAD(H_SMID, sm_id()); V8_HEAD(H_GT0, global_ns()); V8_HEAD(H_CLK0, clock_now());                  \
    V8_HEAD(H_TILES, n_tiles); V8_HEAD(H_M_BLOCK, m_block); V8_HEAD(H_BH, bh);                           \
  } while (0)
// The end of a role's item: the last stamps of its header row.
#define V8_TAIL()                                                                                        \
  do {                                                                                                   \
    V8_HEAD(H_END, clock_now()); V8_HEAD(H_GT1, global_ns()); V8_HEAD(H_CLK1, clock_now());               \
  } while (0)
#else
constexpr bool kTraceBuild = false;
#define V8_TRACE_PARAMS
#define V8_TRACE_ARGS(tr)
#define V8_TRACE_FORWARD
#define V8_TRACE_ROW(role, item, on) ((void)0)
#define V8_STAMP(t, ev) ((void)0)
#define V8_HEAD(field, value) ((void)0)
#define V8_HEADS() ((void)0)
#define V8_TAIL() ((void)0)
#endif

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

// ---------------------------------------------------------------- the kernel ---------------------------
//
// Shared memory, every tile 1024-byte aligned: Q_i, then STAGES x K_j, then STAGES x V_j, then the
// mbarriers (Q; full K, full V, empty K, empty V per stage). A tile of R rows and D columns is D / 64
// panels of [R rows][64 columns] = R x 128 bytes (one TMA box each: the 128-byte swizzle allows at most
// 128 bytes per box row).

// The head dim the tiles have for tensors of head dim d: whole 64-column panels (96 -> 128).
__host__ __device__ constexpr int tile_dim(int d) { return (d + 63) / 64 * 64; }

template <int D, int NWG, int BC, int STAGES, bool SPECIALIZE>
struct Layout {
  // A 128-byte-swizzled panel is 64 columns (D = 96 would need a half panel of another swizzle: it runs on
  // D = 128's tiles, tile_dim).
  static_assert(D % 64 == 0, "v8's tiles are whole 64-column panels");
  static_assert(BC % 16 == 0, "P V takes the key tile in k steps of 16");
  static constexpr int BR = 64 * NWG;
  static constexpr int THREADS = 128 * (NWG + (SPECIALIZE ? 1 : 0));
  static constexpr int PANELS = D / 64;
  static constexpr uint32_t Q_BYTES = BR * D * 2, KV_BYTES = BC * D * 2;
  static constexpr uint32_t K_OFF = Q_BYTES, V_OFF = K_OFF + STAGES * KV_BYTES;
  static constexpr uint32_t BAR_OFF = V_OFF + STAGES * KV_BYTES;
  static constexpr uint32_t BYTES = BAR_OFF + 8 * (2 + 4 * STAGES);   // the last: Q_i empty (persistent)
  static constexpr size_t DYNAMIC = BYTES + 1024;   // room to round the base up to 1024 bytes
  // Blocks per SM the register budget must allow: one with a producer (setmaxnreg hands registers
  // between the warpgroups of one block); without, two where two fit in shared memory, as v7 got at D=64.
  static constexpr int MIN_BLOCKS = !SPECIALIZE && THREADS <= 256 && 2 * (DYNAMIC + 1024) <= 228 * 1024 ? 2 : 1;
};

// The register split: every warpgroup starts with the cap that 128 x (1 + NWG) threads get from the 65,536
// registers (a multiple of 8); the producer keeps what one TMA-issuing thread needs and the consumers
// share what it gives back, so that the block never holds more than it was launched with.
template <int NWG>
struct Registers {
  static constexpr int ENTRY = 65536 / (128 * (NWG + 1)) / 8 * 8;
  static constexpr int PRODUCER = NWG == 2 ? 24 : 32;
  static constexpr int SHARE = ((NWG + 1) * ENTRY - PRODUCER) / NWG / 8 * 8;
  static constexpr int CONSUMER = SHARE > 256 ? 256 : SHARE;
  static_assert(PRODUCER + NWG * CONSUMER <= (NWG + 1) * ENTRY, "the split must fit the launch allotment");
};

// A packed batch (VARLEN, forward_varlen): sequence b's queries are tokens cu_q[b] .. cu_q[b + 1] - 1 of q and o
// ([total_q][H][D]), its keys tokens cu_k[b] .. cu_k[b + 1] - 1 of k and v ([total_k][H_kv][D]); H query heads;
// total_q, also the row length of lse ([H][total_q]); the window's sides as the caller gave them (-1: no bound;
// causal has set the right one to 0), which each item clamps to its own sequence.
// order (V8_VARLEN_ORDER): the pre-pass's list, order[0] the number of row blocks P, then from order + 4 one
// record of 8 ints per row block, in the order the blocks take them: its sequence's (q_tok, k_tok, M, N), its
// index among the sequence's row blocks, 3 unused. Item p * H + h is query head h of row block p.
struct Varlen {
  const int* cu_q;
  const int* cu_k;
  int H, total_q, total_k, window_left, window_right;
  int* order;
  long long order_ints;   // order's size (the launcher checks it)
};

// The kernel's code, shared by flash_fwd_ws (fixed length, below: its machine code is what it was before the
// packed batches) and flash_fwd_varlen (VARLEN: a packed batch, whose items read M, N and the band from va).
// WITH_LSE (training, forward_lse): also write lse_i = ln(sum_j exp(S_ij * scale)), float32 [B*H][M], for
// the backward (kernels/v6_backward.cu); LSE and the window come after scale_log2, so the forward-only
// instance keeps its parameter layout and machine code.
// CAUSAL: the instance for causal=True and for any sliding window, in which row i sees key j iff
// lo <= j - i <= hi: a band of diagonals, lo = N - M - window_left, hi = N - M + window_right. The
// launcher clamps the window's sides to [0, N] and [0, M], past which they bound nothing, so lo >= -M and
// hi <= N (no bound on that side; causal is lo = -M, hi = N - M), and no sum below can overflow.
// DG: the head dim of q, k, v and o in global memory; D, the one computed, is DG rounded up to whole panels
// (DG = 96 runs D = 128: the maps fill columns 96 .. 127 of Q_i, K_j and V_j with zeros, which add nothing
// to S_ij and give O_i zero columns that are not stored).
template <typename T, int D, int NWG, int BC, bool CAUSAL, int STAGES, bool SPECIALIZE, bool SETMAXNREG,
          bool PINGPONG, bool OVERLAP, bool PERSISTENT, bool WITH_LSE, bool VARLEN, int DG = D>
__device__ __forceinline__ void flash_fwd_body(const CUtensorMap& tmQ, const CUtensorMap& tmK, const CUtensorMap& tmV,
                                               T* __restrict__ O, int BH, int group, int M, int N, int m_blocks,
                                               float scale_log2, float* __restrict__ LSE, int lo, int hi,
                                               int head_group, const Varlen& va V8_TRACE_PARAMS) {
  static_assert(!PERSISTENT || SPECIALIZE, "the persistent loop needs the producer warpgroup");
  static_assert(SPECIALIZE || (!SETMAXNREG && !PINGPONG && !OVERLAP),
                "setmaxnreg, ping-pong and overlap need the producer warpgroup (V8_SPECIALIZE=1)");
  static_assert(!PINGPONG || NWG >= 2, "ping-pong needs two consumer warpgroups or more");
  static_assert(STAGES >= 2, "v8 keeps K_{j+1} and V_j in flight together: at least 2 stages");
  using L = Layout<D, NWG, BC, STAGES, SPECIALIZE>;
  constexpr int BR = L::BR, PANELS = D / 64, THREADS = L::THREADS;
  constexpr int NT = BC / 8;   // n8 column groups of S_ij per thread row
  constexpr int DT = D / 8;    // n8 column groups of O_i
  static_assert(DG % 8 == 0 && DG <= D && D - DG < 64, "DG pads to D within the last panel");

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + L::K_OFF, sV = base + L::V_OFF;
  const uint32_t bar_q = base + L::BAR_OFF;
  auto full_k = [&](int s) { return bar_q + 8u * (1 + s); };
  auto full_v = [&](int s) { return bar_q + 8u * (1 + STAGES + s); };
  auto empty_k = [&](int s) { return bar_q + 8u * (1 + 2 * STAGES + s); };
  auto empty_v = [&](int s) { return bar_q + 8u * (1 + 3 * STAGES + s); };
  const uint32_t empty_q = bar_q + 8u * (1 + 4 * STAGES);

  // the kernels the descriptor switches apply to (V8_DESC_ADD, V8_UNIFORM_WG: 1 where they were measured faster)
  constexpr bool DESC_ADD = V8_DESC_ADD == 2 || (V8_DESC_ADD == 1 && (DG == 64 || DG == 128));
  constexpr bool UNIFORM_WG = V8_UNIFORM_WG == 2 || (V8_UNIFORM_WG == 1 && CAUSAL && DG == 128);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // warpgroup, warp inside it; UNIFORM_WG: lane 0's warpgroup, so that ptxas knows it is one per warp
  const int wg = UNIFORM_WG ? __shfl_sync(0xffffffffu, warp >> 2, 0) : warp >> 2, wq = warp & 3;

  // One work item: Q_i's row block m_block of head bh, and its key tiles kt0 .. kt0 + n_tiles - 1 (counted
  // from 0 below). Causal: the items with the most key tiles (last row blocks) go first, as in v6.
  int m_block = 0, bh = 0, bh_kv = 0, m0 = 0, kt0 = 0, n_tiles = 0;
  T* Oh = O;
  // VARLEN: bh = b * H + q_head, query head q_head of sequence b, whose rows start at token q_tok of q and o and
  // whose keys at token k_tok of k and v (0 otherwise); o's rows are H * D apart in the packed layout.
  int q_tok = 0, k_tok = 0, q_head = 0;
  const size_t o_row = VARLEN ? (size_t)va.H * DG : DG;
  auto set_item = [&](unsigned item) {   // unsigned: the division v8 had on blockIdx.x
    int4 seq{};   // VARLEN: the item's sequence, (q_tok, k_tok, M, N)
    if (VARLEN && V8_VARLEN_ORDER) {
      // the pre-pass's row block item / H: its sequence and m_block, one 32-byte sector (no read waits for
      // another, as the lengths would for the sequence's index); bh: the query head
      const int4* row_block = reinterpret_cast<const int4*>(va.order + 4) + 2 * (item / (unsigned)va.H);
      seq = row_block[0];
      m_block = row_block[1].x;
      bh = (int)(item % (unsigned)va.H);
    } else if (CAUSAL) {
      // head_group query heads at a time (V8_HEAD_GROUP; BH: all of them), longest first inside the group: the
      // row blocks of the group's last row block first, then the one below, ...; the last group may be smaller
      const unsigned span = (unsigned)head_group * m_blocks, g = item / span, r = item - g * span;
      const unsigned heads = min((unsigned)head_group, (unsigned)BH - g * head_group);
      bh = (int)(g * head_group + r % heads);
      m_block = m_blocks - 1 - (int)(r / heads);
    } else {
      m_block = item % m_blocks;
      bh = item / m_blocks;
    }
    m0 = m_block * BR;
    Oh = O + (size_t)bh * M * DG;
    // Grouped-query attention: query head h reads kv head h / group, and with H = group * H_kv that is
    // (b * H + h) / group = b * H_kv + h / group in the flat index.
    bh_kv = bh / group;
    if constexpr (VARLEN) {
      // the item's sequence: where its rows and keys start, M and N (the pre-pass's record, or the lengths in
      // global memory), and its band (lo, hi), which the launcher computes for one fixed-length call
      // (v8_forward) as here
      if (V8_VARLEN_ORDER) {
        q_head = bh;
      } else {
        const int b = bh / va.H;
        q_head = bh - b * va.H;
        seq = make_int4(va.cu_q[b], va.cu_k[b], va.cu_q[b + 1] - va.cu_q[b], va.cu_k[b + 1] - va.cu_k[b]);
      }
      q_tok = seq.x;
      k_tok = seq.y;
      M = seq.z;
      N = seq.w;
      const int left = va.window_left < 0 || va.window_left > N ? N : va.window_left;
      const int right = va.window_right < 0 || va.window_right > M ? M : va.window_right;
      lo = N - M - left;
      hi = N - M + right;
      Oh = O + ((size_t)q_tok * va.H + q_head) * DG;   // row r at (q_tok + r) * H * DG + q_head * DG
      bh_kv = q_head / group;                        // the kv head's index in k and v [total_k][H_kv][D]
    }
    kt0 = 0;
    n_tiles = (N + BC - 1) / BC;
    if (CAUSAL) {
      // the block's first row m0 sees keys from m0 + lo on (earlier tiles are skipped), its last row
      // min(m0 + BR, M) - 1 up to that row + hi (later tiles are skipped)
      const long long first_key = (long long)m0 + lo, last_key = (long long)min(m0 + BR, M) - 1 + hi;
      kt0 = first_key <= 0 ? 0 : (int)(first_key / BC);
      n_tiles = last_key < 0 ? 0 : max(0, (int)((min((long long)N, last_key + 1) + BC - 1) / BC) - kt0);
    }
    if constexpr (VARLEN)
      if (m0 >= M) n_tiles = 0;   // a row block past the end of its sequence: nothing to compute or write
  };
  // no row of the item sees a key: its output is 0 (threads `first`, `first` + `count`, ... write it), and
  // its lse -inf, which the backward reads as P = 0
  auto write_zeros = [&](int first, int count) {
    for (int idx = first; idx < BR * DG / 8; idx += count) {
      const int row = m0 + idx / (DG / 8);
      if (row < M) *reinterpret_cast<uint4*>(Oh + (size_t)row * o_row + (idx % (DG / 8)) * 8) = make_uint4(0, 0, 0, 0);
    }
    if constexpr (WITH_LSE) {
      for (int r = first; r < BR && m0 + r < M; r += count) {
        if constexpr (VARLEN)   // lse [H][total_q]
          LSE[(size_t)q_head * va.total_q + q_tok + m0 + r] = -INFINITY;
        else
          LSE[(size_t)bh * M + m0 + r] = -INFINITY;
      }
    }
  };
  const int items = VARLEN && V8_VARLEN_ORDER ? va.order[0] * va.H : m_blocks * BH;
  // Persistent: this block's k-th item, in bands of gridDim.x items (snake: odd bands mirrored). Items
  // only grow with k, so the first k past the end ends the loop.
  auto item_at = [&](int k) {
    const int c = (CAUSAL && V8_SNAKE && (k & 1)) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    return k * (int)gridDim.x + c;
  };
  // the first k' > k whose item has a key tile (its set_item done), or -1
  auto next_k = [&](int k) {
    for (++k; item_at(k) < items; ++k) {
      set_item(item_at(k));
      if (n_tiles > 0) return k;
    }
    return -1;
  };
  // V8_VARLEN_PREFETCH: the record of this block's k-th item into L1 (set_item reads it)
  auto prefetch_record = [&](int k) {
    const int item = item_at(k);
    if (item < items) asm volatile("prefetch.global.L1 [%0];\n" ::"l"(va.order + 4 + 8 * (item / va.H)));
  };
  // K/V tiles loaded (producer) or used (consumers) by this block before the current item: tile t of the
  // item is the block's tile kv_base + t of the ring (slot and phase). Always 0 without PERSISTENT.
  int kv_base = 0;
  if constexpr (!PERSISTENT) {
    if (VARLEN && (int)blockIdx.x >= items) return;   // the grid allows for the most row blocks a batch can have
    set_item(blockIdx.x);
    if (n_tiles == 0) {   // block-uniform
      write_zeros(tid, THREADS);
      return;
    }
  }

  // Tile t of K (or V) into slot u % STAGES (u = kv_base + t), once the consumers have let go of ring
  // tile u - STAGES there.
  auto load_k = [&](int t) {
    const int u = kv_base + t, s = u % STAGES;
    if (u >= STAGES) mbar_wait(empty_k(s), ((u / STAGES) - 1) & 1);
    mbar_arrive_expect_tx(full_k(s), L::KV_BYTES);
#pragma unroll
    for (int p = 0; p < PANELS; ++p) {
      if constexpr (VARLEN)   // (column, head, token)
        tma_load_3d(sK + s * L::KV_BYTES + p * BC * 128, &tmK, p * 64, bh_kv, k_tok + (kt0 + t) * BC, full_k(s));
      else
        tma_load_3d(sK + s * L::KV_BYTES + p * BC * 128, &tmK, p * 64, (kt0 + t) * BC, bh_kv, full_k(s));
    }
  };
  auto load_v = [&](int t) {
    const int u = kv_base + t, s = u % STAGES;
    if (u >= STAGES) mbar_wait(empty_v(s), ((u / STAGES) - 1) & 1);
    mbar_arrive_expect_tx(full_v(s), L::KV_BYTES);
#pragma unroll
    for (int p = 0; p < PANELS; ++p) {
      if constexpr (VARLEN)
        tma_load_3d(sV + s * L::KV_BYTES + p * BC * 128, &tmV, p * 64, bh_kv, k_tok + (kt0 + t) * BC, full_v(s));
      else
        tma_load_3d(sV + s * L::KV_BYTES + p * BC * 128, &tmV, p * 64, (kt0 + t) * BC, bh_kv, full_v(s));
    }
  };
  auto load_q = [&] {
    mbar_arrive_expect_tx(bar_q, L::Q_BYTES);
#pragma unroll
    for (int p = 0; p < PANELS; ++p) {
      if constexpr (VARLEN)
        tma_load_3d(sQ + p * BR * 128, &tmQ, p * 64, q_head, q_tok + m0, bar_q);
      else
        tma_load_3d(sQ + p * BR * 128, &tmQ, p * 64, m0, bh, bar_q);
    }
  };

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 4 * NWG);   // lane 0 of every consumer warp
      mbar_init(empty_v(s), 4 * NWG);
    }
    if constexpr (PERSISTENT) mbar_init(empty_q, 4 * NWG);
    // make the initialised barriers visible to the copy engine (the async proxy)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // ---------------- the consumer: one warpgroup, 64 rows of Q_i, every key tile ----------------
  // cwg: which consumer; item: the work item (set_item done); q_phase: parity of its Q_i load; first /
  // last_item: the block's first / last item with a key tile (the ping-pong turns run on across items).
  auto consume = [&](const int cwg, const int item, const uint32_t q_phase, const bool first_item,
                     const bool last_item) {
    V8_TRACE_ROW(1 + cwg, item, wq == 0 && lane == 0);
    V8_HEADS();
    const int g = lane >> 2, q = lane & 3;
    const int warp_row0 = m0 + cwg * 64 + wq * 16;   // first of this warp's 16 rows
    const uint32_t q_base = sQ + cwg * 64 * 128;      // this warpgroup's rows start 64 x 128 bytes in
    // The tiles that need no mask, the same for the whole block: [first_unmasked, first_masked) of the
    // item's tiles. first_masked: the partial tile at the end of N, or (causal, window) the first tile
    // whose last key lies past the window of the block's first row (its keys end at m0 + hi).
    // first_unmasked (window): the first tile that starts at or after the first key of the block's last
    // row (0 for causal: every row's window starts at key 0 or before).
    int first_masked = N / BC, first_unmasked = 0;
    if (CAUSAL) {
      const long long seen = (long long)m0 + hi + 1;   // keys up to the first row's last one
      first_masked = min(first_masked, seen <= 0 ? 0 : (int)(seen / BC)) - kt0;
      const long long first_key = (long long)min(m0 + BR, M) - 1 + lo;   // the last row's first key
      first_unmasked = first_key <= 0 ? 0 : (int)((first_key + BC - 1) / BC) - kt0;
    }
    // Ping-pong: warpgroup c waits on barrier 1 + c and hands the turn to the next one, cyclically.
    // Each barrier completes when 128 threads wait and 128 arrive.
    auto turn_wait = [&] {
      if constexpr (PINGPONG) named_bar_sync(1 + cwg, 256);
    };
    auto turn_pass = [&](bool last) {
      // the last warpgroup's last pass would be to nobody: skip it so that every barrier ends balanced
      if constexpr (PINGPONG)
        if (!(last && last_item && cwg == NWG - 1)) named_bar_arrive(1 + (cwg + 1) % NWG, 256);
    };

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
    float s_acc[BC / 2];
    uint32_t p_pack[NT][2];
    float alpha[2];

    auto issue_s = [&](int t) {   // S_it = Q_i K_t^T: D / 16 k steps, both operands from shared memory
      const uint32_t k_base = sK + ((kv_base + t) % STAGES) * L::KV_BYTES;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t panel = kk / 4, within = (kk % 4) * 32;
        Wgmma<BC, T>::ss(s_acc, opdesc<DESC_ADD>(q_base, panel * BR * 128 + within, 16),
                         opdesc<DESC_ADD>(k_base, panel * BC * 128 + within, 16), kk > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int t) {   // O_i += P_it V_t: P from registers, V_t MN-major from shared memory
      const uint32_t v_base = sV + ((kv_base + t) % STAGES) * L::KV_BYTES;
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        // A fragment of keys [16kk, 16kk + 16): rows g / g + 8, keys 2q.. (n8 group 2kk) and 8 + 2q.. (2kk + 1)
        const uint32_t a[4] = {p_pack[2 * kk][0], p_pack[2 * kk][1], p_pack[2 * kk + 1][0], p_pack[2 * kk + 1][1]};
        Wgmma<D, T>::rs(o, a, opdesc<DESC_ADD>(v_base, kk * 16 * 128, BC * 128));
      }
      wgmma_commit();
    };
    auto release_k = [&](int t) { if (lane == 0) mbar_arrive(empty_k((kv_base + t) % STAGES)); };
    auto release_v = [&](int t) { if (lane == 0) mbar_arrive(empty_v((kv_base + t) % STAGES)); };
    auto wait_k = [&](int t) { mbar_wait(full_k((kv_base + t) % STAGES), ((kv_base + t) / STAGES) & 1); };
    auto wait_v = [&](int t) { mbar_wait(full_v((kv_base + t) % STAGES), ((kv_base + t) / STAGES) & 1); };

    // Mask tile t (keys past N; causal, window: keys outside the window), then the online softmax, one row
    // half (g or g + 8) at a time. MASK: Unmasked, Masked, or Checked (mask outside [first_unmasked,
    // first_masked), a run-time branch). PACK_NOW: P goes to 16 bits at once (nothing reads p_pack now);
    // otherwise P stays fp32 in s_acc until the product reading p_pack has finished. With the overlap the
    // mask must be a template choice: a branch between the two waits makes ptxas wait for the P V product
    // before it (it keeps no wgmma in flight across a branch that may diverge), and the softmax would no
    // longer overlap anything.
    auto softmax = [&](int t, auto pack_now, auto mask) {
      constexpr int MASK = decltype(mask)::value;
      if (MASK == 1 || (MASK == 2 && (t >= first_masked || t < first_unmasked))) {
        // Row i sees keys up to min(N - 1, i + hi) (CAUSAL: and from i + lo on). Measured from this
        // thread's first column in the tile ((kt0 + t) B_c + 2q), element (c, e) sits c * 8 + (e & 1)
        // further on: one compare with a constant per element and side, against two per-thread limits
        // (rows g and g + 8) per side, keeps the mask cheap in registers.
        int visible[2], before[2];   // from that column: the row's last key, the last key before its window
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = warp_row0 + g + 8 * h, col = (kt0 + t) * BC + 2 * q;
          // min(N - 1, row + hi) and row + lo, summed so that no step can pass 2^31 (hi - N and lo + M
          // are the window's sides less M and N: row + hi itself could, when M + N does)
          const int last = CAUSAL ? N + min(-1, row + (hi - N)) : N - 1;
          visible[h] = last - col;
          before[h] = (row - M) + (lo + M) - 1 - col;
        }
#pragma unroll
        for (int c = 0; c < NT; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int at = c * 8 + (e & 1);
            const bool outside = at > visible[e >> 1] || (CAUSAL && at <= before[e >> 1]);
            s_acc[4 * c + e] = outside ? -INFINITY : s_acc[4 * c + e];
          }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float chain[V8_MAX_CHAINS];   // V8_MAX_CHAINS: independent maxima, so the chain is not NT long
#pragma unroll
        for (int k = 0; k < V8_MAX_CHAINS; ++k) chain[k] = m_i[h];
#pragma unroll
        for (int c = 0; c < NT; ++c)
          chain[c % V8_MAX_CHAINS] = fmaxf(chain[c % V8_MAX_CHAINS], fmaxf(s_acc[4 * c + 2 * h], s_acc[4 * c + 2 * h + 1]));
        float mx = chain[0];
#pragma unroll
        for (int k = 1; k < V8_MAX_CHAINS; ++k) mx = fmaxf(mx, chain[k]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of a quad share a row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // a row that has seen only masked keys keeps max -inf: subtract 0 so that p = 0, not NaN; its
        // alpha is ex2(-inf) = 0, harmless on an O_i and l_i that are still 0
        const float m_base = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float rescale_by = ex2(m_i[h] * scale_log2 - m_base);   // computed always: no branch
        alpha[h] = mx == m_i[h] ? 1.f : rescale_by;
        m_i[h] = mx;
        float row_sum = 0.f;
#pragma unroll
        for (int c = 0; c < NT; ++c) {
          const float p0 = ex2(fmaf(s_acc[4 * c + 2 * h], scale_log2, -m_base));
          const float p1 = ex2(fmaf(s_acc[4 * c + 2 * h + 1], scale_log2, -m_base));
          row_sum += p0 + p1;
          if constexpr (decltype(pack_now)::value) {
            p_pack[c][h] = pack2<T>(p0, p1);
          } else {
            s_acc[4 * c + 2 * h] = p0;
            s_acc[4 * c + 2 * h + 1] = p1;
          }
        }
        l_i[h] = l_i[h] * alpha[h] + row_sum;   // a per-lane partial sum; the quad adds up at the end
      }
    };
    auto pack = [&] {
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) p_pack[c][h] = pack2<T>(s_acc[4 * c + 2 * h], s_acc[4 * c + 2 * h + 1]);
    };
    auto rescale = [&] {
#pragma unroll
      for (int t = 0; t < DT; ++t) {
        o[4 * t + 0] *= alpha[0];
        o[4 * t + 1] *= alpha[0];
        o[4 * t + 2] *= alpha[1];
        o[4 * t + 3] *= alpha[1];
      }
    };
    using Now = std::true_type;
    using Later = std::false_type;
    using Unmasked = std::integral_constant<int, 0>;
    using Masked = std::integral_constant<int, 1>;
    using Checked = std::integral_constant<int, 2>;

    if constexpr (PINGPONG)
      if (cwg == 0 && first_item) named_bar_arrive(1, 256);   // the first warpgroup takes the first turn
    mbar_wait(bar_q, q_phase);
    V8_HEAD(H_Q, clock_now());

    // Tile 0's S and softmax (O_i is still 0: nothing to rescale).
    V8_STAMP(0, C_KWAIT);
    wait_k(0);
    V8_STAMP(0, C_KREADY);
    V8_STAMP(0, C_TURNWAIT);
    turn_wait();
    V8_STAMP(0, C_TURN);
    wgmma_fence();
    issue_s(0);
    V8_STAMP(0, C_S_ISSUED);
    turn_pass(false);
    wgmma_wait<0>();
    pin(s_acc);
    V8_STAMP(0, C_S_DONE);
    release_k(0);
    softmax(0, Now{}, Checked{});
    V8_STAMP(0, C_SOFTMAX_END);

    // One iteration: O_i += P_ij V_j and S_{i,j+1}, then the softmax of tile j + 1.
    auto step = [&](int j, auto masked) {
      if constexpr (OVERLAP) {
        // S_{i,j+1} first, so that wait_group 1 is "S done, P V may still run".
        V8_STAMP(j + 1, C_KWAIT);
        wait_k(j + 1);
        V8_STAMP(j + 1, C_KREADY);
        wait_v(j);
        V8_STAMP(j, C_VREADY);
        V8_STAMP(j + 1, C_TURNWAIT);
        turn_wait();
        V8_STAMP(j + 1, C_TURN);
        wgmma_fence();
        issue_s(j + 1);
        V8_STAMP(j + 1, C_S_ISSUED);
        // O_i's rescale for tile j (alpha from tile j's softmax) runs while S_{i,j+1} is on the tensor
        // cores, before P_ij V_j accumulates into it: after the softmax below nothing waits on O_i but
        // the next product, so ptxas has no reason to pull the wait for P V up into the softmax.
        rescale();
        wgmma_fence();
        issue_pv(j);
        V8_STAMP(j, C_PV_ISSUED);
        turn_pass(false);
        wgmma_wait<1>();
        pin(s_acc);
        V8_STAMP(j + 1, C_S_DONE);
        release_k(j + 1);
        softmax(j + 1, Later{}, masked);   // runs while P_ij V_j is on the tensor cores
        // Nothing reads P before the wait below: passing it through an empty asm volatile keeps the
        // compiler from sinking the softmax past the wait.
        pin(s_acc);
        V8_STAMP(j + 1, C_SOFTMAX_END);
#if V8_CLOCK_FENCE && !V8_TRACE
        // A clock read (stored never: M < 0 is false) is a point ptxas schedules nothing across: the whole
        // softmax then stays ahead of the wait, as the trace build's stamps showed (tests/test_v8.py).
        trace_store(reinterpret_cast<unsigned long long*>(O), clock_now(), M < 0);
#endif
        wgmma_wait<0>();
        pin(o);
        V8_STAMP(j, C_PV_DONE);
        release_v(j);
        pack();
      } else {
        // v7's order: P V, wait, S, wait, softmax. The turn covers both products.
        wait_v(j);
        V8_STAMP(j, C_VREADY);
        V8_STAMP(j + 1, C_TURNWAIT);
        turn_wait();
        V8_STAMP(j + 1, C_TURN);
        wgmma_fence();
        issue_pv(j);
        V8_STAMP(j, C_PV_ISSUED);
        wgmma_wait<0>();
        pin(o);
        V8_STAMP(j, C_PV_DONE);
        release_v(j);
        V8_STAMP(j + 1, C_KWAIT);
        wait_k(j + 1);
        V8_STAMP(j + 1, C_KREADY);
        wgmma_fence();
        issue_s(j + 1);
        V8_STAMP(j + 1, C_S_ISSUED);
        turn_pass(false);
        if constexpr (!SPECIALIZE) {
          // thread 0 refills the slot tile j just left with tile j + STAGES while S runs
          if (tid == 0 && j + STAGES < n_tiles) {
            load_k(j + STAGES);
            load_v(j + STAGES);
          }
        }
        wgmma_wait<0>();
        pin(s_acc);
        V8_STAMP(j + 1, C_S_DONE);
        release_k(j + 1);
        softmax(j + 1, Now{}, masked);
        V8_STAMP(j + 1, C_SOFTMAX_END);
        rescale();
      }
    };
    int j = 0;
    if constexpr (OVERLAP) {   // the tiles without a mask, then those with one: no branch in either loop
      // (a window's left edge first: the tiles it crosses are masked too, in a loop of their own that
      // causal never enters)
      if constexpr (CAUSAL)
#pragma unroll 1
        for (; j + 1 < min(n_tiles, first_unmasked); ++j) step(j, Masked{});
#pragma unroll 1
      for (; j + 1 < min(n_tiles, first_masked); ++j) step(j, Unmasked{});
#pragma unroll 1
      for (; j + 1 < n_tiles; ++j) step(j, Masked{});
    } else {   // nothing in flight during the softmax: v7's run-time check, one loop, fewer registers
#pragma unroll 1
      for (; j + 1 < n_tiles; ++j) step(j, Checked{});
    }

    // The last tile's P V (with the overlap, O_i's rescale for it is still to do).
    // Every S_ij of the item is done: the producer may bring the next item's Q_i (persistent).
    if constexpr (PERSISTENT)
      if (lane == 0) mbar_arrive(empty_q);
    const int last = n_tiles - 1;
    wait_v(last);
    V8_STAMP(last, C_VREADY);
    turn_wait();
    if constexpr (OVERLAP) rescale();
    wgmma_fence();
    issue_pv(last);
    V8_STAMP(last, C_PV_ISSUED);
    turn_pass(true);
    wgmma_wait<0>();
    pin(o);
    V8_STAMP(last, C_PV_DONE);
    release_v(last);

    // ---- O_i / l_i, straight from registers ----
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_i[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv_l = l > 0.f ? 1.f / l : 0.f;   // l = 0 only for rows with no allowed key -> 0
      const int row = warp_row0 + g + 8 * h;
      if (row < M) {
        T* dst = Oh + (size_t)row * o_row + 2 * q;
#pragma unroll
        for (int t = 0; t < DT; ++t)
          if (8 * t < DG)   // (columns past DG are the zero padding)
            *reinterpret_cast<uint32_t*>(dst + t * 8) =
                pack2<T>(o[4 * t + 2 * h] * inv_l, o[4 * t + 2 * h + 1] * inv_l);
        // lse_i = (m_i * scale_log2 + log2(l_i)) * ln(2), as v6 writes it; -inf for a row with no visible key
        if (WITH_LSE && q == 0) {
          if constexpr (VARLEN)   // lse [H][total_q]
            LSE[(size_t)q_head * va.total_q + q_tok + row] =
                l > 0.f ? (m_i[h] * scale_log2 + __log2f(l)) * 0.6931471805599453f : -INFINITY;
          else
            LSE[(size_t)bh * M + row] = l > 0.f ? (m_i[h] * scale_log2 + __log2f(l)) * 0.6931471805599453f : -INFINITY;
        }
      }
    }
    V8_TAIL();
  };

  // The producer's copies for one item: Q_i, then K_0, then K_t before V_{t-1} (the order the consumers
  // use them). Persistent: K_0 may go before Q_i (its slot frees first) and Q_i's buffer must be let go
  // of by the previous item's last S (q_loads: Q_i loads before this one).
  auto produce = [&](const int item, const int q_loads) {
    V8_TRACE_ROW(0, item, true);
    V8_HEADS();
    V8_STAMP(0, P_KWAIT);
    if constexpr (PERSISTENT) {
      load_k(0);
      if (q_loads > 0) mbar_wait(empty_q, (q_loads - 1) & 1);
      load_q();
    } else {
      load_q();
      load_k(0);
    }
    V8_STAMP(0, P_K_ISSUED);
    V8_HEAD(H_Q, clock_now());
    for (int t = 1; t < n_tiles; ++t) {
      V8_STAMP(t, P_KWAIT);
      load_k(t);
      V8_STAMP(t, P_K_ISSUED);
      V8_STAMP(t - 1, P_VWAIT);
      load_v(t - 1);
      V8_STAMP(t - 1, P_V_ISSUED);
    }
    V8_STAMP(n_tiles - 1, P_VWAIT);
    load_v(n_tiles - 1);
    V8_STAMP(n_tiles - 1, P_V_ISSUED);
    V8_TAIL();
  };

  if constexpr (SPECIALIZE) {
    if (wg == 0) {
      // ---------------- the producer: warpgroup 0, one thread issues every copy ----------------
      if constexpr (SETMAXNREG) setmaxnreg_dec<Registers<NWG>::PRODUCER>();
      if (tid == 0) {
        if constexpr (PERSISTENT) {
          int q_loads = 0;   // items without a key tile have nothing to load (the consumers zero them)
          for (int k = next_k(-1); k >= 0; k = next_k(k)) {
            produce(item_at(k), q_loads++);
            kv_base += n_tiles;
          }
        } else {
          produce(blockIdx.x, 0);
        }
      }
    } else {
      if constexpr (SETMAXNREG) setmaxnreg_inc<Registers<NWG>::CONSUMER>();
      if constexpr (PERSISTENT) {
        int q_loads = 0;
        for (int k = 0; item_at(k) < items; ++k) {
          const int item = item_at(k);
          if constexpr (VARLEN && V8_VARLEN_ORDER && V8_VARLEN_PREFETCH) prefetch_record(k + 2);
          set_item(item);
          if (n_tiles == 0) {
            write_zeros(tid - 128, 128 * NWG);
            continue;
          }
          const bool last_item = next_k(k) < 0;
          set_item(item);   // next_k moved the item state on
          consume(wg - 1, item, q_loads & 1, q_loads == 0, last_item);
          ++q_loads;
          kv_base += n_tiles;
        }
      } else {
        consume(wg - 1, blockIdx.x, 0, true, true);
      }
    }
  } else {
    if (tid == 0) {
      load_q();
      for (int t = 0; t < STAGES && t < n_tiles; ++t) {
        load_k(t);
        load_v(t);
      }
    }
    consume(wg, blockIdx.x, 0, true, true);
  }
}

// One launch of fixed-length attention: q [B * H][M][D], k and v [B * H_kv][N][D] (the maps), o like q; the
// tiles are tile_dim(D) wide.
template <typename T, int D, int NWG, int BC, bool CAUSAL, int STAGES, bool SPECIALIZE, bool SETMAXNREG,
          bool PINGPONG, bool OVERLAP, bool PERSISTENT, bool WITH_LSE>
__global__ void __launch_bounds__(Layout<tile_dim(D), NWG, BC, STAGES, SPECIALIZE>::THREADS,
                                  Layout<tile_dim(D), NWG, BC, STAGES, SPECIALIZE>::MIN_BLOCKS)
    flash_fwd_ws(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                 const __grid_constant__ CUtensorMap tmV, T* __restrict__ O, int BH, int group, int M, int N,
                 int m_blocks, float scale_log2, float* __restrict__ LSE, int lo, int hi,
                 int head_group V8_TRACE_PARAMS) {
  flash_fwd_body<T, tile_dim(D), NWG, BC, CAUSAL, STAGES, SPECIALIZE, SETMAXNREG, PINGPONG, OVERLAP, PERSISTENT,
                 WITH_LSE, false, D>(tmQ, tmK, tmV, O, BH, group, M, N, m_blocks, scale_log2, LSE, lo, hi,
                                     head_group, Varlen{} V8_TRACE_FORWARD);
}

// One launch for a packed batch (FLASHATTN_VARLEN): q and o [total_q][H][D], k and v [total_k][H_kv][D] (the
// maps), BH = B * H items per row block, m_blocks the row blocks of the longest sequence.
template <typename T, int D, int NWG, int BC, bool CAUSAL, int STAGES, bool SPECIALIZE, bool SETMAXNREG,
          bool PINGPONG, bool OVERLAP, bool PERSISTENT, bool WITH_LSE>
__global__ void __launch_bounds__(Layout<tile_dim(D), NWG, BC, STAGES, SPECIALIZE>::THREADS,
                                  Layout<tile_dim(D), NWG, BC, STAGES, SPECIALIZE>::MIN_BLOCKS)
    flash_fwd_varlen(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV, T* __restrict__ O, int BH, int group, int m_blocks,
                     float scale_log2, float* __restrict__ LSE, const Varlen va V8_TRACE_PARAMS) {
  flash_fwd_body<T, tile_dim(D), NWG, BC, CAUSAL, STAGES, SPECIALIZE, SETMAXNREG, PINGPONG, OVERLAP, PERSISTENT,
                 WITH_LSE, true, D>(tmQ, tmK, tmV, O, BH, group, 0, 0, m_blocks, scale_log2, LSE, 0, 0,
                                    BH, va V8_TRACE_FORWARD);
}

// The varlen forward's pre-pass (V8_VARLEN_ORDER): the batch's row blocks into `order` (see Varlen), in the
// order the persistent blocks take them, each with its sequence's starts and lengths. Sequence b has
// n_b = ceil(M_b / B_r) row blocks, at most m_blocks (the longest the caller named: V8_VARLEN_ORDER=0 reaches
// no further). Longest work first, so that the round-robin ends on short items:
//   banded (causal, windows): by row block x, the highest first (causal: its rows see the most keys, when
//     M_b = N_b), the sequences of one x in rank order: (b, x) goes to slot level[x] + rank_b, level[x]
//     being the row blocks above x (the sum over b of max(0, n_b - x - 1));
//   otherwise: by sequence in rank order, each sequence's row blocks together (each does all N_b / B_c
//     key tiles): (b, x) goes to slot x after the row blocks of the sequences ranked before b.
// rank_b: how many sequences have more row blocks, or as many and a lower index; those are exactly the
// sequences before b in every level b is in. One block: a thread places whole sequences, with one scan of
// the lengths for its rank (O(B) per sequence).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) fwd_order_varlen(const int* __restrict__ cu_q,
                                                            const int* __restrict__ cu_k, int batch, int BR,
                                                            int m_blocks, bool banded, int* __restrict__ order,
                                                            int* __restrict__ level) {
  auto blocks_of = [&](int b) {
    const long long rows = (long long)cu_q[b + 1] - cu_q[b];
    return rows <= 0 ? 0 : (int)min((long long)m_blocks, (rows + BR - 1) / BR);
  };
  if (banded)
    for (int x = threadIdx.x; x < m_blocks; x += THREADS) {
      int above = 0;
      for (int b = 0; b < batch; ++b) above += max(0, blocks_of(b) - x - 1);
      level[x] = above;
    }
  __syncthreads();
  int4* records = reinterpret_cast<int4*>(order + 4);
  for (int b = threadIdx.x; b < batch; b += THREADS) {
    const int n = blocks_of(b);
    int rank = 0, before = 0;
    for (int s = 0; s < batch; ++s) {
      const int n_s = blocks_of(s);
      if (n_s > n || (n_s == n && s < b)) {
        ++rank;
        before += n_s;
      }
    }
    const int4 seq = make_int4(cu_q[b], cu_k[b], cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]);
    for (int x = 0; x < n; ++x) {
      const int slot = banded ? level[x] + rank : before + x;
      records[2 * slot] = seq;
      records[2 * slot + 1] = make_int4(x, 0, 0, 0);
    }
    if (rank == batch - 1) order[0] = before + n;   // the last sequence in rank order: every row block counted
  }
}

// ---------------------------------------------------------------- launcher ----------------------------

// Where an instrumented build (V8_TRACE) writes its stamps; buffer null: no trace asked for.
struct Trace {
  unsigned long long* buffer;
  int items, tiles;
};

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

// A 3-D map (dims and boxes innermost first, strides in bytes of the outer two), 128-byte swizzle, zero fill
// out of bounds.
template <typename T>
bool encode_map(CUtensorMap* map, const void* ptr, const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2],
                const cuuint32_t (&box)[3]) {
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      sizeof(T) == 2 && std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encoder()(map, type, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// [BH][L][D] as a 3-D map (innermost first), boxes of 64 columns x `box_rows` rows x 1 head.
template <typename T>
bool make_map(CUtensorMap* map, const void* ptr, int BH, int L, int D, int box_rows) {
  return encode_map<T>(map, ptr, {(cuuint64_t)D, (cuuint64_t)L, (cuuint64_t)BH},
                       {(cuuint64_t)D * sizeof(T), (cuuint64_t)L * D * sizeof(T)}, {64, (cuuint32_t)box_rows, 1});
}

// A packed batch's [total][H][D] (q, k or v of forward_varlen) as the map (D, H, total), boxes of 64 columns x
// 1 head x `box_rows` tokens: in shared memory the same rows x 128 bytes as make_map's boxes. Tokens past
// `total` read as zeros; a box that crosses into the next sequence reads that sequence's tokens, where a
// fixed-length box reads zeros: its rows of Q are never stored, its keys are masked (P = 0; a V row there
// is multiplied by 0, which needs it finite, as any input row is).
template <typename T>
bool make_packed_map(CUtensorMap* map, const void* ptr, int total, int H, int D, int box_rows) {
  return encode_map<T>(map, ptr, {(cuuint64_t)D, (cuuint64_t)H, (cuuint64_t)total},
                       {(cuuint64_t)D * sizeof(T), (cuuint64_t)H * D * sizeof(T)}, {64, 1, (cuuint32_t)box_rows});
}

// The L2's size in bytes (0 if the runtime does not say).
inline long long l2_bytes() {
  int dev = 0, bytes = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev);
  return bytes;
}

// The persistent blocks' balance under a causal order: the busiest block's key tiles over the mean, the blocks
// taking items as item_at does (bands of `grid` items, odd bands mirrored with V8_SNAKE) and each item the key
// tiles of its row block when M = N (rows of br, keys of bc). hg query heads per group (set_item), BH in all.
inline double causal_balance(long long BH, int m_blocks, long long hg, int grid, int br, int bc, int N) {
  std::vector<long long> load(grid, 0);
  const long long items = BH * m_blocks, span = hg * m_blocks;
  long long total = 0;
  for (long long i = 0; i < items; ++i) {
    const long long g = i / span, r = i - g * span, heads = std::min(hg, BH - g * hg);
    const long long x = m_blocks - 1 - r / heads, tiles = (std::min((x + 1) * br, (long long)N) + bc - 1) / bc;
    const long long k = i / grid, pos = i - k * grid;
    load[(V8_SNAKE && (k & 1)) ? grid - 1 - pos : pos] += tiles;
    total += tiles;
  }
  return total == 0 ? 1.0 : (double)*std::max_element(load.begin(), load.end()) * grid / total;
}

// How much worse a group's balance may be than all heads' (causal_balance) for the group to be taken: reading
// keys and values the L2 holds paid more than that at every causal row of the FlashAttention-4 table on the H200
// (python -m flashattn.measure.forward_candidates --set head_group, results/h200/logs/
// forward_candidates_head_group_{2017849,54fc96b}.md), where groups of one kv head, at most 0.03 worse, were 1%
// to 17% faster than all heads, and groups 0.075 to 0.78 worse were 6% to 58% slower.
constexpr double kBalanceSlack = 0.04;

// Query heads per group of the causal order (V8_HEAD_GROUP, flash_fwd_body's set_item). -1: all B * H when the
// kv heads' keys and values (N rows of row_bytes, twice) fit in half the L2; otherwise the smallest group of
// 1, 2, 4, ... kv heads, up to as many as fit there, whose blocks stay within kBalanceSlack of all heads' balance
// (the snake deals a group's long and short row blocks unevenly when its items alias with the grid), else all
// heads. 0: all heads; G > 0: G kv heads. A group's query heads share its kv heads (query head h reads kv head
// h / (H / H_kv), and consecutive flat indices b * H + h take consecutive kv heads). The choice is kept per shape.
// Only at head dims 64 and 128, where it was measured; 96, 192 and 256 keep all heads in one group.
inline int head_group(int B, int H, int H_kv, int N, int row_bytes, int m_blocks, int grid, int br, int bc) {
  const long long BH = (long long)B * H, group = H / H_kv, l2 = l2_bytes();
  if (V8_HEAD_GROUP == 0 || l2 <= 0) return (int)BH;
  if (V8_HEAD_GROUP > 0) return (int)std::min(BH, (long long)V8_HEAD_GROUP * group);
  const long long fit = std::max(1LL, l2 / 2 / (2LL * N * row_bytes));
  if (fit * group >= BH) return (int)BH;
  static thread_local std::map<std::tuple<long long, long long, long long, int, int, int, int, int>, int> chosen;
  const auto key = std::make_tuple(BH, group, fit, m_blocks, grid, br, bc, N);
  const auto found = chosen.find(key);
  if (found != chosen.end()) return found->second;
  const double all = causal_balance(BH, m_blocks, BH, grid, br, bc, N);
  int pick = (int)BH;
  for (long long kv = 1; kv <= fit && kv * group < BH; kv *= 2)
    if (causal_balance(BH, m_blocks, kv * group, grid, br, bc, N) <= all + kBalanceSlack) {
      pick = (int)(kv * group);
      break;
    }
  chosen.emplace(key, pick);
  return pick;
}

// VARLEN: a packed batch (flash_fwd_varlen) of B sequences, M the longest one's queries (max_seqlen_q), q
// [va.total_q][H][D], k and v [va.total_k][H_kv][D]; N, lo and hi are unused (each item has its own).
template <typename T, int D, int NWG, int BC, bool CAUSAL, int STAGES, bool SPECIALIZE, bool SETMAXNREG,
          bool PINGPONG, bool OVERLAP, bool PERSISTENT, bool WITH_LSE, bool VARLEN>
const char* launch(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv, int M,
                   int N, float scale, int lo, int hi, const Varlen& va, const Trace& trace, cudaStream_t stream) {
  using L = Layout<tile_dim(D), NWG, BC, STAGES, SPECIALIZE>;
  constexpr size_t smem = L::DYNAMIC;
  auto kernel = flash_fwd_ws<T, D, NWG, BC, CAUSAL, STAGES, SPECIALIZE, SETMAXNREG, PINGPONG, OVERLAP, PERSISTENT,
                             WITH_LSE>;
  const void* entry = reinterpret_cast<const void*>(kernel);
  if constexpr (VARLEN)   // (instantiated only here: builds without FLASHATTN_VARLEN compile none)
    entry = reinterpret_cast<const void*>(flash_fwd_varlen<T, D, NWG, BC, CAUSAL, STAGES, SPECIALIZE, SETMAXNREG,
                                                           PINGPONG, OVERLAP, PERSISTENT, WITH_LSE>);

  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if ((size_t)optin < smem) return "v8: this GPU has too little shared memory per block for this tile";
  cudaError_t err = cudaFuncSetAttribute(entry, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);

  const int m_blocks = (M + L::BR - 1) / L::BR;
  const long long BH = (long long)B * H;
  // VARLEN's pre-pass lists at most `row_blocks`: a sequence of M_b >= 1 rows has ceil(M_b / B_r) <= M_b of
  // them, and their sum is at most (total_q + B (B_r - 1)) / B_r
  const long long bound = ((long long)va.total_q + (long long)B * (L::BR - 1)) / L::BR,
                  row_blocks = bound < va.total_q ? bound : va.total_q;
  const bool ordered = VARLEN && V8_VARLEN_ORDER;
  const long long blocks = ordered ? row_blocks * H : (long long)m_blocks * BH;
  if (ordered && 4 + 8 * row_blocks + (CAUSAL ? m_blocks : 0) > va.order_ints)
    return "v8: the varlen order workspace is too small";
  // (persistent: an item index may run one grid past the last item)
  if (blocks + (PERSISTENT ? 4096 : 0) > 0x7fffffffLL) return "v8: B * H * ceil(M / B_r) must be below 2^31";
  if (trace.buffer != nullptr && trace.tiles < (N + BC - 1) / BC)
    return "v8: the trace buffer has too few tile rows for N";
  // persistent: one block per SM (the most that fit), each taking items blockIdx.x, + gridDim.x, ...
  unsigned grid = (unsigned)blocks;
  if (PERSISTENT) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    grid = (unsigned)(blocks < (long long)sms * L::MIN_BLOCKS ? blocks : (long long)sms * L::MIN_BLOCKS);
  }
  if (encoder() == nullptr) return "v8: the driver has no cuTensorMapEncodeTiled (needs CUDA 12.0 or newer)";
  CUtensorMap tmQ, tmK, tmV;   // of the tensors' own head dim: a box's columns past it read as zeros
  const bool mapped =
      VARLEN ? make_packed_map<T>(&tmQ, q, va.total_q, H, D, L::BR) &&
                   make_packed_map<T>(&tmK, k, va.total_k, H_kv, D, BC) &&
                   make_packed_map<T>(&tmV, v, va.total_k, H_kv, D, BC)
             : make_map<T>(&tmQ, q, (int)BH, M, D, L::BR) && make_map<T>(&tmK, k, B * H_kv, N, D, BC) &&
                   make_map<T>(&tmV, v, B * H_kv, N, D, BC);
  if (!mapped) return "v8: cuTensorMapEncodeTiled refused a tensor (pointers must be 16-byte aligned)";
  const float scale_log2 = scale * 1.4426950408889634f;   // log2(e) * scale
  if constexpr (VARLEN && V8_VARLEN_ORDER)
    fwd_order_varlen<512><<<1, 512, 0, stream>>>(va.cu_q, va.cu_k, B, L::BR, m_blocks, CAUSAL, va.order,
                                                 va.order + 4 + 8 * row_blocks);
  if constexpr (VARLEN)
    flash_fwd_varlen<T, D, NWG, BC, CAUSAL, STAGES, SPECIALIZE, SETMAXNREG, PINGPONG, OVERLAP, PERSISTENT, WITH_LSE>
        <<<grid, L::THREADS, smem, stream>>>(tmQ, tmK, tmV, static_cast<T*>(o), (int)BH, H / H_kv, m_blocks,
                                             scale_log2, lse, va V8_TRACE_ARGS(trace));
  else
    kernel<<<grid, L::THREADS, smem, stream>>>(tmQ, tmK, tmV, static_cast<T*>(o), (int)BH, H / H_kv, M, N, m_blocks,
                                               scale_log2, lse, lo, hi,
                                               CAUSAL && (D == 64 || D == 128)
                                                   ? head_group(B, H, H_kv, N, D * (int)sizeof(T), m_blocks, (int)grid,
                                                                L::BR, BC)
                                                   : (int)BH
                                               V8_TRACE_ARGS(trace));
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// VARLEN: the packed batch's instance of the same tiles and steps (va: its lengths and window).
template <typename T, bool CAUSAL, bool WITH_LSE, bool VARLEN>
const char* dispatch_d(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv,
                       int M, int N, int D, float scale, int lo, int hi, const Varlen& va, const Trace& trace,
                       cudaStream_t stream) {
  constexpr bool SPEC = V8_SPECIALIZE != 0;
  if (D == 64)
    return launch<T, 64, CAUSAL ? V8_D64_CAUSAL_WG : V8_D64_WG, V8_D64_BC, CAUSAL, V8_STAGES, SPEC,
                  V8_SETMAXNREG != 0, V8_PINGPONG != 0, V8_OVERLAP != 0,
                  (CAUSAL ? V8_D64_CAUSAL_PERSISTENT : V8_D64_PERSISTENT) != 0, WITH_LSE, VARLEN>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, va, trace, stream);
  if (D == 96)   // D = 128's block and settings, its own unmasked B_c; columns 96 .. 127 zero (flash_fwd_body's DG)
    return launch<T, 96, V8_D128_WG, CAUSAL ? V8_D128_CAUSAL_BC : V8_D96_BC, CAUSAL, V8_STAGES, SPEC,
                  V8_SETMAXNREG != 0, V8_PINGPONG != 0, V8_OVERLAP != 0, V8_D128_PERSISTENT != 0, WITH_LSE, VARLEN>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, va, trace, stream);
  if (D == 128)
    return launch<T, 128, V8_D128_WG, CAUSAL ? V8_D128_CAUSAL_BC : V8_D128_BC, CAUSAL, V8_STAGES, SPEC,
                  V8_SETMAXNREG != 0, V8_PINGPONG != 0, V8_OVERLAP != 0, V8_D128_PERSISTENT != 0, WITH_LSE, VARLEN>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, va, trace, stream);
  if (D == 192)
    return launch<T, 192, V8_D192_WG, V8_D192_BC, CAUSAL, V8_D192_STAGES, SPEC, V8_SETMAXNREG != 0,
                  V8_PINGPONG != 0, V8_OVERLAP != 0, V8_D192_PERSISTENT != 0, WITH_LSE, VARLEN>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, va, trace, stream);
  if (D == 256)
    return launch<T, 256, V8_D256_WG, V8_D256_BC, CAUSAL, V8_D256_STAGES, SPEC, V8_SETMAXNREG != 0,
                  V8_PINGPONG != 0, V8_OVERLAP != 0, V8_D256_PERSISTENT != 0, WITH_LSE, VARLEN>(
        q, k, v, o, lse, B, H, H_kv, M, N, scale, lo, hi, va, trace, stream);
  return "v8 supports head_dim 64, 96, 128, 192 and 256 only";
}

// lse == nullptr: the forward-only instance; otherwise the one that also writes lse (training), compiled
// only with -DFLASHATTN_LSE=1 (flashattn.autograd.forward_module passes it), so that a forward-only build
// compiles no more kernels than before. banded: causal or a window that bounds some row (the CAUSAL
// instance, see flash_fwd_body). VARLEN: a packed batch (v8_forward_varlen).
template <typename T, bool VARLEN>
const char* dispatch_lse(const void* q, const void* k, const void* v, void* o, float* lse, int B, int H, int H_kv,
                         int M, int N, int D, bool banded, float scale, int lo, int hi, const Varlen& va,
                         const Trace& trace, cudaStream_t stream) {
  if (lse == nullptr)
    return banded ? dispatch_d<T, true, false, VARLEN>(q, k, v, o, nullptr, B, H, H_kv, M, N, D, scale, lo, hi, va,
                                                       trace, stream)
                  : dispatch_d<T, false, false, VARLEN>(q, k, v, o, nullptr, B, H, H_kv, M, N, D, scale, lo, hi, va,
                                                        trace, stream);
#if FLASHATTN_LSE
  return banded ? dispatch_d<T, true, true, VARLEN>(q, k, v, o, lse, B, H, H_kv, M, N, D, scale, lo, hi, va, trace,
                                                    stream)
                : dispatch_d<T, false, true, VARLEN>(q, k, v, o, lse, B, H, H_kv, M, N, D, scale, lo, hi, va, trace,
                                                     stream);
#else
  return "v8: forward_lse needs a build with -DFLASHATTN_LSE=1";
#endif
}

// What both entry points refuse: heads that do not group, a bad scale or head dim, a GPU other than 9.0, a dtype
// other than bf16 / fp16.
inline const char* check_call(int H, int H_kv, int D, float scale, int dtype) {
  if (H_kv < 1 || H % H_kv != 0) return "v8: q's heads must be a multiple of k's heads";
  if (!(scale > 0.f) || !std::isfinite(scale)) return "v8: scale must be a finite number > 0";
  if (D != 64 && D != 96 && D != 128 && D != 192 && D != 256)
    return "v8 supports head_dim 64, 96, 128, 192 and 256 only";
  int dev = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0)
    return "v8 needs a Hopper GPU of compute capability 9.0 (H100/H200): it is built for sm_90a (wgmma, TMA)";
  if (dtype != 0 && dtype != 1) return "v8: dtype must be bfloat16 or float16";
  return nullptr;
}

}  // namespace v8

// dtype: 0 = bfloat16, 1 = float16. lse: nullptr, or float [B*H*M] for forward_lse. trace: null, or a
// buffer [trace_items][TRACE_ROLES][1 + trace_tiles][TRACE_WORDS] of 64-bit words for a V8_TRACE build. k and
// v have H_kv heads, H a multiple of H_kv. window_left, window_right: the sliding window (-1: unbounded).
// Returns nullptr or a message.
const char* v8_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype, int B, int H,
                       int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                       int64_t window_right, unsigned long long* trace, int trace_items, int trace_tiles,
                       cudaStream_t stream) {
  if (B < 1 || H < 1 || M < 1 || N < 1) return "v8: B, H, M and N must all be >= 1";
  if (trace != nullptr && !v8::kTraceBuild) return "v8: forward_trace needs a build with -DV8_TRACE=1";
  if (const char* refused = v8::check_call(H, H_kv, D, scale, dtype)) return refused;
  const v8::Trace tr{trace, trace_items, trace_tiles};
  const bool bf16 = dtype == 0;
  // The window as the kernel takes it, the band lo <= j - i <= hi (see flash_fwd_body): causal sets
  // right = 0; -1, or a side that reaches past every key (left >= N) or every row (right >= M), is
  // clamped to N or M, where it bounds nothing. A window that bounds no row runs the unmasked instance.
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > N ? N : (int)window_left;
  const int right = window_right < 0 || window_right > M ? M : (int)window_right;
  const int lo = N - M - left, hi = N - M + right;
  const bool banded = left < N || right < M;
  return bf16 ? v8::dispatch_lse<__nv_bfloat16, false>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi,
                                                       v8::Varlen{}, tr, stream)
              : v8::dispatch_lse<__half, false>(q, k, v, o, lse, B, H, H_kv, M, N, D, banded, scale, lo, hi,
                                                v8::Varlen{}, tr, stream);
}

// A packed batch of B sequences (forward_varlen): q and o [total_q][H][D], k and v [total_k][H_kv][D], cu_q and
// cu_k int32 [B + 1] on the GPU (never read here: the kernel reads them), max_seqlen_q the longest sequence's
// queries. lse: nullptr, or float [H][total_q] (forward_varlen_lse). order: order_ints ints of workspace for the
// pre-pass (V8_VARLEN_ORDER; the binding sizes it). Returns nullptr or a message.
const char* v8_forward_varlen(const void* q, const void* k, const void* v, void* o, float* lse, const int* cu_q,
                              const int* cu_k, int dtype, int B, int H, int H_kv, int total_q, int total_k,
                              int max_seqlen_q, int D, bool causal, float scale, int64_t window_left,
                              int64_t window_right, int* order, int64_t order_ints, cudaStream_t stream) {
#if FLASHATTN_VARLEN
  if (B < 1 || H < 1 || total_q < 1 || total_k < 1 || max_seqlen_q < 1)
    return "v8: B, H, total_q, total_k and max_seqlen_q must all be >= 1";
  if (const char* refused = v8::check_call(H, H_kv, D, scale, dtype)) return refused;
  // Each item clamps the window's sides to its own sequence (set_sequence in flash_fwd_body); here only the
  // instance: the banded one for causal and any window (a side past 2^31 bounds no sequence of int32 lengths).
  if (causal) window_right = 0;
  const int left = window_left < 0 || window_left > INT32_MAX ? -1 : (int)window_left;
  const int right = window_right < 0 || window_right > INT32_MAX ? -1 : (int)window_right;
  const bool banded = left >= 0 || right >= 0;
  const v8::Varlen va{cu_q, cu_k, H, total_q, total_k, left, right, order, order_ints};
  const v8::Trace none{nullptr, 0, 0};
  return dtype == 0 ? v8::dispatch_lse<__nv_bfloat16, true>(q, k, v, o, lse, B, H, H_kv, max_seqlen_q, 0, D, banded,
                                                            scale, 0, 0, va, none, stream)
                    : v8::dispatch_lse<__half, true>(q, k, v, o, lse, B, H, H_kv, max_seqlen_q, 0, D, banded, scale,
                                                     0, 0, va, none, stream);
#else
  return "v8: forward_varlen needs a build with -DFLASHATTN_VARLEN=1";
#endif
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
// Only the headers the binding uses: <torch/extension.h> would double this half's build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>     // torch::wrap_pybind_function, used by load_inline's module code
#include <torch/csrc/utils/pybind.h>   // at::Tensor <-> torch.Tensor for pybind11
#include <cmath>
#include <optional>

const char* v8_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype, int B, int H,
                       int H_kv, int M, int N, int D, bool causal, float scale, int64_t window_left,
                       int64_t window_right, unsigned long long* trace, int trace_items, int trace_tiles,
                       cudaStream_t stream);
const char* v8_forward_varlen(const void* q, const void* k, const void* v, void* o, float* lse, const int* cu_q,
                              const int* cu_k, int dtype, int B, int H, int H_kv, int total_q, int total_k,
                              int max_seqlen_q, int D, bool causal, float scale, int64_t window_left,
                              int64_t window_right, int* order, int64_t order_ints, cudaStream_t stream);

// q: [B, H, M, D], k and v: [B, H_kv, N, D] with H a multiple of H_kv, contiguous, all bfloat16 or all
// float16, on one CUDA device of compute capability 9.0; D in {64, 96, 128, 192, 256}; scale None means 1/sqrt(D), a
// window side -1 no bound. Returns o like q, and with_lse: lse float32 [B, H, M] too. Messages carry no
// numbers (see v6.cu). trace: null, or (forward_trace) an int64 buffer for a V8_TRACE build, see
// flashattn/book/trace.py.
static std::tuple<at::Tensor, at::Tensor> run_forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal,
                                                      std::optional<double> scale, int64_t window_left,
                                                      int64_t window_right, at::Tensor* trace,
                                                      bool with_lse = false) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "q must be bfloat16 or float16 (v8 has no fp32 mode)");
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
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 96 || q.size(3) == 128 || q.size(3) == 192 || q.size(3) == 256,
              "q: v8 supports head_dim 64, 96, 128, 192 and 256 only");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k must match q in batch and head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H_kv, N, D]");
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(3)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const int B = q.size(0), H = q.size(1), H_kv = k.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  unsigned long long* buffer = nullptr;
  int items = 0, tiles = 0;
  if (trace != nullptr) {
    TORCH_CHECK(trace->is_cuda() && trace->device() == q.device(), "trace must be on the device of q");
    TORCH_CHECK(trace->scalar_type() == at::kLong, "trace must be int64");
    TORCH_CHECK(trace->dim() == 4 && trace->size(1) == 4 && trace->size(3) == 10 && trace->size(2) >= 2,
                "trace must be [items, 4 roles, 1 + key tiles, 10 words] (flashattn.book.trace.buffer)");
    TORCH_CHECK(trace->is_contiguous(), "trace must be contiguous");
    TORCH_CHECK(trace->size(0) < (int64_t{1} << 31) && trace->size(2) < (int64_t{1} << 31),
                "trace: every dimension must be below 2^31");
    buffer = reinterpret_cast<unsigned long long*>(trace->data_ptr());
    items = trace->size(0);
    tiles = trace->size(2) - 1;
  }
  auto o = at::empty_like(q);
  at::Tensor lse;
  if (with_lse) lse = at::empty({B, H, M}, q.options().dtype(at::kFloat));
  const char* err = v8_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                               with_lse ? lse.data_ptr<float>() : nullptr, dtype == at::kBFloat16 ? 0 : 1, B, H,
                               H_kv, M, N, D, causal, s, window_left, window_right, buffer, items, tiles,
                               c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {o, lse};
}

at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal, std::optional<double> scale,
                   int64_t window_left, int64_t window_right) {
  return std::get<0>(run_forward(q, k, v, causal, scale, window_left, window_right, nullptr));
}

// Training: (o, lse), lse float32 [B, H, M] = ln(sum_j exp(scale * S_ij)), -inf for a row that sees no key.
std::tuple<at::Tensor, at::Tensor> forward_lse(at::Tensor q, at::Tensor k, at::Tensor v, bool causal,
                                               std::optional<double> scale, int64_t window_left,
                                               int64_t window_right) {
  return run_forward(q, k, v, causal, scale, window_left, window_right, nullptr, true);
}

// The same product (at scale 1/sqrt(D)), and clock stamps into `trace` (a build with -DV8_TRACE=1 only;
// others refuse).
at::Tensor forward_trace(at::Tensor q, at::Tensor k, at::Tensor v, bool causal, at::Tensor trace) {
  return std::get<0>(run_forward(q, k, v, causal, std::nullopt, -1, -1, &trace));
}

// A packed batch in FlashAttention-2's varlen layout, in one launch (a build with -DFLASHATTN_VARLEN=1;
// flashattn.varlen_kernel): q [total_q, H, D], k and v [total_k, H_kv, D], cu_seqlens_q and cu_seqlens_k int32
// [B + 1] on q's device, max_seqlen_q at least the longest sequence's queries. The lengths stay on the GPU:
// nothing here reads them (flashattn.attention_varlen checks their values unless validate=False), so rows of a
// sequence longer than max_seqlen_q are not computed. Returns o like q, and with_lse: lse float32 [H, total_q].
static std::tuple<at::Tensor, at::Tensor> run_forward_varlen(at::Tensor q, at::Tensor k, at::Tensor v,
                                                             at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                                                             int64_t max_seqlen_q, bool causal,
                                                             std::optional<double> scale, int64_t window_left,
                                                             int64_t window_right, bool with_lse) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "q must be bfloat16 or float16 (v8 has no fp32 mode)");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == dtype, name, " must have the same dtype as q");
    TORCH_CHECK(t->dim() == 3, name, " must have rank 3 [total_tokens, heads, head_dim]");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->size(1) > 0 && t->size(2) > 0, name, " has no heads or an empty head_dim");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    TORCH_CHECK(t->numel() == 0 || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, name,
                " must be 16-byte aligned (TMA reads 16-byte aligned tensors)");
    for (int d = 0; d < 3; ++d)
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 96 || q.size(2) == 128 || q.size(2) == 192 || q.size(2) == 256,
              "q: v8 supports head_dim 64, 96, 128, 192 and 256 only");
  TORCH_CHECK(k.size(2) == q.size(2), "k must match q in head_dim");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "k's heads must divide q's heads (grouped-query attention)");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [total_k, H_kv, D]");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"cu_seqlens_q", &cu_seqlens_q},
                         {"cu_seqlens_k", &cu_seqlens_k}}) {
    TORCH_CHECK(t->is_cuda() && t->device() == q.device(), name, " must be a CUDA tensor on the device of q");
    TORCH_CHECK(t->scalar_type() == at::kInt, name, " must be int32");
    TORCH_CHECK(t->dim() == 1 && t->size(0) >= 2, name, " must be 1-D with batch + 1 >= 2 entries");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
  }
  TORCH_CHECK(cu_seqlens_k.size(0) == cu_seqlens_q.size(0), "cu_seqlens_k must have as many entries as cu_seqlens_q");
  TORCH_CHECK(cu_seqlens_q.size(0) - 1 < (int64_t{1} << 31), "cu_seqlens_q: the batch must be below 2^31");
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_q <= q.size(0), "max_seqlen_q must be >= 0 and at most q's tokens");
  TORCH_CHECK(window_left >= -1 && window_right >= -1, "window_left and window_right must be -1 (no bound) or >= 0");
  const float s = (float)(scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(2)));
  TORCH_CHECK(std::isfinite(s) && s > 0.f, "scale must be a finite number > 0");
  const int B = cu_seqlens_q.size(0) - 1, H = q.size(1), H_kv = k.size(1), total_q = q.size(0), total_k = k.size(0),
            D = q.size(2);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto lse_options = q.options().dtype(at::kFloat);
  // no query, or no key in the whole batch (every row sees nothing: 0, and lse -inf): nothing to launch
  if (total_q == 0 || max_seqlen_q == 0 || total_k == 0)
    return {at::zeros_like(q), with_lse ? at::full({H, total_q}, -INFINITY, lse_options) : at::Tensor()};
  auto o = at::empty_like(q);
  at::Tensor lse;
  if (with_lse) lse = at::empty({H, total_q}, lse_options);
  // The pre-pass's list of row blocks (V8_VARLEN_ORDER), sized for the smallest B_r, 64: its count (4 ints, so
  // that the records are 16-byte aligned), 8 ints for each of at most min(total_q, (total_q + 63 B) / 64) row
  // blocks, and a start per row block of the longest sequence.
  const int64_t row_blocks = std::min<int64_t>(total_q, (total_q + 63 * int64_t{B}) / 64);
  auto order = at::empty({4 + 8 * row_blocks + (max_seqlen_q + 63) / 64}, q.options().dtype(at::kInt));
  const char* err = v8_forward_varlen(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                      with_lse ? lse.data_ptr<float>() : nullptr, cu_seqlens_q.data_ptr<int>(),
                                      cu_seqlens_k.data_ptr<int>(), dtype == at::kBFloat16 ? 0 : 1, B, H, H_kv,
                                      total_q, total_k, (int)max_seqlen_q, D, causal, s, window_left, window_right,
                                      order.data_ptr<int>(), order.numel(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {o, lse};
}

at::Tensor forward_varlen(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                          int64_t max_seqlen_q, bool causal, std::optional<double> scale, int64_t window_left,
                          int64_t window_right) {
  return std::get<0>(run_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, scale,
                                        window_left, window_right, false));
}

// Training: (o, lse), lse float32 [H, total_q] (FlashAttention-2's varlen layout), -inf for a row that sees no key.
std::tuple<at::Tensor, at::Tensor> forward_varlen_lse(at::Tensor q, at::Tensor k, at::Tensor v,
                                                      at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                                                      int64_t max_seqlen_q, bool causal, std::optional<double> scale,
                                                      int64_t window_left, int64_t window_right) {
  return run_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, scale, window_left,
                            window_right, true);
}
#endif

