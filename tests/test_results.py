"""flashattn.measure.results: the one format of every record under results/, its writer and reader, and the
migration that converted the older shapes (scripts/migrate_results.py) without losing a number."""
from __future__ import annotations

import importlib.util
import json

import pytest

from flashattn.loader import REPO_ROOT
from flashattn.measure import results

RECORDS = results.records()
spec = importlib.util.spec_from_file_location("migrate_results", REPO_ROOT / "scripts" / "migrate_results.py")
migrate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(migrate)


def test_write_then_read_gives_the_same_document(tmp_path):
    path = tmp_path / "sub" / "bench.json"
    rows = [{"version": "v4", "median_us": 1234.5, "rel_error": None, "causal": False}]
    doc = results.write(path, "bench", rows, meta={"device": {"name": "X"}}, settings={"warmup": 3})
    assert doc == results.read(path, "bench") == results.read(path)
    assert doc["schema"] == "flashattn.bench/2" and list(doc) == list(results.KEYS)
    assert results.runs(doc) == [{"meta": {"device": {"name": "X"}}, "settings": {"warmup": 3}, "rows": rows}]
    assert not list(tmp_path.rglob("*.tmp"))


def test_meta_defaults_to_the_environment_of_the_run(tmp_path):
    doc = results.write(tmp_path / "r.json", "kernel_times", [])
    assert doc["meta"]["torch"] and doc["meta"]["command"].startswith("python") and "git" in doc["meta"]


def test_reader_refuses_another_kind_an_old_shape_and_an_unknown_kind(tmp_path):
    path = tmp_path / "r.json"
    results.write(path, "sweep", [], meta={})
    with pytest.raises(results.RecordError, match="is a sweep record, not bench"):
        results.read(path, "bench")
    path.write_text(json.dumps({"schema": 1, "runs": [{"meta": {}, "settings": {}, "rows": []}]}))
    with pytest.raises(results.RecordError, match="old shape"):
        results.read(path)
    path.write_text(json.dumps({"schema": "flashattn.sweep/1", "meta": {}, "settings": {}, "rows": []}))
    with pytest.raises(results.RecordError, match="flashattn.<kind>/2"):
        results.read(path)
    with pytest.raises(ValueError, match="unknown kind"):
        results.write(path, "no_such_kind", [])
    assert results.read_if_exists(tmp_path / "absent.json") is None


def test_appended_runs_tag_their_rows_and_split_back(tmp_path):
    path = tmp_path / "repeat.json"
    results.append(path, "bench", [{"version": "v6", "median_us": 1.0}], meta={"time_utc": "a"}, settings={"x": 1})
    assert "runs" not in results.read(path)["meta"]               # one run: the plain form
    results.append(path, "bench", [{"version": "v6", "median_us": 2.0}, {"version": "sdpa", "median_us": 3.0}],
                   meta={"time_utc": "b"}, settings={"x": 2})
    doc = results.read(path, "bench")
    assert [r["run"] for r in doc["rows"]] == [0, 1, 1]
    assert doc["meta"] == {"runs": [{"time_utc": "a"}, {"time_utc": "b"}]}
    runs = results.runs(doc)
    assert [(r["meta"]["time_utc"], r["settings"]["x"], [x["median_us"] for x in r["rows"]]) for r in runs] == \
        [("a", 1, [1.0]), ("b", 2, [2.0, 3.0])]
    assert all("run" not in x for r in runs for x in r["rows"])


@pytest.mark.parametrize("path", RECORDS, ids=[str(p.relative_to(REPO_ROOT)) for p in RECORDS])
def test_every_committed_record_reads_in_the_one_format(path):
    doc = results.read(path)
    assert doc["rows"], f"{path} has no rows"


def test_no_committed_record_is_left_in_an_old_shape():
    assert RECORDS and migrate.main(["--check"]) == 0


def test_migration_keeps_every_number_and_refuses_a_lost_one(tmp_path):
    old = {"schema": 1, "runs": [
        {"meta": {"git": {"commit": "abc"}, "time_utc": "t0"}, "settings": {"impl": ["v4"], "warmup": 5},
         "rows": [{"impl": "v4", "ran_as": "v4", "median_us": 10.5, "calls_timed": 100, "rel_error": None}]},
        {"meta": {"git": {"commit": "abc"}, "time_utc": "t1"}, "settings": {"impl": ["v4"], "warmup": 5},
         "rows": [{"impl": "v4", "ran_as": "v4", "median_us": 11.5, "calls_timed": 100, "rel_error": None}]}]}
    path = tmp_path / "bench_x.json"
    path.write_text(json.dumps(old))
    new = migrate.convert(path, old)
    migrate.verify(old, new)
    assert new["schema"] == "flashattn.bench/2" and [r["run"] for r in new["rows"]] == [0, 1]
    assert [r["version"] for r in new["rows"]] == ["v4", "v4"] and new["settings"]["runs"][1]["versions"] == ["v4"]
    assert migrate.main(["--root", str(tmp_path)]) == 0
    assert results.read(path, "bench") == new and migrate.main(["--check", "--root", str(tmp_path)]) == 0
    lost = json.loads(json.dumps(new))
    lost["rows"][1]["median_us"] = 11.25
    with pytest.raises(ValueError, match="numbers differ"):
        migrate.verify(old, lost)
    dropped = json.loads(json.dumps(new))
    dropped["meta"]["runs"][0].pop("time_utc")
    with pytest.raises(ValueError, match="strings lost"):
        migrate.verify(old, dropped)


def test_sweep_and_trace_shapes_move_their_extras_to_meta(tmp_path):
    sweep = {"schema": "flashattn.sweep/1", "version": "v7", "dtype": "bfloat16", "meta": {"torch": "2"},
             "settings": {"timing": "t"}, "variants": [{"name": "a", "D": 64}],
             "references": [{"name": "sdpa", "D": 64, "timing": {"median_us": 5.0}}], "total_seconds": 4.3}
    new = migrate.convert(tmp_path / "v7_sweep.json", sweep)
    migrate.verify(sweep, new)
    assert new["rows"] == sweep["variants"] and new["meta"]["references"] == sweep["references"]
    trace = {"schema": "flashattn.trace/1", "flags": [], "environment": {"torch": "2"}, "runs": [{"clock_ghz": 1.9}]}
    new = migrate.convert(tmp_path / "v8_trace.json", trace)
    migrate.verify(trace, new)
    assert new["meta"] == {"torch": "2", "flags": []} and new["rows"] == trace["runs"]
