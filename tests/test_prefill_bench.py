"""flashattn.measure.prefill_bench without a GPU: its shapes, FLOPs, refusals and rows."""
from __future__ import annotations

import pytest
import torch

from flashattn.measure import prefill_bench as pb
from flashattn.measure.timing import Timing


def test_shapes_cover_the_fa4_table_and_grouped_heads():
    assert (1, 32, 8, 8192, 128, True) in pb.FORWARD_SHAPES            # Llama-3-8B's prefill
    assert all(s[1] % s[2] == 0 for s in pb.FORWARD_SHAPES)
    assert pb.BACKWARD_SHAPES and all(s[1] != s[2] for s in pb.BACKWARD_SHAPES)


def test_a_column_that_cannot_run_is_a_refusal_timed_as_its_reason():
    def refuses(*_):
        raise ValueError("fa4: does not import here\nmore")
    call, ctx = pb.column(refuses, 1)
    with pytest.raises(ValueError, match="^fa4: does not import here$"):
        call()
    with ctx():
        pass
    fn = lambda: None  # noqa: E731
    assert pb.column(lambda: (fn, "ctx", "v8")) == (fn, "ctx")
    assert pb.column(lambda: fn)[0] is fn


def test_rows_of_records_times_and_reasons(capsys):
    t = Timing(times_ms=[0.1, 0.2, 0.3])
    rows = pb.rows_of("forward", (1, 32, 8, 1024, 128, True), {"v8": t, "fa4": ValueError("no")})
    ok, refused = rows
    assert ok["status"] == "ok" and ok["median_us"] == pytest.approx(200.0)
    assert ok["tflops"] == pytest.approx(4 * 32 * 1024 * 1024 * 128 / 2 / 200e-6 / 1e12)
    back = pb.rows_of("backward", (1, 32, 8, 1024, 128, True), {"v8": t})[0]
    assert back["tflops"] == pytest.approx(2.5 * ok["tflops"])
    assert refused == dict(part="forward", column="fa4", B=1, H_q=32, H_kv=8, N=1024, D=128, causal=True,
                           status="unsupported", message="no")
    assert "1,32/8,1024,128 causal v8" in capsys.readouterr().out


def test_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        pb.main(["--out", "/nonexistent"])


def test_wide_part_is_v8s_new_head_dims_in_its_own_record(monkeypatch):
    """The wide shapes are the head dims only v8 takes, the Gemma-like grouped layer among them; those that train
    (96) are timed backward too; asked for with another part, the run refuses before it times anything (each
    part's record has its own file)."""
    assert {s[4] for s in pb.WIDE_SHAPES} == {96, 192, 256} and (1, 16, 8, 8192, 256, True) in pb.WIDE_SHAPES
    assert pb.WIDE_BACKWARD_SHAPES and {s[4] for s in pb.WIDE_BACKWARD_SHAPES} == {96}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit, match="run it alone"):
        pb.main(["--parts", "forward,wide", "--out", "/nonexistent"])
