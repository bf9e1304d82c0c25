"""python -m flashattn.measure.sweep: variants as -D macros of one kernel file, one JSON format for every version."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flashattn.measure import sweep
from flashattn.versions import INFO

ROOT = Path(__file__).resolve().parent.parent


def test_every_variant_names_macros_its_kernel_file_defines():
    for key, variants in sweep.VARIANTS.items():
        version = sweep.kernel_version(key)     # "v6-steps" builds kernels/v6.cu
        assert INFO[version].kernel
        text = (ROOT / "kernels" / f"{version}.cu").read_text()
        for name, variant in variants.items():
            for macro in variant.macros:
                assert f"#ifndef {macro}" in text or f"defined({macro})" in text, (version, name, macro)
            assert sweep.flags(variant) == [f"-D{k}={v}" for k, v in variant.macros.items()]


def test_unknown_variant_and_missing_gpu_are_refused(monkeypatch):
    with pytest.raises(SystemExit, match="unknown variant"):
        sweep.main(["v5", "--only", "no_such_variant"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        sweep.main(["v5"])


@pytest.mark.parametrize("version", ["v5", "v6"])
def test_printed_table_of_a_recorded_sweep(version):
    doc = json.loads((ROOT / "results" / "h200" / f"{version}_sweep.json").read_text())
    printed = sweep.format_table(doc)
    for r in doc["variants"]:
        assert r["name"] in printed
    assert printed.count("\n") == len(doc["variants"]) + len(doc["references"])


@pytest.mark.gpu
def test_one_variant_end_to_end(tmp_path):
    name = next(iter(sweep.VARIANTS["v5"]))
    assert sweep.main(["v5", "--only", name, "--out", str(tmp_path), "--warmup", "1", "--repetitions", "3",
                       "--rounds", "1"]) == 0
    doc = json.loads((tmp_path / "v5_sweep.json").read_text())
    assert doc["schema"] == sweep.SCHEMA and [r["name"] for r in doc["variants"]] == [name]
    r = doc["variants"][0]
    assert r["correct"] is True and r["max_rel_error"] <= r["error_bound"]
    assert (r["runtime"]["threads"], r["runtime"]["smem_bytes"]) == (r["geometry"]["threads"], r["geometry"]["smem"])
    assert r["timing"]["median_us"] > 0 and r["vs"]["sdpa"] > 0


def test_v7_variants_fit_one_sm_and_name_their_geometry():
    """Every v7 step the sweep times must launch: its shared memory (flashattn.measure.geometry's copy of the
    kernel's Layout) within the H200's per-block limit, threads a whole number of warpgroups."""
    from flashattn.measure.resources import SM90
    for name, variant in sweep.VARIANTS["v7"].items():
        geo = sweep.geometry_of("v7", variant)
        assert geo["D"] == variant.D and geo["threads"] == 128 * geo["warpgroups"] == 2 * geo["B_r"], name
        assert geo["smem"] <= SM90["smem_per_block_max"], name
    defaults = [v for n, v in sweep.VARIANTS["v7"].items() if "(default)" in n]
    assert sorted(v.D for v in defaults) == [64, 128] and all(not v.macros for v in defaults)


def test_v8_variants_are_the_chapter_steps_and_fit_one_sm():
    """The v8 sweep times the steps of tests/test_v8.py (same macros, both head dims), each step one
    change from the one before, and every variant launches: shared memory within the H200's per-block
    limit, threads = 128 x (consumer warpgroups + the producer when specialised)."""
    from test_v8 import VARIANTS as TESTED

    from flashattn.measure.resources import SM90
    variants = sweep.VARIANTS["v8"]
    as_flags = {n: sorted(f"-D{k}={v}" for k, v in var.macros.items()) for n, var in variants.items()}
    for name, flags in TESTED.items():
        step = "persistent (default)" if name == "default" else name
        timed = [n for n in variants if n.split(" ", 1)[1] == step]
        assert timed, f"test_v8 step {name} is not timed by the sweep"
        assert all(as_flags[n] == sorted(flags) for n in timed), (name, timed)
    steps = ["spec0", "spec", "setmaxnreg", "pingpong", "overlap", "persistent (default)"]
    for D in (64, 128):
        chain = [variants[f"d{D} {s}"].macros for s in steps]
        for before, after in zip(chain[1:], chain[2:]):        # past spec0: each step drops one switch
            assert len(set(before.items()) ^ set(after.items())) == 1, (before, after)
    for name, variant in variants.items():
        geo = sweep.geometry_of("v8", variant)
        assert geo["threads"] == 128 * (geo["warpgroups"] + geo["producer"]), name
        assert geo["B_r"] == 64 * geo["warpgroups"] and geo["D"] == variant.D, name
        assert geo["smem"] <= SM90["smem_per_block_max"], name


def test_step_sets_name_their_file_kernel_and_fit_one_sm():
    from flashattn.measure.resources import SM90
    assert sweep.kernel_version("v6-steps") == "v6" and sweep.output_name("v6-steps") == "v6_steps.json"
    assert sweep.output_name("v6") == "v6_sweep.json" and not sweep.is_steps("v6")
    for name, variant in sweep.VARIANTS["v6-steps"].items():
        assert variant.change, name
        geo = sweep.geometry_of("v6-steps", variant)
        assert geo["D"] == variant.D and geo["smem"] <= SM90["smem_per_block_max"], name
    # the first step carries P through shared memory: B_r x B_c more bytes than the second
    first, second = (sweep.geometry_of("v6-steps", sweep.VARIANTS["v6-steps"][f"d64 {n}"])["smem"]
                     for n in ("P via shared memory", "P in registers"))
    assert first - second == 2 * 128 * 64


def test_recorded_step_counters_are_ncus_own_numbers():
    """results/h200/v6_steps.json's counters per step are the values of the raw page ncu printed for that
    step's profiled launch (v6_steps_ncu.raw.csv, launches in step order, each step's second one)."""
    from flashattn.measure import ncu
    doc = json.loads((ROOT / "results" / "h200" / "v6_steps.json").read_text())
    raw = ROOT / "results" / "h200" / "v6_steps_ncu.raw.csv"
    profiled = [r for r in doc["variants"] if "counters" in (r.get("metrics") or {})]
    assert profiled and raw.exists(), "v6_steps.json and its raw ncu page are committed with the counters"
    rows = ncu.read_raw_rows(raw)
    assert len(rows) == 2 * len(profiled)
    for i, r in enumerate(profiled):
        counters, stalls = ncu.raw_values(rows[2 * i + 1], ncu.STEP_METRICS)
        assert counters == pytest.approx(r["metrics"]["counters"]) and stalls == pytest.approx(r["metrics"]["stalls"])
