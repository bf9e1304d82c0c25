"""flashattn.book.schedule (the ping-pong model of the V8 chapter) and the V8 helpers of flashattn.measure.sass, on
inputs small enough to check by hand."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashattn.book import schedule, trace  # noqa: E402
from flashattn.measure import sass  # noqa: E402


def test_pingpong_issues_in_turn_and_keeps_the_tensor_cores_busier():
    turns = schedule.simulate(warpgroups=2, tiles=3, pingpong=True)
    products = [p for p in turns if p.kind == "products"]
    assert [p.warpgroup for p in products] == [0, 1, 0, 1, 0, 1]
    for a, b in zip(products, products[1:]):          # one warpgroup on the tensor cores at a time
        assert b.start >= a.end
    lockstep = schedule.simulate(warpgroups=2, tiles=3, pingpong=False)
    shared = [p for p in lockstep if p.kind == "products" and p.tile == 0]
    assert shared[0].start == shared[1].start and shared[0].end == shared[1].end == 2.0
    assert schedule.tensor_busy(turns) > schedule.tensor_busy(lockstep)
    assert schedule.tensor_busy(lockstep) == pytest.approx(2 / 3)


def test_pingpong_figure_shows_both_schedules_with_their_busy_share():
    fig = schedule.fig_pingpong(show=False)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2 and "V8_PINGPONG=0" in titles[0] and "V8_PINGPONG=1" in titles[1]
    for pingpong, title in zip((False, True), titles):
        busy = schedule.tensor_busy(schedule.simulate(2, 4, pingpong=pingpong))
        assert f"busy {100 * busy:.0f}%" in title
    plt.close(fig)


def test_overlap_window_counts_exponentials_and_finds_a_write_in_flight():
    lines = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0",          # S: from shared memory
             "HGMMA.64x64x16.F32.BF16 R56, R100, gdesc[UR8].tnspB, R56, gsb0",  # P V: A in R100..R103
             "WARPGROUP.DEPBAR.LE gsb0, 0x1",
             "MUFU.EX2 R5, R5", "MUFU.EX2 R6, R6", "FMUL R60, R60, R5",     # R60: an O_i accumulator
             "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R7, R7"]
    (length, exps, clobbered), = sass.overlap_windows(lines)
    assert (length, exps) == (3, 2) and clobbered == ["FMUL R60, R60, R5"]
    assert sass.overlap_windows(lines[:2] + lines[6:]) == []


def test_register_moves_reads_setmaxnreg():
    lines = ["USETMAXREG.DEALLOC.CTAPOOL 0x18", "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0", "MOV R1, R2"]
    assert sass.register_moves(lines) == {"release": [24], "claim": [240]}


# ---------------------------------------------------------------- flashattn.book.trace (V8_TRACE stamps)
def _stamps(tiles=6, period=2000, offset=1000):
    """One item of a hand-made trace at 1 cycle per ns: producer and two consumers taking turns."""
    rows = []
    for role in range(trace.ROLES):
        r = [[-1] * trace.WORDS for _ in range(1 + tiles + 1)]
        if role < 3:
            r[0] = [0, 0, 0, 100_000, 100_000, tiles, 0, 0, 50, 99_000]
            for t in range(tiles):
                c = 500 + t * period + (role - 1) * offset
                r[1 + t] = ([t * 1500, t * 1500 + 40, t * 1500 + 50, t * 1500 + 90] + [-1] * 6 if role == 0 else
                            [c, c + 10, c + 20, c + 30, c + 45, c + 50, c + 300, c + 900, c + 950, c + 1500])
        rows.append(r)
    return rows


def test_trace_summary_of_hand_made_stamps():
    raw = [_stamps()]
    assert trace.clock_ghz(raw) == 1.0
    s = trace.summarize(raw, 1.0)
    assert s["tile period"] == 2000 and s["turn wait"] == 15 and s["K wait"] == 10
    assert s["S = Q K^T"] == 250 and s["softmax"] == 600 and s["P V"] == 550
    assert s["producer K slot wait"] == 40 and s["alternating turns"] == 1.0
    assert s["prologue"] == (550 + 1550) / 2 and s["item"] == 99_000   # median of the two consumers
    serial = [_stamps(offset=6 * 2000)]          # consumer 1 starts after consumer 0's last tile
    assert trace.summarize(serial, 1.0)["alternating turns"] == pytest.approx(1 / 11)
    run = {"shape": dict(B=1, H=1, M=1, N=1, D=64, causal=False), "clock_ghz": 1.0, "items": [{"stamps": raw[0]}]}
    kinds = {(row, kind) for row, kind, *_ in trace.timeline(run)}
    assert ("consumer 1", "softmax") in kinds and ("producer", "K slot wait") in kinds
    assert ("consumer 0", "write O_i") in kinds


@pytest.mark.parametrize("name", ["v8_trace.json", "v8_trace_nonpersistent.json"])
def test_recorded_trace_reads_back_in_order(name):
    """The stamps recorded on the H200 (python -m flashattn.book.trace) give a timeline whose segments all end
    after they start, per consumer in tile order, with the figure drawn from them."""
    doc = trace.load(trace.RECORD.parent / name)
    assert doc is not None, f"results/h200/{name} missing"
    assert [(r["shape"]["D"], r["shape"]["causal"]) for r in doc["rows"]] == [(128, False), (64, False),
                                                                             (128, True), (64, True)]
    for run in doc["rows"]:
        segs = trace.timeline(run)
        assert {"producer", "consumer 0", "consumer 1"} <= {s[0] for s in segs}
        assert all(0 <= a <= b for _, _, _, a, b in segs)
        for row in ("consumer 0", "consumer 1"):
            s_issue = [a for r, kind, _, a, _ in segs if r == row and kind == "S = Q K^T"]
            assert s_issue == sorted(s_issue) and len(s_issue) >= 2
        raw = [it["stamps"] for it in run["items"]]
        assert trace.clock_ghz(raw) == pytest.approx(run["clock_ghz"], rel=0.15)
        mine = trace.summarize(raw, run["clock_ghz"])["tile period"]
        assert mine == pytest.approx(run["summary"]["tile period"], rel=0.25)
        fig = trace.fig_timeline(run, show=False)
        assert len(fig.axes[0].patches) > 10
        plt.close(fig)
