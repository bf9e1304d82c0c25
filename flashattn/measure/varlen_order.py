"""The varlen forward's order step (kernels/v8.cu, V8_VARLEN_ORDER): `python -m flashattn.measure.varlen_order`.

Three builds of the single-launch forward timed in one interleaved run (flashattn.measure.timing, L2
flushed, the median), FlashAttention-4's varlen forward beside them:

* `order0`: V8_VARLEN_ORDER=0, the first version. Its persistent blocks walk B x H x the longest sequence's
  row blocks in a fixed-length launch's order; in a batch of mixed lengths most of those items are empty,
  and the real ones fall to the blocks unevenly;
* `order1`: the default. A one-block pre-pass lists the batch's row blocks, longest work first (causal: the
  highest row blocks first; otherwise the longest sequences first), each with its sequence's starts and
  lengths in a 32-byte record, and the blocks take them round-robin;
* `order1_prefetch`: V8_VARLEN_PREFETCH=1, a candidate: the same with the consumers prefetching into L1 the
  record of the item after next while an item runs (each record is a line of its own in L2; the lengths
  order0 reads stay in L1).

Beside each time, the model that motivates the step: each block's sum of key tiles when the G persistent
blocks take the items round-robin (the kernel's snake order for causal), the busiest block's over the mean.
A block is busy for about its sum, so the launch lasts about as long as the busiest block; 1.00 is a perfect
balance. The builds' outputs must agree bit for bit (each item is computed alone, whatever its turn).

Batches: varlen_bench's (8192, 4096, 1000, 513, 17, 1, 2048, 300; 32/8 heads; D = 128; bf16) causal and not,
the same lengths reversed, and two sequences of 8192 (the dense record's shape: there both orders take the
same items in the same turns, and what differs is the pre-pass and where set_item reads its sequence).
Prints a markdown table.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys

import torch

from flashattn.loader import build
from flashattn.measure import peers
from flashattn.measure.timing import add_interleaved_arguments, guarded, interleaved_args
from flashattn.measure.varlen_bench import H_KV, H_Q, LENGTHS, D, forward_fn, packed_inputs
from flashattn.validate import aligned
from flashattn.varlen_kernel import VARLEN_FLAGS, VARLEN_FUNCTIONS, varlen_forward

BATCHES = [(LENGTHS, True), (LENGTHS, False), (tuple(reversed(LENGTHS)), True), ((8192, 8192), True)]
B_R = B_C = 128          # v8's D = 128 tiles
SMS = 132                # the H200's SMs: the persistent grid
VARIANTS = {"order0": "-DV8_VARLEN_ORDER=0", "order1_prefetch": "-DV8_VARLEN_PREFETCH=1"}


@functools.cache
def variant_module(name: str):
    """kernels/v8.cu's varlen build with VARIANTS[name]."""
    return build("v8", extra_cuda_cflags=[*VARLEN_FLAGS, VARIANTS[name]], functions=VARLEN_FUNCTIONS,
                 module_name=f"flashattn_v8_varlen_{name}")


def item_tiles(n: int, m_block: int, causal: bool) -> int:
    """Key tiles of row block m_block of a sequence of n queries and n keys (v8's set_item, M = N)."""
    if not causal:
        return (n + B_C - 1) // B_C
    return (min((m_block + 1) * B_R, n) - 1) // B_C + 1


def items(lengths, causal: bool, ordered: bool) -> list[int]:
    """Each item's key tiles in the order the blocks take them (0: an empty item)."""
    blocks = [(n + B_R - 1) // B_R for n in lengths]
    if not ordered:                                          # set_item without the pre-pass
        m_blocks, BH = max(blocks), len(lengths) * H_Q
        order = ([(i % BH // H_Q, m_blocks - 1 - i // BH) for i in range(m_blocks * BH)] if causal
                 else [(bh // H_Q, m) for bh in range(BH) for m in range(m_blocks)])
        return [item_tiles(lengths[b], m, causal) if m < blocks[b] else 0 for b, m in order]
    rank = sorted(range(len(lengths)), key=lambda b: (-blocks[b], b))      # fwd_order_varlen's ranks
    pairs = ([(b, x) for x in reversed(range(max(blocks))) for b in rank if blocks[b] > x] if causal
             else [(b, x) for b in rank for x in range(blocks[b])])
    return [item_tiles(lengths[b], x, causal) for b, x in pairs for _ in range(H_Q)]


def block_loads(tiles: list[int], causal: bool, blocks: int = SMS) -> list[int]:
    """Each persistent block's sum of key tiles, item k taken by block k % G (mirrored on odd rounds for causal:
    V8_SNAKE)."""
    load = [0] * blocks
    for k, t in enumerate(tiles):
        band, c = divmod(k, blocks)
        load[blocks - 1 - c if causal and band & 1 else c] += t
    return load


def balance(tiles: list[int], causal: bool, blocks: int = SMS) -> float:
    """The busiest block's sum of key tiles over the mean."""
    load = block_loads(tiles, causal, blocks)
    return max(load) / (sum(load) / blocks)


def row(lengths, causal: bool, args) -> str:
    """One batch's line of the table: the builds (checked equal) and FA4 in one interleaved run."""
    q, k, v, cu = packed_inputs(lengths)
    longest, scale = max(lengths), D ** -0.5

    def variant(name):
        module = variant_module(name)
        return lambda: module.forward_varlen(aligned(q), aligned(k), aligned(v), cu, cu, longest, causal, scale,
                                             -1, -1)

    def order1():
        return varlen_forward(q, k, v, cu, cu, longest, causal, scale)
    calls = {name: (variant(name), contextlib.nullcontext) for name in VARIANTS}
    calls["order1"] = (order1, contextlib.nullcontext)
    want = order1()
    for name in VARIANTS:
        assert torch.equal(calls[name][0](), want), f"{name} and order1 differ at {lengths}, causal={causal}"
    with peers.quiet():
        fa4 = guarded(forward_fn, "fa4", q, k, v, cu, lengths, causal)
    if isinstance(fa4, tuple):
        calls["fa4"] = fa4
    t = {name: r.median_ms * 1e3 for name, r in interleaved_args(calls, args).items() if not isinstance(r, Exception)}
    fa4_us, fa4_ratio = (f"{t['fa4']:.1f}", f"{t['fa4'] / t['order1']:.2f}") if "fa4" in t else ("—", "—")
    loads = [f"{balance(items(lengths, causal, ordered), causal):.2f}" for ordered in (False, True)]
    return (f"| {', '.join(map(str, lengths))} | {'yes' if causal else 'no'} | {t['order0']:.1f} | "
            f"{t['order1']:.1f} | {t['order1_prefetch']:.1f} | {fa4_us} | {t['order1'] / t['order0']:.2f} | "
            f"{fa4_ratio} | {loads[0]} | {loads[1]} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn.measure.varlen_order", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_interleaved_arguments(parser, repetitions=40, rounds=6, max_seconds=1.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.varlen_order needs a CUDA GPU")
    print(f"# V8_VARLEN_ORDER on {torch.cuda.get_device_name()}: {H_Q}/{H_KV} heads, D={D}, bf16, forward, "
          f"median us of one interleaved run per batch; balance: busiest block's key tiles / mean, {SMS} blocks")
    print("\n| lengths | causal | order0 (us) | order1 (us) | order1_prefetch (us) | FA4 (us) | order1 / order0 "
          "| FA4 / order1 | balance 0 | balance 1 |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for lengths, causal in BATCHES:
        print(row(lengths, causal, args), flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
