"""flashattn.measure.ring_bench's parts that need no GPU: arguments, the plan per rank, the slowest rank per
call, the overlap of NCCL and compute kernels in a trace, and the record it appends then completes."""
from __future__ import annotations

import json

import pytest

from flashattn.measure import results, ring_bench


@pytest.fixture
def ring_kind(monkeypatch):
    """The record kind "ring" (for a test that writes one, whether or not results.KINDS lists it yet)."""
    if "ring" not in results.KINDS:
        monkeypatch.setattr(results, "KINDS", results.KINDS + ("ring",))


def test_defaults_are_the_issue_s_shape():
    args = ring_bench.parse_args(["--out", "r.json"])
    assert args.shape == [1, 32, 131072, 128] and args.causal and args.dtype == "bf16" and args.version == "v8"
    assert args.long_length == 2**21 and args.long_head_chunk == 8 and args.parts == "time,trace,long"
    assert not ring_bench.parse_args(["--out", "r.json", "--no-causal"]).causal
    with pytest.raises(SystemExit):
        ring_bench.parse_args(["--out", "r.json", "--parts", "time,speed"])
    with pytest.raises(SystemExit):
        ring_bench.parse_args(["--out", "r.json", "--version", "v5"])     # no backward


def test_plan_per_rank_and_its_errors():
    args = ring_bench.parse_args(["--out", "r.json"])
    p = ring_bench.plan(args, 2)
    assert p["per_rank"] == [1, 32, 65536, 128] and p["long_per_rank"] == [1, 32, 2**20, 128]
    assert p["mode"] == "ring" and p["layout"] == "zigzag"
    assert ring_bench.plan(args, 1)["mode"] == "one_gpu"
    with pytest.raises(ValueError, match="--shape's L = 131072 does not shard over 3 ranks: .* divisible by 6"):
        ring_bench.plan(args, 3)
    bad = ring_bench.parse_args(["--out", "r.json", "--long-length", "1000002"])
    with pytest.raises(ValueError, match="--long-length = 1000002 .* divisible by 4"):
        ring_bench.plan(bad, 2)
    with pytest.raises(ValueError, match="--long-head-chunk = 33 must be in"):
        ring_bench.plan(ring_bench.parse_args(["--out", "r.json", "--long-head-chunk", "33"]), 2)


def test_a_step_lasts_as_long_as_its_slowest_rank():
    assert ring_bench.slowest_per_call([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_overlap_of_nccl_and_compute_kernels():
    doc = {"traceEvents": [
        {"cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "ts": 0, "dur": 10},
        {"cat": "kernel", "name": "v8_forward_kernel", "ts": 5, "dur": 15},
        {"cat": "kernel", "name": "v8_forward_kernel", "ts": 18, "dur": 4},
        {"cat": "kernel", "name": "ncclKernel_SendRecv_RING", "ts": 21, "dur": 9},
        {"cat": "cpu_op", "name": "aten::empty", "ts": 0, "dur": 100},
        {"ph": "M", "name": "process_name"},
    ]}
    kernels = ring_bench.trace_kernels(doc)
    assert [k[0][:4] for k in kernels] == ["nccl", "v8_f", "v8_f", "nccl"]
    got = ring_bench.overlap(kernels)
    # NCCL [0, 10] and [21, 30]; compute [5, 22]: hidden 5 + 1
    assert got == dict(comm_us=19.0, compute_us=17.0, hidden_us=6.0, exposed_us=13.0, kernels=4)


def test_record_is_appended_then_completed(tmp_path, ring_kind):
    path = tmp_path / "h200x2" / "ring.json"
    ring_bench.save(path, [{"part": "plan", "world": 1}], {"x": 1}, first=True)
    ring_bench.save(path, [{"part": "plan", "world": 2}], {"x": 2}, first=True)
    ring_bench.save(path, [{"part": "plan", "world": 2}, {"part": "long", "status": "ok"}], {"x": 2}, first=False)
    runs = results.runs(results.read(path, "ring"))
    assert [len(r["rows"]) for r in runs] == [1, 2] and runs[1]["rows"][1]["status"] == "ok"
    assert [r["settings"]["x"] for r in runs] == [1, 2]


def test_dry_run_prints_the_plan_without_a_gpu(monkeypatch, capsys, ring_kind):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ring_bench.main(["--out", "r.json", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["per_rank"] == [1, 32, 65536, 128]
