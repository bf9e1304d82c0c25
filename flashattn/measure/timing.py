"""CUDA-event timing of one GPU call, shared by `flashattn.measure.bench` and the notebooks.

How a call is timed (the book explains the why once; this is the how):

* before each timed call a buffer twice the size of the device's L2 cache is zeroed, outside the timed
  region, so every call starts with a cold cache instead of finding last call's Q, K and V in L2;
* a start and an end CUDA event are recorded on the current stream around the call alone, and their
  difference is the call's device time (host timers around asynchronous launches measure the launch,
  not the kernel);
* the flush is queued before the start event, so the GPU is still busy zeroing while the host enqueues
  the call: the launch latency hides behind the flush rather than landing inside the measurement;
* a call whose host side outlasts the flush (the autograd engine walking a graph, a Python-side
  dispatcher such as FlashAttention-4's) would still leave the GPU idle inside the measurement, so
  `host_slack_us` queues a spin kernel of that many microseconds after the flush: the host enqueues
  the whole call while the GPU spins, and the events bracket device work only. Every column of a
  comparison gets the same slack (the benchmark's --host-slack-us);
* warm-ups run first (module load, lazy initialisation, cuBLAS/cuDNN handle creation stay out), and the
  summary is the median with the minimum and maximum;
* several versions compared in one run are timed in interleaved rounds (`time_interleaved`): each round
  times a slice of every version's calls in turn, so a drift of clock or temperature during the run
  lands on all of them alike instead of on whichever happened to be timed first. The order rotates
  from round to round, so that no version always follows the same one: at large shapes an H200 runs
  into its power cap and lowers its clock, and a version timed right after a power-hungry one would
  otherwise start every round at a lower clock.

Slow versions can take 0.5 s per call at large shapes, so both the warm-ups and the timed calls stop
early once they have used `max_seconds` (after at least `min_calls` timed calls); the number of calls
actually timed is returned so that readers can see it.

Importable without a GPU: torch.cuda is touched only when a timing runs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

_flush_buffers: dict = {}


def l2_flush_buffer(device=None) -> torch.Tensor:
    """A byte buffer of 2x the device's L2 size (cached per device); zeroing it evicts L2."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    key = (device.type, device.index)
    if key not in _flush_buffers:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        _flush_buffers[key] = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return _flush_buffers[key]


@dataclass
class Timing:
    """Per-call device times in milliseconds and how many calls were made."""
    times_ms: list = field(default_factory=list)
    host_ms: list = field(default_factory=list)   # how long the host took to enqueue each timed call
    warmups: int = 0
    requested_warmups: int = 0
    requested_repetitions: int = 0
    stopped_early: bool = False       # the max_seconds cap cut the timed calls short

    @property
    def calls(self) -> int:
        return len(self.times_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    def summary(self) -> dict:
        """Median, min and max in microseconds plus the call counts (what the JSON records)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("times_ms", "host_ms")}
        d.update(calls_timed=self.calls, median_us=self.median_ms * 1e3, min_us=self.min_ms * 1e3,
                 max_us=self.max_ms * 1e3)
        if self.host_ms:    # the host's enqueue time: a measurement is device work only while this stays
            d.update(host_median_us=statistics.median(self.host_ms) * 1e3,   # under the flush plus the slack
                     host_max_us=max(self.host_ms) * 1e3)
        return d


def _cap(max_seconds: float | None) -> float | None:
    return max_seconds if max_seconds and max_seconds > 0 else None


def warm_up(fn: Callable[[], object], calls: int, max_seconds: float | None = 3.0) -> int:
    """Call `fn()` up to `calls` times, synchronising after each, stopping once `max_seconds` of wall time
    are used; returns how many calls were made."""
    cap, started, made = _cap(max_seconds), time.perf_counter(), 0
    for _ in range(calls):
        fn()
        torch.cuda.synchronize()
        made += 1
        if cap is not None and time.perf_counter() - started >= cap:
            break
    return made


def guarded(make, *args):
    """make(*args) now, or, when it raises, a call that raises the same message (its first line) when timed:
    a column that cannot take a shape (a peer that does not import, a backend that refuses) is then a row of
    time_interleaved's result holding its reason, not a crash of the whole run."""
    try:
        return make(*args)
    except Exception as err:          # noqa: BLE001 -- a refusal is a recorded result
        message = str(err).splitlines()[0] if str(err) else type(err).__name__

        def refuse():
            raise ValueError(message)
        return refuse


def spin(microseconds: float) -> None:
    """Queue a kernel that keeps the GPU busy for about `microseconds` (at the SM clock), so that the host
    can run ahead of it; nothing for 0."""
    if microseconds > 0:
        khz = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0) or 2_000_000
        torch.cuda._sleep(int(microseconds * khz / 1e3))     # PyTorch's own spin kernel (a private helper)


def time_cuda(fn: Callable[[], object], warmup: int = 25, repetitions: int = 100,
              max_seconds: float | None = 3.0, min_calls: int = 5, flush_l2: bool = True,
              on_call: Callable[[], None] | None = None,
              before: Callable[[], object] | None = None, host_slack_us: float = 0.0) -> Timing:
    """Time `fn()` on the current CUDA stream; see the module docstring for the method.

    `before()` runs after the flush and before the start event, outside the timed region: the
    measuring chapter passes `torch.cuda.synchronize` (the GPU is idle when the call is enqueued, so
    launch latency lands inside the measurement) or an untimed `fn` (its data is left in L2).

    `host_slack_us` > 0 queues a spin of that length after `before()` (see the module docstring).

    `max_seconds` (None or <= 0: no cap) bounds the warm-ups and, separately, the timed calls: timing
    stops once the timed calls have used that much device time and at least `min_calls` were made.
    `on_call` is called after every timed call (a progress bar hook).
    """
    cap = _cap(max_seconds)
    flush = l2_flush_buffer() if flush_l2 else None
    stream = torch.cuda.current_stream()
    result = Timing(requested_warmups=warmup, requested_repetitions=repetitions)
    result.warmups = warm_up(fn, warmup, max_seconds)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    used_ms = 0.0
    for _ in range(repetitions):
        if flush is not None:
            flush.zero_()
        if before is not None:
            before()
        spin(host_slack_us)
        start.record(stream)
        t0 = time.perf_counter()
        fn()
        result.host_ms.append((time.perf_counter() - t0) * 1e3)
        end.record(stream)
        end.synchronize()
        ms = start.elapsed_time(end)
        result.times_ms.append(ms)
        used_ms += ms
        if on_call is not None:
            on_call()
        if cap is not None and used_ms >= cap * 1e3 and result.calls >= min_calls:
            result.stopped_early = result.calls < repetitions
            break
    return result


def time_interleaved(calls: dict, warmup: int = 25, repetitions: int = 100, rounds: int = 10,
                     max_seconds: float | None = 3.0, min_calls: int = 5, host_slack_us: float = 0.0) -> dict:
    """Time several calls side by side: {name: (fn, context)} -> {name: Timing or the exception it raised}.
    `context` is a factory: `context()` gives a fresh context manager each time it is entered.

    Each `fn` is warmed up once (`warmup` calls), then `rounds` rounds each time about
    `repetitions / rounds` calls of every name in turn, one more untimed call first; round r starts
    at the r-th name (a rotation), so that no name always follows the same one. `context()` (e.g.
    an SDPA backend choice) is entered around each name's calls, outside the timed region. The
    per-name caps of `time_cuda` apply to the sum over rounds: `max_seconds` of device time for the
    timed calls, after at least `min_calls`. `host_slack_us` is time_cuda's, the same for every name.
    """
    rounds = max(1, min(rounds, repetitions))
    cap = _cap(max_seconds)
    results: dict = {}
    for name, (fn, context) in calls.items():
        try:
            with context():
                results[name] = Timing(requested_warmups=warmup, requested_repetitions=repetitions,
                                       warmups=warm_up(fn, warmup, max_seconds))
        except (RuntimeError, ValueError, TypeError) as err:
            results[name] = err
    names = list(calls)
    for r in range(rounds):
        share = repetitions * (r + 1) // rounds - repetitions * r // rounds
        start = r % len(names) if names else 0
        for name in names[start:] + names[:start]:
            fn, context = calls[name]
            t = results[name]
            if not isinstance(t, Timing) or t.stopped_early:
                continue
            left = None if cap is None else cap - sum(t.times_ms) / 1e3
            if left is not None and left <= 0 and t.calls >= min_calls:
                t.stopped_early = True
                continue
            try:
                with context():
                    part = time_cuda(fn, warmup=1, repetitions=share, min_calls=max(0, min_calls - t.calls),
                                     max_seconds=max(left, 1e-9) if left is not None else None,
                                     host_slack_us=host_slack_us)
            except (RuntimeError, ValueError, TypeError) as err:
                results[name] = err
                continue
            t.times_ms += part.times_ms
            t.host_ms += part.host_ms
            if part.calls < share:
                t.stopped_early = True
    return results


def bench_parser(prog: str, doc: str, parts: str, **timing) -> argparse.ArgumentParser:
    """The command line every interleaved benchmark starts from: --out, --parts (default `parts`) and the
    timing options of add_interleaved_arguments (`timing`: its defaults for this benchmark)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--parts", default=parts)
    add_interleaved_arguments(parser, **timing)
    return parser


def add_interleaved_arguments(parser, *, repetitions: int, rounds: int, max_seconds: float,
                              host_slack_us: float = 1000.0, warmup: int = 10, slack_help: str = "") -> None:
    """The command-line options of a benchmark that times with time_interleaved (`interleaved_args` reads
    them back), each benchmark with its own defaults."""
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--repetitions", type=int, default=repetitions)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--max-seconds", type=float, default=max_seconds)
    parser.add_argument("--host-slack-us", type=float, default=host_slack_us,
                        help="GPU spin queued before each timed call, so that no column's Python time is timed"
                             f"{slack_help} (default: %(default)s)")


def interleaved_args(calls: dict, args) -> dict:
    """time_interleaved(calls) with the options add_interleaved_arguments defined."""
    return time_interleaved(calls, warmup=args.warmup, repetitions=args.repetitions, rounds=args.rounds,
                            max_seconds=args.max_seconds, host_slack_us=args.host_slack_us)


def interleaved_settings(args) -> dict:
    """Those options as a record's settings."""
    return dict(warmup=args.warmup, repetitions=args.repetitions, rounds=args.rounds, l2_flush=True,
                host_slack_us=args.host_slack_us)
