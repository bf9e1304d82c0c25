"""The order in which V8's consumer warpgroups use the tensor cores, from the kernel's barrier protocol.

This is a model; the measured timeline (clock stamps of kernels/v8.cu's V8_TRACE build) is
flashattn.book.trace. In the model every warpgroup repeats "issue the tile's products, wait for them, run the
softmax", the products of all warpgroups run one after another on the SM's tensor cores, and each phase
takes an assumed duration. With ping-pong (kernels/v8.cu, V8_PINGPONG) warpgroup c may issue only after
bar.sync on named barrier 1 + c, which warpgroup c - 1 completes with bar.arrive once it has issued;
warpgroup 0 is let in first. Without it, every warpgroup issues as soon as its softmax is done.
`simulate` plays that protocol out; the figure draws what it gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from flashattn.book.figures import show_or_return


@dataclass(frozen=True)
class Phase:
    warpgroup: int
    tile: int
    kind: str      # "products" (on the tensor cores) or "softmax" (the warpgroup's own FMA/SFU work)
    start: float
    end: float


def simulate(warpgroups: int = 2, tiles: int = 4, products: float = 1.0, softmax: float = 1.0,
             pingpong: bool = True) -> list[Phase]:
    """Phases of every warpgroup over `tiles` key tiles. With `pingpong` the warpgroups issue in the turn
    order 0, 1, ..., NWG - 1, 0, ... that the named barriers enforce, and the tensor cores take one
    warpgroup's products after the other. Without it, warpgroups that issue while the tensor cores are
    still busy share them (their wgmma instructions interleave), so all finish together: started together,
    they stay in lockstep, and their softmaxes leave the tensor cores idle at the same time."""
    ready = [0.0] * warpgroups            # when each warpgroup can issue its next products
    turn_free = 0.0                       # when the turn reaches the warpgroup whose turn it is
    tensor_free = 0.0                     # when the tensor cores finish what was issued before
    phases = []
    for tile in range(tiles):
        if pingpong:
            for c in range(warpgroups):
                issue = max(ready[c], turn_free)
                start = max(issue, tensor_free)
                tensor_free = start + products
                turn_free = issue         # bar.arrive right after issuing hands the turn on
                phases += [Phase(c, tile, "products", start, tensor_free),
                           Phase(c, tile, "softmax", tensor_free, tensor_free + softmax)]
                ready[c] = tensor_free + softmax
            continue
        waiting = sorted(range(warpgroups), key=lambda c: (ready[c], c))
        while waiting:                    # a batch: every warpgroup ready before the tensor cores start
            start = max(ready[waiting[0]], tensor_free)
            batch = [c for c in waiting if ready[c] <= start]
            waiting = [c for c in waiting if c not in batch]
            tensor_free = start + products * len(batch)
            for c in batch:
                phases += [Phase(c, tile, "products", start, tensor_free),
                           Phase(c, tile, "softmax", tensor_free, tensor_free + softmax)]
                ready[c] = tensor_free + softmax
    return phases


def tensor_busy(phases: list[Phase]) -> float:
    """Share of the span from the first product to the last softmax during which the tensor cores work."""
    busy, covered = 0.0, float("-inf")       # length of the union of the product intervals
    for p in sorted((p for p in phases if p.kind == "products"), key=lambda p: p.start):
        busy += max(0.0, p.end - max(p.start, covered))
        covered = max(covered, p.end)
    return busy / (max(p.end for p in phases) - min(p.start for p in phases))


def fig_pingpong(warpgroups: int = 2, tiles: int = 4, show: bool = True):
    """Both schedules, one above the other: each consumer warpgroup's products (dark) and softmax (light)
    and, on the bottom row of each panel, which warpgroup the tensor cores serve."""
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), sharex=True)
    for ax, pingpong in zip(axes, (False, True)):
        phases = simulate(warpgroups, tiles, pingpong=pingpong)
        for p in phases:
            y = warpgroups - p.warpgroup
            alpha = 1.0 if p.kind == "products" else 0.35
            ax.barh(y, p.end - p.start, left=p.start, color=colors[p.warpgroup % 4], alpha=alpha,
                    edgecolor="black", linewidth=0.5)
            ax.text((p.start + p.end) / 2, y, ("GEMM " if p.kind == "products" else "softmax ") + str(p.tile),
                    ha="center", va="center", fontsize=8)
            if p.kind == "products":      # one thin bar per warpgroup: shared stretches show both
                ax.barh(-0.25 + 0.5 * p.warpgroup / max(1, warpgroups - 1), p.end - p.start, left=p.start,
                        height=0.4, color=colors[p.warpgroup % 4], edgecolor="black", linewidth=0.5)
        ax.set_yticks(range(warpgroups + 1), ["tensor cores"] + [f"consumer {c}" for c in reversed(range(warpgroups))])
        ax.set_title(("ping-pong (V8_PINGPONG=1): turns by named barriers" if pingpong else
                      "no turn-taking (V8_PINGPONG=0)") + f" -- tensor cores busy {100 * tensor_busy(phases):.0f}%"
                     " of the span", fontsize=10)
    axes[-1].set_xlabel("time in units of one warpgroup's products (assumed: softmax takes as long; a model, "
                        "not a measurement)")
    fig.tight_layout()
    return show_or_return(fig, show)
