"""flashattn.measure.host_cost: refuses without a GPU; on one, times and profiles every path; reads its records."""
from __future__ import annotations

import pytest
import torch

from flashattn.measure import host_cost


def test_refuses_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert host_cost.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [False, True])
def test_times_every_path(dense):
    from test_v7 import is_hopper
    if not is_hopper():
        pytest.skip("the v8 paths need a GPU of compute capability 9.0")
    q, k, v = host_cost.model_inputs(2, 2, 64, 64, dense=dense)
    assert all(t.is_contiguous() for t in (q, k, v)) == dense
    out = host_cost.measure(2, 2, 64, 64, repetitions=6, rounds=2, host_slack_us=500.0, profile=True, dense=dense)
    assert [r["path"] for r in out["rows"]] == list(host_cost.PATHS)
    assert all(r["host_us"] > 0 and r["gpu_us"] > 0 and r["calls"] == 6 for r in out["rows"])
    assert set(out["profiles"]) == set(host_cost.PATHS)
    assert "autograd.py" in out["profiles"]["v6"]          # cProfile saw our Python


def test_table_reads_both_records(tmp_path):
    text = host_cost.table()
    assert all(f"| {p} |" in text for p in host_cost.PATHS)
    assert "dense inputs" in text and "commit" in text
    assert host_cost.table(views=tmp_path / "none.json").startswith("*Not recorded yet")
