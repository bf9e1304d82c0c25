"""The order in which kernels/v8_backward.cu's blocks take their key tiles (V8B_HEAD_GROUP), mirrored from the
launcher and the kernel for the lab notes of "The backward on Hopper" and for tests/test_v8_backward.py, which
checks these lines against the kernel's text.

- `l2_head_group`: the default's kv heads at a time, as many as keep their rows in half the L2;
- `block_tile`: the (kv head, first key) of a block under a head group;
- `fig_block_order`: which blocks run in the same wave under three orders, and how many heads they touch;
- `forward_head_group`, `causal_item`, `causal_balance`: the same idea in kernels/v8.cu's causal forward
  (V8_HEAD_GROUP): the (head, row block) of a work item, longest first inside each group of heads; how evenly the
  persistent blocks' key tiles fall under a group size; and the launcher's choice of the group.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from flashattn.book.figures import show_or_return

BC = 128   # flash_bwd_ws's key tile at both head dims (Layout::BC)
WAVES = ListedColormap(["#1f5fa8", "#d9d9d9", "#f2f2f2"])   # the first wave, then the others alternating


def l2_head_group(l2: int, group: int, M_pad: int, D: int, elem: int = 2) -> int:
    """The kv heads at a time of the default order (V8B_HEAD_GROUP -1) with an L2 of l2 bytes: their Q and dO
    (elem bytes) and dQ accumulator (fp32) rows, for each of the `group` query heads per kv head, within half of
    it; at least one; 0 (all heads) when the device reports no L2."""
    heads = l2 // 2 // (group * M_pad * D * (2 * elem + 4))
    return 0 if l2 <= 0 else max(1, min(heads, 2**31 - 1))


def block_tile(block: int, BH_kv: int, N: int, head_group: int) -> tuple[int, int]:
    """(kv head, first key) of block `block` of flash_bwd_ws, whose launcher passes head_group (V8B_HEAD_GROUP or,
    by default, l2_head_group): groups of head_group heads one after another (0: one group of all), inside a group
    the same key tile of each of its heads, then the next tile."""
    n_kt = (N + BC - 1) // BC
    HG = BH_kv if head_group <= 0 or head_group > BH_kv else head_group
    grp = block // (HG * n_kt)
    rem, width = block - grp * HG * n_kt, min(HG, BH_kv - grp * HG)
    return grp * HG + rem % width, (rem // width) * BC


def waves(BH_kv: int, N: int, head_group: int, sms: int) -> np.ndarray:
    """[kv head, key tile]: the wave of the block that takes it, blockIdx // sms (one block per SM: the blocks of a
    wave run at the same time when every block takes as long, as without a mask)."""
    grid = np.zeros((BH_kv, (N + BC - 1) // BC), dtype=int)
    for block in range(grid.size):
        h, n0 = block_tile(block, BH_kv, N, head_group)
        grid[h, n0 // BC] = block // sms
    return grid


def fig_block_order(show: bool = False, B: int = 2, H: int = 16, N: int = 8192, D: int = 128, sms: int = 132,
                    l2: int = 60 << 20):
    """Three orders of (2, 16, 8192, 128)'s blocks on 132 SMs: the first wave's tiles in colour, and the heads whose
    Q, dO and dQ rows that wave reads."""
    group = l2_head_group(l2, 1, N, D)
    orders = {"all heads first (the first version)": 0, f"{group} heads at a time (the default)": group,
              "key tiles first": 1}
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.2), sharey=True)
    for ax, (title, hg) in zip(axes, orders.items()):
        grid = waves(B * H, N, hg, sms)
        first = grid == 0
        # the first wave dark, the later ones in two alternating greys, so that each wave's tiles show
        ax.imshow(np.where(first, 0, 1 + grid % 2), cmap=WAVES, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        heads = int(first.any(axis=1).sum())
        ax.set_title(f"{title}\nfirst wave: {first.sum()} blocks over {heads} heads, "
                     f"{heads * N * D * 8 / 2**20:.0f} MiB of rows", fontsize=9.5)
        ax.set_xlabel(f"key tile j (B_c = {BC})")
    axes[0].set_ylabel("kv head (b, h)")
    fig.suptitle(f"B = {B}, H = {H}, N = {N}, D = {D}: blockIdx // {sms} SMs, dark: the first wave; grey: later waves; "
                 f"half of a {l2 >> 20} MiB L2 holds {group} heads' rows", fontsize=10)
    fig.tight_layout()
    return show_or_return(fig, show)


BALANCE_SLACK = 0.04   # kernels/v8.cu's kBalanceSlack


def causal_balance(BH: int, m_blocks: int, head_group: int, grid: int, br: int = 128, bc: int = 128,
                   N: int | None = None, snake: bool = True) -> float:
    """kernels/v8.cu's causal_balance: the busiest persistent block's key tiles over the mean, the blocks taking
    items in bands of `grid` (odd bands mirrored: the snake), each item its row block's key tiles when M = N."""
    N = m_blocks * br if N is None else N
    load = [0] * grid
    for i in range(BH * m_blocks):
        _, x = causal_item(i, BH, m_blocks, head_group)
        k, pos = divmod(i, grid)
        load[grid - 1 - pos if snake and k & 1 else pos] += -(-min((x + 1) * br, N) // bc)
    return max(load) * grid / sum(load) if sum(load) else 1.0


def forward_head_group(l2: int, B: int, H: int, H_kv: int, N: int, row_bytes: int, setting: int = -1,
                       m_blocks: int | None = None, grid: int = 132, br: int = 128, bc: int = 128) -> int:
    """Query heads per group of kernels/v8.cu's causal order (its launcher's head_group). setting (V8_HEAD_GROUP)
    -1: all B * H when the kv heads' K and V (N rows of row_bytes each, twice) fit in half of an L2 of l2 bytes;
    otherwise the smallest group of 1, 2, 4, ... kv heads, up to as many as fit there, whose causal_balance stays
    within BALANCE_SLACK of all heads', else all heads. 0 (or no L2): all heads; G > 0: G kv heads."""
    BH, group = B * H, H // H_kv
    m_blocks = -(-N // br) if m_blocks is None else m_blocks
    if setting == 0 or l2 <= 0:
        return BH
    if setting > 0:
        return min(BH, setting * group)
    fit = max(1, l2 // 2 // (2 * N * row_bytes))
    if fit * group >= BH:
        return BH
    everyone = causal_balance(BH, m_blocks, BH, grid, br, bc, N)
    kv = 1
    while kv <= fit and kv * group < BH:
        if causal_balance(BH, m_blocks, kv * group, grid, br, bc, N) <= everyone + BALANCE_SLACK:
            return kv * group
        kv *= 2
    return BH


def causal_item(item: int, BH: int, m_blocks: int, head_group: int) -> tuple[int, int]:
    """(flat query head b * H + h, row block) of causal work item `item` (flash_fwd_body's set_item): head_group
    heads at a time, longest first inside the group (its heads' last row block, then the one below, ...); the
    last group may have fewer heads."""
    span = head_group * m_blocks
    g, r = divmod(item, span)
    heads = min(head_group, BH - g * head_group)
    return g * head_group + r % heads, m_blocks - 1 - r // heads
