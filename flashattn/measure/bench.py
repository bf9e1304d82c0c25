"""Benchmark: `python -m flashattn.measure.bench VERSION [VERSION ...] [options]` (see --help).

Every version in one run is timed side by side on the same inputs with `flashattn.measure.timing` (CUDA events
around each call, L2 flushed between calls, interleaved rounds, median with min and max). Each row reports
latency, TFLOP/s (4*B*H*M*N*D floating-point operations, half that for causal), the change against the
naive PyTorch baseline and the ratio to SDPA, as in the README's results table. A version that cannot
take a shape or dtype gets a row saying why instead of stopping the run. At the smallest shape of the
run every version's output is also checked against the float64 reference.

`--backward` times the gradient computation instead: given dO, `torch.autograd.grad` on the output of a
forward run once beforehand (flashattn.measure.backward.backward_call), the same path for every name, FLOPs
2.5 x the forward's. Its rows say "direction": "backward" and are checked against float64 gradients
(flashattn.reference.attention_gradients). Names: v6, v6_deterministic (v6 with its atomic-free dQ kernel),
v8_backward (v8 trained by kernels/v8_backward.cu), sdpa, the SDPA backends and fa4.

`fa4` is FlashAttention-4 (flashattn.measure.peers), a column wherever `flash_attn.cute` imports; its
rows say "unsupported" elsewhere.

`--json PATH` writes every figure with the device, driver, torch and CUDA versions, the git commit and
the shapes, as a record of kind bench (flashattn.measure.results; `--append` adds a run to it);
`flashattn.measure.table` turns that file into the README table.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

from flashattn.autograd import BACKWARD_DTYPES
from flashattn.measure import peers, results
from flashattn.measure.backward import BACKWARD_NAMES, backward_call, backward_flops
from flashattn.measure.sdpa_backends import SDPA_BACKENDS, sdpa_backend_context
from flashattn.measure.timing import time_interleaved
from flashattn.reference import attention_gradients, attention_reference, relative_error, sdpa
from flashattn.validate import plan
from flashattn.versions import INFO, VERSIONS

PROG = "python -m flashattn.measure.bench"
BENCH_NAMES = tuple(VERSIONS) + tuple(SDPA_BACKENDS) + peers.PEERS
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# what --help lists, read from the versions' own contracts
HALF_VERSIONS = [v for v in VERSIONS if torch.bfloat16 in INFO[v].dtypes] + ["the SDPA variants"]
CAUSAL_VERSIONS = [v for v in VERSIONS if INFO[v].causal] + ["the SDPA variants"]

DEFAULTS = dict(batch_size=4, num_heads=12, head_dim=64, seq_lens=[512, 1024, 2048],
                warmup=25, repetitions=100, rounds=10, max_seconds=3.0, dtype="float32", host_slack_us=1000.0)

EPILOG = f"""\
VERSION: all (= {', '.join(VERSIONS)}), any one of those, or the bench-only SDPA variants
{', '.join(SDPA_BACKENDS)} (SDPA with that backend forced by torch.nn.attention.sdpa_kernel; the backend
context is entered outside the timed region), or fa4 (FlashAttention-4, where it imports). Several names
may be given.

Timing: CUDA events around each call; a buffer of twice the L2 size is zeroed before each call,
outside the timed region, then the GPU spins for --host-slack-us (default {DEFAULTS['host_slack_us']:g} µs) so that
the host enqueues the whole call before the start event fires (the autograd engine of a backward, or a
Python dispatcher, would otherwise leave the GPU idle inside the measurement); the median is reported
with min and max. After every version's warm-ups,
the timed calls are spread over --rounds R interleaved rounds (default {DEFAULTS['rounds']}): each round
times about 1/R of every version's calls in turn, starting one version later each round, so drift
during the run (and the H200's power cap at large shapes) hits all versions alike.
Slow versions: --max-seconds S (default {DEFAULTS['max_seconds']:g}) stops a row's timed calls once they
have used S seconds of device time (after at least 5 calls) and caps the warm-ups at S seconds of wall
time too; the number of calls actually timed is printed and written to the JSON. --max-seconds 0 turns
the cap off.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("versions", nargs="+", metavar="VERSION", help="all, a version name, or an SDPA variant")
    p.add_argument("-B", "--batch-size", type=int, default=DEFAULTS["batch_size"],
                   help="batch size B (default: %(default)s)")
    p.add_argument("-H", "--num-heads", type=int, default=DEFAULTS["num_heads"],
                   help="attention heads H (default: %(default)s)")
    p.add_argument("-D", "--head-dim", type=int, default=DEFAULTS["head_dim"],
                   help="head dimension D (default: %(default)s)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=DEFAULTS["seq_lens"], metavar="L",
                   help="sequence lengths M = N to run (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="warm-up calls (default: %(default)s)")
    p.add_argument("--repetitions", type=int, default=DEFAULTS["repetitions"],
                   help="timed calls (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=DEFAULTS["rounds"],
                   help="interleaved rounds the timed calls are spread over (default: %(default)s)")
    p.add_argument("--max-seconds", type=float, default=DEFAULTS["max_seconds"], metavar="S",
                   help="stop timing a row after S seconds (at least 5 calls); 0: no cap (default: %(default)s)")
    p.add_argument("--host-slack-us", type=float, default=DEFAULTS["host_slack_us"], metavar="US",
                   help="spin the GPU this long after each flush, before the start event, so that a call whose "
                        "host side outlasts the flush (autograd, a Python dispatcher) is timed on device work "
                        "only; the same for every column; 0: off (default: %(default)s)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help=f"input dtype; bfloat16/float16 for {', '.join(HALF_VERSIONS)} (default: float32; "
                        "bfloat16 with --backward)")
    p.add_argument("--causal", action="store_true",
                   help=f"causal masking ({', '.join(CAUSAL_VERSIONS)}; default: off)")
    p.add_argument("--backward", action="store_true",
                   help="time the backward (dQ, dK, dV given dO, through torch.autograd.grad for every name) of "
                        f"{', '.join(BACKWARD_NAMES)} instead of the forward (default: forward)")
    p.add_argument("--json", type=Path, metavar="PATH",
                   help="write all figures and the environment here (default: print only)")
    p.add_argument("--append", action="store_true",
                   help="add this run to an existing --json file (default: replace the file)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the correctness check at the smallest shape (default: check)")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default: %(default)s)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    known, every = BENCH_NAMES, VERSIONS
    if args.backward:
        known = every = BACKWARD_NAMES
        args.dtype = args.dtype or "bfloat16"
        if DTYPES[args.dtype] not in BACKWARD_DTYPES:
            parser.error(f"--backward times bfloat16 and float16 only; got --dtype {args.dtype}")
    args.dtype = args.dtype or DEFAULTS["dtype"]
    names = []
    for version in args.versions:
        if version == "all":
            names.extend(every)
        elif version in known:
            names.append(version)
        else:
            parser.error(f"unknown VERSION {version!r}{' for --backward' if args.backward else ''}; "
                         f"choose all or one of {', '.join(known)}")
    args.versions = list(dict.fromkeys(names))          # keep order, drop repeats
    for opt in ("batch_size", "num_heads", "head_dim", "repetitions", "rounds"):
        if getattr(args, opt) < 1:
            parser.error(f"--{opt.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.host_slack_us < 0:
        parser.error("--host-slack-us must be >= 0")
    if any(L < 1 for L in args.seq_lens):
        parser.error("--seq-lens must all be >= 1")
    args.seq_lens = sorted(dict.fromkeys(args.seq_lens))
    return args


def attention_flops(B: int, H: int, M: int, N: int, D: int, causal: bool = False) -> float:
    """4*B*H*M*N*D: two matrix products of 2*M*N*D each per head; causal masking skips about half."""
    flops = 4.0 * B * H * M * N * D
    return flops / 2 if causal else flops


# --------------------------------------------------------------------------------------------- calls
def make_call(version: str, q, k, v, causal: bool):
    """(fn, context, runs_as): `fn()` runs one forward; `context()` gives a context to enter around warm-ups
    and timing (it forces an SDPA backend, so the choice happens outside the timed region); `runs_as` is the
    version that really runs (v3/v4/v5 hand unsupported head dims to v2). The inputs are checked once,
    here, by flashattn.plan (ValueError/TypeError when the version cannot take them); `fn` runs the plan."""
    if version in SDPA_BACKENDS:
        return (lambda: sdpa(q, k, v, causal=causal)), sdpa_backend_context(version), "sdpa"
    if version in peers.PEERS:
        return peers.forward_call(version, q, k, v, causal), contextlib.nullcontext, version
    p = plan(q, k, v, version, causal)          # compiles or loads the kernel before any timing
    return (lambda: p.run(q, k, v)), contextlib.nullcontext, p.runs_as


# ----------------------------------------------------------------------------------------------- run
def _progress(total: int):
    try:
        from tqdm import tqdm  # optional: the GPU image may not ship it
        return tqdm(total=total, unit="row", file=sys.stderr, disable=None, dynamic_ncols=True)
    except ImportError:                            # the GPU image may not ship tqdm
        class _Quiet:
            def update(self, n=1): pass
            def set_postfix_str(self, s): print(s, file=sys.stderr, flush=True)
            def close(self): pass
        return _Quiet()


def make_backward_call(name: str, q, k, v, do, causal: bool):
    """(fn, context, runs_as) like make_call, where `fn()` returns (dq, dk, dv) given `do` (the forward ran
    once, here: flashattn.measure.backward.backward_call; "v6_deterministic" is v6 with its atomic-free dQ)."""
    fn = backward_call(name, q, k, v, do, causal)
    return fn, contextlib.nullcontext, "sdpa" if name in SDPA_BACKENDS else name.removesuffix("_deterministic")


def bench_shape(versions, q, k, v, causal: bool, args, ref=None, on_row=None, do=None) -> list[dict]:
    """Time `versions` side by side on one set of inputs, one row each; never raises for a version that
    refuses the inputs. Each version is built and called once (errors surface here, before timing, and
    the output is checked against `ref` when given); then `flashattn.measure.timing.time_interleaved` times all
    of them in `args.rounds` interleaved rounds. With `do` (the output's gradient) the backward is timed
    instead: rows say "direction": "backward", `ref` is (dq, dk, dv) and rel_error the largest of the three."""
    B, H, M, D = q.shape
    N = k.shape[2]
    backward = do is not None
    rows, calls = {}, {}
    for version in versions:
        row = dict(version=version, batch_size=B, num_heads=H, seq_len_q=M, seq_len_kv=N, head_dim=D,
                   dtype=str(q.dtype).replace("torch.", ""), causal=causal,
                   flops=(backward_flops if backward else attention_flops)(B, H, M, N, D, causal), status="ok",
                   message=None, runs_as=None, rel_error=None)
        if backward:
            row["direction"] = "backward"
        rows[version] = row
        try:
            fn, context, row["runs_as"] = (make_backward_call(version, q, k, v, do, causal) if backward
                                           else make_call(version, q, k, v, causal))
            with context():
                out = fn()
                torch.cuda.synchronize()
                if ref is not None:
                    row["rel_error"] = max(map(relative_error, out, ref)) if backward else relative_error(out, ref)
                del out
            calls[version] = (fn, context)
        except (ValueError, TypeError) as err:
            row.update(status="unsupported", message=str(err).strip().splitlines()[0])
        except RuntimeError as err:                # launch failures, refused backends, out of memory
            row.update(status="failed", message=str(err).strip().splitlines()[0][:300])
    timings = time_interleaved(calls, warmup=args.warmup, repetitions=args.repetitions,
                               rounds=args.rounds, max_seconds=args.max_seconds,
                               host_slack_us=getattr(args, "host_slack_us", 0.0))
    for version, timing in timings.items():
        row = rows[version]
        if isinstance(timing, Exception):
            row.update(status="failed", message=str(timing).strip().splitlines()[0][:300])
            continue
        row.update(timing.summary())
        row["tflops"] = row["flops"] / (row["median_us"] * 1e-6) / 1e12
    if on_row is not None:
        for row in rows.values():
            on_row(row)
    return list(rows.values())


def add_comparisons(rows: list[dict]) -> list[dict]:
    """Add change vs baseline (%, negative = faster) and the SDPA ratios to every timed row, each
    against the baseline/sdpa row of the same shape, dtype and masking in the same run."""
    def key(r):
        return (r["batch_size"], r["num_heads"], r["seq_len_q"], r["seq_len_kv"], r["head_dim"], r["dtype"],
                r["causal"])
    ref = {(key(r), r["version"]): r.get("median_us") for r in rows if r["status"] == "ok"}
    for r in rows:
        t, base, sdpa = r.get("median_us"), ref.get((key(r), "baseline")), ref.get((key(r), "sdpa"))
        r["change_vs_baseline_pct"] = (t / base - 1) * 100 if t and base else None
        r["time_ratio_vs_sdpa"] = t / sdpa if t and sdpa else None          # < 1: faster than SDPA
        r["speedup_vs_sdpa"] = sdpa / t if t and sdpa else None              # > 1: faster than SDPA
    return rows


def run(args) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("flashattn.measure.bench needs a CUDA GPU: torch.cuda.is_available() is False")
    dtype = DTYPES[args.dtype]
    backward = getattr(args, "backward", False)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows, bar = [], _progress(len(args.seq_lens) * len(args.versions))
    try:
        for L in args.seq_lens:
            shape = (args.batch_size, args.num_heads, L, args.head_dim)
            q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
            do = torch.randn(shape, device="cuda", dtype=dtype, generator=gen) if backward else None
            check = not args.no_check and L == args.seq_lens[0]
            ref = None
            if check:
                ref = attention_gradients(q, k, v, do, args.causal) if backward else \
                    attention_reference(q, k, v, causal=args.causal)
            bar.set_postfix_str(f"L={L}")
            rows += bench_shape(args.versions, q, k, v, args.causal, args, ref, on_row=lambda _: bar.update(1),
                                do=do)
            del q, k, v, do, ref
            torch.cuda.empty_cache()
    finally:
        bar.close()
    settings = {k: getattr(args, k) for k in ("versions", "batch_size", "num_heads", "head_dim", "seq_lens",
                                              "warmup", "repetitions", "rounds", "max_seconds", "host_slack_us",
                                              "dtype",
                                              "causal", "seed")}
    settings["l2_flush"] = True
    settings["direction"] = "backward" if backward else "forward"
    settings["flops_formula"] = ("2.5*4*B*H*M*N*D" if backward else "4*B*H*M*N*D") + \
        (" / 2 (causal)" if args.causal else "")
    meta = results.environment(getattr(args, "argv", None), prog=PROG)
    if any(v in peers.PEERS for v in args.versions):
        meta["peers"] = peers.versions()
    return {"meta": meta, "settings": settings, "rows": add_comparisons(rows)}


# ----------------------------------------------------------------------------------------- printing
def _num(x, fmt="{:,.2f}"):
    return "—" if x is None else fmt.format(x)


def format_rows(rows: list[dict]) -> str:
    """A plain-text table per shape: latency (median, min-max, calls), TFLOP/s, comparisons, error."""
    out, groups = [], {}
    for r in rows:
        groups.setdefault((r["batch_size"], r["num_heads"], r["seq_len_q"], r["seq_len_kv"], r["head_dim"],
                           r["dtype"], r["causal"]), []).append(r)
    head = ("version", "median us", "min - max us", "calls", "TFLOP/s", "vs baseline", "x SDPA time", "rel. error")
    for (B, H, M, N, D, dt, causal), group in groups.items():
        direction = " backward" if group[0].get("direction") == "backward" else ""
        out.append(f"\nB={B} H={H} M={M} N={N} D={D} {dt}{' causal' if causal else ''}{direction}")
        lines = [head]
        for r in group:
            if r["status"] != "ok":
                lines.append((r["version"], f"{r['status']}: {r['message']}"))
                continue
            calls = str(r["calls_timed"]) + ("*" if r["calls_timed"] < r["requested_repetitions"] else "")
            name = r["version"] + (f" (as {r['runs_as']})" if r["runs_as"] not in (None, r["version"], "sdpa") else "")
            lines.append((name, _num(r["median_us"]), f"{r['min_us']:,.1f} - {r['max_us']:,.1f}", calls,
                          _num(r["tflops"]), _num(r["change_vs_baseline_pct"], "{:+.1f}%"),
                          _num(r["time_ratio_vs_sdpa"], "{:.3f}"), _num(r["rel_error"], "{:.1e}")))
        widths = [max(len(l[i]) for l in lines if len(l) == len(head)) for i in range(len(head))]
        widths[0] = max(len(l[0]) for l in lines)
        for l in lines:
            if len(l) != len(head):                # a refusal: the message instead of figures
                out.append(f"  {l[0]:<{widths[0]}}  {l[1]}")
            else:
                out.append("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(l, widths))))
    if any(r.get("stopped_early") for r in rows):
        out.append("\n* fewer calls than --repetitions: --max-seconds stopped the row early")
    return "\n".join(out)


def write_json(result: dict, path: Path, append: bool = False) -> dict:
    """Write the run `result` ({meta, settings, rows}) as a bench record (flashattn.measure.results), or add it
    to the file's runs with `append`; returns the file's document."""
    if append:
        return results.append(path, "bench", result["rows"], result["meta"], result["settings"])
    return results.write(path, "bench", result["rows"], result["meta"], result["settings"])


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(format_rows(result["rows"]))
    if args.json:
        write_json(result, args.json, append=args.append)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
