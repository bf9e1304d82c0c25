"""v8's single-launch varlen backward (kernels/v8_backward.cu, FLASHATTN_VARLEN), its index arithmetic transcribed
line for line into Python and checked on the CPU, for packed batches with sequences of 0, 1, 17, 113, 129 and
1023 tokens (M != N both ways, queries without keys and keys without queries), at every query tile of the
kernel (B_r = 64, 80, 128) and every order of the blocks (V8B_HEAD_GROUP).

* the grid (H_kv x the batch's key tiles, a gap of at most one tile after each sequence's) gives every key of
  every sequence and kv head to exactly one block, and the blocks in the gaps find nothing to do;
* each block's band is the one the fixed-length launcher computes for its sequence alone, so it walks the
  query tiles the fixed-length kernel walks (tests/test_window_bounds.py checks those against the window);
* the padded rows of the row terms and the dQ accumulator: each sequence starts at a whole tile, its query
  tiles stay inside its own rows (so a tile's bulk copies and its dQ image never touch another sequence's),
  the pre-pass finds every row's sequence and token (padding rows marked so: lse2 = +inf, D_i = 0), and the
  conversion reads each (token, head) from the row the pre-pass wrote for it;
* the deterministic mode's turns: one per (head, query tile), all distinct, inside the ints the workspace has;
* the workspace the binding allocates holds what either instance uses.

tests/test_varlen.py runs the kernels against float64 and against the per-sequence backward on an H200.
`test_kernel_still_holds_the_transcribed_lines` fails when the kernel's arithmetic changes, so that the
transcription here changes with it.
"""
from __future__ import annotations

import itertools

import pytest
from test_window_bounds import backward_tiles, band

from flashattn.loader import KERNELS_DIR

# The lines of kernels/v8_backward.cu the functions below transcribe (whitespace-normalised).
TRANSCRIBED = [
    "return (token + b * BR) / BR * BR;",
    "const int mid = (lo + hi + 1) >> 1; if (start(mid) <= x) lo = mid; else hi = mid - 1;",
    # the grid
    "const long long n_blocks = VARLEN ? padded_start(va.total_k, a.B, L::BC) / L::BC : (a.N + L::BC - 1) / L::BC;",
    "const long long BH = (long long)a.B * a.H, BH_kv = VARLEN ? a.H_kv : (long long)a.B * a.H_kv;",
    "return varlen ? (long long)a.H * padded_start(a.va.total_q, a.B, query_tile(D, banded))",
    # the block
    "const int n_kt = (N + BC - 1) / BC, block = (int)blockIdx.x;",
    "const int HG = head_group <= 0 || head_group > BH_kv ? BH_kv : head_group;",
    "const int grp = block / (HG * n_kt), rem = block - grp * HG * n_kt, width = min(HG, BH_kv - grp * HG);",
    "const int bh_kv = grp * HG + rem % width; int n0 = (rem / width) * BC;",
    "const int tile = n0 / BC; auto first_tile = [&](int s) { return padded_start(va.cu_k[s], s, BC) / BC; };"
    " const int b = last_at_most(va.batch, tile, first_tile); n0 = (int)(tile - first_tile(b)) * BC;",
    "q_tok = va.cu_q[b]; M = va.cu_q[b + 1] - q_tok; k_tok = va.cu_k[b]; N = va.cu_k[b + 1] - k_tok;"
    " if (n0 >= N) return;",
    "const int left = va.window_left < 0 || va.window_left > N ? N : va.window_left;",
    "const int right = va.window_right < 0 || va.window_right > M ? M : va.window_right;",
    "lo = N - M - left; hi = N - M + right; M_pad = (M + BR - 1) / BR * BR; seq_rows = padded_start(q_tok, b, BR);",
    "if constexpr (VARLEN) return (size_t)(bh_kv * group + gi) * va.rows + seq_rows;",
    "if constexpr (VARLEN) return ((size_t)(k_tok + key) * va.H_kv + bh_kv) * DG;",
    "tma_load_3d(dst, map, c, bh_kv * group + gi, q_tok + it * BR, bar);",
    "tma_load_3d(dst, map, c, bh_kv, k_tok + n0, bar);",
    "dq_turn + (VARLEN ? head_rows(gi) / BR : (size_t)(bh_kv * group + gi) * m_tiles) + it;",
    # the pre-pass and the conversion
    "const long long h = row / va.rows, p = row % va.rows;",
    "const int b = last_at_most(B, p, [&](int s) { return padded_start(va.cu_q[s], s, BR); });",
    "const long long i = p - padded_start(va.cu_q[b], b, BR), token = va.cu_q[b] + i;",
    "row < rows && i < va.cu_q[b + 1] - va.cu_q[b], row < rows,",
    "const long long row = i / (DG / 4), token = row / H, h = row % H;",
    "const int b = last_at_most(B, token, [&](int s) { return (long long)va.cu_q[s]; });",
    "const long long src = h * va.rows + padded_start(va.cu_q[b], b, BR) + (token - va.cu_q[b]);",
    # the workspace
    "rows = std::max(rows, (long long)H * v8b::padded_start(total_q, B, v8b::query_tile(D, banded)));",
    "return (size_t)rows * (D + 2) * sizeof(float) + (size_t)rows / tile * sizeof(int);",
    # the instance
    "const bool banded = left >= 0 || right >= 0;",
]

BC = 128
TILES = {64: (128,), 128: (80, 64)}          # B_r by head dim: D = 128 takes 80 unbanded, 64 banded
BATCHES = [((17, 1, 0, 113, 203, 1023, 5), (17, 1, 4, 203, 113, 1023, 0)),
           ((1,), (1,)), ((129, 0, 300), (0, 257, 300)), ((1023, 1, 1, 64), (1025, 2, 129, 64))]
WINDOWS = [(-1, -1), (37, 5), (100, -1), (0, 0)]


def padded_start(token: int, b: int, BR: int) -> int:
    return (token + b * BR) // BR * BR


def last_at_most(B: int, x: int, start) -> int:
    lo, hi = 0, B - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if start(mid) <= x:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cumulative(lengths) -> list[int]:
    return [0, *itertools.accumulate(lengths)]


def block_item(block: int, head_group: int, H_kv: int, tiles: int, cu_k: list[int]):
    """flash_bwd_body's start for VARLEN: (kv head, sequence, n0), n0 >= N for a block in a gap."""
    BH_kv, n_kt = H_kv, tiles
    HG = BH_kv if head_group <= 0 or head_group > BH_kv else head_group
    grp = block // (HG * n_kt)
    rem = block - grp * HG * n_kt
    width = min(HG, BH_kv - grp * HG)
    bh_kv, n0 = grp * HG + rem % width, (rem // width) * BC
    tile = n0 // BC
    first_tile = lambda s: padded_start(cu_k[s], s, BC) // BC   # noqa: E731
    b = last_at_most(len(cu_k) - 1, tile, first_tile)
    return bh_kv, b, (tile - first_tile(b)) * BC


def sequence_band(M: int, N: int, causal: bool, window) -> tuple[int, int]:
    """The block's (lo, hi): v8_backward_varlen's instance sides, then the block's clamp to its sequence."""
    wl, wr = window
    wr = 0 if causal else wr
    left = N if wl < 0 or wl > N else wl
    right = M if wr < 0 or wr > M else wr
    return N - M - left, N - M + right


@pytest.mark.parametrize("head_group", [0, 1, 3, -1])
@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_every_key_belongs_to_exactly_one_block(batch, head_group):
    lengths_q, lengths_k = BATCHES[batch]
    cu_k, B, H_kv = cumulative(lengths_k), len(lengths_k), 4
    tiles = padded_start(cu_k[-1], B, BC) // BC
    assert tiles <= cu_k[-1] // BC + B                       # at most one gap per sequence
    owner = {}
    for block in range(H_kv * tiles):
        h_kv, b, n0 = block_item(block, head_group, H_kv, tiles, cu_k)
        assert 0 <= h_kv < H_kv and 0 <= b < B and n0 >= 0
        N = cu_k[b + 1] - cu_k[b]
        if n0 >= N:
            continue                                         # a gap: the block returns at once
        for key in range(n0, min(n0 + BC, N)):
            assert (h_kv, b, key) not in owner, (block, owner[(h_kv, b, key)])
            owner[(h_kv, b, key)] = block
    assert len(owner) == H_kv * cu_k[-1]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_each_block_walks_its_sequence_as_the_fixed_length_kernel(batch, window, causal):
    """The block's band is band() of its sequence alone (where the instance is banded), so its query tiles are
    the fixed-length kernel's; their rows stay inside the sequence's padded rows of each head, and their TMA
    boxes start at the sequence's own tokens."""
    lengths_q, lengths_k = BATCHES[batch]
    cu_q, cu_k, B = cumulative(lengths_q), cumulative(lengths_k), len(lengths_q)
    wl = -1 if window[0] < 0 else window[0]
    wr = -1 if causal or window[1] < 0 else window[1]
    banded = causal or wl >= 0 or wr >= 0
    for D, BR in ((d, br) for d in TILES for br in TILES[d]):
        if D == 128 and (BR == 64) != banded:
            continue
        rows = padded_start(cu_q[-1], B, BR)
        regions = []
        for b in range(B):
            M, N = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            start, m_tiles = padded_start(cu_q[b], b, BR), -(-M // BR)
            assert start % BR == 0 and start + m_tiles * BR <= rows
            regions.append((start, start + m_tiles * BR))
            lo, hi = sequence_band(M, N, causal, (wl, wr))
            want = band(M, N, causal, *window)
            if want[2]:
                assert (lo, hi) == want[:2], (b, M, N)
            for n0 in range(0, N, BC):
                begin, end = backward_tiles(M, N, lo, hi, banded, n0, BR, BC)
                assert 0 <= begin and end <= m_tiles
                for it in range(begin, end):
                    assert regions[b][0] <= start + it * BR < start + (it + 1) * BR <= regions[b][1]
                    assert cu_q[b] + it * BR < cu_q[b + 1]       # the box's first row is the sequence's
        assert all(a[1] <= b[0] for a, b in zip(regions, regions[1:])), regions


@pytest.mark.parametrize("batch", range(len(BATCHES)))
@pytest.mark.parametrize("BR", [64, 80, 128])
def test_prepass_and_conversion_agree_on_every_row(batch, BR):
    lengths_q, _ = BATCHES[batch]
    cu_q, B, H = cumulative(lengths_q), len(lengths_q), 3
    rows = padded_start(cu_q[-1], B, BR)
    written = {}
    for row in range(H * rows):                               # bwd_prep_varlen, one row per thread group
        h, p = divmod(row, rows)
        b = last_at_most(B, p, lambda s: padded_start(cu_q[s], s, BR))
        i = p - padded_start(cu_q[b], b, BR)
        valid = i < cu_q[b + 1] - cu_q[b]
        assert i >= 0
        if valid:
            token = cu_q[b] + i
            assert (token, h) not in written
            written[(token, h)] = row
    assert len(written) == H * cu_q[-1]                      # every (token, head) once; the rest padding
    for token, h in itertools.product(range(cu_q[-1]), range(H)):   # bwd_convert_varlen
        b = last_at_most(B, token, lambda s: cu_q[s])
        assert cu_q[b] <= token < cu_q[b + 1]
        src = h * rows + padded_start(cu_q[b], b, BR) + (token - cu_q[b])
        assert src == written[(token, h)]
    # the deterministic mode's turns: head_rows / B_r + it, one per (head, query tile), inside rows / B_r
    turns = [(h * rows + padded_start(cu_q[b], b, BR)) // BR + it
             for h in range(H) for b in range(B) for it in range(-(-(cu_q[b + 1] - cu_q[b]) // BR))]
    assert len(set(turns)) == len(turns) and all(0 <= t < H * rows // BR for t in turns)


@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_the_workspace_holds_either_instance(batch):
    lengths_q, _ = BATCHES[batch]
    total_q, B, H = sum(lengths_q), len(lengths_q), 5
    for D, tiles in TILES.items():
        rows = max(H * padded_start(total_q, B, BR) for BR in tiles)
        floats = rows * (D + 2) + rows // min(tiles)          # v8_backward_varlen_workspace_bytes / 4
        for BR in tiles:
            used = H * padded_start(total_q, B, BR)
            assert used * (D + 2) + used // BR <= floats


def test_kernel_still_holds_the_transcribed_lines():
    text = " ".join((KERNELS_DIR / "v8_backward.cu").read_text().split())
    for line in TRANSCRIBED:
        assert " ".join(line.split()) in text, line
