"""The measuring chapter's experiments: time_cuda's `before` hook runs outside the timed region once per
timed call, and cache_and_launch separates the L2 effect from the launch latency (GPU), or says in one
line that it runs live only (no GPU)."""
from __future__ import annotations

import pytest
import torch

from flashattn.book import live
from flashattn.measure.timing import time_cuda

pytest.importorskip("IPython")


def test_without_a_gpu_the_experiments_say_live_only(monkeypatch, capsys):
    monkeypatch.setattr(live, "gpu", lambda: False)
    assert live.cache_and_launch() is None and live.timing_pitfalls() is None
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("No CUDA GPU") for line in lines)


@pytest.mark.gpu
def test_before_runs_once_per_call_outside_the_timed_region():
    calls = []
    cycles = 20_000_000                                    # about 10 ms at the H200's ~2 GHz

    def before():
        calls.append(1)
        torch.cuda._sleep(cycles)
    x = torch.randn(1 << 16, device="cuda")
    t = time_cuda(lambda: x * 2, warmup=2, repetitions=7, max_seconds=None, before=before)
    assert len(calls) == t.calls == 7
    assert max(t.times_ms) < 2.0, t.times_ms             # the sleep queued before the start event is not timed


@pytest.mark.gpu
def test_the_live_table_has_every_case_and_real_times():
    out = live.cache_and_launch(softmax_mb=(0.03, 8), L=256).data
    rows = [r for r in out.splitlines() if r.startswith("| softmax") or r.startswith("| Baseline")]
    assert len(rows) == 3, out
    assert [float(r.split("|")[2]) for r in rows[:2]] == [0.03, 8.0], rows
    for r in rows:
        times = [float(c.replace(",", "")) for c in r.split("|")[3:7]]
        assert all(0 < t < 1e5 for t in times), r
    # Whether an idle start costs time is the chapter's measurement, taken with the GPU to itself. It is not
    # asserted here: under pytest-xdist other workers keep the same GPU busy, so "idle" is not idle (on the
    # H200 the suite once measured 8.2 us idle against 8.3 us queued for the 32 KB softmax).


def _times(cold_queued, warm_queued, cold_idle, warm_idle):
    return {("cold", "queued"): cold_queued, ("warm", "queued"): warm_queued,
            ("cold", "idle"): cold_idle, ("warm", "idle"): warm_idle}


def test_the_sentences_follow_the_table():
    cases = [("tiny", 0.03, _times(2.0, 2.0, 9.0, 9.0)), ("fits", 32.0, _times(20.0, 8.0, 27.0, 15.0)),
             ("spills", 256.0, _times(90.0, 89.0, 97.0, 96.0)), ("Baseline", 452.0, _times(580.0, 590.0, 600.0, 611.0))]
    out = live.cache_and_launch_table(cases, l2_mb=62.9, device="a GPU", calls=7)
    rows = [r for r in out.splitlines() if r.startswith("| ") and not r.startswith("| call")]
    assert [r.split("|")[1].strip() for r in rows] == ["tiny", "fits", "spills", "Baseline"]
    assert "| 2.50× | 7.0 |" in rows[1]                       # cold ÷ warm, then idle − queued
    assert "medians of 7 calls" in out and "holds 63 MB" in out
    assert "that fit in L2 (32 MB): cold ÷ warm = 2.50, warm calls are faster" in out
    assert "larger than L2 (256 MB, 452 MB): cold ÷ warm = 0.98–1.01, warm calls are no faster" in out
    assert "adds 7.0–20.0 µs per call" in out and "for tiny that is 3.5× its own device time" in out
    # the baseline's old "warm" figure split into its two causes, which add up
    assert "is +31.0 µs, of which the idle start accounts for +21.0 µs and the warm cache for +10.0 µs" in out
