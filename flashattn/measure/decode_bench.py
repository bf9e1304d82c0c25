"""The Decoding chapter's measurements: `python -m flashattn.measure.decode_bench --out results/h200`.

Six tables, each one interleaved run (flashattn.measure.timing.time_interleaved: L2 flushed before every
call, then a 1 ms GPU spin queued so that no column's host time, Python checks included, is timed; the
median; the host time recorded beside it as host_median_us), written as one record of kind "decode"
(results/h200/decode.json), a row per timed call with its `part`:

* `peers`: attention_with_kvcache against FlashAttention-4 (`flash_attn.cute.flash_attn_varlen_func` on the
  same cache, its own split heuristic, num_splits=0), cuDNN and FlashAttention-2 (SDPA with that backend
  forced, on [B, H, N, D] views of the same cache; grouped heads through enable_gqa) at the issue's shapes;
* `ceiling`: torch.sum and torch.amax over as many bytes as the first shape's cache (a plain read);
* `variants`: the chapter's builds of the kernel (VARIANTS), each at a fixed split count;
* `floor` (not among the default parts; `--parts floor`, results/h200/decode_floor.json): at rows16_32k,
  one_32k and batch8_16k, what reading the call's bytes costs at all: ours beside our kernel with its
  arithmetic compiled out, the steps of FLOOR_BUILDS, torch.sum and plain read kernels
  (flashattn.measure.read_floor: 16-byte loads, and bulk copies through a deep ring) over as many bytes;
* `fused`: the default call beside the build whose last split block merges the splits (DECODE_FUSED_MERGE,
  no merge kernel) at every peers shape, each with the rule's split count: what that build would change if
  it became the default;
* `splits`: ours with every fixed split count and with the rule (flashattn.decode.choose_num_splits);
* `paged`: the contiguous cache against pages of 64 and 256 rows in shuffled order;
* `lengths`: a batch whose lengths range from 1 to 32k, against the same total spread evenly and against
  the batch padded to its longest sequence;
* `anatomy`: ours at every peers shape under torch.profiler (flashattn.measure.kernel_trace, the same flush
  and spin): each kernel's GPU time and the call's span from its first kernel's start to its last's end,
  the default build (the merge a programmatic dependent launch) beside an ordinary launch (DECODE_PDL=0),
  so that the event-timed median can be split into split kernel, merge kernel and the gaps around them.

Paged and uneven calls are timed as a serving loop would make them: split count planned once by the rule,
validate=False (the check of lengths and pages copies them to the host, which waits for the GPU: a timed
call would then measure the host). Every other call of ours is the default call, checks included.

Each row has the bytes the call must read (K and V of the valid keys, q, o), the achieved TB/s and the
floor: those bytes at the H200's 4.8 TB/s datasheet bandwidth. Every call is non-causal (with one new row
causal changes nothing; with 16 rows SDPA's causal mask would be top-left aligned, not a decode mask).
`--profile` also records Nsight Compute reports of our kernel (flashattn.measure.decode_profile).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from flashattn import decode
from flashattn.measure import decode_profile, peers, read_floor, results
from flashattn.measure.kernel_trace import profile_spans
from flashattn.measure.sdpa_backends import sdpa_backend_context
from flashattn.measure.table import update_readme
from flashattn.measure.timing import bench_parser, guarded, interleaved_args, interleaved_settings

DATASHEET_BYTES_PER_S = 4.8e12
# (name, B, H_q, H_kv, M, N, D): the targets and two neighbours
SHAPES = [("batch8_16k", 8, 32, 32, 1, 16384, 128), ("rows16_32k", 1, 32, 32, 16, 32768, 128),
          ("gqa64_8k", 64, 32, 8, 1, 8192, 128), ("one_32k", 1, 32, 32, 1, 32768, 128),
          ("gqa1_128k", 1, 32, 8, 1, 131072, 128)]
SPLITS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 64, 128)
# The chapter's steps: builds of kernels/decode.cu, each timed at the first four shapes with a fixed split
# count (so that they compare how each block streams its keys, not the split rule).
VARIANTS = {
    "16-byte copies, 3 stages": ("-DDECODE_STAGES=3",),
    "16-byte copies, 2 stages": ("-DDECODE_STAGES=2",),
    "2 stages, L2 prefetch 128 B": ("-DDECODE_STAGES=2", "-DDECODE_L2_PREFETCH=128"),
    "2 stages, L2 prefetch 256 B": ("-DDECODE_STAGES=2", "-DDECODE_L2_PREFETCH=256"),
    "2 stages, 3 blocks/SM": ("-DDECODE_STAGES=2", "-DDECODE_MIN_BLOCKS=3"),
    "2 stages, 3 blocks/SM, L2 prefetch 256 B": ("-DDECODE_STAGES=2", "-DDECODE_MIN_BLOCKS=3",
                                                 "-DDECODE_L2_PREFETCH=256"),
    "3 stages, L2 prefetch 256 B": ("-DDECODE_STAGES=3", "-DDECODE_L2_PREFETCH=256"),
    "bulk rows, 3 stages": ("-DDECODE_BULK=1", "-DDECODE_STAGES=3"),
    "2 stages, merge launched after the split": ("-DDECODE_STAGES=2", "-DDECODE_PDL=0"),
    "2 stages, merge reading one split at a time": ("-DDECODE_STAGES=2", "-DDECODE_MERGE_UNROLL=1"),
    "2 stages, merge fused into the last split": ("-DDECODE_STAGES=2", "-DDECODE_FUSED_MERGE=1"),
}
NO_PDL = VARIANTS["2 stages, merge launched after the split"]
FUSED = VARIANTS["2 stages, merge fused into the last split"]
# The floor part's builds: ours without its arithmetic, and the two steps tried against rows16_32k's target
# after the variants table was recorded (each passes tests/test_decode.py and compute-sanitizer).
READ_ONLY = ("-DDECODE_READ_ONLY=1",)
INTERLEAVED = ("-DDECODE_INTERLEAVE=1",)
CLUSTER = ("-DDECODE_CLUSTER_MERGE=1",)
FLOOR_BUILDS = {"ours, no arithmetic": READ_ONLY, "ours, splits interleaved": INTERLEAVED,
                "ours, merge in a cluster": CLUSTER}
FLOOR_SHAPES = ("rows16_32k", "one_32k", "batch8_16k")
# The plain reads of the floor part (flashattn.measure.read_floor): (label, kernel, keyword arguments)
PLAIN_READS = [("16-byte loads, 264 blocks", "loads", dict(blocks=264)),
               ("16-byte loads, 528 blocks", "loads", dict(blocks=528)),
               ("bulk copies, 1 block/SM, 6 x 32 KB", "bulk", dict(blocks=132, chunk=32768, stages=6)),
               ("bulk copies, 2 blocks/SM, 3 x 32 KB", "bulk", dict(blocks=264, chunk=32768, stages=3)),
               ("bulk copies, 1 block/SM, 12 x 16 KB", "bulk", dict(blocks=132, chunk=16384, stages=12))]
FUSED_COLUMNS = {"ours": None, "ours, merge fused into the last split": FUSED}     # the fused part's builds
VARIANT_SPLITS = {"batch8_16k": 1, "rows16_32k": 8, "gqa64_8k": 1, "one_32k": 8}
LENGTHS = (1, 300, 1000, 2048, 4096, 8192, 16384, 32768)     # the "1 to 32k" batch


def bytes_moved(B, H_q, H_kv, M, lengths, D, element=2) -> int:
    """Bytes a call must move at least: K and V of every valid key once, q read and o written."""
    return element * D * (2 * H_kv * sum(lengths) + 2 * B * M * H_q)


def floor_us(nbytes: float, bytes_per_s: float = DATASHEET_BYTES_PER_S) -> float:
    """The time those bytes take at the datasheet bandwidth: no kernel can be faster."""
    return nbytes / bytes_per_s * 1e6


def row(part, name, column, timing, nb, **extra) -> dict:
    r = dict(part=part, shape=name, column=column, bytes=nb, floor_us=floor_us(nb), **extra)
    if isinstance(timing, Exception):
        r.update(status="unsupported", message=str(timing).splitlines()[0][:300])
    else:
        r.update(status="ok", **timing.summary())
        r["tb_per_s"] = nb / (r["median_us"] * 1e-6) / 1e12
    return r


def inputs(B, H_q, H_kv, M, N, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, M, H_q, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, N, H_kv, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    return q, k, v


def ours(q, k, v, flags=None, **kw):
    """Our call, non-causal; `flags`: a build variant of kernels/decode.cu (VARIANTS) instead of the default."""
    fn = decode.attention_with_kvcache if flags is None else decode.variant(flags)
    return lambda: fn(q, k, v, causal=False, **kw)


def fa4_call(q, k, v, seqused_k=None, page_table=None):
    varlen = peers.fa4_module().flash_attn_varlen_func
    call = lambda: varlen(q, k, v, seqused_k=seqused_k, page_table=page_table, causal=False, num_splits=0)  # noqa: E731
    with peers.quiet():
        call()
    return call


def sdpa_call(q, k, v):
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)     # views: [B, H, L, D]
    gqa = q.shape[2] != k.shape[2]
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa)


def timed(calls, args):
    return interleaved_args({name: (fn, ctx or contextlib.nullcontext) for name, (fn, ctx) in calls.items()}, args)


def at_shape(part: str, name: str, dims, calls: dict, args, **per_column) -> list[dict]:
    """Time `calls` side by side at one shape (B, H_q, H_kv, M, N, D: every key of every sequence valid) and
    return their rows, printed; `per_column[key](column)` adds a field to each row."""
    B, H_q, H_kv, M, N, D = dims
    nb = bytes_moved(B, H_q, H_kv, M, [N] * B, D)
    rows = [row(part, name, column, t, nb, dims=list(dims), **{k: f(column) for k, f in per_column.items()})
            for column, t in timed(calls, args).items()]
    print_rows(rows)
    return rows


def peers_part(args) -> list[dict]:
    rows = []
    for name, B, H_q, H_kv, M, N, D in SHAPES:
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        calls = {"ours": (ours(q, k, v), None),
                 "fa4": (guarded(fa4_call, q, k, v), None),
                 "cudnn": (guarded(sdpa_call, q, k, v), sdpa_backend_context("sdpa_cudnn")),
                 "fa2": (guarded(sdpa_call, q, k, v), sdpa_backend_context("sdpa_flash"))}
        rows += at_shape("peers", name, (B, H_q, H_kv, M, N, D), calls, args)
    return rows


def splits_part(args) -> list[dict]:
    rows = []
    for name, B, H_q, H_kv, M, N, D in SHAPES[:3]:
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        calls = {"rule": (ours(q, k, v), None)}
        calls.update({f"splits={s}": (ours(q, k, v, num_splits=s), None) for s in SPLITS})
        rule = planned(q, k, v, N)["num_splits"]          # what the default call chooses
        rows += at_shape("splits", name, (B, H_q, H_kv, M, N, D), calls, args,
                         num_splits=lambda column, rule=rule: rule if column == "rule" else int(column.split("=")[1]))
    return rows


def variants_part(args) -> list[dict]:
    rows = []
    for name, B, H_q, H_kv, M, N, D in SHAPES[:4]:
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        splits = VARIANT_SPLITS[name]
        calls = {label: (ours(q, k, v, flags, num_splits=splits), None) for label, flags in VARIANTS.items()}
        rows += at_shape("variants", name, (B, H_q, H_kv, M, N, D), calls, args,
                         num_splits=lambda column, splits=splits: splits, flags=lambda column: list(VARIANTS[column]))
    return rows


def fused_part(args) -> list[dict]:
    rows = []
    for name, B, H_q, H_kv, M, N, D in SHAPES:
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        calls = {column: (ours(q, k, v, flags), None) for column, flags in FUSED_COLUMNS.items()}
        rule = planned(q, k, v, N)["num_splits"]          # both columns split as the default call does
        rows += at_shape("fused", name, (B, H_q, H_kv, M, N, D), calls, args, num_splits=lambda column, rule=rule: rule,
                         flags=lambda column: list(FUSED_COLUMNS[column] or ()))
    return rows


def ceiling_part(args) -> list[dict]:
    """What a plain read of the same number of bytes costs: torch.sum over one bf16 tensor of the size of
    K and V at the first shape (a reduction reads every byte once and writes almost nothing)."""
    name, B, H_q, H_kv, M, N, D = SHAPES[0]
    x = torch.randn(2 * B * N * H_kv * D, device="cuda", dtype=torch.bfloat16)
    nb = x.numel() * 2
    rows = [row("ceiling", name, column, t, nb) for column, t in
            timed({"torch.sum": (lambda: x.sum(), None), "torch.amax": (lambda: x.amax(), None)}, args).items()]
    print_rows(rows)
    return rows


def floor_part(args) -> list[dict]:
    """What reading each shape's bytes costs, beside our call: ours as a user calls it, our kernel with its
    arithmetic compiled out (DECODE_READ_ONLY: the tiles stream, nothing is computed), the steps of
    FLOOR_BUILDS, torch.sum over a buffer of the cache's size, and PLAIN_READS (read_floor's kernels). Every
    build of ours splits as the rule does for the shape."""
    rows = []
    for name, B, H_q, H_kv, M, N, D in (s for s in SHAPES if s[0] in FLOOR_SHAPES):
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        splits = planned(q, k, v, N)["num_splits"]
        calls = {"ours": (ours(q, k, v), None)}
        calls.update({label: (ours(q, k, v, flags, num_splits=splits), None) for label, flags in FLOOR_BUILDS.items()})
        x = torch.empty(2 * B * N * H_kv * D, device="cuda", dtype=torch.bfloat16).normal_()
        calls["torch.sum"] = (lambda x=x: x.sum(), None)
        for label, kernel, kw in PLAIN_READS:
            read = getattr(read_floor, kernel)
            calls[label] = (lambda x=x, read=read, kw=kw: read(x, **kw), None)
        rows += at_shape("floor", name, (B, H_q, H_kv, M, N, D), calls, args, num_splits=lambda column, s=splits: s)
        del q, k, v, x
    return rows


def build_variants() -> None:
    """Every variant of VARIANTS built, each in its own process (nvcc runs in parallel)."""
    procs = [subprocess.Popen([sys.executable, "-c", f"from flashattn import decode; decode.module({flags!r})"])
             for flags in (*VARIANTS.values(), *FLOOR_BUILDS.values())]
    if any(p.wait() for p in procs):
        raise SystemExit("a variant of kernels/decode.cu did not build")


def paged(k, v, page_size, seed=1):
    """The caches cut into pages of `page_size` rows stored in a shuffled order, and their block table."""
    return decode.paged_copy(k, v, page_size, generator=torch.Generator(device="cuda").manual_seed(seed))


def planned(q, k, v, lengths, block_table=None) -> dict:
    """The split the rule picks for these lengths (a list, or one int for all), so that the timed call can
    skip the host's check of lengths and pages (validate=False): that check copies them to the host, which
    waits for the GPU's queue, and the timing would then hold the host's time, not the kernel's. Without
    the lengths the kernel sizes splits for the cache's capacity, so a list's split is expressed as a
    count of splits of the capacity."""
    B, M, H_q, _ = q.shape
    H_kv, tile = k.shape[2], decode.module().tile_keys()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = decode.splits_for(B, M, H_q, H_kv, lengths, tile, sms)
    if not isinstance(lengths, int):
        per_split = math.ceil(math.ceil(max(lengths) / tile) / splits)
        capacity = k.shape[1] if block_table is None else block_table.shape[1] * k.shape[1]
        splits = min(decode.MAX_SPLITS, math.ceil(math.ceil(capacity / tile) / per_split))
    return dict(num_splits=splits, validate=False, block_table=block_table)


def paged_part(args) -> list[dict]:
    rows = []
    for name, B, H_q, H_kv, M, N, D in (SHAPES[0], SHAPES[2]):
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        lengths = torch.full((B,), N, dtype=torch.int32, device="cuda")
        calls = {"contiguous": (ours(q, k, v), None)}
        for size in (64, 256):
            kp, vp, table = paged(k, v, size)
            calls[f"paged {size}"] = (ours(q, kp, vp, cache_seqlens=N, **planned(q, k, v, N, table)), None)
            calls[f"fa4 paged {size}"] = (guarded(fa4_call, q, kp, vp, lengths, table), None)
        calls["fa4 contiguous"] = (guarded(fa4_call, q, k, v), None)
        rows += at_shape("paged", name, (B, H_q, H_kv, M, N, D), calls, args)
    return rows


def lengths_part(args) -> list[dict]:
    B, H_q, H_kv, M, D = len(LENGTHS), 32, 8, 1, 128
    N = max(LENGTHS)
    q, k, v = inputs(B, H_q, H_kv, M, N, D)
    even_length = sum(LENGTHS) // B
    cases = {"spread 1..32k": list(LENGTHS), "even, same total": [even_length] * B, "padded to 32k": [N] * B}
    calls, sizes = {}, {}
    for label, valid in cases.items():
        lens = torch.tensor(valid, dtype=torch.int32, device="cuda")
        calls[label] = (ours(q, k, v, cache_seqlens=lens, **planned(q, k, v, valid)), None)
        calls[f"fa4 {label}"] = (guarded(fa4_call, q, k, v, lens), None)
        sizes[label] = sizes[f"fa4 {label}"] = bytes_moved(B, H_q, H_kv, M, valid, D)
    rows = [row("lengths", "gqa8_spread", column, t, sizes[column], dims=[B, H_q, H_kv, M, N, D])
            for column, t in timed(calls, args).items()]
    print_rows(rows)
    return rows


def anatomy_part(args) -> list[dict]:
    rows = []
    for name, B, H_q, H_kv, M, N, D in SHAPES:
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        nb = bytes_moved(B, H_q, H_kv, M, [N] * B, D)
        for column, flags in (("ours", None), ("ours, merge launched after the split", NO_PDL)):
            per_kernel, span = profile_spans(ours(q, k, v, flags), calls=args.repetitions, warmup=args.warmup,
                                             slack_us=args.host_slack_us)
            rows.append(dict(part="anatomy", shape=name, column=column, bytes=nb, floor_us=floor_us(nb),
                             dims=[B, H_q, H_kv, M, N, D], status="ok", kernels=per_kernel, span_us=span,
                             flags=list(flags or ())))
            each = ", ".join(f"{kk['name'].split('<')[0][-14:]} {kk['median_us']:.1f}" for kk in per_kernel)
            print(f"anatomy  {name:12} {column:34} span {span:8.1f} us: {each}", flush=True)
    return rows


def print_rows(rows):
    for r in rows:
        if r["status"] == "ok":
            print(f"{r['part']:8} {r['shape']:12} {r['column']:22} {r['median_us']:9.1f} us  {r['tb_per_s']:5.2f} TB/s "
                  f"(floor {r['floor_us']:.1f} us; host {r.get('host_median_us', 0):.0f} us)", flush=True)
        else:
            print(f"{r['part']:8} {r['shape']:12} {r['column']:22} {r['status']}: {r['message']}", flush=True)


COLUMNS = ("ours", "fa4", "cudnn", "fa2")


def peers_markdown(doc: dict) -> str:
    """The README's decode table: every peers shape, µs and % of the bandwidth floor per column."""
    rows = [r for r in doc["rows"] if r["part"] == "peers"]
    head = ("| B, H_q/H_kv, M, N, D | floor (µs) | " + " | ".join(f"{c} (µs, % of floor)" for c in COLUMNS)
            + " |\n|---|--:|" + "--:|" * len(COLUMNS))
    lines = [head]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        cells = {r["column"]: r for r in rows if r["shape"] == shape}
        any_row = next(iter(cells.values()))
        B, H_q, H_kv, M, N, D = any_row["dims"]
        out = [f"{B}, {H_q}/{H_kv}, {M}, {N:,}, {D}", f"{any_row['floor_us']:,.1f}"]
        for c in COLUMNS:
            r = cells.get(c)
            ok = r is not None and r["status"] == "ok"
            out.append(f"{r['median_us']:,.1f} ({100 * r['floor_us'] / r['median_us']:.0f}%)" if ok else "–")
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = bench_parser("python -m flashattn.measure.decode_bench", __doc__,
                     "ceiling,variants,peers,splits,paged,lengths,anatomy,fused", repetitions=60, rounds=6,
                     max_seconds=2.0)
    p.add_argument("--profile", action="store_true", help="also record Nsight Compute reports (needs ncu)")
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--target", help=argparse.SUPPRESS)      # internal: the program ncu profiles
    p.add_argument("--update-readme", type=Path, metavar="README",
                   help="write the peers table of OUT/decode.json into README's decode-table block and stop")
    args = p.parse_args(argv)
    if args.update_readme:
        update_readme(args.update_readme, peers_markdown(results.read(args.out / "decode.json", "decode")),
                      block="decode-table")
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.decode_bench needs a CUDA GPU")
    if args.target:                       # B,H_q,H_kv,M,N,D[,page_size]
        B, H_q, H_kv, M, N, D, *page_size = map(int, args.target.split(","))
        q, k, v = inputs(B, H_q, H_kv, M, N, D)
        if page_size:
            kp, vp, table = paged(k, v, page_size[0])
            call = ours(q, kp, vp, cache_seqlens=N, **planned(q, k, v, N, table))
        else:
            call = ours(q, k, v)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        return 0
    parts = {"peers": peers_part, "splits": splits_part, "paged": paged_part, "lengths": lengths_part,
             "variants": variants_part, "ceiling": ceiling_part, "anatomy": anatomy_part, "fused": fused_part,
             "floor": floor_part}
    if any(part in args.parts for part in ("variants", "anatomy", "fused", "floor")):
        build_variants()
    rows = []
    for part in args.parts.split(","):
        rows += parts[part](args)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {**results.environment(argv), "peers": peers.versions(),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count, "tile_keys": decode.module().tile_keys()}
    settings = dict(interleaved_settings(args), dtype="bfloat16", causal=False,
                    datasheet_bytes_per_s=DATASHEET_BYTES_PER_S)
    path = results.write(args.out / "decode.json", "decode", rows, meta, settings) and args.out / "decode.json"
    print(f"wrote {path}")
    if args.profile:
        decode_profile.profile(args.out, args.ncu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
