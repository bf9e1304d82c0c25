"""v8's single-launch varlen forward (kernels/v8.cu, FLASHATTN_VARLEN), its index arithmetic transcribed line
for line into Python and checked on the CPU against a brute-force mask of each sequence alone.

What can be checked without a GPU (tests/test_varlen.py runs the kernel itself on one). For packed batches with
lengths 0, 1, 17, 113 and 1023 (M != N in most sequences, a sequence with queries and no keys, one with keys
and no queries), causal or not, with and without sliding windows, at the tile shapes of both head dims:

* the pre-pass (fwd_order_varlen, V8_VARLEN_ORDER = 1) lists every row block of the batch exactly once, within
  the launcher's bound and the binding's workspace, the highest row blocks first when banded and each
  sequence's row blocks together otherwise, the sequences with more row blocks first;
* the items, (sequence, query head, row block) from that list, or over the longest sequence's row blocks
  for every sequence (V8_VARLEN_ORDER = 0), write every (token, head) row of o and lse exactly once, and the
  items past their sequence's end nothing;
* each item's band (lo, hi) is the one the fixed-length launcher computes for its sequence alone;
* the keys an item's rows see, after the tile range, the masked and unmasked tiles and the per-element mask,
  are exactly the sequence's visible keys (tests/test_window_bounds.py's `visible`): in particular no key
  of the next sequence, which the last key tile's box reads from the packed k and v;
* the TMA coordinates of the packed maps (column, head, token) address the rows the item means, and a box
  of (64, 1, rows) lands in shared memory as the fixed-length maps' (64, rows, 1) boxes do;
* o's and lse's addresses are FlashAttention-2's varlen layouts ([total_q, H, D] and [H, total_q]).

`test_kernel_still_holds_the_transcribed_lines` fails when the kernel's arithmetic changes, so that the
transcription here changes with it.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_window_bounds import band, v8_unmasked, visible

from flashattn.book.block_order import causal_item
from flashattn.loader import KERNELS_DIR

# The lines of kernels/v8.cu the functions below transcribe (whitespace-normalised).
TRANSCRIBED = [
    # the launcher: the instance, the window's sides, the grid over the longest sequence's row blocks
    "if (causal) window_right = 0;",
    "const int left = window_left < 0 || window_left > INT32_MAX ? -1 : (int)window_left;",
    "const int right = window_right < 0 || window_right > INT32_MAX ? -1 : (int)window_right;",
    "const bool banded = left >= 0 || right >= 0;",
    "const int m_blocks = (M + L::BR - 1) / L::BR;",
    "const long long bound = ((long long)va.total_q + (long long)B * (L::BR - 1)) / L::BR,"
    " row_blocks = bound < va.total_q ? bound : va.total_q;",
    "const long long blocks = ordered ? row_blocks * H : (long long)m_blocks * BH;",
    "if (ordered && 4 + 8 * row_blocks + (CAUSAL ? m_blocks : 0) > va.order_ints)",
    "fwd_order_varlen<512><<<1, 512, 0, stream>>>(va.cu_q, va.cu_k, B, L::BR, m_blocks, CAUSAL, va.order,"
    " va.order + 4 + 8 * row_blocks);",
    # the binding's workspace for the pre-pass
    "const int64_t row_blocks = std::min<int64_t>(total_q, (total_q + 63 * int64_t{B}) / 64);",
    "auto order = at::empty({4 + 8 * row_blocks + (max_seqlen_q + 63) / 64}, q.options().dtype(at::kInt));",
    # the pre-pass
    "return rows <= 0 ? 0 : (int)min((long long)m_blocks, (rows + BR - 1) / BR);",
    "for (int b = 0; b < batch; ++b) above += max(0, blocks_of(b) - x - 1);",
    "if (n_s > n || (n_s == n && s < b)) { ++rank; before += n_s; }",
    "const int4 seq = make_int4(cu_q[b], cu_k[b], cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]);",
    "const int slot = banded ? level[x] + rank : before + x; records[2 * slot] = seq;"
    " records[2 * slot + 1] = make_int4(x, 0, 0, 0);",
    "if (rank == batch - 1) order[0] = before + n;",
    "const int items = VARLEN && V8_VARLEN_ORDER ? va.order[0] * va.H : m_blocks * BH;",
    # the packed maps
    "{(cuuint64_t)D, (cuuint64_t)H, (cuuint64_t)total}",
    "{(cuuint64_t)D * sizeof(T), (cuuint64_t)H * D * sizeof(T)}, {64, 1, (cuuint32_t)box_rows}",
    "{(cuuint64_t)D, (cuuint64_t)L, (cuuint64_t)BH}",
    "{(cuuint64_t)D * sizeof(T), (cuuint64_t)L * D * sizeof(T)}, {64, (cuuint32_t)box_rows, 1}",
    # set_item
    "const int4* row_block = reinterpret_cast<const int4*>(va.order + 4) + 2 * (item / (unsigned)va.H);"
    " seq = row_block[0]; m_block = row_block[1].x; bh = (int)(item % (unsigned)va.H);",
    # the causal order in groups of head_group heads; the varlen kernel passes head_group = BH (one group)
    "const unsigned span = (unsigned)head_group * m_blocks, g = item / span, r = item - g * span;"
    " const unsigned heads = min((unsigned)head_group, (unsigned)BH - g * head_group);"
    " bh = (int)(g * head_group + r % heads); m_block = m_blocks - 1 - (int)(r / heads);",
    "WITH_LSE, true, D>(tmQ, tmK, tmV, O, BH, group, 0, 0, m_blocks, scale_log2, LSE, 0, 0, BH, va V8_TRACE_FORWARD);",
    "m_block = item % m_blocks; bh = item / m_blocks;",
    "m0 = m_block * BR;",
    "if (V8_VARLEN_ORDER) { q_head = bh; } else { const int b = bh / va.H; q_head = bh - b * va.H;"
    " seq = make_int4(va.cu_q[b], va.cu_k[b], va.cu_q[b + 1] - va.cu_q[b], va.cu_k[b + 1] - va.cu_k[b]); }"
    " q_tok = seq.x; k_tok = seq.y; M = seq.z; N = seq.w;",
    "const int left = va.window_left < 0 || va.window_left > N ? N : va.window_left;",
    "const int right = va.window_right < 0 || va.window_right > M ? M : va.window_right;",
    "lo = N - M - left; hi = N - M + right;",
    "Oh = O + ((size_t)q_tok * va.H + q_head) * DG;",
    "bh_kv = q_head / group;",
    "kt0 = 0; n_tiles = (N + BC - 1) / BC;",
    "const long long first_key = (long long)m0 + lo, last_key = (long long)min(m0 + BR, M) - 1 + hi;",
    "kt0 = first_key <= 0 ? 0 : (int)(first_key / BC);",
    "n_tiles = last_key < 0 ? 0 : max(0, (int)((min((long long)N, last_key + 1) + BC - 1) / BC) - kt0);",
    "if (m0 >= M) n_tiles = 0;",
    # the copies
    "tma_load_3d(sK + s * L::KV_BYTES + p * BC * 128, &tmK, p * 64, bh_kv, k_tok + (kt0 + t) * BC, full_k(s));",
    "tma_load_3d(sV + s * L::KV_BYTES + p * BC * 128, &tmV, p * 64, bh_kv, k_tok + (kt0 + t) * BC, full_v(s));",
    "tma_load_3d(sQ + p * BR * 128, &tmQ, p * 64, q_head, q_tok + m0, bar_q);",
    # the consumer's tiles and mask
    "const int warp_row0 = m0 + cwg * 64 + wq * 16;",
    "int first_masked = N / BC, first_unmasked = 0;",
    "const long long seen = (long long)m0 + hi + 1;",
    "first_masked = min(first_masked, seen <= 0 ? 0 : (int)(seen / BC)) - kt0;",
    "const long long first_key = (long long)min(m0 + BR, M) - 1 + lo;",
    "first_unmasked = first_key <= 0 ? 0 : (int)((first_key + BC - 1) / BC) - kt0;",
    "if (MASK == 1 || (MASK == 2 && (t >= first_masked || t < first_unmasked))) {",
    "for (; j + 1 < min(n_tiles, first_unmasked); ++j) step(j, Masked{});",
    "for (; j + 1 < min(n_tiles, first_masked); ++j) step(j, Unmasked{});",
    "for (; j + 1 < n_tiles; ++j) step(j, Masked{});",
    "const int row = warp_row0 + g + 8 * h, col = (kt0 + t) * BC + 2 * q;",
    "const int last = CAUSAL ? N + min(-1, row + (hi - N)) : N - 1;",
    "visible[h] = last - col; before[h] = (row - M) + (lo + M) - 1 - col;",
    "const int at = c * 8 + (e & 1);",
    "const bool outside = at > visible[e >> 1] || (CAUSAL && at <= before[e >> 1]);",
    # the stores
    "const size_t o_row = VARLEN ? (size_t)va.H * DG : DG;",
    "if (row < M) { T* dst = Oh + (size_t)row * o_row + 2 * q;",
    "LSE[(size_t)q_head * va.total_q + q_tok + row] =",
    "if (row < M) *reinterpret_cast<uint4*>(Oh + (size_t)row * o_row + (idx % (DG / 8)) * 8) = make_uint4(0, 0, 0, 0);",
    "LSE[(size_t)q_head * va.total_q + q_tok + m0 + r] = -INFINITY;",
]

INT32_MAX = 2**31 - 1


def launcher(causal: bool, window: tuple[int, int]):
    """flashattn.varlen.single_launch's sides (after check_window), then v8_forward_varlen's: (CAUSAL instance,
    window_left, window_right as the kernel gets them)."""
    left, right = window[0], 0 if causal else window[1]               # flashattn.validate.check_window
    if not (left >= 0 or (not causal and right >= 0)):                # reference.window_narrows
        left, right = -1, -1
    if causal:
        right = 0
    left = -1 if left < 0 or left > INT32_MAX else left
    right = -1 if right < 0 or right > INT32_MAX else right
    return left >= 0 or right >= 0, left, right


def order_pass(cu_q, BR: int, m_blocks: int, banded: bool, cu_k=None):
    """fwd_order_varlen: (the count it writes to order[0], the (sequence, row block) pairs in their slots,
    and with cu_k the records the kernel reads, (q_tok, k_tok, M, N, row block) by slot)."""
    batch = len(cu_q) - 1

    def blocks_of(b):
        rows = cu_q[b + 1] - cu_q[b]
        return 0 if rows <= 0 else min(m_blocks, (rows + BR - 1) // BR)

    level = [sum(max(0, blocks_of(b) - x - 1) for b in range(batch)) for x in range(m_blocks)] if banded else []
    slots, records, count = {}, {}, None
    for b in range(batch):                              # one thread per sequence
        n, rank, before = blocks_of(b), 0, 0
        for s in range(batch):
            n_s = blocks_of(s)
            if n_s > n or (n_s == n and s < b):
                rank, before = rank + 1, before + n_s
        for x in range(n):
            slot = level[x] + rank if banded else before + x
            assert slot not in slots, ("two pairs in one slot", slot)
            slots[slot] = (b, x)
            if cu_k is not None:
                records[slot] = (cu_q[b], cu_k[b], cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b], x)
        if rank == batch - 1:
            count = before + n
    return (count, slots, records) if cu_k is not None else (count, slots)


def set_item(item, CAUSAL, BH, m_blocks, BR, BC, H, group, cu_q, cu_k, wl, wr, records=None):
    """flash_fwd_body's set_item in a VARLEN instance: the item's sequence state and key tiles. records: the
    pre-pass's (V8_VARLEN_ORDER = 1; the item's sequence b, for the checks, is the one its record describes),
    or None (0)."""
    if records is not None:
        q_tok, k_tok, M, N, m_block = records[item // H]
        q_head = item % H
        b = next(s for s in range(len(cu_q) - 1) if cu_q[s] == q_tok and cu_q[s + 1] - cu_q[s] == M
                 and cu_k[s] == k_tok and cu_k[s + 1] - cu_k[s] == N)
        bh = b * H + q_head
    else:
        if CAUSAL:   # the varlen kernel passes head_group = BH: one group
            bh, m_block = causal_item(item, BH, m_blocks, BH)
        else:
            m_block, bh = item % m_blocks, item // m_blocks
        b = bh // H
        q_head = bh - b * H
        q_tok, k_tok = cu_q[b], cu_k[b]
        M, N = cu_q[b + 1] - q_tok, cu_k[b + 1] - k_tok
    m0 = m_block * BR
    left = N if wl < 0 or wl > N else wl
    right = M if wr < 0 or wr > M else wr
    lo, hi = N - M - left, N - M + right
    bh_kv = q_head // group
    kt0, n_tiles = 0, (N + BC - 1) // BC
    if CAUSAL:
        first_key, last_key = m0 + lo, min(m0 + BR, M) - 1 + hi
        kt0 = 0 if first_key <= 0 else first_key // BC                # first_key > 0 here: // is C's /
        n_tiles = 0 if last_key < 0 else max(0, (min(N, last_key + 1) + BC - 1) // BC - kt0)
    if m0 >= M:
        n_tiles = 0
    return dict(b=b, bh=bh, m0=m0, q_head=q_head, q_tok=q_tok, k_tok=k_tok, M=M, N=N, lo=lo, hi=hi,
                bh_kv=bh_kv, kt0=kt0, n_tiles=n_tiles)


def tile_masked(it, t, CAUSAL, BR, BC):
    """Whether key tile t of the item runs the mask: [first_unmasked, first_masked) runs without it, in the
    overlapped loops (tile 0: Checked; then the Masked loop left of the window, Unmasked, Masked) and in
    the Checked loop alike."""
    first_unmasked, first_masked = v8_unmasked(it["M"], it["N"], it["lo"], it["hi"], CAUSAL, it["m0"], it["kt0"],
                                               BR, BC)
    return t >= first_masked or t < first_unmasked


def thread_rows(BR: int) -> np.ndarray:
    """The item's rows, relative to m0, in the order of the consumers' threads: warpgroup cwg, warp wq, lane
    group g, row half h hold row warp_row0 - m0 + g + 8 h."""
    return np.array([cwg * 64 + wq * 16 + g + 8 * h
                     for cwg, wq, g, h in itertools.product(range(BR // 64), range(4), range(8), range(2))])


def keys_seen(it, CAUSAL, BR, BC):
    """[BR, N] bool: the keys (of the item's sequence) each of its BR rows gives a nonzero weight, and the
    number of (row, key past the sequence's end) pairs that get one (must be 0): the tiles' keys, less those
    the mask sets to -inf, from each thread's (row, column) arithmetic, vectorised over rows and elements."""
    m0, M, N, lo, hi, kt0 = it["m0"], it["M"], it["N"], it["lo"], it["hi"], it["kt0"]
    offsets = thread_rows(BR)
    assert sorted(offsets) == list(range(BR))               # every row of the block, once
    row = m0 + offsets
    c, e = np.meshgrid(np.arange(BC // 8), np.arange(2), indexing="ij")
    at = (c * 8 + e).ravel()                                # element (c, e & 1) of a thread's S_ij
    seen = np.zeros((BR, max(N, 1)), dtype=bool)
    leaked = 0
    for t in range(it["n_tiles"]):
        ok = np.ones((BR, BC), dtype=bool)
        if tile_masked(it, t, CAUSAL, BR, BC):
            for q in range(4):
                col = (kt0 + t) * BC + 2 * q
                last = N + np.minimum(-1, row + (hi - N)) if CAUSAL else np.full(BR, N - 1)
                vis, before = last - col, (row - M) + (lo + M) - 1 - col
                outside = (at[None, :] > vis[:, None]) | (CAUSAL & (at[None, :] <= before[:, None]))
                ok[:, 2 * q + at] = ~outside
        j = (kt0 + t) * BC + np.arange(BC)                  # the keys of the tile's box, from the sequence's start
        leaked += int((ok & (j >= N)[None, :]).sum())
        inside = j < N
        seen[offsets[:, None], j[inside][None, :]] |= ok[:, inside]
    return seen[:, :N], leaked


def run(lengths_q, lengths_k, causal, window, BR, BC, H=2, H_kv=1, D=64, ordered=True):
    """Every item of one varlen launch against each sequence's own mask; returns the number of items.
    ordered: V8_VARLEN_ORDER = 1 (the pre-pass's items) or 0 (B x H x the longest sequence's row blocks)."""
    cu_q = [0, *itertools.accumulate(lengths_q)]
    cu_k = [0, *itertools.accumulate(lengths_k)]
    B, total_q, group = len(lengths_q), cu_q[-1], H // H_kv
    CAUSAL, wl, wr = launcher(causal, window)
    max_q = max(lengths_q)
    m_blocks = (max_q + BR - 1) // BR
    BH = B * H
    records = None
    items = m_blocks * BH
    if ordered:
        count, slots, records = order_pass(cu_q, BR, m_blocks, CAUSAL, cu_k)
        assert sorted(slots) == list(range(count)), "the row blocks fill slots 0 .. count - 1"
        items = count * H
    written = np.zeros((total_q, H), dtype=int)                    # o's rows (and lse's), by token and head
    for item in range(items):
        it = set_item(item, CAUSAL, BH, m_blocks, BR, BC, H, group, cu_q, cu_k, wl, wr, records)
        if ordered:                                                  # the record is its row block's sequence
            assert (it["b"], it["m0"] // BR) == slots[item // H]
        b, M, N, m0, q_tok, q_head = it["b"], it["M"], it["N"], it["m0"], it["q_tok"], it["q_head"]
        assert (M, N) == (lengths_q[b], lengths_k[b]) and q_head == it["bh"] % H
        assert it["bh_kv"] == q_head // (H // H_kv)                  # the kv head the sequence's head reads
        if m0 >= M:
            assert it["n_tiles"] == 0                                # past the sequence's end: nothing at all
            continue
        # the band is the fixed-length launcher's for this sequence alone, where that one bounds anything
        lo, hi, fixed_banded = band(M, N, causal, *window)
        if fixed_banded:
            assert CAUSAL and (it["lo"], it["hi"]) == (lo, hi), (b, it, lo, hi)
        rows = slice(m0, min(m0 + BR, M))
        # o's rows: the store (or write_zeros) at Oh + row * o_row, row < M, is token q_tok + row, head q_head
        for row in range(rows.start, rows.stop):
            element = (q_tok * H + q_head) * D + row * (H * D)          # Oh + (size_t)row * o_row
            token, rest = divmod(element, H * D)
            assert rest == q_head * D and token == q_tok + row
            assert q_head * total_q + q_tok + row == q_head * total_q + token   # lse [H][total_q]
            written[token, q_head] += 1
        # the Q box: tokens q_tok + m0 .. + BR - 1 of head q_head, row r of the tile is the item's row m0 + r
        assert (q_tok + m0, q_head) == (it["q_tok"] + it["m0"], it["q_head"])
        seen, leaked = keys_seen(it, CAUSAL, BR, BC)
        assert leaked == 0, ("a key past the sequence's end is visible", b, it)
        want = visible(M, N, causal, *window)
        assert (seen[:M - m0] == want[rows]).all(), (b, m0, it)
    assert (written == 1).all(), "every (token, head) of o and lse is written exactly once"
    return items


# lengths (q, k) per sequence: 0, 1, 17, 113, 1023, M != N both ways, queries without keys and keys without
# queries
BATCHES = [((17, 0, 1, 113, 1023, 5, 113, 1), (113, 4, 0, 17, 1000, 1023, 113, 1)),
           ((1, 1023, 17, 0), (1023, 1, 17, 0))]
WINDOWS = [(-1, -1), (-1, 0), (0, 0), (3, 0), (17, 17), (100, 50), (300, -1), (-1, 40), (2000, 2000)]
TILES = [(192, 128), (128, 128), (128, 176), (128, 64)]   # (B_r, B_c): D=64, D=128, D=128 at B_c 176, V8_*_BC=64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_every_item_sees_exactly_its_sequences_keys(batch, window, causal):
    for (BR, BC), ordered in itertools.product(TILES, (True, False)):
        assert run(*BATCHES[batch], causal, window, BR, BC, ordered=ordered) > 0


ORDER_BATCHES = [(17, 0, 1, 113, 1023, 5, 113, 1), (8192, 4096, 1000, 513, 17, 1, 2048, 300), (0, 0, 3),
                 (1,), (300, 2048, 1, 17, 513, 1000, 4096, 8192), (129,) * 5 + (0, 1024)]


@pytest.mark.parametrize("banded", [True, False])
@pytest.mark.parametrize("BR", [64, 128, 192])
@pytest.mark.parametrize("lengths", ORDER_BATCHES, ids=str)
def test_the_pre_pass_lists_every_row_block_once_longest_work_first(lengths, BR, banded):
    """Every row block of every sequence once, in the count's slots; banded: row blocks from the highest down
    (and within one, the sequences with more row blocks first); otherwise each sequence's row blocks
    together, the sequences with more first. The count fits the launcher's grid bound and the workspace the
    binding allocates for B_r = 64, which holds the level starts after the pairs."""
    cu_q = [0, *itertools.accumulate(lengths)]
    B, total_q, max_q = len(lengths), cu_q[-1], max(lengths)
    m_blocks = (max_q + BR - 1) // BR
    count, slots = order_pass(cu_q, BR, m_blocks, banded)
    pairs = [slots[p] for p in range(count)]
    blocks = [(n + BR - 1) // BR for n in lengths]
    assert sorted(pairs) == [(b, x) for b in range(B) for x in range(blocks[b])]
    if banded:
        assert [x for _, x in pairs] == sorted((x for _, x in pairs), reverse=True)
        for (b0, x0), (b1, x1) in zip(pairs, pairs[1:]):
            assert x0 > x1 or (blocks[b0], -b0) > (blocks[b1], -b1)
    else:
        runs = [b for i, (b, _) in enumerate(pairs) if i == 0 or pairs[i - 1][0] != b]
        assert len(runs) == len(set(runs)), "a sequence's row blocks are together"
        assert [blocks[b] for b in runs] == sorted((blocks[b] for b in runs), reverse=True)
    bound = min(total_q, (total_q + B * (BR - 1)) // BR)          # the launcher's `pairs`
    assert count <= bound
    ints = 4 + 8 * min(total_q, (total_q + 63 * B) // 64) + (max_q + 63) // 64   # the binding's
    assert 4 + 8 * bound + (m_blocks if banded else 0) <= ints


def test_the_pre_pass_keeps_to_the_longest_length_named():
    """A sequence longer than max_seqlen_q keeps m_blocks row blocks, as V8_VARLEN_ORDER = 0's items did."""
    cu_q = [0, 1000, 1010]
    count, slots = order_pass(cu_q, 128, 2, True)
    assert count == 3 and sorted(slots.values()) == [(0, 0), (0, 1), (1, 0)]


def test_grouped_heads_map_to_their_kv_head():
    run((113, 17, 0), (17, 113, 5), True, (30, 0), 128, 128, H=8, H_kv=2, D=128)
    run((113, 17, 0), (17, 113, 5), False, (-1, -1), 192, 128, H=6, H_kv=1, D=64)


def test_the_instance_covers_every_sequence_that_needs_a_band():
    """The host picks the banded (CAUSAL) instance from the window alone, not from lengths it never reads;
    every sequence whose own launcher would mask runs it, and a band that bounds nothing is the whole matrix."""
    for causal, window in itertools.product((False, True), WINDOWS):
        CAUSAL, wl, wr = launcher(causal, window)
        for M, N in itertools.product((0, 1, 17, 113, 1023), repeat=2):
            lo, hi, banded = band(M, N, causal, *window)
            assert CAUSAL or not banded
            if CAUSAL and not banded and M and N:
                d = np.arange(N)[None, :] - np.arange(M)[:, None]
                left = N if wl < 0 or wl > N else wl
                right = M if wr < 0 or wr > M else wr
                assert ((d >= N - M - left) & (d <= N - M + right)).all()


def test_packed_box_lands_in_shared_memory_as_the_fixed_box():
    """TMA writes a box innermost dimension first. (64, 1, rows) of the packed map and (64, rows, 1) of the
    fixed one both put element (column c, row r) at c + 64 r: the same rows x 128 bytes, the same swizzle
    (a function of the shared-memory address) and so the same wgmma descriptors. And the packed map's
    strides address token t, head h, column c of [total, H, D] at (t H + h) D + c."""
    rows, H, D = 128, 3, 128
    for c, r in itertools.product(range(64), range(rows)):
        packed = c + 64 * (0 + 1 * r)              # box dims (64, 1, rows): (c, head 0, r)
        fixed = c + 64 * (r + rows * 0)            # box dims (64, rows, 1): (c, r, head 0)
        assert packed == fixed
    strides = (D, H * D)                           # in elements: {D * sizeof(T), H * D * sizeof(T)} bytes
    for t, h, c in itertools.product(range(5), range(H), (0, 63, 64, 127)):
        assert c + h * strides[0] + t * strides[1] == (t * H + h) * D + c


def test_kernel_still_holds_the_transcribed_lines():
    text = " ".join((KERNELS_DIR / "v8.cu").read_text().split())
    for line in TRANSCRIBED:
        assert " ".join(line.split()) in text, f"kernels/v8.cu changed: {line}"
