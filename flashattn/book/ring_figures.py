"""Ring attention's concept figures, drawn from flashattn.ring's schedule (the one ring_attention runs):

- `fig_ring_steps`: W ranks on a ring, each sending the K/V shard it holds to the next rank while it computes
  with it, step by step: which shard each rank holds and which part of the block the causal mask leaves;
- `fig_zigzag_balance`: the causal (query chunk, key chunk) grid of 2W x 2W chunks coloured by the rank that
  computes each pair, contiguous shards against zigzag ones, and the work per rank and per step.

Every text has its own font size, so that the drawing does not depend on rcParams that a notebook changed
(flashattn.book.notebook.setup). The PNGs live in book/_static/ring/, not yet in book/_static/concepts/, whose
test wants every figure there shown in a chapter (the chapter "Beyond one GPU" is still to be written):

    python -m flashattn.book.ring_figures            # redraw them
    python -m flashattn.book.ring_figures --check    # compare the committed PNGs with a fresh drawing
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Circle, FancyArrowPatch, Patch, Polygon, Rectangle

from flashattn import ring
from flashattn.book import figure_files
from flashattn.book.figures import show_or_return
from flashattn.loader import REPO_ROOT

FOLDER = REPO_ROOT / "book" / "_static" / "ring"
RANK_COLORS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#e6d7f0", "#fde0c5", "#d0f0ee", "#e6e6e6")
WORLD = 4


def step_work(world: int, causal: bool = True, layout: str | None = None) -> np.ndarray:
    """[step, rank] chunk pairs computed (a diagonal pair counts 1/2): a step of the ring lasts as long as
    its busiest rank, so the ring's compute time is the sum over steps of each row's maximum."""
    work = np.zeros((world, world))
    for p in ring.pairs(world, causal, layout):
        if p.rank is not None:
            work[p.step, p.rank] += 0.5 if p.kind == "causal" else 1.0
    return work


def block_words(rank: int, step: int, world: int) -> str:
    """What a rank computes at a step of the causal zigzag ring, in words."""
    j = ring.holder(rank, step, world)
    if j == rank:
        return "own: causal"
    return "both q × early kv" if j < rank else "late q × both kv"


def _arrow(ax, a, b, color="0.3", **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=13, color=color, lw=1.2, **kw))


def fig_ring_steps(world: int = WORLD, show: bool = False):
    """Left: the ring. Right: the K/V shard each rank holds at each step, and the half of the block it computes."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.4), gridspec_kw=dict(width_ratios=[1, 1.7]))
    a.set(xlim=(-1.6, 1.6), ylim=(-1.6, 1.6), aspect="equal")
    a.axis("off")
    angles = np.pi / 2 - 2 * np.pi * np.arange(world) / world
    centers = np.stack([np.cos(angles), np.sin(angles)], 1) * 1.05
    for r, (x, y) in enumerate(centers):
        a.add_patch(Circle((x, y), 0.36, fc=RANK_COLORS[r], ec="0.3"))
        a.text(x, y, f"rank {r}\nQ, K, V\nchunks {', '.join(map(str, ring.zigzag_chunks(r, world)))}",
               ha="center", va="center", fontsize=8.5)
        nx, ny = centers[(r + 1) % world]
        d = np.array([nx - x, ny - y])
        u = d / np.linalg.norm(d)
        _arrow(a, (x + 0.42 * u[0], y + 0.42 * u[1]), (nx - 0.42 * u[0], ny - 0.42 * u[1]),
               connectionstyle="arc3,rad=-0.25")
    a.text(0, 0, "each step:\nsend the K/V held\nto rank r + 1,\nreceive from r − 1,\ncompute meanwhile",
           ha="center", va="center", fontsize=9)
    a.set_title(f"{world} ranks on a ring (zigzag shards of {2 * world} chunks)", fontsize=11)

    b.set(xlim=(-1.4, world), ylim=(-0.9, world + 0.2))
    b.axis("off")
    for s in range(world):
        b.text(s + 0.5, world + 0.05, f"step {s}", ha="center", fontsize=9.5)
        for r in range(world):
            j = ring.holder(r, s, world)
            y = world - 1 - r
            b.add_patch(Rectangle((s + 0.04, y + 0.06), 0.92, 0.88, fc=RANK_COLORS[j], ec="0.35"))
            b.text(s + 0.5, y + 0.6, f"K/V of rank {j}", ha="center", va="center", fontsize=8.5)
            b.text(s + 0.5, y + 0.3, block_words(r, s, world), ha="center", va="center", fontsize=7.5, color="0.25")
    for r in range(world):
        b.text(-0.1, world - 1 - r + 0.5, f"rank {r}", ha="right", va="center", fontsize=9.5)
    b.text(world / 2, -0.45, "colour: whose K/V shard; every cell is half a block of work, so every rank is busy "
           "for the same time at every step", ha="center", fontsize=8.5)
    b.set_title("What each rank holds and computes (causal, zigzag)", fontsize=11)
    fig.tight_layout()
    return show_or_return(fig, show)


def _grid(ax, world: int, layout: str, title: str):
    n = 2 * world
    for p in ring.pairs(world, True, layout):
        x, y = p.kv_chunk, n - 1 - p.q_chunk
        if p.kind == "skipped":
            ax.add_patch(Rectangle((x, y), 1, 1, fc="white", ec="0.85", lw=0.6))
            continue
        color = RANK_COLORS[p.rank]
        if p.kind == "causal":     # the diagonal pair: its lower-left triangle is all the mask leaves
            ax.add_patch(Rectangle((x, y), 1, 1, fc="white", ec="0.5", lw=0.6))
            ax.add_patch(Polygon([(x, y), (x, y + 1), (x + 1, y)], closed=True, fc=color, ec="0.5", lw=0.6))
        else:
            ax.add_patch(Rectangle((x, y), 1, 1, fc=color, ec="0.5", lw=0.6))
        ax.text(x + 0.5 - 0.18 * (p.kind == "causal"), y + 0.5 - 0.18 * (p.kind == "causal"), f"r{p.rank}\ns{p.step}",
                ha="center", va="center", fontsize=6.5)
    ax.set(xlim=(0, n), ylim=(0, n), aspect="equal")
    ax.set_title(title, fontsize=11)
    ax.set_xticks(np.arange(n) + 0.5, [str(i) for i in range(n)], fontsize=8)
    ax.set_yticks(np.arange(n) + 0.5, [str(i) for i in reversed(range(n))], fontsize=8)
    ax.set_xlabel("key / value chunk", fontsize=9)
    ax.set_ylabel("query chunk", fontsize=9)
    ax.tick_params(length=0)


def fig_zigzag_balance(world: int = WORLD, show: bool = False):
    """The causal grid of 2W x 2W chunk pairs, coloured by the rank that computes each (r: rank, s: step),
    contiguous and zigzag, and the work per rank and per step that follows."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 5.2), gridspec_kw=dict(width_ratios=[1, 1, 1.1]))
    _grid(a, world, "contiguous", "Contiguous shards: rank r holds chunks 2r, 2r+1")
    _grid(b, world, "zigzag", f"Zigzag shards: rank r holds chunks r, {2 * world - 1}−r")
    x, handles = np.arange(world), []
    for i, (layout, hatch) in enumerate((("contiguous", "//"), ("zigzag", None))):
        work = ring.work_per_rank(world, True, layout)
        steps = step_work(world, True, layout).max(axis=1).sum()
        c.bar(x + (i - 0.5) * 0.38, work, 0.36, color=[RANK_COLORS[r] for r in range(world)], ec="0.3", hatch=hatch)
        handles.append(Patch(fc="white", ec="0.3", hatch=hatch,
                             label=f"{layout}: the ring lasts {steps:g} pair-times"))
    c.axhline(2 * world, ls=":", color="0.4", lw=1)
    c.text(-0.45, 2 * world + 0.2, f"even share: {2 * world:g}", ha="left", fontsize=8.5, color="0.3")
    c.set_xticks(x, [f"rank {r}" for r in range(world)], fontsize=9)
    c.tick_params(axis="y", labelsize=8.5)
    c.set_ylim(0, max(ring.work_per_rank(world, True, "contiguous")) * 1.3)
    c.set_ylabel("chunk pairs computed (diagonal = ½)", fontsize=9)
    c.set_title("Work per rank over the whole ring", fontsize=11)
    c.legend(handles=handles, fontsize=8.5, loc="upper left",
             title="a step lasts as long as its busiest rank", title_fontsize=8.5)
    c.grid(axis="y", alpha=0.25)
    fig.suptitle(f"Causal attention over {world} ranks: which rank computes each pair of chunks, and when",
                 fontsize=11.5)
    fig.tight_layout()
    return show_or_return(fig, show)


FIGURES = {"ring_steps": fig_ring_steps, "ring_zigzag": fig_zigzag_balance}


def save(name: str, folder: Path = FOLDER) -> Path:
    """Draw FIGURES[name] and write it to folder/name.png, as the book shows it."""
    return figure_files.save(FIGURES, name, folder)


def differences(folder: Path = FOLDER) -> dict[str, str]:
    """name -> what differs, for every figure whose committed PNG is missing or no longer what the code draws."""
    return figure_files.differences(FIGURES, folder)


def main(argv=None) -> int:
    return figure_files.main("python -m flashattn.book.ring_figures", __doc__, FIGURES, FOLDER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
