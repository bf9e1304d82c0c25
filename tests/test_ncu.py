"""flashattn.measure.ncu: the parsed values equal what `ncu --import REPORT` prints for every committed report.

`flashattn.measure.profile` saves ncu's details page (.details.csv, base units) and raw page (.raw.csv) next to
each report; there is no ncu on the machines that run these tests without a GPU, so those files are the
reference. The unit and number helpers are tested on their own so this file says something before any
report is committed.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from flashattn.measure import ncu, ncu_pages, ncu_tables, profile
from flashattn.measure.backward import BACKWARD_NAMES

RESULTS = Path(__file__).resolve().parent.parent / "results" / "h200"
# the reports of `python -m flashattn.measure.profile`, which saves ncu's pages next to each; other tools' reports
# (flashattn.book.kernel_times, exploratory runs) carry only what their own readers need
REPORTS = sorted(RESULTS.glob("flash_*_profile.ncu-rep"))


def test_unit_scales():
    assert ncu.unit_scale("nsecond") == pytest.approx(1e-9)
    assert ncu.unit_scale("usecond") == pytest.approx(1e-6)
    assert ncu.unit_scale("Gbyte/second") == pytest.approx(1e9)
    assert ncu.unit_scale("cycle/nsecond") == pytest.approx(1e9)
    assert ncu.unit_scale("Kbyte") == pytest.approx(1e3)
    assert ncu.unit_scale("Kibyte") == pytest.approx(1024)
    assert ncu.unit_scale("Ghz") == pytest.approx(1e9)
    for base in ("%", "byte", "second", "register/thread", "block", "", None, "inst/cycle"):
        assert ncu.unit_scale(base) == 1.0


def test_printed_numbers():
    assert ncu.parse_number("1,234,567") == 1234567 and ncu.parse_number("n/a") is None
    assert ncu.equals_printed(48.386, "48.39", "%")
    assert not ncu.equals_printed(48.40, "48.39", "%")
    assert ncu.equals_printed(4_123_456e-9, "4,123,456", "nsecond")
    assert ncu.equals_printed(3.7449e10, "3.745e+10", "byte/second")
    assert ncu.equals_printed(80, "80", "register/thread")


def test_report_names():
    assert ncu.version_of("results/h200/flash_v4_s2048_profile.ncu-rep") == "v4"
    assert ncu.version_of("flash_v6_s8192_profile.ncu-rep") == "v6"


def test_export_readers(tmp_path):
    details = tmp_path / "r.details.csv"
    details.write_text(
        '==PROF== note\n"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","k","GPU Speed Of Light Throughput","Duration","nsecond","4,123,456"\n'
        '"0","k","Occupancy","Achieved Occupancy","%","48.39"\n')
    raw = tmp_path / "r.raw.csv"
    raw.write_text('"ID","Kernel Name","gpu__time_duration.sum"\n"","","nsecond"\n"0","k","4,123,456"\n')
    assert ncu_pages.read_details_csv(details)["Duration"] == ("4,123,456", "nsecond")
    assert ncu_pages.read_raw_csv(raw)["gpu__time_duration.sum"] == ("4,123,456", "nsecond")
    summary = {f: None for f in ncu.FIELDS} | {"duration_s": 4.123456e-3, "achieved_occupancy_pct": 48.386,
                                                 "block_limits": {}}
    assert ncu.compare_with_exports(summary, ncu_pages.read_details_csv(details)) == []
    summary["achieved_occupancy_pct"] = 50.0
    assert ncu.compare_with_exports(summary, ncu_pages.read_details_csv(details))


def test_table_rows_from_a_synthetic_summary():
    s = dict(duration_s=4.12e-3, fp32_flops_per_s=14.1e12, fp32_peak_flops_per_s=60e12, fp32_pct_of_peak=23.5,
             tensor_ops_per_s=None, tensor_pipe_pct=None, arithmetic_intensity=376.4, fp32_ridge=15.0,
             dram_bytes_per_s=37.5e9, dram_peak_bytes_per_s=4.8e12, achieved_occupancy_pct=48.39,
             theoretical_occupancy_pct=50.0, blocks_per_sm=3, limited_by=["registers", "shared memory"],
             registers_per_thread=80, block_size=256, grid_size=1536, shared_total_bytes=33920,
             shared_dynamic_bytes=32896, shared_static_bytes=0, shared_driver_bytes=1024)
    text = ncu_tables.markdown_table(s)
    assert "compute-bound side" in text and "limited jointly by registers and shared memory" in text
    assert "33.92 KB/block" in text and "32.90 KB dynamic" in text


def test_stall_table_from_a_synthetic_summary():
    s = dict(stalls={"wait": 1.9, "selected": 1.0, "short_scoreboard": 0.5, "barrier": 0.1},
             warp_cycles_per_issue=3.5, issued_ipc=1.67)
    rows = ncu_tables.stall_rows(s, top=3)
    assert [r[0] for r in rows] == ["wait", "selected", "short_scoreboard"]
    assert rows[0][2] == pytest.approx(100 * 1.9 / 3.5)
    text = ncu_tables.stall_table(s)
    assert "| wait | 1.90 | 54% |" in text and "3.50 cycles per issued instruction" in text and "1.67" in text
    assert "no warp-state statistics" in ncu_tables.stall_table({"stalls": {}})


@pytest.mark.skipif(not REPORTS, reason="no Nsight Compute report committed under results/h200/ yet")
@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_parsed_values_equal_ncu_pages(report):
    pytest.importorskip("ncu_report", reason="needs NVIDIA's ncu_report module (pip install ncu-report)")
    base = str(report)[: -len(".ncu-rep")]
    details, raw = Path(base + ".details.csv"), Path(base + ".raw.csv")
    assert details.exists(), f"{details.name} missing: profile.py saves it next to each report"
    s = ncu.summarize(report)
    assert s["duration_s"] > 0 and s["registers_per_thread"] > 0 and s["blocks_per_sm"] >= 1
    assert s["dram_bytes_per_s"] > 0 and s["fp32_peak_flops_per_s"] > 0 and s["arithmetic_intensity"] > 0
    printed = ncu_pages.read_details_csv(details)
    for label in ("Duration", "Registers Per Thread", "Achieved Occupancy", "Theoretical Occupancy",
                  "Dynamic Shared Memory Per Block", "Driver Shared Memory Per Block", "Block Limit Registers"):
        assert label in printed, f"{label} not on the details page"
    problems = ncu.compare_with_exports(s, printed, ncu_pages.read_raw_csv(raw) if raw.exists() else None,
                                        ncu.load_action(report))
    assert not problems, "\n".join(problems)
    # profile.py collects WarpStateStats: one figure per stall reason, and they add up to the warp
    # cycles per issued instruction that the details page prints, within 1%; 3% for v8's backward, whose
    # report's per-issue ratios (all of them, wgmma's "gmma" included) add up to 8.13 of its 8.34 cycles
    assert "Warp Cycles Per Issued Instruction" in printed and s["stalls"], "no warp-state statistics"
    tolerance = 0.03 if "v8_backward" in report.name else 0.01
    assert sum(s["stalls"].values()) == pytest.approx(s["warp_cycles_per_issue"], rel=tolerance)
    if ncu.version_of(report.name) == "v6":
        assert s["tensor_ops_per_s"] or s["tensor_pipe_pct"], "v6 runs on tensor cores"


def test_raw_rows_of_several_kernels_and_their_step_metrics(tmp_path):
    """flashattn.measure.sweep --metrics reads one raw page with a row per profiled launch."""
    conflicts = ncu.SHARED["bank_conflicts_ld"]
    stall = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
    raw = tmp_path / "r.raw.csv"
    raw.write_text(f'==PROF== note\n"ID","Kernel Name","{conflicts}","gpu__time_duration.sum","{stall}"\n'
                   '"","","","nsecond","ratio"\n"0","k","1,024","2,000","0.50"\n"1","k","0","1,000","0"\n')
    rows = ncu_pages.read_raw_rows(raw)
    assert len(rows) == 2 and ncu_pages.read_raw_csv(raw) == rows[0]
    names = {"bank_conflicts_ld": conflicts, "duration_s": "gpu__time_duration.sum", "absent": "no.such"}
    counters, stalls = ncu_pages.raw_values(rows[0], names)
    assert counters == {"bank_conflicts_ld": 1024, "duration_s": pytest.approx(2e-6), "absent": None}
    assert stalls == {"barrier": 0.5}
    assert ncu_pages.raw_values(rows[1], names)[1] == {}     # a zero stall is left out, like ncu.stalls


def test_bank_conflict_row_only_when_the_report_has_the_counters():
    s = dict(duration_s=1e-3, fp32_flops_per_s=None, fp32_peak_flops_per_s=None, fp32_pct_of_peak=None,
             tensor_ops_per_s=None, tensor_pipe_pct=None, arithmetic_intensity=None, fp32_ridge=None,
             dram_bytes_per_s=None, dram_peak_bytes_per_s=None, achieved_occupancy_pct=None,
             theoretical_occupancy_pct=None, blocks_per_sm=None, limited_by=[], registers_per_thread=None,
             block_size=None, grid_size=None, shared_total_bytes=None, shared_dynamic_bytes=None,
             shared_static_bytes=None, shared_driver_bytes=None)
    assert "bank conflicts" not in ncu_tables.markdown_table(s)
    s.update(bank_conflicts_ld=12.0, bank_conflicts_st=3.0, shared_wavefronts_ld=1000.0, shared_wavefronts_st=40.0)
    row = "| Shared-memory bank conflicts | 12 load, 3 store | extra wavefronts, out of 1,000 load"
    assert row in ncu_tables.markdown_table(s)


def test_every_profile_collects_the_bank_conflict_counters():
    from types import SimpleNamespace

    from flashattn.measure import profile
    args = SimpleNamespace(kernel_regex=None, warmup=1, dtype=None, batch_size=1, num_heads=1, seq_len=64,
                           head_dim=64, causal=False)
    cmd = profile.ncu_command("ncu", "v6", args, Path("/tmp/x"), ["WarpStateStats"])
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(ncu.SHARED.values())


# ---------------------------------------------------------------- the source page (per SASS instruction)
SOURCE_PAGE = '''"Kernel Name","void k1<int, (int)2>(const int *)"
"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_wait"
"0x10","IMAD.SHL.U32 R70, R230, 0x20, RZ","90","80","1"
"0x20","REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR10][R76.64], R188","5","0","0"
"0x30","LDS R5, [R2]","1","0","0"
"0x40","@P0 IMAD.X R77, RZ, RZ, R66, P0","60","50","0"
"0x50","IADD3 R9, R8, 1, RZ","20","10","0"
"0x60","STG.E desc[UR10][R70.64], R31","1","0","0"
"Kernel Name","void k2<int, (int)3>(const int *)"
"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_wait"
"0x10","BAR.SYNC.DEFER_BLOCKING 0x0","7","7","0"
'''


def test_source_page_round_trip(tmp_path):
    pages = ncu_pages.split_source_page("==PROF== noise\n" + SOURCE_PAGE)
    assert list(pages) == ["void k1<int, (int)2>(const int *)", "void k2<int, (int)3>(const int *)"]
    assert [len(rows) for rows in pages.values()] == [6, 1]
    assert pages["void k1<int, (int)2>(const int *)"][3]["stall_long_sb"] == "50"
    path = tmp_path / "source.csv"
    ncu_pages.write_source_rows(pages, path, labels=["red", "bulk"])
    back = ncu_pages.read_source_rows(path)
    assert list(back) == ["red", "bulk"]
    assert back["red"][1]["Source"].startswith("REDG") and back["bulk"][0]["stall_long_sb"] == "7"
    assert back["red"][0]["stall_mio"] == ""   # a column the page did not have stays empty
    with pytest.raises(ValueError):
        ncu_pages.write_source_rows(pages, path, labels=["only one"])


def test_stall_log_keeps_the_sampled_instructions_of_one_kernel(tmp_path):
    one = SOURCE_PAGE.split('"Kernel Name","void k2')[0].replace('"1","0","0"', '"0","0","0"')
    path = tmp_path / "stalls.csv"
    ncu_pages.write_stall_log(one, path, "the command\n(the commit)")
    text = path.read_text().splitlines()
    assert text[:3] == ["# the command", "# (the commit)",
                        "Address,Source,Warp Stall Sampling (All Samples),stall_long_sb,stall_wait"]
    # the two instructions without a sample left out; addresses from the kernel's first instruction
    assert [ln.split(",")[0] for ln in text[3:]] == ["0x0000", "0x0010", "0x0030", "0x0040"]
    assert next(csv.reader(text[4:5])) == ["0x0010", "REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR10][R76.64], R188",
                                           "5", "0", "0"]
    with pytest.raises(ValueError):   # a page of two kernels
        ncu_pages.write_stall_log(SOURCE_PAGE, path, "x")


def test_register_waits_finds_the_memory_instruction_that_holds_the_register():
    rows = ncu_pages.split_source_page(SOURCE_PAGE)["void k1<int, (int)2>(const int *)"]
    waits = ncu_pages.register_waits(rows, top=3)
    assert [w["samples"] for w in waits] == [80, 50, 10]
    # R70 is read by the STG at the loop's bottom: found by wrapping around, one instruction back
    assert waits[0]["waits_for"] == {"source": "STG.E desc[UR10][R70.64], R31", "distance": 1, "wrapped": True}
    # R77 is the high half of the REDG's 64-bit address R76.64; the predicate does not hide the opcode
    assert waits[1]["waits_for"]["source"].startswith("REDG") and waits[1]["waits_for"]["distance"] == 2
    assert waits[2]["waits_for"] is None                      # R9: no memory instruction reads it
    assert ncu_pages.register_waits(rows, top=2, window=2)[1]["waits_for"] is None   # the REDG is 2 back


def test_recorded_dq_profile_backs_the_backward_chapter():
    """The chapter's claim about results/h200/backward_dq_ncu.*: in the red.global build, most of the
    instructions with the most long-scoreboard samples overwrite a register of a pending REDG, and the bulk
    build has a small fraction of those samples."""
    from flashattn.book.records import RESULTS, ncu_record
    info = ncu_record(RESULTS / "backward_dq_ncu.json")
    pages = ncu_pages.read_source_rows(RESULTS / info["source_csv"])
    assert list(pages) == info["kernels"] == ["v6_layout2", "v6_layout2_bulk"]
    waits = ncu_pages.register_waits(pages["v6_layout2"], top=3)
    assert sum(bool(w["waits_for"]) and w["waits_for"]["source"].startswith("REDG") for w in waits) >= 2, waits

    def long_scoreboard(rows):
        return sum(float(r["stall_long_sb"] or 0) for r in rows)

    assert long_scoreboard(pages["v6_layout2_bulk"]) < 0.25 * long_scoreboard(pages["v6_layout2"])
    assert not any(r["Source"].lstrip().startswith("REDG") for r in pages["v6_layout2_bulk"])


def test_every_backward_file_profiles_its_dk_dv_kernel():
    """`python -m flashattn.measure.profile v6_backward` / `v8_backward` / `fa4_backward`: ncu's filter names a
    kernel that the file declares (FlashAttention-4's: a name of its own), the gradient call is a benchmark
    name (the Hopper backward's the one that trains V8 on it, V6's that of the version it belongs to)."""
    assert set(profile.BACKWARD) == {"v6_backward", "v8_backward", "fa4_backward"}
    for file, (version, kernel, call) in profile.BACKWARD.items():
        if file != "fa4_backward":
            assert kernel in profile.kernel_names(file), (file, kernel)
        assert profile.kernel_filter(file) == "regex:" + kernel
        assert profile.default_dtype(file) == "bfloat16"
        assert call in BACKWARD_NAMES + (version,) and profile.refusal(file) is None
    assert profile.BACKWARD["v8_backward"].call == "v8_backward" and profile.BACKWARD["fa4_backward"].call == "fa4"
    assert profile.BACKWARD["v6_backward"].call == "v6" and "v6_backward" not in BACKWARD_NAMES
    assert "fa4_backward" in profile.refusal("nope")
