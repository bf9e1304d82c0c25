"""Prefill attention as models call it, against FlashAttention-4, cuDNN and FlashAttention-2:
`python -m flashattn.measure.prefill_bench --out results/h200`.

Two parts, each shape one interleaved run (flashattn.measure.timing.time_interleaved: L2 flushed before every
call, a GPU spin so that no column's Python time is timed, the median), written as one record of kind
"prefill" (results/h200/prefill.json), a row per timed call:

* `forward`: every forward row of the FlashAttention-4 table (../shared/anchors/README.md) and the
  grouped-query prefill of a Llama-3-8B layer, (1, 32 query / 8 kv heads, 8192, 128) causal: ours (v8, through
  flashattn.plan), FlashAttention-4 (`flash_attn.cute.flash_attn_func`, grouped heads native), cuDNN and
  FlashAttention-2 (SDPA with that backend forced, enable_gqa when the heads differ);
* `wide`: the head dims beyond 64 and 128, which only v8 among our kernels takes: 192 and 256 (the Gemma-like
  (1, 16 query / 8 kv heads, 8192, 256) causal among them) and 96 (a Phi-3-mini layer, 32 heads at 4096), the
  same columns as `forward`, and at 96, which trains, the backward too; written to its own record,
  prefill_wide.json (`--parts wide`);
  run alone (`--parts forward`) it writes prefill_forward.json, which the chapter reads before prefill.json's
  forward rows;
* `backward`: the grouped-query shapes, every column through `torch.autograd.grad` on its forward's output
  (flashattn.measure.backward.backward_call; ours is v8's forward trained by its own backward).

FLOPs: flashattn.measure.bench.attention_flops (4·B·H_q·M·N·D, half for causal) and backward.backward_flops
(2.5 times that); TFLOP/s beside each time. A column that cannot take a shape (FA4
not importable, a backend refusing) is a row with its reason.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from flashattn.measure import peers, results
from flashattn.measure.backward import backward_call, backward_flops
from flashattn.measure.bench import attention_flops, make_call
from flashattn.measure.timing import bench_parser, guarded, interleaved_args, interleaved_settings

# (B, H_q, H_kv, N, D, causal): M = N
FORWARD_SHAPES = [(4, 12, 12, 2048, 64, False), (4, 12, 12, 2048, 64, True), (2, 16, 16, 8192, 128, False),
                  (2, 16, 16, 8192, 128, True), (1, 32, 32, 4096, 128, False), (1, 32, 32, 4096, 128, True),
                  (16, 16, 16, 1024, 128, False), (16, 16, 16, 1024, 128, True), (1, 8, 8, 2048, 128, False),
                  (1, 8, 8, 2048, 128, True), (1, 32, 8, 8192, 128, True), (4, 32, 8, 4096, 128, True)]
WIDE_SHAPES = [(1, 16, 8, 8192, 256, True), (1, 16, 16, 4096, 256, False), (2, 16, 16, 4096, 192, True),
               (1, 32, 32, 4096, 96, True), (1, 32, 32, 4096, 96, False)]
WIDE_BACKWARD_SHAPES = [s for s in WIDE_SHAPES if s[4] == 96]   # the wide part's dims that train
BACKWARD_SHAPES = [s for s in FORWARD_SHAPES if s[1] != s[2]]
FORWARD_COLUMNS = ("v8", "fa4", "sdpa_cudnn", "sdpa_flash")
BACKWARD_COLUMNS = ("v8", "fa4", "sdpa_cudnn", "sdpa_flash")


def inputs(B, H_q, H_kv, N, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H_q, N, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(B, H_kv, N, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


def column(make, *args):
    """(call, context) of one column: make(*args)'s forward call and its context (make_call), or its backward
    call (backward_call); when the column cannot take the shape, a call that raises the reason when timed."""
    made = guarded(make, *args)
    return (made[0], made[1]) if isinstance(made, tuple) else (made, contextlib.nullcontext)


def rows_of(part, shape, timings: dict) -> list[dict]:
    B, H_q, H_kv, N, D, causal = shape
    out = []
    for column, t in timings.items():
        r = dict(part=part, column=column, B=B, H_q=H_q, H_kv=H_kv, N=N, D=D, causal=causal)
        if isinstance(t, Exception):
            r.update(status="unsupported", message=str(t)[:300])
        else:
            r.update(status="ok", **t.summary())
            count = backward_flops if part == "backward" else attention_flops
            r["tflops"] = count(B, H_q, N, N, D, causal) / (r["median_us"] * 1e6)
        out.append(r)
        cell = f"{r['median_us']:9.1f} us {r['tflops']:6.1f} TFLOP/s" if r["status"] == "ok" else r["message"][:80]
        print(f"{part:8} {B},{H_q}/{H_kv},{N},{D} {'causal' if causal else 'full  '} {column:11} {cell}", flush=True)
    return out


def forward_part(args, shapes=FORWARD_SHAPES) -> list[dict]:
    rows = []
    for shape in shapes:
        q, k, v = inputs(*shape[:5])
        calls = {name: column(make_call, name, q, k, v, shape[5]) for name in FORWARD_COLUMNS}
        rows += rows_of("forward", shape, interleaved_args(calls, args))
    return rows


def wide_part(args) -> list[dict]:
    return forward_part(args, WIDE_SHAPES) + backward_part(args, WIDE_BACKWARD_SHAPES)


def backward_part(args, shapes=BACKWARD_SHAPES) -> list[dict]:
    rows = []
    for shape in shapes:
        q, k, v = inputs(*shape[:5])
        do = torch.randn_like(q)
        calls = {name: column(backward_call, name, q, k, v, do, shape[5]) for name in BACKWARD_COLUMNS}
        rows += rows_of("backward", shape, interleaved_args(calls, args))
    return rows


def write_record(args, argv, filename: str, rows: list[dict]) -> None:
    """OUT/filename as a record of kind "prefill" (bf16 runs, the peers' versions in its meta); varlen_bench
    writes its record this way too."""
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {**results.environment(argv), "peers": peers.versions()}
    settings = dict(interleaved_settings(args), dtype="bfloat16")
    print(f"wrote {results.write(args.out / filename, 'prefill', rows, meta, settings) and args.out / filename}")


def main(argv=None) -> int:
    args = bench_parser("python -m flashattn.measure.prefill_bench", __doc__, "forward,backward", repetitions=40,
                        rounds=4, max_seconds=1.0).parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.prefill_bench needs a CUDA GPU")
    parts = {"forward": forward_part, "backward": backward_part, "wide": wide_part}
    names = args.parts.split(",")
    if "wide" in names and names != ["wide"]:
        raise SystemExit("--parts wide writes its own record (prefill_wide.json): run it alone")
    # a part run alone writes its own record, so that a rerun of one part keeps the other's
    filename = {("wide",): "prefill_wide.json", ("forward",): "prefill_forward.json"}.get(tuple(names), "prefill.json")
    write_record(args, argv, filename, [r for name in names for r in parts[name](args)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
