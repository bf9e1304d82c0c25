"""The sliding window's tile arithmetic of v6, v7, v8 and the shared backward, transcribed line for line into
Python and checked against the window's definition on the CPU, for many shapes, windows and tile sizes.

The kernels' own results are checked on a GPU (tests/test_window.py); this checks, without one, that each
block's loop visits every tile holding a key its rows may see (no tile is wrongly skipped) and that a tile
run without the mask has no key to hide. `test_kernels_still_hold_the_transcribed_lines` fails when a
kernel's arithmetic changes, so that the transcription here changes with it.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from flashattn.loader import KERNELS_DIR

# kernel file -> lines the functions below transcribe
TRANSCRIBED = {
    "v6": ["const long long first_key = (long long)m0 + lo, last_key = (long long)m_last + hi;",
           "jt_begin = first_key <= 0 ? 0 : (int)(first_key / BC);",
           "jt_end = last_key < 0 ? 0 : (int)((min((long long)N, last_key + 1) + BC - 1) / BC);"],
    "v7": ["const long long first_key = (long long)m0 + lo, last_key = (long long)min(m0 + BR, M) - 1 + hi;"],
    "v8": ["const long long first_key = (long long)m0 + lo, last_key = (long long)min(m0 + BR, M) - 1 + hi;",
           "kt0 = first_key <= 0 ? 0 : (int)(first_key / BC);",
           "n_tiles = last_key < 0 ? 0 : max(0, (int)((min((long long)N, last_key + 1) + BC - 1) / BC) - kt0);",
           "const long long seen = (long long)m0 + hi + 1;",
           "first_masked = min(first_masked, seen <= 0 ? 0 : (int)(seen / BC)) - kt0;",
           "const long long first_key = (long long)min(m0 + BR, M) - 1 + lo;",
           "first_unmasked = first_key <= 0 ? 0 : (int)((first_key + BC - 1) / BC) - kt0;",
           "const int left = window_left < 0 || window_left > N ? N : (int)window_left;"],
    "v6_backward": ["const long long first = (long long)n0 - hi, last = (long long)min(n0 + BC, N) - 1 - lo;",
                    "return {first <= 0 ? 0 : first >= M ? m_tiles : (int)(first / BR),",
                    "last < 0 ? 0 : (int)min((long long)m_tiles, last / BR + 1)};"],
}


def band(M, N, causal, left, right):
    """The launcher: causal sets right to 0; a side that is -1, or bounds nothing, is clamped to N (left) or M
    (right); lo = N - M - left, hi = N - M + right; banded when some side bounds a row."""
    right = 0 if causal else right
    left = N if left < 0 or left > N else left
    right = M if right < 0 or right > M else right
    return N - M - left, N - M + right, left < N or right < M


def visible(M, N, causal, left, right):
    i, j = np.arange(M)[:, None], np.arange(N)[None, :]
    ok = np.ones((M, N), dtype=bool)
    right = 0 if causal else right
    if left >= 0:
        ok &= j >= i + N - M - left
    if right >= 0:
        ok &= j <= i + N - M + right
    return ok


def forward_tiles(M, N, lo, hi, banded, m0, BR, BC):
    """v7 and v8 (kt0, n_tiles); v6's [jt_begin, jt_end) is the same range."""
    if not banded:
        return 0, -(-N // BC)
    first_key, last_key = m0 + lo, min(m0 + BR, M) - 1 + hi
    kt0 = 0 if first_key <= 0 else first_key // BC
    n_tiles = 0 if last_key < 0 else max(0, (min(N, last_key + 1) + BC - 1) // BC - kt0)
    return kt0, n_tiles


def v8_unmasked(M, N, lo, hi, banded, m0, kt0, BR, BC):
    """v8's [first_unmasked, first_masked), relative to kt0."""
    first_masked, first_unmasked = N // BC, 0
    if banded:
        seen = m0 + hi + 1
        first_masked = min(first_masked, 0 if seen <= 0 else seen // BC) - kt0
        first_key = min(m0 + BR, M) - 1 + lo
        first_unmasked = 0 if first_key <= 0 else (first_key + BC - 1) // BC - kt0
    return first_unmasked, first_masked


def backward_tiles(M, N, lo, hi, banded, n0, BR, BC):
    """v6_backward's query_tiles: [begin, end) of the query tiles a dK/dV block of key tile n0 walks."""
    m_tiles = -(-M // BR)
    if not banded:
        return 0, m_tiles
    first, last = n0 - hi, min(n0 + BC, N) - 1 - lo
    begin = 0 if first <= 0 else m_tiles if first >= M else first // BR
    end = 0 if last < 0 else min(m_tiles, last // BR + 1)
    return begin, end


WINDOWS = [(-1, -1), (-1, 0), (0, 0), (3, 0), (0, 5), (17, 17), (100, 50), (300, -1), (-1, 40), (1000, 1000), (0, -1)]
SIZES = [1, 17, 64, 113, 129, 203, 300]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_loops_visit_every_visible_tile_and_skip_the_mask_only_where_nothing_hides(window, causal):
    for M, N in itertools.product(SIZES, SIZES):
        lo, hi, banded = band(M, N, causal, *window)
        vis = visible(M, N, causal, *window)
        for BR, BC in ((128, 64), (64, 64), (128, 128), (192, 128)):
            for m0 in range(0, M, BR):
                rows = vis[m0:min(m0 + BR, M)]
                kt0, n_tiles = forward_tiles(M, N, lo, hi, banded, m0, BR, BC)
                seen = np.nonzero(rows.any(0))[0]
                if len(seen):
                    assert kt0 <= seen.min() // BC and seen.max() // BC < kt0 + n_tiles, (M, N, m0, BR, BC)
                fu, fm = v8_unmasked(M, N, lo, hi, banded, m0, kt0, BR, BC)
                for t in range(max(fu, 0), min(fm, n_tiles)):
                    j0 = (kt0 + t) * BC
                    assert j0 + BC <= N and rows[:, j0:j0 + BC].all(), (M, N, m0, t, BR, BC)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_backward_walks_every_query_tile_that_sees_its_keys(window, causal):
    for M, N in itertools.product(SIZES, SIZES):
        lo, hi, banded = band(M, N, causal, *window)
        vis = visible(M, N, causal, *window)
        for BR, BC in ((64, 128), (128, 128), (64, 64)):
            for n0 in range(0, N, BC):
                begin, end = backward_tiles(M, N, lo, hi, banded, n0, BR, BC)
                seen = np.nonzero(vis[:, n0:min(n0 + BC, N)].any(1))[0]
                if len(seen):
                    assert begin <= seen.min() // BR and seen.max() // BR < end, (M, N, n0, BR, BC)


def test_the_band_is_the_window():
    for M, N, causal, window in itertools.product(SIZES, SIZES, (False, True), WINDOWS):
        lo, hi, banded = band(M, N, causal, *window)
        d = np.arange(N)[None, :] - np.arange(M)[:, None]
        inside = (d >= lo) & (d <= hi)
        assert (inside == visible(M, N, causal, *window)).all() or not banded
        if not banded:
            assert visible(M, N, causal, *window).all()


@pytest.mark.parametrize("kernel", sorted(TRANSCRIBED))
def test_kernels_still_hold_the_transcribed_lines(kernel):
    text = " ".join((KERNELS_DIR / f"{kernel}.cu").read_text().split())
    for line in TRANSCRIBED[kernel]:
        assert " ".join(line.split()) in text, f"kernels/{kernel}.cu changed: {line}"
