"""flashattn.book.decoding, the Decoding chapter's tables and figures: on the record on disk (their numbers are
the record's, and the chapter's qualitative readings still hold for it) and on small synthetic records (a slow
row misses its target, a missing part says so, each column lands where it belongs)."""
from __future__ import annotations

import ast
import math
import shutil

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pytest

from flashattn import decode
from flashattn.book import decoding, records
from flashattn.book import decoding_figures as figs
from flashattn.book import decoding_live as live
from flashattn.book import decoding_results as measured
from flashattn.loader import source
from flashattn.measure import results

DOC = decoding.record()
PARTS = {r["part"] for r in DOC["rows"]} if DOC else set()
NVCC = shutil.which(decoding.resources.nvcc()) is not None


def needs(part):
    return pytest.mark.skipif(part not in PARTS, reason=f"results/h200/decode.json has no {part} part")


def _row(part, shape, column, us, nb=2_000_000_000, **extra):
    r = dict(part=part, shape=shape, column=column, bytes=nb, floor_us=decoding.floor_us(nb), status="ok",
             median_us=us, tb_per_s=nb / (us * 1e-6) / 1e12)
    r.update(extra)
    return r


def _doc(rows, **meta):
    return results.document("decode", rows, {"sms": 132, "tile_keys": 64, **meta}, {})


# --------------------------------------------------------------------------------------------- arithmetic
def test_bytes_and_floor_match_the_record():
    if DOC is None:
        pytest.skip("no record")
    checked = 0
    for r in DOC["rows"]:
        if r.get("dims") and r["part"] != "lengths":
            B, H_q, H_kv, M, N, D = r["dims"]
            assert decoding.bytes_moved(B, H_q, H_kv, M, [N] * B, D) == r["bytes"]
            assert decoding.floor_us(r["bytes"]) == pytest.approx(r["floor_us"])
            checked += 1
    assert checked


def test_intensity_is_one_flop_per_byte_per_row():
    assert decoding.intensity(1, 1) == 1          # 4D FLOPs against 4D bytes of bf16 K and V
    assert decoding.intensity(16, 1) == 16
    assert decoding.intensity(1, 4) == 4
    assert decoding.intensity(1, 1, element=1) == 2   # an fp8 cache: the same FLOPs over half the bytes
    # the exercises: a floor, and the rule for two sequences of 64k keys at H_kv = 8, G = 4
    assert decode.choose_num_splits(1024, 16, 132) == 16
    nb = decoding.bytes_moved(16, 32, 8, 1, [4096] * 16, 128)
    assert nb == 268_697_600 and round(decoding.floor_us(nb), 1) == 56.0


# ---------------------------------------------------------------------------------- the concept figures
def test_merge_example_is_the_unsplit_softmax():
    ex = figs.merge_example()
    assert ex["max_error"] < 1e-12 and ex["max_error_kernel"] < 1e-12
    assert ex["weights"].sum() == pytest.approx(1.0)
    assert ex["lse"] == pytest.approx(ex["lse_all"])
    # uneven splits merge exactly too
    assert figs.merge_example(n_keys=37, splits=5)["max_error"] < 1e-12
    # the kernel's merge weighs against the largest lse_s, as max_error_kernel does
    assert "- lse_max)" in decoding.excerpt("for (int s0 = 0; s0 < splits; s0 += 32) {", "const float inv")


def test_packing_and_paging_mirror_the_kernel():
    assert figs.packed_rows(2, 4)[5] == (5, 1, 1)
    assert len(figs.packed_rows(4, 8)) == 32                 # exercise 3: two row blocks of 16
    assert "m = pr / p.G, g = pr % p.G" in decoding.excerpt("auto row_offset = [&](int r)", "};")
    assert figs.page_of(9, [5, 2, 7, 0], 4) == (7, 1)
    lookup = decoding.excerpt("auto row_of = [&]", "};")
    assert "j / p.page_size" in lookup and "j % p.page_size" in lookup
    from flashattn.measure.decode_timeline import MAX_CLUSTER_SPLITS
    assert f"kMaxClusterSplits = {MAX_CLUSTER_SPLITS};" in source("decode")


@pytest.mark.parametrize("name", sorted(figs.FIGURES))
def test_concept_figures_draw(name):
    fig = figs.FIGURES[name]()
    assert fig.axes
    plt.close(fig)


def test_every_excerpt_of_the_chapter_is_in_the_kernel():
    book = nbformat.read(records.ROOT / "book" / "decoding.ipynb", as_version=4)
    calls = [node for c in book.cells if c.cell_type == "code" for node in ast.walk(ast.parse(c.source))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "excerpt"]
    assert len(calls) >= 4
    for call in calls:
        text = decoding.excerpt(*[ast.literal_eval(a) for a in call.args])
        assert text in source("decode")


# ----------------------------------------------------------------------------------------- the record
@needs("variants")
def test_variants_table_has_every_build_and_shape():
    text = decoding.variants_table(DOC, compile_builds=False).data
    rows = [r for r in DOC["rows"] if r["part"] == "variants"]
    for r in rows:
        assert f"{r['median_us']:,.1f}" in text and f"| {r['column']} |" in text
    body = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| build")]
    assert len(body) == len({r["column"] for r in rows})


@needs("variants")
def test_the_chapters_reading_of_the_variants_holds():
    """The prose of 'What each build choice bought', checked against the record it describes."""
    def every(before, after, faster):
        x = decoding.speedups(DOC, before, after)
        assert x and all((v > 1) == faster for v in x.values()), (before, after, x)
        return x
    every("16-byte copies, 3 stages", "16-byte copies, 2 stages", True)       # two stages beat three
    every("16-byte copies, 2 stages", "2 stages, L2 prefetch 256 B", False)   # .L2::256B costs time
    every("16-byte copies, 2 stages", "2 stages, 3 blocks/SM", False)
    every("16-byte copies, 3 stages", "bulk rows, 3 stages", False)
    x = decoding.speedups(DOC, "16-byte copies, 2 stages", "2 stages, L2 prefetch 128 B")
    assert all(abs(v - 1) < 0.01 for v in x.values())                         # "changes nothing measurable"
    assert "#define DECODE_STAGES 2" in source("decode")                      # "Two stages is the default"
    lines = decoding.variant_lines(DOC).splitlines()
    assert lines[0].startswith("three stages → two: faster at every shape")


@needs("variants")
@pytest.mark.skipif(not NVCC, reason="needs nvcc (ptxas reports the registers)")
def test_littles_law_on_the_record():
    builds = ("16-byte copies, 2 stages", "16-byte copies, 3 stages", "2 stages, 3 blocks/SM")
    text = decoding.in_flight_table(DOC, builds=builds).data
    body = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith("| 16-byte") or line.startswith("| 2 stages")}
    latency = {b: float(cells[5].split()[0]) for b, cells in body.items()}
    resident = {b: int(cells[1]) for b, cells in body.items()}
    got = {r["column"]: r for r in DOC["rows"] if r["part"] == "variants" and r["shape"] == "batch8_16k"}
    two, three = got[builds[0]], got[builds[1]]
    # twice the bytes in flight, about the same bandwidth, about twice the wait
    assert abs(two["tb_per_s"] / three["tb_per_s"] - 1) < 0.05
    assert 1.7 < latency[builds[1]] / latency[builds[0]] < 2.3
    # the third block per SM finds no block to hold at batch8_16k, and the cap spills "a few bytes"
    assert resident[builds[2]] == resident[builds[0]]
    assert 0 < decoding.build_resources(tuple(got[builds[2]]["flags"]))["spill_bytes"] <= 128


@needs("splits")
def test_splits_figure_waves_and_rule():
    fig = figs.splits_figure(DOC, show=False)
    shapes = {r["shape"] for r in DOC["rows"] if r["part"] == "splits"}
    assert len([a for a in fig.axes if a.get_title()]) == len(shapes)
    plt.close(fig)
    text = decoding.waves_table(DOC).data
    assert "| 8 | 256 | 0.97 |" in text and "| 12 | 384 | 1.45 |" in text and "| 16 | 512 | 1.94 |" in text
    us = {r["num_splits"]: r["median_us"] for r in DOC["rows"]
          if r["part"] == "splits" and r["shape"] == "rows16_32k" and r["column"] != "rule"}
    assert us[12] > us[8] and us[12] > us[16]                 # the step the waves explain
    for r in decoding.rule_rows(DOC):
        B, H_q, H_kv, M, N, D = next(x["dims"] for x in DOC["rows"]
                                     if x["part"] == "splits" and x["shape"] == r["shape"])
        blocks = B * H_kv * math.ceil(M * (H_q // H_kv) / 16)
        assert r["blocks"] == blocks
        assert r["rule_now"] == decode.choose_num_splits(math.ceil(N / 64), blocks, 132)


@needs("peers")
def test_peers_table_targets_and_bandwidth_figure():
    text = measured.peers_table(DOC).data
    for r in DOC["rows"]:
        if r["part"] == "peers" and r["status"] == "ok":
            assert f"{r['median_us']:,.1f}, {r['tb_per_s']:.2f}, {100 * r['floor_us'] / r['median_us']:.0f}%" in text
    for t in measured.targets(DOC):
        assert t["met"] in (True, False, None)
    got = {(r["shape"], r["column"]): r for r in DOC["rows"] if r["part"] == "peers" and r["status"] == "ok"}
    first = measured.targets(DOC)[0]
    assert first["met"] == (got[("batch8_16k", "ours")]["median_us"] <= got[("batch8_16k", "cudnn")]["median_us"])
    fig = figs.bandwidth_figure(DOC, show=False)
    assert fig is not None
    plt.close(fig)


# --------------------------------------------------------------------------------------- synthetic records
def _peers(ours_batch8, ours_rows16, ours_gqa, cudnn=500.0):
    nb = decoding.bytes_moved(8, 32, 32, 1, [16384] * 8, 128)
    nb16 = decoding.bytes_moved(1, 32, 32, 16, [32768], 128)
    nbg = decoding.bytes_moved(64, 32, 8, 1, [8192] * 64, 128)
    return [_row("peers", "batch8_16k", "ours", ours_batch8, nb, dims=[8, 32, 32, 1, 16384, 128]),
            _row("peers", "batch8_16k", "cudnn", cudnn, nb, dims=[8, 32, 32, 1, 16384, 128]),
            dict(part="peers", shape="batch8_16k", column="fa4", status="unsupported", message="no fa4 here",
                 bytes=nb, floor_us=decoding.floor_us(nb)),
            _row("peers", "rows16_32k", "ours", ours_rows16, nb16, dims=[1, 32, 32, 16, 32768, 128]),
            _row("peers", "gqa64_8k", "ours", ours_gqa, nbg, dims=[64, 32, 8, 1, 8192, 128])]


def test_targets_say_missed_for_slow_rows_and_met_for_fast_ones():
    slow = measured.targets(_doc(_peers(600.0, 200.0, 600.0)))
    assert [t["met"] for t in slow] == [False, False, False, False, None, None]
    assert "missed" in measured.target_lines(_doc(_peers(600.0, 200.0, 600.0)))
    fast = measured.targets(_doc(_peers(460.0, 120.0, 470.0) + [
        _row("paged", "batch8_16k", "contiguous", 460.0), _row("paged", "batch8_16k", "paged 64", 470.0),
        _row("paged", "batch8_16k", "paged 256", 500.0)]))
    assert [t["met"] for t in fast] == [True, True, True, True, True, False, None]
    lines = measured.target_lines(_doc(_peers(460.0, 120.0, 470.0)))
    assert "met  batch8_16k: at most cuDNN's time: ours 460.0 µs, cuDNN 500.0 µs" in lines
    assert "not recorded  paged" in lines
    dims = [8, 32, 8, 1, 32768, 128]
    for spread, met in ((104.0, True), (106.0, False)):
        ragged = [_row("lengths", "g", "spread 1..32k", spread, dims=dims),
                  _row("lengths", "g", "even, same total", 100.0, dims=dims)]
        assert measured.targets(_doc(ragged))[-1]["met"] is met


def test_anatomy_table_reads_the_merge_from_the_ordinary_launch():
    def anatomy(column, span, *kernels):
        return dict(part="anatomy", shape="s", column=column, status="ok", floor_us=100.0, span_us=span,
                    kernels=[dict(name=n, median_us=us) for n, us in kernels])
    rows = [anatomy("ours", 130.0, ("split_kernel", 125.0), ("merge_kernel", 128.0)),
            anatomy("ours, merge launched after the split", 131.5, ("split_kernel", 125.0), ("merge_kernel", 3.0)),
            _row("peers", "s", "ours", 133.0)]
    text = measured.anatomy_table(_doc(rows)).data
    assert "| s | 100.0 | 133.0 | 130.0 | 125.0 | 3.0 | 131.5 |" in text


def test_paged_profile_tables(tmp_path):
    def build(name, us, inst, lines):
        return dict(part="instructions", build=name, status="ok", duration_us=us, dram_pct=90.0, inst_executed=inst,
                    opcodes={}, lines=[dict(line=n, inst_executed=c, text=t) for n, c, t in lines])
    paths = {"before": tmp_path / "b.json", "after": tmp_path / "a.json"}
    results.write(paths["before"], "decode", [build("paged64", 600.0, 200e6, [(339, 44e6, "origin * stride")])])
    results.write(paths["after"], "decode", [build("paged64", 480.0, 100e6, [(396, 7e6, "k_src += k_step")])])
    text = measured.paged_profile_table(paths).data
    assert "| before | paged64 | 600.0 | 90.0% | 200 M |" in text and "| after | paged64 | 480.0 |" in text
    hot = measured.hot_lines("before", paths=paths).data
    assert "| 339 | 44.0 M | `origin * stride` |" in hot
    assert "No contiguous profile" in measured.hot_lines("after", build="contiguous", paths=paths).data
    assert "Not recorded yet" in measured.paged_profile_table({"before": tmp_path / "none.json"}).data


def test_missing_parts_and_files_say_so(tmp_path, capsys):
    empty = _doc([])
    for fn in (decoding.variants_table, decoding.waves_table, decoding.rule_table, measured.peers_table,
               measured.paged_table, measured.lengths_table, decoding.intensity_table, decoding.in_flight_table,
               measured.anatomy_table):
        assert "Not recorded yet" in fn(empty).data
    assert figs.splits_figure(empty, show=False) is None
    assert figs.bandwidth_figure(empty, show=False) is None
    assert "Not recorded yet" in capsys.readouterr().out
    assert "Not recorded yet" in measured.generation_table(tmp_path / "generation.json").data
    assert measured.profile_lines({"a": tmp_path / "a.ncu-rep"}).startswith("No Nsight Compute report")
    assert measured.profile_roofline({"a": tmp_path / "a.ncu-rep"}, show=False) is None
    assert all(t["met"] is None for t in measured.targets(empty))


def test_profile_lines_read_a_report():
    path = records.report_path("v6")                      # any committed report stands in for the decode ones
    if not path.exists() or not records.ncu_report_importable():
        pytest.skip("no readable Nsight Compute report here")
    s = records.profile_summary("v6")
    text = measured.profile_lines({"stand-in": path})
    assert text.startswith(f"stand-in: tensor pipe busy {s['tensor_pipe_pct']:.1f}%")
    fig = measured.profile_roofline({"stand-in": path}, show=False)
    assert fig is not None
    plt.close(fig)


def test_variant_lines_and_speedups():
    rows = [_row("variants", s, b, us) for s, b, us in (
        ("x", "16-byte copies, 3 stages", 110.0), ("x", "16-byte copies, 2 stages", 100.0),
        ("y", "16-byte copies, 3 stages", 90.0), ("y", "16-byte copies, 2 stages", 100.0))]
    doc = _doc(rows)
    assert decoding.speedups(doc, "16-byte copies, 3 stages", "16-byte copies, 2 stages") == \
        pytest.approx({"x": 1.1, "y": 0.9})
    first = decoding.variant_lines(doc).splitlines()[0]
    assert first == "three stages → two: faster at 1 of 2 shapes, time -9.1% to +11.1%"
    assert "not recorded" in decoding.variant_lines(doc).splitlines()[1]
    text = decoding.variants_table(doc, compile_builds=False).data
    assert "**100.0** (" in text and "| 16-byte copies, 3 stages | — | — | 110.0 (" in text


def test_waves_model_on_a_synthetic_sweep():
    dims = [1, 32, 32, 1, 32768, 128]                      # 32 blocks per split, 264 slots
    rows = [_row("splits", "s", f"splits={n}", us, dims=dims, num_splits=n)
            for n, us in ((4, 200.0), (8, 100.0), (12, 130.0), (16, 105.0))]
    rows.append(_row("splits", "s", "rule", 100.0, dims=dims, num_splits=8))
    text = decoding.waves_table(_doc(rows), shape="s").data
    # ceil(waves) / splits, relative to 8 splits: 4 -> 2.00, 12 -> 2/12 * 8 = 1.33, 16 -> 2/16 * 8 = 1.00
    assert "| 4 | 128 | 0.48 | 2.00 | 200.0 | 2.00 |" in text
    assert "| 12 | 384 | 1.45 | 1.33 | 130.0 | 1.30 |" in text
    assert "| 16 | 512 | 1.94 | 1.00 | 105.0 | 1.05 |" in text
    assert "| 12 |" not in decoding.waves_table(_doc(rows), shape="s", only=(8, 16)).data
    (r,) = decoding.rule_rows(_doc(rows))
    assert (r["rule_recorded"], r["best"], r["best_us"]) == (8, 8, 100.0)


def test_paged_and_lengths_tables():
    rows = [_row("paged", "b", "contiguous", 100.0), _row("paged", "b", "paged 64", 103.0),
            _row("paged", "b", "fa4 contiguous", 90.0), _row("paged", "b", "fa4 paged 64", 99.0),
            dict(part="paged", shape="b", column="fa4 paged 256", status="unsupported", message="x")]
    text = measured.paged_table(_doc(rows)).data
    assert "| b | 100.0 | 103.0 (+3.0%) | 90.0 | 99.0 (+10.0%) | not run |" in text
    lengths = [_row("lengths", "gqa8_spread", "spread 1..32k", 50.0, 200_000_000, dims=[8, 32, 8, 1, 32768, 128]),
               _row("lengths", "gqa8_spread", "padded to 32k", 100.0, 400_000_000, dims=[8, 32, 8, 1, 32768, 128])]
    text = measured.lengths_table(_doc(lengths)).data
    assert "| spread 1..32k | 0.20 GB | 50.0 | 4.00 | 83% |" in text


def test_generation_table(tmp_path):
    vs = dict(max_rel_logit_diff=3e-3, sequences_agreeing=30)
    rows = [dict(attention="sdpa", batch=32, status="ok", tokens_per_s=1000.0, ms_per_step=32.0, vs_sdpa=None),
            dict(attention="flashattn", batch=32, status="ok", tokens_per_s=1200.0, ms_per_step=26.7, vs_sdpa=vs),
            dict(attention="fa4", status="skipped", reason="fa4: flash_attn.cute does not import here")]
    path = tmp_path / "generation.json"
    results.write(path, "generation", rows, {"model": dict(n_layer=8, n_head=16, head_dim=128)},
                  dict(prompt_len=64, new_tokens=512))
    text = measured.generation_table(path).data
    assert "| 32 | ours | 1,200 | 1.20× | 3.0e-03 | 30 of 32 |" in text
    assert "| 32 | SDPA | 1,000 | — | — | — |" in text
    assert "FA4 not run: fa4: flash_attn.cute does not import here." in text


def test_bandwidth_figure_marks_columns_that_did_not_run(capsys):
    rows = _peers(480.0, 140.0, 480.0) + [_row("ceiling", "batch8_16k", "torch.sum", 500.0)]
    fig = figs.bandwidth_figure(_doc(rows), show=False)
    ax = fig.axes[0]
    assert any(t.get_text() == "not run" for t in ax.texts)
    labels = ax.get_legend_handles_labels()[1]
    assert any(label.startswith("torch.sum read") for label in labels) and "FA4" in labels
    heights = sorted(p.get_height() for p in ax.patches if p.get_height() > 0)
    assert heights[-1] == pytest.approx(max(r["tb_per_s"] for r in rows if r.get("tb_per_s") and r["part"] == "peers"))
    plt.close(fig)
    assert np.isfinite(heights).all()


def test_live_cells_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(live, "gpu", lambda: False)
    assert live.correctness() is None
    text = live.time_one_shape(doc=_doc(_peers(480.0, 140.0, 480.0))).data
    assert "| ours | 480.0 |" in text and "| cuDNN | 500.0 |" in text
    assert "Not recorded yet" in live.time_one_shape(doc=_doc([])).data
    out = capsys.readouterr().out
    assert "No CUDA GPU" in out and "runs live only" in out


@pytest.mark.gpu
def test_live_correctness_on_the_gpu():
    text = live.correctness().data
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "rel. error" not in line
            and not line.startswith("|---")]
    assert len(rows) == len(live.CASES)
    for cells in rows:
        ours, sdpa = float(cells[3]), float(cells[4].strip(" |"))
        assert ours < 1e-2 and ours < 3 * sdpa + 1e-3, cells


def _floor_doc(times: dict) -> dict:
    """A floor part at rows16_32k: `times` column -> µs over 536 MB."""
    nb = 536_870_912
    return {"rows": [dict(part="floor", shape="rows16_32k", column=c, status="ok", median_us=us, floor_us=111.9,
                          tb_per_s=nb / us / 1e6) for c, us in times.items()]}


def test_floor_lines_pick_the_fastest_read_that_computes_nothing():
    from flashattn.book import decoding_floor as floor
    doc = _floor_doc({"ours": 135.0, "ours, no arithmetic": 133.0, "ours, splits interleaved": 120.0,
                      "torch.sum": 141.0, "16-byte loads, 528 blocks": 131.0})
    line = floor.floor_lines(doc=doc)
    # the interleaved build computes: it is no read floor, however fast
    assert "16-byte loads, 528 blocks, took 131.0 µs" in line and "4.8% above the 125 µs target" in line
    assert "Ours took 135.0 µs, 3.1% behind that read" in line
    table = floor.floor_table(doc).data
    assert "| ours, splits interleaved | 120.0 (4.47) |" in table and "rows16_32k 111.9 µs" in table
    assert "Not recorded" in floor.floor_lines(doc={"rows": []})


def test_cluster_waves_counts_late_blocks():
    from flashattn.book import decoding_floor as floor
    blocks = [[sm, 0, 4000, 110_000, 120_000] for sm in range(3)] + [[7, 122_000, 126_000, 230_000, 240_000]]
    doc = {"rows": [{"shape": "rows16_32k", "call": 0, "split": blocks}]}
    assert floor.cluster_waves(doc) == ("rows16_32k, the cluster build: call 0: 3 blocks on 3 SMs at once, "
                                        "1 starting 122 µs later.")


def test_fixed_cost_is_the_line_through_two_sizes():
    from flashattn.book import decoding_floor as floor
    column = "ours, no arithmetic"
    rows = [dict(part="floor", shape=s, column=column, status="ok", bytes=nb, median_us=us, tb_per_s=nb / us / 1e6)
            for s, nb, us in (("rows16_32k", 500e6, 120.0), ("batch8_16k", 2000e6, 420.0))]
    fit = floor.fixed_cost(doc={"rows": rows})
    assert math.isclose(fit["tb_per_s"], 5.0) and math.isclose(fit["fixed_us"], 20.0)   # 1.5 GB in 300 µs
    assert "a fixed 20.0 µs per call, then 5.00 TB/s" in floor.fixed_cost_lines(doc={"rows": rows})
    assert "leaves 25.0 µs of the 125 µs target" in floor.fixed_cost_lines(doc={"rows": rows})
    assert floor.fixed_cost(doc={"rows": rows[:1]}) is None


def test_bytes_for_fraction_and_the_lab_exercise_follow_the_record():
    """On a synthetic line (20 µs + bytes / 5 TB/s) the bytes for a fraction solve bytes / time = f x 4.8 TB/s;
    on the record, the lab's exercise quotes what the functions give."""
    from flashattn.book import decoding_floor as floor
    rows = [dict(part="floor", shape=s, column="ours, no arithmetic", status="ok", bytes=nb, median_us=20 + nb / 5e6,
                 tb_per_s=0.0, floor_us=nb / 4.8e6) for s, nb in (("rows16_32k", 5e8), ("batch8_16k", 2e9))]
    doc = {"rows": rows}
    got = floor.bytes_for_fraction(0.9, doc)
    assert math.isclose(got / (20e-6 + got / 5e12), 0.9 * 4.8e12)
    assert floor.bytes_for_fraction(5.0 / 4.8, doc) is None                  # the line's own pace: never
    assert floor.fit_figure(doc=doc, show=False) is not None
    plt.close("all")
    fit = floor.fixed_cost()
    if fit is None:
        pytest.skip("results/h200/decode_floor.json is not recorded")
    lab = "".join(c.source for c in nbformat.read(records.ROOT / "book" / "decoding_lab.ipynb", as_version=4).cells
                  if c.cell_type == "markdown")
    for text in (f"$a$ = {fit['fixed_us']:.1f} µs, $P$ = {fit['tb_per_s']:.2f} TB/s",
                 f"93%: about\n{floor.bytes_for_fraction(0.93) / 1e9:.2f} GB",
                 f"90%: about {floor.bytes_for_fraction(0.90) / 1e9:.2f} GB",
                 f"({100 * fit['tb_per_s'] / 4.8:.1f}%)", f"reads {fit['large']['bytes'] / 1e9:.2f} GB",
                 f"rows16_32k's {fit['small']['bytes'] / 1e9:.2f} GB"):
        assert text in lab, text
