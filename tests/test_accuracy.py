"""The V6 chapter's accuracy cell (flashattn.book.accuracy_cell) read from its record without a GPU, and the
recording itself (flashattn.measure.accuracy) on one."""
from __future__ import annotations

import pytest

from flashattn.book import accuracy_cell
from flashattn.measure import accuracy, results


def text(out) -> str:
    return getattr(out, "data", out)


def test_the_cell_shows_every_recorded_case(monkeypatch):
    monkeypatch.setattr(accuracy_cell, "gpu", lambda: False)
    doc = results.read(accuracy_cell.RESULTS / "v6_accuracy.json", "accuracy")
    table = text(accuracy_cell.accuracy_table("v6"))
    body = [line for line in table.splitlines() if line.startswith("| ") and "dtype" not in line]
    assert len(body) == len(doc["rows"]) == len(accuracy.ACCURACY_CASES)
    r = doc["rows"][0]
    ratio = r["rel_error"] / r["sdpa_rel_error"]
    assert f"| {r['rel_error']:.1e} | {r['sdpa_rel_error']:.1e} | {ratio:.2f} |" in body[0]
    assert f"Recorded on {accuracy_cell.device_name(doc['meta'])}" in table


def test_a_missing_record_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(accuracy_cell, "gpu", lambda: False)
    monkeypatch.setattr(accuracy_cell, "RESULTS", tmp_path)
    assert "No recorded accuracy yet" in text(accuracy_cell.accuracy_table("v6"))


def test_device_name_of_either_meta():
    assert accuracy_cell.device_name({"device": {"name": "NVIDIA H200"}}) == "NVIDIA H200"
    assert accuracy_cell.device_name({"device": "NVIDIA H200"}) == "NVIDIA H200"
    assert accuracy_cell.device_name({}) == "the H200"


@pytest.mark.gpu
def test_recorded_rows_keep_ours_near_sdpa(tmp_path):
    assert accuracy.main(["v6", "--out", str(tmp_path)]) == 0
    doc = results.read(tmp_path / "v6_accuracy.json", "accuracy")
    assert doc["meta"]["version"] == "v6" and len(doc["rows"]) == len(accuracy.ACCURACY_CASES)
    for r in doc["rows"]:   # 16-bit inputs: within a few times SDPA's error (float32 runs V6's TF32 mode)
        assert r["dtype"] == "float32" or r["rel_error"] <= 4 * r["sdpa_rel_error"], r
