"""python -m flashattn.measure.sweep: variants as -D macros of one kernel file, one JSON format for every version."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashattn.measure import geometry, profile, results, sweep
from flashattn.measure.resources import SM90
from flashattn.measure.variants import SETS, SWEEPS

ROOT = Path(__file__).resolve().parent.parent


def test_unknown_variant_and_missing_gpu_are_refused(monkeypatch):
    with pytest.raises(SystemExit, match="unknown variant"):
        sweep.main(["v5", "--only", "no_such_variant"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        sweep.main(["v5"])


@pytest.mark.parametrize("version", ["v5", "v6"])
def test_printed_table_of_a_recorded_sweep(version):
    doc = results.read(ROOT / "results" / "h200" / f"{version}_sweep.json", "sweep")
    printed = sweep.format_table(doc)
    for r in doc["rows"]:
        assert r["name"] in printed
    assert printed.count("\n") == len(doc["rows"]) + len(doc["meta"]["references"])


@pytest.mark.gpu
def test_one_variant_end_to_end(tmp_path):
    name = next(iter(SETS["v5"]))
    assert sweep.main(["v5", "--only", name, "--out", str(tmp_path), "--warmup", "1", "--repetitions", "3",
                       "--rounds", "1"]) == 0
    doc = results.read(tmp_path / "v5_sweep.json", "sweep")
    assert [r["name"] for r in doc["rows"]] == [name]
    r = doc["rows"][0]
    assert r["correct"] is True and r["max_rel_error"] <= r["error_bound"]
    assert (r["runtime"]["threads"], r["runtime"]["smem_bytes"]) == (r["geometry"]["threads"], r["geometry"]["smem"])
    assert r["timing"]["median_us"] > 0 and r["vs"]["sdpa"] > 0


def test_v7_variants_fit_one_sm_and_name_their_geometry():
    """Every v7 step the sweep times must launch: its shared memory (flashattn.measure.geometry's copy of the
    kernel's Layout) within the H200's per-block limit, threads a whole number of warpgroups."""
    for name, variant in SETS["v7"].items():
        geo = geometry.variant_geometry(variant)
        assert geo["D"] == variant.D and geo["threads"] == 128 * geo["warpgroups"] == 2 * geo["B_r"], name
        assert geo["smem"] <= SM90["smem_per_block_max"], name
    defaults = [v for n, v in SETS["v7"].items() if "(default)" in n]
    assert sorted(v.D for v in defaults) == [64, 128] and all(not v.macros for v in defaults)


def test_v8_variants_fit_one_sm():
    """Every v8 variant launches: shared memory within the H200's per-block limit, threads = 128 x (consumer
    warpgroups + the producer when specialised). (That they are tests/test_v8.py's builds and change one thing
    per step: tests/test_variants.py.)"""
    for name, variant in SETS["v8"].items():
        geo = geometry.variant_geometry(variant)
        assert geo["threads"] == 128 * (geo["warpgroups"] + geo["producer"]), name
        assert geo["B_r"] == 64 * geo["warpgroups"] and geo["D"] == variant.D, name
        assert geo["smem"] <= SM90["smem_per_block_max"], name


def test_step_sets_name_their_file_kernel_and_fit_one_sm():
    assert sweep.output_name("v6-steps") == "v6_steps.json" and sweep.output_name("v6") == "v6_sweep.json"
    assert set(SWEEPS) <= set(SETS) and sweep.build_parser().parse_args(["v6-steps"]).version == "v6-steps"
    for name, variant in SETS["v6-steps"].items():
        assert variant.change, name
        geo = geometry.variant_geometry(variant)
        assert geo["D"] == variant.D and geo["smem"] <= SM90["smem_per_block_max"], name
    # the first step carries P through shared memory: B_r x B_c more bytes than the second
    first, second = (geometry.variant_geometry(SETS["v6-steps"][f"d64 {n}"])["smem"]
                     for n in ("P via shared memory", "P in registers"))
    assert first - second == 2 * 128 * 64


def test_recorded_step_counters_are_ncus_own_numbers():
    """results/h200/v6_steps.json's counters per step are the values of the raw page ncu printed for that
    step's profiled launch (v6_steps_ncu.raw.csv, launches in step order, each step's second one)."""
    from flashattn.measure import ncu, ncu_pages
    doc = results.read(ROOT / "results" / "h200" / "v6_steps.json", "sweep")
    raw = ROOT / "results" / "h200" / "v6_steps_ncu.raw.csv"
    profiled = [r for r in doc["rows"] if "counters" in (r.get("metrics") or {})]
    assert profiled and raw.exists(), "v6_steps.json and its raw ncu page are committed with the counters"
    rows = ncu_pages.read_raw_rows(raw)
    assert len(rows) == 2 * len(profiled)
    for i, r in enumerate(profiled):
        counters, stalls = ncu_pages.raw_values(rows[2 * i + 1], ncu.STEP_METRICS)
        assert counters == pytest.approx(r["metrics"]["counters"]) and stalls == pytest.approx(r["metrics"]["stalls"])


def test_metrics_land_on_their_variants(monkeypatch, tmp_path):
    """--metrics (flashattn.measure.profile.attach_metrics): the correct rows only, each with the counters of its
    own last launch (ncu profiles warm-up + 1 launches per variant, in order); without ncu each says why."""
    doc = results.document("sweep", [dict(name=f"d64 {i}", D=64, correct=i != 1) for i in range(3)],
                           {"dtype": "bfloat16"})
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    profile.attach_metrics(doc, "v6-steps", tmp_path, sweep.METRICS_SHAPE)
    assert [("metrics" in r, r.get("metrics", {}).get("error")) for r in doc["rows"]] == \
        [(True, profile.MISSING_NCU), (False, None), (True, profile.MISSING_NCU)]

    asked = {}

    def collect(ncu, target, kernel_regex, count, out_base):
        asked.update(target=target, count=count)
        return {"launches": [{"counters": {"launch": i}, "stalls": {}} for i in range(count)]}
    monkeypatch.setattr(profile, "find_ncu", lambda: "ncu")
    monkeypatch.setattr(profile, "collect_metrics", collect)
    profile.attach_metrics(doc, "v6-steps", tmp_path, sweep.METRICS_SHAPE, warmup=2)
    assert asked["target"][-3:] == ["--target", "d64 0", "d64 2"] and asked["count"] == 6
    first, third = doc["rows"][0]["metrics"], doc["rows"][2]["metrics"]
    assert first["counters"] == {"launch": 2} and third["counters"] == {"launch": 5}
    assert first["shape"] == [*sweep.METRICS_SHAPE, 64] and first["dtype"] == "bfloat16"


@pytest.mark.gpu
def test_metrics_target_runs_its_variants():
    """The program ncu runs for --metrics: each named variant's build, warm-up and one more launch, finite."""
    assert sweep.target("v6-steps", ["d64 ldmatrix", "d128 1 barrier (default)"], warmup=0) == 0
