"""Ring attention's arithmetic, with no communication: the merge of partial results, the sharding of a sequence
over ranks, which block pairs each rank computes at each step, and a float64 local attention that stands in for
the kernel on CPUs. `flashattn.distributed.ring_attention` moves the blocks; everything it computes is here.

The merge. A partial result over a subset of the keys is (O_a, lse_a): O_a the softmax-weighted sum of those
keys' values, already normalised, and lse_a = log sum_j exp(s_j) over them (-inf: the row saw no key). Two of
them combine exactly, in any order, the way split-KV decoding combines its splits:

    lse = log(e^lse_a + e^lse_b),   O = e^(lse_a - lse) O_a + e^(lse_b - lse) O_b.

Sharding. The sequence of length L is cut into 2W chunks of L / 2W (W ranks). Without a mask every rank holds
L / W contiguous positions (chunks 2r and 2r + 1), and every step of the ring costs every rank the same.
Causally, contiguous shards would give rank r 4r + 2 of the 2W^2 chunk pairs the mask leaves (a diagonal
pair counts 1/2): rank 0 idles while rank W - 1 computes, and a step lasts as long as its busiest rank.
Zigzag sharding gives rank r chunks r and 2W - 1 - r, an early chunk and a late one, so that every rank
computes 2 pairs at every step (`pairs` lists who computes what; flashattn.book.ring_figures draws it).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from flashattn.reference import causal_mask, softmax_scale

LAYOUTS = ("contiguous", "zigzag")


# ------------------------------------------------------------------------------------------------ merge
def merge(o_a, lse_a, o_b, lse_b):
    """(o, lse) of the keys of both partial results: o [B, H, M, D], lse [B, H, M] (-inf: no key seen).

    Computed in the wider of the inputs' dtypes and float32 (bf16 partials give a float32 o). A row where one
    side is -inf takes the other side's o exactly (its weight is e^0 = 1, the empty side's e^-inf = 0); a row
    where both are -inf stays o = 0, lse = -inf, with no NaN.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    # rows that saw no key on either side: subtracting 0 instead of -inf keeps both weights at e^-inf = 0
    top = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - top).unsqueeze(-1)
    w_b = torch.exp(lse_b - top).unsqueeze(-1)
    dtype = functools.reduce(torch.promote_types, (o_a.dtype, o_b.dtype, lse.dtype), torch.float32)
    return w_a.to(dtype) * o_a.to(dtype) + w_b.to(dtype) * o_b.to(dtype), lse


# --------------------------------------------------------------------------------------------- sharding
def check_length(length: int, parts: int, arg: str = "x", what: str = "") -> int:
    """length // parts, or ValueError naming `arg` when `parts` does not divide `length`."""
    if length % parts:
        raise ValueError(f"{arg} has sequence length {length}, which {what or f'{parts} shards'} cannot split "
                         f"evenly: it must be divisible by {parts}")
    return length // parts


def zigzag_chunks(rank: int, world: int) -> tuple[int, int]:
    """The two chunks (of 2 * world) that `rank` holds under zigzag sharding: an early one and its mirror."""
    return rank, 2 * world - 1 - rank


def zigzag_shard(x: torch.Tensor, rank: int, world: int, dim: int = 2) -> torch.Tensor:
    """Chunks rank and 2W-1-rank of the 2W equal chunks of `x` along `dim`, concatenated (a new tensor)."""
    check_world(rank, world)
    c = check_length(x.shape[dim], 2 * world, "x", f"zigzag sharding over {world} ranks (2 x {world} chunks)")
    return torch.cat([x.narrow(dim, i * c, c) for i in zigzag_chunks(rank, world)], dim=dim)


def zigzag_unshard(shards, dim: int = 2) -> torch.Tensor:
    """The full tensor from every rank's zigzag shard, in rank order (the inverse of zigzag_shard)."""
    world = len(shards)
    if world == 0:
        raise ValueError("shards is empty: give one shard per rank, in rank order")
    check_length(shards[0].shape[dim], 2, "shards[0]", "a zigzag shard's two chunks")
    halves = [s.chunk(2, dim=dim) for s in shards]
    order = [halves[i][0] for i in range(world)] + [halves[world - 1 - i][1] for i in range(world)]
    return torch.cat(order, dim=dim)


def contiguous_shard(x: torch.Tensor, rank: int, world: int, dim: int = 2) -> torch.Tensor:
    """Positions [rank * L/W, (rank + 1) * L/W) of `x` along `dim` (a view)."""
    check_world(rank, world)
    c = check_length(x.shape[dim], world, "x", f"contiguous sharding over {world} ranks")
    return x.narrow(dim, rank * c, c)


def shard(x: torch.Tensor, rank: int, world: int, causal: bool, dim: int = 2) -> torch.Tensor:
    """This rank's shard in the layout ring_attention expects: zigzag when causal, contiguous otherwise."""
    return (zigzag_shard if causal else contiguous_shard)(x, rank, world, dim)


def unshard(shards, causal: bool, dim: int = 2) -> torch.Tensor:
    """The full sequence from every rank's shard, in rank order (the inverse of `shard`)."""
    return zigzag_unshard(shards, dim) if causal else torch.cat(list(shards), dim=dim)


def check_world(rank: int, world: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world) and world >= 1; got rank={rank}, world={world}")


# ------------------------------------------------------------------------------------------- the schedule
@dataclass(frozen=True)
class Block:
    """What one rank computes at one step, in units of its local chunks (two per rank: a causal shard holds
    chunks r and 2W-1-r, a contiguous one chunks 2r and 2r+1): query chunks [q0, q1) of its own shard against
    key chunks [k0, k1) of the shard it holds now, causal (the diagonal) or full."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool

    def rows(self, length: int) -> slice:
        """The block's query rows in a shard of `length` positions (a full slice when it covers both chunks,
        whatever the parity of `length`: a contiguous shard need not be even)."""
        return slice(self.q0 * length // 2, self.q1 * length // 2)

    def keys(self, length: int) -> slice:
        return slice(self.k0 * length // 2, self.k1 * length // 2)


def holder(rank: int, step: int, world: int) -> int:
    """Whose K/V rank `rank` holds at `step`: blocks travel to rank + 1, so rank r sees rank r - s's."""
    return (rank - step) % world


def local_block(rank: int, step: int, world: int, causal: bool, layout: str | None = None) -> Block | None:
    """The block rank `rank` computes at `step`, or None when the mask hides all of it.

    Without a mask: everything against everything. Zigzag with a mask: step 0 is causal attention over the
    rank's own two chunks (in order, so one causal call covers the diagonal pairs and the late-early pair);
    a shard from a lower rank j < r is seen by both query chunks through its early chunk only; a shard
    from a higher rank j > r is seen whole by the late query chunk only. Either way half the block.
    Contiguous with a mask (the figure's counter-example): lower ranks' shards full, its own causal, higher
    ranks' none.
    """
    check_world(rank, world)
    layout = layout or ("zigzag" if causal else "contiguous")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    j = holder(rank, step, world)
    if not causal:
        return Block(0, 2, 0, 2, False)
    if j == rank:
        return Block(0, 2, 0, 2, True)
    if layout == "contiguous":
        return Block(0, 2, 0, 2, False) if j < rank else None
    return Block(0, 2, 0, 1, False) if j < rank else Block(1, 2, 0, 2, False)


def global_chunks(rank: int, world: int, layout: str) -> tuple[int, int]:
    """The two chunks (of 2 * world along the sequence) a rank's shard holds, in shard order."""
    return zigzag_chunks(rank, world) if layout == "zigzag" else (2 * rank, 2 * rank + 1)


@dataclass(frozen=True)
class Pair:
    """One (query chunk, key chunk) pair of the 2W x 2W grid: who computes it, when, and how."""
    q_chunk: int
    kv_chunk: int
    rank: int | None        # None: the mask hides it and nobody computes it
    step: int | None
    kind: str               # "full", "causal" (the diagonal: half of it) or "skipped"


def pairs(world: int, causal: bool, layout: str | None = None) -> list[Pair]:
    """Every chunk pair of the 2W x 2W grid, by query chunk then key chunk, from `local_block` (the schedule
    ring_attention runs): which rank computes it at which step, and whether it is full, causal or skipped."""
    layout = layout or ("zigzag" if causal else "contiguous")
    done: dict[tuple[int, int], Pair] = {}
    for rank in range(world):
        mine = global_chunks(rank, world, layout)
        for step in range(world):
            block = local_block(rank, step, world, causal, layout)
            if block is None:
                continue
            theirs = global_chunks(holder(rank, step, world), world, layout)
            for qi in range(block.q0, block.q1):
                for ki in range(block.k0, block.k1):
                    a, b = mine[qi], theirs[ki]
                    if block.causal and b > a:
                        continue        # inside a causal block: above its diagonal
                    if (a, b) in done:
                        raise RuntimeError(f"the schedule computes chunk pair {(a, b)} twice: {done[a, b]}")
                    done[a, b] = Pair(a, b, rank, step, "causal" if block.causal and a == b else "full")
    n = 2 * world
    return [done.get((a, b), Pair(a, b, None, None, "skipped")) for a in range(n) for b in range(n)]


def work_per_rank(world: int, causal: bool, layout: str | None = None) -> list[float]:
    """Chunk pairs each rank computes over the whole ring (a diagonal pair counts 1/2)."""
    work = [0.0] * world
    for p in pairs(world, causal, layout):
        if p.rank is not None:
            work[p.rank] += 0.5 if p.kind == "causal" else 1.0
    return work


# ------------------------------------------------------------------------------ float64 local attention
def scores(q, k, causal: bool):
    """S * scale in float64 with masked entries -inf (bottom-right causal, as the kernels)."""
    s = q.double() @ k.double().transpose(-1, -2) * softmax_scale(q)
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return s


def reference_local(q, k, v, causal: bool = False):
    """(o, lse) of one block in float64: what the kernel's forward_lse returns, without rounding. Rows that
    see no key get o = 0 and lse = -inf."""
    s = scores(q, k, causal)
    lse = torch.logsumexp(s, dim=-1)
    # exp(s - lse) for a row with lse = -inf is exp(nan); those rows have P = 0
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return p @ v.double(), lse


def reference_local_backward(q, k, v, o, lse, do, causal: bool = False):
    """(dq, dk, dv) in float64 of one block, given the FINAL o and lse of its query rows (over every key of
    the ring, not this block's), the way the kernel's backward does: P = exp(S * scale - lse),
    D_i = rowsum(dO_i * O_i), dS = P * (dO V^T - D_i)."""
    s = scores(q, k, causal)
    lse = lse.double()
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    do, scale = do.double(), softmax_scale(q)
    d_i = (do * o.double()).sum(-1, keepdim=True)
    ds = p * (do @ v.double().transpose(-1, -2) - d_i)
    return ds @ k.double() * scale, ds.transpose(-1, -2) @ q.double() * scale, p.transpose(-1, -2) @ do
