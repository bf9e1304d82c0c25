"""Ring attention on two GPUs against one at the same total length:

    python -m flashattn.measure.ring_bench --out results/h200x2/ring.json                        # one GPU
    torchrun --nproc-per-node 2 -m flashattn.measure.ring_bench --out results/h200x2/ring.json   # the ring

Each invocation appends one run (flashattn.measure.results.append) to the record, kind "ring", a row per
measurement with its `part`:

* `time`: `forward` and `forward_backward` at --shape (the TOTAL sequence; default (1, 32, 131072, 128), causal,
  bf16, --version v8). One process: flashattn.attention on the whole sequence. Under torchrun:
  flashattn.distributed.ring_attention, each rank holding L / W positions (zigzag when causal). Timing is
  flashattn.measure.timing.time_cuda: L2 flushed before each call, CUDA events around it, warm-ups, then the
  median. Under torchrun every call starts after a host barrier of all ranks and a spin of --host-slack-us
  (so that no rank's launch time is measured), the counts are fixed (no time cap: a rank that stopped
  early would leave the others waiting), and a step lasts as long as its slowest rank: `median_us` is
  the median over calls of the slowest rank's time, `rank_median_us` each rank's own.
* `trace`: one forward+backward under torch.profiler per rank, its Chrome trace saved beside --out as
  ring_trace_w{W}_rank{r}.json.gz (gzip: every *.json under results/ is a record), and from its kernels how
  long NCCL's kernels ran, how much of that under a compute kernel (`hidden_us`) and how much alone
  (`exposed_us`). NCCL's receive kernels run from the moment they are launched until the data arrives, so
  their time includes waiting for the peer.
* `long`: one training step of attention (forward and backward) at --long-length tokens (default 2^21, about
  2M) at the shape's heads and head dim. Under torchrun it runs the ring, --long-head-chunk heads per pass
  (the float32 accumulators and transfers of all 32 heads would not fit), with its time and each rank's peak
  memory. One process only allocates what the step would hold at once (q, k, v, o, dO, dQ, dK, dV and the
  backward's float32 dQ accumulator) and records where that runs out of memory, without running a kernel.

`--dry-run` prints the plan (shapes per rank) and checks the arguments without touching a GPU. The long part
runs last, after the record holds everything else: a rank that runs out of memory there can leave its peer
waiting until the NCCL timeout (--timeout-s).
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import flashattn
from flashattn.distributed import multicast_off, ring_attention
from flashattn.measure import kernel_trace, results
from flashattn.measure.timing import time_cuda

KIND = "ring"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.ring_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the record (JSON, kind ring); runs are appended")
    p.add_argument("--shape", type=int, nargs=4, default=[1, 32, 131072, 128], metavar=("B", "H", "L", "D"),
                   help="the whole sequence's shape (each rank holds L / W)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--version", default="v8", choices=flashattn.TRAINING_VERSIONS)
    p.add_argument("--head-chunk", type=int, default=None, help="heads per ring pass in the time part (all)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repetitions", type=int, default=20)
    p.add_argument("--host-slack-us", type=float, default=5000.0,
                   help="GPU spin before each timed call, so that the host has enqueued it all (timing.py)")
    p.add_argument("--parts", default="time,trace,long")
    p.add_argument("--long-length", type=int, default=2**21)
    p.add_argument("--long-head-chunk", type=int, default=8)
    p.add_argument("--timeout-s", type=float, default=900.0, help="NCCL's timeout for a stuck collective")
    p.add_argument("--dry-run", action="store_true", help="print the plan and check the arguments; no GPU")
    args = p.parse_args(argv)
    unknown = set(args.parts.split(",")) - {"time", "trace", "long"}
    if unknown:
        p.error(f"--parts takes time, trace, long; got {', '.join(sorted(unknown))}")
    return args


def plan(args, world: int) -> dict:
    """Shapes per rank for every part; ValueError naming the option when a length does not shard."""
    B, H, L, D = args.shape
    parts = (2 if args.causal else 1) * world
    for option, length in (("--shape's L", L), ("--long-length", args.long_length)):
        if world > 1 and length % parts:
            raise ValueError(f"{option} = {length} does not shard over {world} ranks: it must be divisible by "
                             f"{parts} ({'2 zigzag chunks' if args.causal else '1 chunk'} per rank)")
    for option, chunk in (("--head-chunk", args.head_chunk), ("--long-head-chunk", args.long_head_chunk)):
        if chunk is not None and not 1 <= chunk <= H:
            raise ValueError(f"{option} = {chunk} must be in [1, H = {H}]")
    local = lambda n: n // world
    return dict(world=world, mode="ring" if world > 1 else "one_gpu", total=[B, H, L, D],
                per_rank=[B, H, local(L), D], long_total=[B, H, args.long_length, D],
                long_per_rank=[B, H, local(args.long_length), D], layout="zigzag" if args.causal else "contiguous")


# ------------------------------------------------------------------------------------------ timings
def slowest_per_call(rank_times: list[list[float]]) -> list[float]:
    """Call i of a step ends when its slowest rank does: the max over ranks of each call's time."""
    return [max(ts) for ts in zip(*rank_times)]


def attention_call(q, k, v, args, world: int, head_chunk):
    """The forward the part times: the ring under torchrun, flashattn.attention in one process."""
    if world > 1:
        return lambda: ring_attention(q, k, v, causal=args.causal, version=args.version, head_chunk=head_chunk)
    return lambda: flashattn.attention(q, k, v, causal=args.causal, version=args.version)


def inputs(shape, dtype, rank: int, world: int, seed: int = 0):
    """Random q, k, v (requiring grad) and dO of this rank's L / W positions, made on the GPU (the values do not
    change the time; no rank allocates the whole sequence)."""
    B, H, L, D = shape
    g = torch.Generator(device="cuda").manual_seed(seed + rank)
    local = [B, H, L // world, D]
    q, k, v, do = (torch.randn(local, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    return [t.requires_grad_(True) for t in (q, k, v)] + [do]


def time_part(args, world: int, rank: int, host) -> list[dict]:
    q, k, v, do = inputs(args.shape, DTYPES[args.dtype], rank, world)
    fwd = attention_call(q, k, v, args, world, args.head_chunk)
    calls = {"forward": lambda: fwd().detach(), "forward_backward": lambda: torch.autograd.grad(fwd(), (q, k, v), do)}
    before = (lambda: (torch.cuda.synchronize(), dist.barrier(group=host))) if world > 1 else None
    rows = []
    for name, fn in calls.items():
        torch.cuda.reset_peak_memory_stats()
        t = time_cuda(fn, warmup=args.warmup, repetitions=args.repetitions, max_seconds=None, before=before,
                      host_slack_us=args.host_slack_us)
        everyone = gather((t.times_ms, torch.cuda.max_memory_allocated()), world, host)
        step = slowest_per_call([ts for ts, _ in everyone])
        rows.append({"part": "time", "call": name, **t.summary(), "median_us": statistics.median(step) * 1e3,
                     "min_us": min(step) * 1e3, "max_us": max(step) * 1e3,
                     "rank_median_us": [statistics.median(ts) * 1e3 for ts, _ in everyone],
                     "rank_peak_bytes": [peak for _, peak in everyone]})
    return rows


def gather(obj, world: int, host):
    """[obj of rank 0, ...] over the host group (gloo), or [obj] in one process."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj, group=host)
    return out


# ------------------------------------------------------------------------------------------ the trace
def trace_kernels(doc: dict) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel of a Chrome trace, by start."""
    return [(name, start, start + dur) for name, start, dur in kernel_trace.trace_kernels(doc)]


def union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def overlap(kernels) -> dict:
    """How long NCCL's kernels ran (their union), how much of that while a compute kernel ran too (hidden)
    and how much alone (exposed), and the compute kernels' union, in microseconds."""
    comm = union((a, b) for n, a, b in kernels if "nccl" in n.lower())
    compute = union((a, b) for n, a, b in kernels if "nccl" not in n.lower())
    hidden = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in compute)
    comm_us = sum(b - a for a, b in comm)
    return dict(comm_us=comm_us, compute_us=sum(b - a for a, b in compute), hidden_us=hidden,
                exposed_us=comm_us - hidden, kernels=len(kernels))


def trace_part(args, world: int, rank: int, host) -> list[dict]:
    q, k, v, do = inputs(args.shape, DTYPES[args.dtype], rank, world)
    fwd = attention_call(q, k, v, args, world, args.head_chunk)
    step = lambda: torch.autograd.grad(fwd(), (q, k, v), do)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier(group=host)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    path = args.out.parent / f"ring_trace_w{world}_rank{rank}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    with gzip.open(path, "rt") as f:
        found = overlap(trace_kernels(json.load(f)))
    return [dict(part="trace", trace=str(path), **row) for row in gather(found, world, host)]


# ------------------------------------------------------------------------------------------ 2M tokens
def long_part(args, world: int, rank: int, host) -> list[dict]:
    B, H, L, D = args.shape[0], args.shape[1], args.long_length, args.shape[3]
    dtype = DTYPES[args.dtype]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    row = dict(part="long", total=[B, H, L, D], head_chunk=args.long_head_chunk if world > 1 else None)
    try:
        if world == 1:
            row.update(allocate_step(B, H, L, D, dtype))
        else:
            q, k, v, do = inputs([B, H, L, D], dtype, rank, world)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            o = ring_attention(q, k, v, causal=args.causal, version=args.version, head_chunk=args.long_head_chunk)
            grads = torch.autograd.grad(o, (q, k, v), do)
            end.record()
            end.synchronize()
            finite = bool(torch.isfinite(o).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
            row.update(status="ok", step_ms=start.elapsed_time(end), wall_s=time.perf_counter() - t0, finite=finite)
    except torch.cuda.OutOfMemoryError as err:
        row.update(status="out of memory", message=str(err).splitlines()[0])
    row.update(peak_bytes=torch.cuda.max_memory_allocated(), device_bytes=torch.cuda.get_device_properties(0)
               .total_memory)
    return [dict(r, rank=i) for i, r in enumerate(gather(row, world, host))]


def allocate_step(B, H, L, D, dtype) -> dict:
    """Allocate, in the order one GPU's forward+backward holds them, the tensors of a training step of
    attention, until memory runs out: what fit (names and bytes) and the one that did not."""
    held, names = [], []
    shapes = [(n, [B, H, L, D], dtype) for n in ("q", "k", "v", "o", "dO", "dQ", "dK", "dV")]
    shapes.append(("dQ float32 accumulator", [B, H, L, D], torch.float32))
    for name, shape, dt in shapes:
        try:
            held.append(torch.empty(shape, device="cuda", dtype=dt))
        except torch.cuda.OutOfMemoryError:
            return dict(status="out of memory", allocated=names, failed_at=name,
                        held_bytes=sum(t.numel() * t.element_size() for t in held))
        names.append(name)
    return dict(status="fits", allocated=names, held_bytes=sum(t.numel() * t.element_size() for t in held))


# ------------------------------------------------------------------------------------------ main
def save(path: Path, rows: list[dict], settings: dict, first: bool) -> None:
    """Append this invocation's run to the record, or (after the first save) replace its rows."""
    if first or not path.exists():
        results.append(path, KIND, rows, settings=settings)
        return
    runs = results.runs(results.read(path, KIND))
    runs[-1]["rows"] = rows
    results.save(path, results.several(KIND, runs))


def main(argv=None) -> int:
    args = parse_args(argv)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    layout = plan(args, world)
    if args.dry_run:
        print(json.dumps(layout))
    results.schema(KIND)          # an unknown kind of record fails here, before any GPU time is spent
    if args.dry_run:
        return 0
    multicast_off()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    host = None
    if world > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank),
                                timeout=datetime.timedelta(seconds=args.timeout_s))
        host = dist.new_group(backend="gloo")     # barriers and gathers on the host, off the GPU's streams
    settings = dict(vars(args), out=str(args.out), plan=layout)
    parts = args.parts.split(",")
    rows = [dict(part="plan", **layout)]
    for name, part in (("time", time_part), ("trace", trace_part)):
        if name in parts:
            rows += part(args, world, rank, host)
    if rank == 0:
        save(args.out, rows, settings, first=True)
    if "long" in parts:
        rows += long_part(args, world, rank, host)
        if rank == 0:
            save(args.out, rows, settings, first=False)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
