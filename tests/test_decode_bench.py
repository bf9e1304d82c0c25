"""The Decoding chapter's benchmark without a GPU: the rows one shape's timings become, the README table."""
from types import SimpleNamespace

from flashattn.measure import decode_bench
from flashattn.measure.timing import Timing


def test_at_shape_rows(monkeypatch, capsys):
    """Each column's row carries the shape, the bytes every valid key costs, the floor at 4.8 TB/s, the
    achieved TB/s, per-column fields, and an exception as an "unsupported" row with its message."""
    timings = {"ours": Timing(times_ms=[0.5, 0.4, 0.6], host_ms=[0.05] * 3), "fa4": ValueError("fa4: no split-KV")}
    monkeypatch.setattr(decode_bench, "timed", lambda calls, args: {c: timings[c] for c in calls})
    dims = (2, 8, 2, 1, 1000, 128)
    rows = decode_bench.at_shape("peers", "small", dims, {"ours": None, "fa4": None}, SimpleNamespace(),
                                 num_splits=lambda column: {"ours": 3, "fa4": 0}[column])
    ours, fa4 = rows
    expect = 2 * 128 * (2 * 2 * 2 * 1000 + 2 * 2 * 1 * 8)
    assert ours["bytes"] == fa4["bytes"] == expect and ours["dims"] == list(dims)
    assert ours["median_us"] == 500.0 and abs(ours["tb_per_s"] - expect / 500e-6 / 1e12) < 1e-12
    assert abs(ours["floor_us"] - expect / 4.8e12 * 1e6) < 1e-9 and ours["num_splits"] == 3
    assert fa4["status"] == "unsupported" and fa4["message"] == "fa4: no split-KV" and "median_us" not in fa4
    assert "unsupported: fa4: no split-KV" in capsys.readouterr().out


def test_readme_table_marks_missing_columns():
    rows = [dict(part="peers", shape="s", column=c, status="ok", median_us=us, floor_us=100.0,
                 dims=[1, 32, 8, 1, 4096, 128]) for c, us in (("ours", 125.0), ("cudnn", 200.0))]
    rows.append(dict(part="peers", shape="s", column="fa4", status="unsupported", floor_us=100.0,
                     dims=[1, 32, 8, 1, 4096, 128]))
    table = decode_bench.peers_markdown({"rows": rows})
    assert "| 1, 32/8, 1, 4,096, 128 | 100.0 | 125.0 (80%) | – | 200.0 (50%) | – |" in table
