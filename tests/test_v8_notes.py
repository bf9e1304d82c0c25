"""flashattn.book.v8_notes on the committed records: the V8 chapter's and its lab notes' tables have the rows the
records have, and their numbers are the records' numbers."""
from __future__ import annotations

import json

import pytest

from flashattn.book import records, trace, v8_notes
from flashattn.loader import source
from flashattn.measure.variants import V8_STEPS

SWEEP = json.loads(v8_notes.SWEEP.read_text()) if v8_notes.SWEEP.exists() else None
needs_sweep = pytest.mark.skipif(SWEEP is None, reason="results/h200/v8_sweep.json not committed")


def _us(name: str) -> float:
    return next(r for r in SWEEP["rows"] if r["name"] == name)["timing"]["median_us"]


def test_excerpt_cuts_the_kernel_between_markers():
    text = v8_notes.excerpt("struct Registers {", "};")
    lines = text.splitlines()
    assert "struct Registers {" in lines[0] and lines[-1].strip() == "};"
    assert text in source("v8")
    assert v8_notes.excerpt("struct Registers {") == lines[0]
    assert v8_notes.excerpts(("struct Registers {", None), ("struct Registers {", None), gap="..") == \
        f"{lines[0]}\n..\n{lines[0]}"
    with pytest.raises(ValueError, match="no line containing 'no such line in the kernel'"):
        v8_notes.excerpt("no such line in the kernel")


def test_register_lines_add_up_within_the_launch_allotment():
    rows = [dict(d=128, causal=0, consumers=2, threads=384, entry=168, producer=24, consumer=240),
            dict(d=128, causal=1, consumers=2, threads=384, entry=168, producer=24, consumer=240)]
    text = v8_notes.register_lines(rows)
    assert text == ("D=128: 2 consumers + 1 producer = 384 threads at 168 registers; producer 24, consumers 240: "
                    "24 + 2 x 240 = 504 <= 504")
    wide = [dict(r, d=d) for d in (192, 256) for r in rows[:1]]
    d64 = dict(d=64, causal=0, consumers=3, threads=512, entry=128, producer=32, consumer=160)
    assert v8_notes.register_lines([d64] + rows + wide).splitlines() == [
        "D=64: 3 consumers + 1 producer = 512 threads at 128 registers; producer 32, consumers 160: "
        "32 + 3 x 160 = 512 <= 512", "D=128/192/256: " + text.removeprefix("D=128: ")]


@needs_sweep
def test_steps_follow_the_variants_and_match_the_record():
    rows = v8_notes.step_rows()
    recorded = {r["name"].split(" ", 1)[1] for r in SWEEP["rows"]}
    # every recorded build of V8_STEPS, in V8_STEPS's order, and nothing else
    assert [r["name"] for r in rows] == [name for name, *_ in V8_STEPS if name in recorded]
    for r in rows:
        for D in (64, 128):
            us, ratio = r[D]
            key = f"d{D} {r['name']}"
            assert us == (_us(key) if any(x["name"] == key for x in SWEEP["rows"]) else None)
            if ratio is not None:
                assert ratio == pytest.approx(_us(f"d{D} {r['against']}") / us)
    first = rows[0]
    assert first["against"] is None and first[64][1] is None
    # the chain steps are each measured against the recorded step before them
    default = next(k for k, (_, macros, _, _) in enumerate(V8_STEPS) if not macros)
    chain_names = [name for name, *_ in V8_STEPS[:default + 1]]
    chain = [r for r in rows if r["name"] in chain_names]
    assert all(b["against"] == a["name"] for a, b in zip(chain, chain[1:]))


@needs_sweep
def test_steps_table_prints_one_line_per_step():
    text = v8_notes.steps_table().data
    body = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(body) == len(v8_notes.step_rows())
    assert f"{_us('d128 spec0'):,.1f}" in body[0]


def test_a_new_step_appears_in_the_table(tmp_path, monkeypatch):
    steps = (("a", {"X": 0, "Y": 0}, "first", None), ("b", {"Y": 0}, "second", None),
             ("c", {}, "third (default)", None), ("c2", {"Z": 1}, "off the chain", 128))
    rows = [{"name": f"d{D} {n}", "D": D, "timing": {"median_us": us}}
            for D in (64, 128) for n, us in (("a", 10.0), ("b", 8.0), ("c", 5.0))] + \
        [{"name": "d128 c2", "D": 128, "timing": {"median_us": 4.0}}]
    path = tmp_path / "sweep.json"
    path.write_text("{}")
    monkeypatch.setattr(v8_notes, "V8_STEPS", steps)
    monkeypatch.setattr(v8_notes, "_sweep", lambda p: {"rows": rows})
    got = v8_notes.step_rows(path)
    assert [(r["name"], r["against"]) for r in got] == [("a", None), ("b", "a"), ("c", "b"), ("c2", "c")]
    assert got[1][64][1] == pytest.approx(10 / 8) and got[3][64] == (None, None)
    assert got[3][128][1] == pytest.approx(5 / 4)


@needs_sweep
def test_step_pairs_and_sentences_read_the_record():
    text = v8_notes.step_pairs_table().data
    # the tile change and the producer as two steps: spec0 -> tile -> spec
    for a, b in (("spec0", "tile"), ("tile", "spec")):
        assert f"({a} → {b}) | {_us(f'd64 {a}'):,.1f} → {_us(f'd64 {b}'):,.1f}" in text
        assert f"{_us(f'd128 {a}') / _us(f'd128 {b}'):.2f}×" in text
    sentences = v8_notes.step_sentences()
    assert f"(spec0 -> tile) {_us('d128 spec0') / _us('d128 tile'):.2f}x" in sentences
    assert f"(tile -> spec) {_us('d64 tile') / _us('d64 spec'):.2f}x" in sentences


def test_variants_table_lists_every_build():
    text = v8_notes.variants_table().data
    for name, macros, _, _ in V8_STEPS:
        assert f"| `{name}` |" in text
        for k, v in macros.items():
            assert f"{k}={v}" in text


@pytest.mark.parametrize("name", v8_notes.CANDIDATES)
def test_candidates_table_has_every_configuration(name):
    path = records.RESULTS / name
    if not path.exists():
        pytest.skip(f"{name} not committed")
    doc = json.loads(path.read_text())
    text = v8_notes.candidates_table(path)
    configs = {(r["D"], r["causal"], r["B"], r["H"], r["L"]) for r in doc["rows"]}
    assert text.count("**D=") == len(configs)
    assert text.count("| sdpa_cudnn |") == len(configs)       # cuDNN over itself: 1.000 in every run
    runs = len(doc["rows"]) // len(configs)
    assert ", ".join(["1.000"] * runs) in text


def test_trace_reading_prints_every_traced_shape():
    doc = trace.load(records.RESULTS / "v8_trace.json")
    if not doc:
        pytest.skip("results/h200/v8_trace.json not committed")
    text = v8_notes.trace_reading(doc)
    for run in doc["rows"]:
        assert trace.label(run["shape"]) + ":" in text
        assert f"S issue to done {run['summary']['S = Q K^T']:,.0f} ns" in text
    assert v8_notes.trace_reading(None) == "Not recorded yet."


def test_target_lines_are_cudnn_over_v8_in_the_same_run():
    if not v8_notes.BENCH.exists():
        pytest.skip("results/h200/bench_v8.json not committed")
    ratios = v8_notes.target_ratios()
    assert len(ratios) == 4
    rows = json.loads(v8_notes.BENCH.read_text())["rows"]
    v8 = next(r for r in rows if r["version"] == "v8" and r["status"] == "ok")
    sdpa = next(r for r in rows if r["version"] == "sdpa" and r["status"] == "ok" and
                (r["batch_size"], r["seq_len_q"], r["head_dim"], r["causal"]) ==
                (v8["batch_size"], v8["seq_len_q"], v8["head_dim"], v8["causal"]))
    assert ratios[0][1] == pytest.approx(sdpa["median_us"] / v8["median_us"])
    assert f"{ratios[0][1]:.2f}x cuDNN's speed" in v8_notes.target_lines().splitlines()[0]


def test_profile_comparison_prints_the_recorded_tensor_pipe_and_occupancy():
    s = records.profile_summary("v8", 8192)
    if s is None:
        pytest.skip("V8's D=128 profile not committed")
    text = v8_notes.profile_comparison().data
    row = next(line for line in text.splitlines() if line.startswith("| 8,192 | V8 |"))
    assert f"{s['tensor_pipe_pct']:.1f}%" in row
    assert f"{s['achieved_occupancy_pct']:.2f}%" in row and f"{s['theoretical_occupancy_pct']:.2f}%" in row


def test_defaults_table_reads_every_run():
    from flashattn.measure import results
    doc = results.read(v8_notes.DEFAULTS, "sweep")
    text = v8_notes.defaults_table().data
    runs = results.runs(doc)
    assert text.count("| d128 bc176 |") == 1 and f"{len(runs)} separate processes" in text
    for k, run in enumerate(runs):
        got = {r["name"]: r["timing"]["median_us"] for r in run["rows"]}
        assert f"run {k + 1}: µs" in text
        assert f"{got['d128 persistent (default)'] / got['d128 stages3']:.3f}" in text
