"""Where a decode call's time goes, block by block: `python -m flashattn.measure.decode_timeline --out DIR`.

A build of kernels/decode.cu with DECODE_TRACE=1 has every block of the split kernel stamp the GPU's
global timer (nanoseconds) as it starts, when its first K/V tile has landed, after its last tile and as it
leaves, beside the SM it ran on; the merge kernel's blocks stamp their start and end (a build with
DECODE_FUSED_MERGE=1, `--flags=-DDECODE_FUSED_MERGE=1`, has no merge kernel: the split block that merges
stamps its end after the merge, so the split kernel's end is the call's). This program makes
the chapter's shapes' calls (L2 flushed before each, as decode_bench times them), reads the stamps back
and records, per shape and call, every block's stamps relative to the first start, as one record of kind
"decode_timeline" (DIR/decode_timeline.json). `summary` turns one call's blocks into the numbers the
lab-notes page discusses: how long the launch takes to start every block, how long the first tile takes
to arrive, how the blocks' streaming times spread, how long the last blocks run alone (the tail), and the
bandwidth while every block is streaming.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from flashattn import decode
from flashattn.measure import results
from flashattn.measure.decode_bench import DATASHEET_BYTES_PER_S, SHAPES, bytes_moved, inputs
from flashattn.measure.timing import l2_flush_buffer

TRACE_FLAGS = ("-DDECODE_TRACE=1",)
FUSED_FLAG = "-DDECODE_FUSED_MERGE=1"
CLUSTER_FLAG = "-DDECODE_CLUSTER_MERGE=1"      # no merge kernel either, up to MAX_CLUSTER_SPLITS splits
MAX_CLUSTER_SPLITS = 8                         # kMaxClusterSplits in kernels/decode.cu
TRACE_FUNCTIONS = ("decode", "tile_keys", "trace")
SPLIT_STAMPS = ("sm", "start", "first_tile", "last_tile", "end")
MERGE_STAMPS = ("sm", "start", "end")


def trace_module(extra_flags: tuple[str, ...] = ()):
    """kernels/decode.cu built with DECODE_TRACE=1 (and `extra_flags`), exporting `trace` beside `decode`."""
    return decode.module(TRACE_FLAGS + tuple(extra_flags), TRACE_FUNCTIONS)


def grid_blocks(B: int, H_q: int, H_kv: int, M: int, splits: int) -> int:
    """Blocks of the split kernel: (sequence, kv head, 16 packed rows) x splits."""
    return B * decode.blocks_per_sequence(M, H_q, H_kv) * splits


def stamps(table: torch.Tensor, split_blocks: int, merge_blocks: int) -> dict:
    """One call's blocks from the `trace` table: split and merge blocks, times in ns from the first start."""
    split = table[:split_blocks].tolist()
    half = table.shape[0] // 2
    merge = table[half:half + merge_blocks].tolist()
    t0 = min(r[1] for r in split)
    return {"split": [[r[0]] + [x - t0 for x in r[1:]] for r in split],
            "merge": [[r[0]] + [x - t0 for x in r[1:]] for r in merge]}


def summary(call: dict, nbytes: int) -> dict:
    """The numbers of one traced call (times in microseconds from the first block's start)."""
    split = call["split"]
    start, first, last, end = ([r[i] / 1e3 for r in split] for i in range(1, 5))
    kernel_end = max(end)
    # the window in which every block is streaming: from the last block's first tile to the first block's
    # last tile (empty when the blocks do not overlap that much)
    all_from, all_to = max(first), min(last)
    out = {
        "blocks": len(split), "sms": len({r[0] for r in split}),
        "launch_spread_us": max(start),
        "first_tile_us": statistics.median(f - s for f, s in zip(first, start)),
        "streaming_us": {"min": min(la - f for la, f in zip(last, first)),
                         "median": statistics.median(la - f for la, f in zip(last, first)),
                         "max": max(la - f for la, f in zip(last, first))},
        "end_us": {"min": min(end), "median": statistics.median(end), "max": kernel_end},
        "tail_us": kernel_end - statistics.median(end),
        "split_kernel_us": kernel_end,
        "all_streaming_us": max(0.0, all_to - all_from),
        "kernel_tb_per_s": nbytes / (kernel_end * 1e-6) / 1e12,
    }
    if call["merge"]:
        out["merge_start_us"] = min(r[1] for r in call["merge"]) / 1e3
        out["merge_end_us"] = max(r[2] for r in call["merge"]) / 1e3
    # bandwidth at the median block's pace: its bytes over its streaming time, times the blocks
    out["median_block_tb_per_s"] = nbytes / (out["streaming_us"]["median"] * 1e-6) / 1e12
    out["floor_us"] = nbytes / DATASHEET_BYTES_PER_S * 1e6
    return out


def merge_kernel_blocks(B: int, H_q: int, M: int, splits: int, fused: bool = False, cluster: bool = False) -> int:
    """Blocks of the merge kernel: one per 4 output rows; none with one split, a fused merge, or a cluster
    merge of at most MAX_CLUSTER_SPLITS splits."""
    if fused or splits == 1 or (cluster and splits <= MAX_CLUSTER_SPLITS):
        return 0
    return (B * M * H_q + 3) // 4


def trace_shape(mod, name: str, dims, calls: int, flush: torch.Tensor, fused: bool = False,
                cluster: bool = False) -> list[dict]:
    """`calls` traced calls of ours at one shape, with the rule's split count; `fused`, `cluster`: `mod` was
    built with DECODE_FUSED_MERGE=1, DECODE_CLUSTER_MERGE=1."""
    B, H_q, H_kv, M, N, D = dims
    q, k, v = inputs(*dims)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    splits = decode.splits_for(B, M, H_q, H_kv, N, int(mod.tile_keys()), sms)
    nb = bytes_moved(B, H_q, H_kv, M, [N] * B, D)
    run = decode.bound(lambda: mod)
    split_blocks = grid_blocks(B, H_q, H_kv, M, splits)
    merges = merge_kernel_blocks(B, H_q, M, splits, fused, cluster)
    for _ in range(3):
        run(q, k, v, causal=False, num_splits=splits)
    rows = []
    for i in range(calls):
        flush.zero_()
        run(q, k, v, causal=False, num_splits=splits)
        torch.cuda.synchronize()
        call = stamps(mod.trace(), split_blocks, merges)
        rows.append({"shape": name, "dims": list(dims), "splits": splits, "call": i, "bytes": nb,
                     "summary": summary(call, nb), **call})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.decode_timeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--shapes", default="batch8_16k,rows16_32k,one_32k")
    p.add_argument("--flags", default="", help="more -D flags for the traced build, space-separated")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.decode_timeline needs a CUDA GPU")
    mod = trace_module(tuple(args.flags.split()))
    flush = l2_flush_buffer()
    wanted = args.shapes.split(",")
    rows = []
    for name, *dims in SHAPES:
        if name in wanted:
            rows += trace_shape(mod, name, dims, args.calls, flush, fused=FUSED_FLAG in args.flags.split(),
                                cluster=CLUSTER_FLAG in args.flags.split())
            s = rows[-1]["summary"]
            print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in s.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    results.write(args.out / "decode_timeline.json", "decode_timeline", rows, meta=results.environment(argv),
                  settings={"calls": args.calls, "flags": list(TRACE_FLAGS) + args.flags.split()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
