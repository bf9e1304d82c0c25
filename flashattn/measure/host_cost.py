"""What one attention call costs the host: the Python and C++ time between the call and its last launch.

A small model's training step is bound by the host, not the GPU: in the training demo (4 layers, B=16,
H=4, T=256, D=64) the GPU runs each kernel faster than the host enqueues the next, so the step takes as
long as the host does, and every microsecond around an attention call is a microsecond of step time. This
module times, side by side, the forward and backward of one attention call as the model makes it (q, k, v
views of one projection, under bf16 autocast) through each path:

    python -m flashattn.measure.host_cost --json results/h200/host_cost.json [--profile log.txt]
    python -m flashattn.measure.host_cost --dense --json results/h200/host_cost_dense.json   # no views

* each call is `torch.autograd.grad(o, (q, k, v), do)` of one attention output;
* time_interleaved with a spin queued before each call (`host_slack_us`): the host enqueues the whole
  call while the GPU is busy, so `host_us` is the host's cost alone and `gpu_us` the device's;
* `--profile` adds cProfile's view of the host side of each path (cumulative time, top entries).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from flashattn import attention
from flashattn.autograd import through_custom_ops
from flashattn.measure import results
from flashattn.measure.timing import spin, time_interleaved

SHAPE = dict(B=16, H=4, T=256, D=64)      # the training demo's attention (flashattn.book.training_model)


def _ours(through_ops: bool, **kw):
    def call(q, k, v):
        with through_custom_ops() if through_ops else contextlib.nullcontext():
            return attention(q, k, v, causal=True, **kw)
    return call


HOPPER = dict(version="v8", backward="v8_backward")
PATHS = {    # the demo's three attentions, ours each way: the eager path and the custom ops (torch.compile's)
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "v6": _ours(False),
    "v6 custom ops": _ours(True),
    "v8+v8_backward": _ours(False, **HOPPER),
    "v8+v8_backward custom ops": _ours(True, **HOPPER),
}


def model_inputs(B: int, H: int, T: int, D: int, device="cuda", dense: bool = False):
    """q, k, v as the demo's model makes them: views (B, H, T, D) of one (B, T, 3 H D) projection; `dense`:
    three contiguous (B, H, T, D) leaves instead (what our kernels read without a copy)."""
    if dense:
        return [torch.randn(B, H, T, D, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    qkv = torch.randn(B, T, 3 * H * D, device=device, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))
    return q, k, v


def step(path: str, q, k, v, do):
    """One forward and backward through `path`, under bf16 autocast like the model's."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = PATHS[path](q, k, v)
    return torch.autograd.grad(o, (q, k, v), do)


def measure(B: int, H: int, T: int, D: int, repetitions: int = 300, rounds: int = 6,
            host_slack_us: float = 3000.0, profile: bool = False, dense: bool = False) -> dict:
    q, k, v = model_inputs(B, H, T, D, dense=dense)
    do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)   # the model's dO: a view
    if dense:
        do = do.contiguous()
    calls = {p: ((lambda p=p: step(p, q, k, v, do)), contextlib.nullcontext) for p in PATHS}
    timed = time_interleaved(calls, warmup=20, repetitions=repetitions, rounds=rounds, max_seconds=None,
                             host_slack_us=host_slack_us)
    rows = []
    for p, t in timed.items():
        if isinstance(t, Exception):
            rows.append({"path": p, "error": str(t)})
            continue
        s = t.summary()
        rows.append({"path": p, "host_us": s["host_median_us"], "gpu_us": s["median_us"], "calls": s["calls_timed"]})
    out = {"rows": rows, "settings": dict(B=B, H=H, T=T, D=D, dtype="bfloat16", causal=True, repetitions=repetitions,
                                          rounds=rounds, host_slack_us=host_slack_us,
                                          inputs="dense" if dense else "views, as the model makes them")}
    if profile:
        out["profiles"] = {p: host_profile(p, q, k, v, do) for p in PATHS}
    return out


def host_profile(path: str, q, k, v, do, calls: int = 200, chunk: int = 10, top: int = 30) -> str:
    """cProfile's cumulative view of `calls` steps through `path`. The GPU spins while each `chunk` of calls is
    enqueued (so no launch waits for the GPU), and the queue is drained between chunks (so no launch waits for
    a full queue either, which would charge the wait to whichever call met it)."""
    prof = cProfile.Profile()
    for _ in range(calls // chunk):
        torch.cuda.synchronize()
        spin(chunk * 2000.0)
        prof.enable()
        for _ in range(chunk):
            step(path, q, k, v, do)
        prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def table(views=results.H200 / "host_cost.json", dense=results.H200 / "host_cost_dense.json") -> str:
    """The two records side by side (markdown): each path's host and GPU time per call with the model's
    views as inputs and with dense ones."""
    docs = [results.read_if_exists(p, "host_cost") for p in (views, dense)]
    if docs[0] is None:
        return f"*Not recorded yet: `{views.name}` (`python -m flashattn.measure.host_cost --json ...`).*"
    by_path = [{r["path"]: r for r in d["rows"]} if d else {} for d in docs]
    lines = ["| path | host µs, the model's views | GPU µs | host µs, dense inputs | GPU µs |", "|---|--:|--:|--:|--:|"]
    for path in by_path[0]:
        cells = []
        for rows in by_path:
            r = rows.get(path, {})
            cells += [f"{r['host_us']:,.1f}", f"{r['gpu_us']:,.1f}"] if "host_us" in r else ["–", "–"]
        lines.append(f"| {path} | " + " | ".join(cells) + " |")
    s, m = docs[0]["settings"], docs[0]["meta"]
    commits = ", ".join(sorted({(d["meta"].get("git") or {}).get("commit", "?") for d in docs if d}))
    lines += ["", f"B={s['B']}, H={s['H']}, T={s['T']}, D={s['D']}, {s['dtype']}, causal, forward and backward "
              f"(torch.autograd.grad) under bf16 autocast; medians of {s['repetitions']} calls in {s['rounds']} "
              f"interleaved rounds, a {s['host_slack_us']:.0f} µs spin before each so that host and GPU are timed "
              f"apart; {m.get('device', {}).get('name', '?')}, `python -m flashattn.measure.host_cost` (and "
              f"`--dense`), commit {commits}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn.measure.host_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, value in SHAPE.items():
        parser.add_argument(f"-{name}", type=int, default=value)
    parser.add_argument("--repetitions", type=int, default=300)
    parser.add_argument("--dense", action="store_true", help="contiguous q, k, v and dO instead of the model's views")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="write cProfile's view of every path here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_cost needs a CUDA GPU", file=sys.stderr)
        return 2
    out = measure(args.B, args.H, args.T, args.D, args.repetitions, profile=args.profile is not None, dense=args.dense)
    print(f"B={args.B} H={args.H} T={args.T} D={args.D}, bf16 causal, forward + backward through autograd")
    print(f"  {'path':<26} {'host us':>9} {'gpu us':>9}")
    for r in out["rows"]:
        print(f"  {r['path']:<26} " + (f"{r['host_us']:9.1f} {r['gpu_us']:9.1f}" if "host_us" in r else r["error"]))
    if args.profile:
        args.profile.write_text("\n\n".join(f"== {p}\n{text}" for p, text in out.pop("profiles").items()))
    if args.json:
        results.write(args.json, "host_cost", out["rows"], settings=out["settings"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
