"""A packed batch of sequences of different lengths, as a serving or training loop hands it over:
`python -m flashattn.measure.varlen_bench --out results/h200`.

One batch (LENGTHS: 8192, 4096, 1000, 513, 17, 1, 2048, 300 tokens; 32 query / 8 kv heads; D = 128;
bf16), forward and backward, causal, each one interleaved run (flashattn.measure.timing.time_interleaved: L2
flushed before every call, a GPU spin so that no column's Python time is timed, the median). Columns:

* `ours`: flashattn.attention_varlen (FlashAttention-2's packed conventions, int32 cumulative lengths), with
  validate=False: the lengths are this script's own, and checking them copies them to the host, which would
  wait for the spin that keeps the host's time out of every column (v8's forward and backward then make no
  such copy);
* `ours_per_sequence` (backward only): the same call with the first version of its backward, v8's
  fixed-length kernel once per sequence (flashattn.varlen_kernel.per_sequence_backward: the lengths copied to
  the host, slices copied in and out), the step the single launch replaced;
* `fa4`: FlashAttention-4's `flash_attn.cute.flash_attn_varlen_func` on the same packed tensors;
* `sdpa_cudnn_padded`, `sdpa_flash_padded`: SDPA with that backend forced, on the batch padded to its
  longest sequence ([8, H, 8192, D]): what a model without a varlen path pays.

`--wall`: what a training loop sees instead, a forward and `autograd.grad` per step timed from the host
(no GPU spin), single launch against per sequence: the wall time of ten steps after a sync, and the Python
call's own time (the per-sequence backward waits for the GPU when it copies the lengths to the host).

Backward: every column through `torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` on its forward's
output (the forward runs once, untimed), as flashattn.measure.backward times the square shapes. TFLOP/s
count the packed batch's own work for every column, padded ones included: per sequence 4·H_q·L²·D, half
for causal, 2.5 times that for the backward. Written as one record of kind "prefill", parts
`varlen_forward` and `varlen_backward` (results/h200/varlen.json).
"""
from __future__ import annotations

import contextlib
import itertools
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from flashattn.measure import peers
from flashattn.measure.prefill_bench import write_record
from flashattn.measure.sdpa_backends import sdpa_backend_context
from flashattn.measure.timing import bench_parser, guarded, interleaved_args
from flashattn.varlen import attention_varlen
from flashattn.varlen_kernel import per_sequence_backward

LENGTHS = (8192, 4096, 1000, 513, 17, 1, 2048, 300)
H_Q, H_KV, D = 32, 8, 128
COLUMNS = ("ours", "ours_per_sequence", "fa4", "sdpa_cudnn_padded", "sdpa_flash_padded")
BACKWARD_ONLY = ("ours_per_sequence",)   # a step of the backward: its forward is `ours`
BACKENDS = {"sdpa_cudnn_padded": "sdpa_cudnn", "sdpa_flash_padded": "sdpa_flash"}


def packed_inputs(lengths=LENGTHS, H_q=H_Q, H_kv=H_KV, D=D, seed=0):
    """q [total, H_q, D], k and v [total, H_kv, D] (bf16, fresh normal draws) and int32 cu_seqlens."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, H_q, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(total, H_kv, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    return q, k, v, cu


def padded(t: torch.Tensor, lengths) -> torch.Tensor:
    """Packed [total, H, D] to [B, H, longest, D], zeros after each sequence's end."""
    longest, starts = max(lengths), [0, *itertools.accumulate(lengths)]
    out = t.new_zeros(len(lengths), longest, t.shape[1], t.shape[2])
    for i, n in enumerate(lengths):
        out[i, :n] = t[starts[i]:starts[i] + n]
    return out.transpose(1, 2)


def forward_fn(name: str, q, k, v, cu, lengths, causal: bool):
    """(fn, context factory): `fn()` runs column `name`'s forward on the packed batch and returns its output."""
    longest = max(lengths)
    if name in ("ours", "ours_per_sequence"):
        ours = lambda: attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,  # noqa: E731
                                        validate=False)
        return ours, contextlib.nullcontext
    if name == "fa4":
        varlen = peers.fa4_module().flash_attn_varlen_func

        def fa4():
            out = varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
                         causal=causal)
            return out[0] if isinstance(out, tuple) else out
        with peers.quiet():
            fa4()                         # its first call compiles (CuTe DSL): outside the timed region
        return fa4, contextlib.nullcontext
    qp, kp, vp = (padded(t, lengths) for t in (q, k, v))
    qp, kp, vp = (t.detach().requires_grad_(q.requires_grad) for t in (qp, kp, vp))
    context = sdpa_backend_context(BACKENDS[name])
    fn = lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal, enable_gqa=True)  # noqa: E731
    fn.inputs = (qp, kp, vp)
    return fn, context


def backward_fn(name: str, q, k, v, cu, lengths, causal: bool):
    """(fn, context factory): `fn()` is autograd.grad of column `name`'s output, whose forward runs once here."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    fwd, context = forward_fn(name, q, k, v, cu, lengths, causal)
    with context():
        o = fwd()
    inputs = getattr(fwd, "inputs", (q, k, v))
    do = torch.randn_like(o)
    grad = lambda: torch.autograd.grad(o, inputs, do, retain_graph=True)  # noqa: E731
    if name == "ours_per_sequence":
        def per_sequence():
            with per_sequence_backward():
                return grad()
        return per_sequence, context
    return grad, context


def flops(lengths, H_q: int, D: int, causal: bool, backward: bool) -> float:
    work = sum(4 * H_q * n * n * D for n in lengths) / (2 if causal else 1)
    return work * (2.5 if backward else 1.0)


def part_rows(part: str, lengths, causal: bool, args) -> list[dict]:
    q, k, v, cu = packed_inputs(lengths)
    make = backward_fn if part == "varlen_backward" else forward_fn
    calls = {}
    for name in COLUMNS:
        if part == "varlen_forward" and name in BACKWARD_ONLY:
            continue
        made = guarded(make, name, q, k, v, cu, lengths, causal)
        calls[name] = made if isinstance(made, tuple) else (made, contextlib.nullcontext)
    timings = interleaved_args(calls, args)
    rows = []
    for name, t in timings.items():
        r = dict(part=part, column=name, lengths=list(lengths), H_q=H_Q, H_kv=H_KV, D=D, causal=causal)
        if isinstance(t, Exception):
            r.update(status="unsupported", message=str(t).splitlines()[0][:300])
        else:
            r.update(status="ok", **t.summary())
            r["tflops"] = flops(lengths, H_Q, D, causal, part == "varlen_backward") / (r["median_us"] * 1e6)
        cell = f"{r['median_us']:9.1f} us {r['tflops']:6.1f} TFLOP/s" if r["status"] == "ok" else r["message"][:90]
        print(f"{part:16} {name:18} {cell}", flush=True)
        rows.append(r)
    return rows


def wall(lengths=LENGTHS, rounds: int = 6, steps: int = 10) -> list[str]:
    """--wall's lines: per way of running the backward, the median over `rounds` of the wall time per step of
    `steps` steps after a sync, and the median of every step's host time (the Python call, no sync)."""
    q, k, v, cu = packed_inputs(lengths)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    longest, do = max(lengths), torch.randn_like(q)

    def step():
        o = attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, validate=False)
        return torch.autograd.grad(o, (q, k, v), do)
    ways = {"single launch": contextlib.nullcontext, "per sequence": per_sequence_backward}
    got = {name: {"wall": [], "host": []} for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            with way():
                for _ in range(2):
                    step()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(steps):
                    t = time.perf_counter()
                    step()
                    got[name]["host"].append(time.perf_counter() - t)
                torch.cuda.synchronize()
                got[name]["wall"].append((time.perf_counter() - start) / steps)
    lines = [f"# varlen batch {tuple(lengths)}, {H_Q}/{H_KV} heads, D={D}, causal, bf16, "
             f"{torch.cuda.get_device_name()}: forward + autograd.grad per step, no GPU spin; "
             f"wall = {steps} steps / {steps} after a sync, median of {rounds} rounds; "
             f"host = the Python call's own time, median of {rounds * steps}"]
    for name, r in got.items():
        lines.append(f"{name:14} wall {statistics.median(r['wall']) * 1e6:9.1f} us   host "
                     f"{statistics.median(r['host']) * 1e6:9.1f} us")
    return lines


def main(argv=None) -> int:
    parser = bench_parser("python -m flashattn.measure.varlen_bench", __doc__, "varlen_forward,varlen_backward",
                        repetitions=40, rounds=4, max_seconds=1.0, host_slack_us=3000.0,
                        slack_help="; ours_per_sequence's backward loops over the sequences in Python, "
                                   "so the default is longer than the other benches'")
    parser.add_argument("--wall", action="store_true",
                        help="instead of the columns: the host-timed training step, single launch against per sequence")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.varlen_bench needs a CUDA GPU")
    if args.wall:
        print("\n".join(wall()))
        return 0
    write_record(args, argv, "varlen.json",
                 [r for part in args.parts.split(",") for r in part_rows(part, LENGTHS, True, args)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
