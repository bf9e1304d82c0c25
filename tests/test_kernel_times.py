"""flashattn.book.kernel_times and v0_memory: the per-kernel times of the unfused versions and V0's memory metrics."""
from __future__ import annotations

import csv

import pytest
import torch

from flashattn.book import kernel_times as kt
from flashattn.book import v0_memory
from flashattn.measure import kernel_trace, results

FLUSH = "vectorized_elementwise_kernel<FillFunctor<unsigned char>>"


def test_calls_are_split_at_the_flush_and_kernels_before_the_first_flush_dropped():
    trace = [("warm_kernel", 0, 1.0), (FLUSH, 1, 5.0), ("a", 2, 2.0), ("b", 3, 3.0), (FLUSH, 4, 5.0),
             ("a", 5, 4.0), ("b", 6, 1.0), (FLUSH, 7, 5.0)]
    calls = kernel_trace.split_calls(trace, {FLUSH})
    assert calls == [[("a", 2.0), ("b", 3.0)], [("a", 4.0), ("b", 1.0)]]
    rows = kernel_trace.summarize_calls(calls + [[("a", 9.0), ("b", 2.0)]])
    assert [(r["name"], r["median_us"], r["min_us"], r["max_us"]) for r in rows] == [("a", 4.0, 2.0, 9.0),
                                                                                     ("b", 2.0, 1.0, 3.0)]
    # a call's span runs from its first kernel's start to its last kernel's end, gaps included
    spans = [kernel_trace.span_us(c) for c in kernel_trace.calls_between(trace, {FLUSH})]
    assert spans == [4.0, 4.0]          # the second: a (5 to 9) outlasts b (6 to 7)


def test_calls_with_different_kernels_are_refused():
    with pytest.raises(RuntimeError, match="different kernels"):
        kernel_trace.summarize_calls([[("a", 1.0), ("b", 1.0)], [("a", 1.0), ("c", 1.0)]])
    with pytest.raises(RuntimeError, match="no kernel"):
        kernel_trace.summarize_calls([])


def test_roles_of_the_baseline_and_v0():
    baseline = ["sm90_xmma_gemm_f32f32_f32f32_f32_tn_n", "vectorized_elementwise_kernel<4, DivFunctor<float>>",
                "cunn_SoftMaxForward<4, float>", "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n"]
    assert kt.label_roles("baseline", baseline) == ["QK^T", "scale", "softmax", "PV"]
    v0 = ["scores_kernel(const float*, ...)", "softmax_kernel(float*, ...)", "pv_kernel(const float*, ...)"]
    assert kt.label_roles("v0", v0) == ["scores", "softmax", "PV"]
    assert kt.role("v0", "something_else") == "other"


def test_traffic_model():
    B, H, M, N, D = 2, 3, 5, 7, 11
    s, io = 4 * B * H * M * N, 4 * B * H * (M + N) * D
    assert kt.traffic("QK^T", B, H, M, N, D) == kt.traffic("scores", B, H, M, N, D) == (io + s, 2 * B * H * M * N * D)
    assert kt.traffic("softmax", B, H, M, N, D) == (2 * s, None)
    assert kt.traffic("scale", B, H, M, N, D) == (2 * s, B * H * M * N)
    assert kt.traffic("other", B, H, M, N, D) == (None, None)


def test_expected_sectors_follow_the_thread_mapping():
    # scores: the 16 x-lanes read 16 key rows D floats apart (16 sectors), the 2 y-rows two query rows
    assert v0_memory.expected_sectors("scores_kernel", D=64) == {"load": 9.0, "store": 4}
    assert v0_memory.expected_sectors("scores_kernel", D=1)["load"] == 1.5      # rows 4 bytes apart: coalesced
    assert v0_memory.expected_sectors("pv_kernel", D=64) == {"load": 2.0, "store": 4}
    assert v0_memory.expected_sectors("softmax_kernel") == {"load": 4.0, "store": 4}
    with pytest.raises(ValueError, match="kernel"):
        v0_memory.expected_sectors("gemm")


def _write_ncu_csv(path, rows):
    header = ["ID", "Kernel Name", *v0_memory.NCU_METRICS, v0_memory.PACE_METRICS["L1 throughput"]]
    with open(path, "w", newline="") as fh:
        fh.write("==PROF== Disconnected\n")
        w = csv.writer(fh, quoting=csv.QUOTE_ALL)
        w.writerow(header)
        w.writerow(["", "", "sector", "request", "sector", "request", "%", "byte", "byte", "byte", "ns", "%"])
        for i, (name, values) in enumerate(rows):
            w.writerow([str(i), name, *values])


def test_ncu_rows_parse_the_raw_page(tmp_path):
    path = tmp_path / v0_memory.NCU_FILE
    _write_ncu_csv(path, [("scores_kernel(const float*)", [900, 100, 40, 10, 95.5, 2e9, 1e8, 8e8, 1e7, 61.5]),
                          ("pv_kernel(const float*)", [200, 100, 40, 10, 50, 1e9, 8e8, 1e6, 2e7, 20.0])])
    rows = v0_memory.ncu_rows(path)
    assert [r["kernel"] for r in rows] == ["scores_kernel", "pv_kernel"]
    assert rows[0]["load_sectors_per_request"] == 9.0 and rows[1]["load_sectors_per_request"] == 2.0
    assert rows[0]["store_sectors_per_request"] == 4.0 and rows[1]["dram_read"] == 8e8
    assert rows[0]["l1_load_bytes"] == 900 * 32
    assert rows[0]["pace"] == {"L1 throughput": 61.5}              # the pace counters the file has
    assert rows[0]["time_s"] == pytest.approx(0.01) and rows[1]["time_s"] == pytest.approx(0.02)   # ns -> s
    assert v0_memory.ncu_rows(tmp_path / "absent.csv") == []


def test_table_lines_shares_add_up():
    run = {"kernel_sum_us": 400.0, "kernels": [
        dict(name="scores_kernel(float)", role="scores", median_us=300.0, bytes=3e9, flops=3e9),
        dict(name="softmax_kernel(float)", role="softmax", median_us=100.0, bytes=1e9, flops=None)]}
    lines = kt.table_lines(run, dram=4e12, fp32=50e12)
    assert len(lines) == 4
    assert "| 75% |" in lines[2] and "| 25% |" in lines[3]
    assert "10,000" in lines[2] and "250%" in lines[2]      # 3e9 B in 300 us = 10 TB/s = 250% of 4 TB/s
    assert "10.00 | 20% |" in lines[2]                      # 3e9 FLOP in 300 us = 10 TFLOP/s
    assert lines[3].endswith("| — | — |")


def test_a_step_split_over_launches_is_one_row_with_the_whole_model():
    run = dict(B=4, H=12, M=4096, N=4096, D=64, kernel_sum_us=40.0, kernels=[
        dict(name="gemm_tn", role="QK^T", median_us=10.0), dict(name="elementwise<Div>", role="scale", median_us=5.0),
        dict(name="elementwise<Div>", role="scale", median_us=6.0), dict(name="softmax", role="softmax", median_us=9.0),
        dict(name="gemm_nn", role="PV", median_us=10.0)])
    kt.add_model(run)
    full, _ = kt.traffic("scale", 4, 12, 4096, 4096, 64)
    assert [k["bytes"] for k in run["kernels"][1:3]] == [full / 2, full / 2]
    merged = kt.steps_of(run)
    assert [(k["role"], k["launches"], k["median_us"]) for k in merged] == [
        ("QK^T", 1, 10.0), ("scale", 2, 11.0), ("softmax", 1, 9.0), ("PV", 1, 10.0)]
    assert merged[1]["bytes"] == full
    assert "(× 2)" in kt.table_lines(run, dram=4e12, fp32=50e12)[3]


def test_cli_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kt.main(["--out", "/nonexistent"]) == 2


@pytest.mark.gpu
def test_profile_call_finds_each_kernel_of_each_call():
    a = torch.randn(1 << 20, device="cuda")
    b = torch.randn(1 << 20, device="cuda")
    rows = kernel_trace.profile_call(lambda: (torch.mul(a, b), torch.exp(a)), calls=5)
    assert len(rows) == 2
    assert rows[0]["name"] != rows[1]["name"]
    assert all(0 < r["min_us"] <= r["median_us"] <= r["max_us"] for r in rows)


@pytest.mark.gpu
@pytest.mark.parametrize("version,roles", [("v0", ["scores", "softmax", "PV"]), ("baseline", None)])
@pytest.mark.parametrize("L", [17, 203])
def test_measure_names_every_kernel(version, roles, L):
    run = kt.measure(version, L, calls=3, B=2, H=3, D=40)
    got = [k["role"] for k in run["kernels"]]
    if roles is not None:
        assert got == roles
    else:                                   # cuBLAS may split a product, but the order is fixed
        assert got[0] == "QK^T" and got[-1] == "PV" and "softmax" in got
    assert all(k["median_us"] > 0 for k in run["kernels"])
    assert run["kernel_sum_us"] == pytest.approx(sum(k["median_us"] for k in run["kernels"]))
    # the kernels are part of the call: their sum cannot be far above the call timed end to end
    assert run["kernel_sum_us"] <= 1.5 * run["end_to_end"]["median_us"] + 20


@pytest.mark.gpu
def test_cli_writes_a_record_the_readers_take(tmp_path):
    assert kt.main(["--out", str(tmp_path), "--versions", "v0", "--seq-lens", "64", "--calls", "3"]) == 0
    doc = results.read(tmp_path / "kernel_times.json", kt.KIND)
    assert doc["meta"]["command"].startswith("python -m flashattn.book.kernel_times")
    run = kt.recorded_run("v0", 64, tmp_path / "kernel_times.json")
    assert [k["role"] for k in run["kernels"]] == ["scores", "softmax", "PV"]
    assert len(kt.table_lines(run, dram=4e12, fp32=50e12)) == 5


def test_short_names():
    assert kt.short_name("void (anonymous namespace)::softmax_warp_forward<float, float, 11>(float*, int)") == \
        "softmax_warp_forward"
    assert kt.short_name("scores_kernel(float const*, float const*, float*, int, int, float)") == "scores_kernel"
    long = kt.short_name("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma")
    assert len(long) == 32 and long.endswith("…")


def test_recorded_table_agrees_with_its_record():
    """The committed record (when there is one) gives a table whose shares add up and whose rows are the
    record's kernels in launch order."""
    run = kt.recorded_run("v0", 2048)
    assert run is not None, "results/h200/kernel_times.json is committed and has V0 at M=N=2048"
    lines = kt.table_lines(run, dram=4e12, fp32=50e12)[2:]
    assert [line.split("`")[1] for line in lines] == ["scores_kernel", "softmax_kernel", "pv_kernel"]
    shares = [int(line.split("|")[4].strip().rstrip("%")) for line in lines]
    assert 98 <= sum(shares) <= 102
