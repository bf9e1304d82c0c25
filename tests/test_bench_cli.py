"""flashattn.measure.bench and flashattn.measure.profile: argument parsing and refusals (no GPU needed), and a short
real run of every version plus one profile (GPU only)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashattn.measure import bench, profile, results
from flashattn.versions import INFO, VERSIONS

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------- bench
def test_defaults_match_the_seed_suite():
    a = bench.parse_args(["all"])
    assert a.versions == list(VERSIONS)
    assert (a.batch_size, a.num_heads, a.head_dim, a.seq_lens) == (4, 12, 64, [512, 1024, 2048])
    assert (a.warmup, a.repetitions, a.max_seconds, a.dtype, a.causal) == (25, 100, 3.0, "float32", False)
    assert a.rounds == 10


def test_overrides_and_sdpa_variants():
    a = bench.parse_args(["v6", "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "--dtype", "bfloat16",
                          "--causal", "-B", "2", "-H", "16", "-D", "128", "--seq-lens", "8192", "1024",
                          "--warmup", "2", "--repetitions", "3", "--max-seconds", "0.5", "--json", "x.json"])
    assert a.versions == ["v6", "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"]
    assert (a.batch_size, a.num_heads, a.head_dim, a.seq_lens) == (2, 16, 128, [1024, 8192])
    assert (a.dtype, a.causal, a.max_seconds, a.json) == ("bfloat16", True, 0.5, Path("x.json"))
    assert not set(bench.SDPA_BACKENDS) & set(VERSIONS)


def test_backward_mode_names_and_dtype(capsys):
    a = bench.parse_args(["--backward", "all"])
    assert a.backward and a.dtype == "bfloat16"
    assert a.versions == ["v6", "v6_deterministic", "v8_backward", "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
                          "fa4"]
    assert bench.parse_args(["--backward", "v6", "--dtype", "float16"]).dtype == "float16"
    assert bench.parse_args(["v6"]).dtype == "float32"
    for bad, says in ((["--backward", "v7"], "unknown VERSION 'v7' for --backward"),
                      (["--backward", "v6", "--dtype", "float32"], "bfloat16 and float16 only")):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
        assert says in capsys.readouterr().err


def test_unknown_version_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["v99"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown VERSION 'v99'" in err and "sdpa_flash" in err


@pytest.mark.parametrize("bad", [["v4", "--seq-lens", "0"], ["v4", "--repetitions", "0"], ["v4", "--rounds", "0"],
                                 ["v4", "--dtype", "int8"]])
def test_bad_options_are_errors(bad):
    with pytest.raises(SystemExit):
        bench.parse_args(bad)


def test_help_explains_max_seconds_and_variants(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = capsys.readouterr().out
    for word in ("--max-seconds", "calls actually timed", "sdpa_cudnn", "sdpa_kernel", "outside the timed",
                 "--rounds", "interleaved rounds"):
        assert word in text.replace("\n", " ")


def test_help_gives_every_option_a_description_with_its_default(capsys):
    parser = bench.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, f"{action.option_strings} has no help text"
        assert "default" in action.help, f"{action.option_strings} does not state its default"
    for flag, dest in (("-B", "batch_size"), ("-H", "num_heads"), ("-D", "head_dim")):
        assert f"{flag} {dest.upper()}, --{dest.replace('_', '-')} {dest.upper()}" in text
        assert f"(default: {bench.DEFAULTS[dest]})" in text


def test_flop_count():
    assert bench.attention_flops(4, 12, 2048, 2048, 64) == 4 * 4 * 12 * 2048 * 2048 * 64
    assert bench.attention_flops(1, 1, 8, 16, 4, causal=True) == 4 * 8 * 16 * 4 / 2


def _row(version, us, status="ok", **kw):
    r = dict(version=version, batch_size=4, num_heads=12, seq_len_q=2048, seq_len_kv=2048, head_dim=64, dtype="float32",
             causal=False, status=status, message=None if status == "ok" else "no", median_us=us, min_us=us,
             max_us=us, calls_timed=100, requested_repetitions=100, runs_as=version, rel_error=None,
             tflops=1.0, stopped_early=False)
    r.update(kw)
    return r


def test_comparisons_against_baseline_and_sdpa():
    rows = bench.add_comparisons([_row("baseline", 200.0), _row("sdpa", 100.0), _row("v4", 50.0),
                                  _row("v0", None, status="unsupported"), _row("v1", 80.0, seq_len_q=1024)])
    by = {r["version"]: r for r in rows}
    assert by["v4"]["change_vs_baseline_pct"] == pytest.approx(-75.0)
    assert by["v4"]["time_ratio_vs_sdpa"] == pytest.approx(0.5) and by["v4"]["speedup_vs_sdpa"] == pytest.approx(2)
    assert by["v0"]["change_vs_baseline_pct"] is None
    assert by["v1"]["change_vs_baseline_pct"] is None      # no baseline at its shape
    text = bench.format_rows(rows)
    assert "unsupported: no" in text and "-75.0%" in text


def test_json_append(tmp_path):
    path = tmp_path / "b.json"
    bench.write_json({"meta": {"n": 1}, "settings": {}, "rows": [{"median_us": 1.0}]}, path)
    bench.write_json({"meta": {"n": 2}, "settings": {}, "rows": [{"median_us": 2.0}]}, path, append=True)
    runs = results.runs(results.read(path, "bench"))
    assert [(r["meta"]["n"], r["rows"]) for r in runs] == [(1, [{"median_us": 1.0}]), (2, [{"median_us": 2.0}])]
    bench.write_json({"meta": {"n": 3}, "settings": {}, "rows": []}, path)       # without --append: replaced
    assert [r["meta"]["n"] for r in results.runs(results.read(path))] == [3]


def test_help_lists_every_version_that_takes_a_dtype_or_causal(capsys):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split("options:")[1].split())
    dtype_help = set(text.split("--dtype {float32,bfloat16,float16}")[1].split("(default")[0].replace(",", " ").split())
    causal_help = set(text.split("--causal ")[1].split(";")[0].replace(",", " ").replace("(", " ").split())
    for v in VERSIONS:
        assert (v in dtype_help) == (torch.bfloat16 in INFO[v].dtypes), (v, dtype_help)
        assert (v in causal_help) == INFO[v].causal, (v, causal_help)
    assert "v8" in dtype_help and "v8" in causal_help


# -------------------------------------------------------------------------------------- profile
@pytest.mark.parametrize("name", ["baseline", "sdpa", "v0"])
def test_profile_refuses_multi_kernel_and_external_versions(name, capsys):
    with pytest.raises(SystemExit) as exc:
        profile.main([name])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert name in err and ("several" in err or "PyTorch's own" in err)


def test_profile_all_means_the_fused_versions():
    assert profile.PROFILED == tuple(n for n in VERSIONS if INFO[n].kernel and INFO[n].fused)
    assert "v0" not in profile.PROFILED and "v1" in profile.PROFILED
    assert profile.report_stem("v4", 2048) == "flash_v4_s2048_profile"
    assert profile.default_dtype("v6") == "bfloat16" and profile.default_dtype("v4") == "float32"
    for name in VERSIONS:                  # a version without float32 is never profiled in it
        if torch.float32 not in INFO[name].dtypes and name in profile.PROFILED:
            assert profile.default_dtype(name) == "bfloat16"


def test_profile_of_a_backward_kernel_file(tmp_path):
    """v6_backward: the dK/dV kernel only, in a bf16 gradient call, reports named like the forward's (so
    flashattn.measure.ncu.version_of and records.profile_table find them)."""
    assert profile.refusal("v6_backward") is None and profile.owner("v6_backward") == "v6"
    args = profile.build_parser().parse_args(["v6_backward"])
    stem = profile.report_stem("v6_backward", args.seq_len)
    cmd = " ".join(profile.ncu_command("/x/ncu", "v6_backward", args, tmp_path / stem, ["SpeedOfLight"]))
    assert "--kernel-name regex:bwd_dkdv " in cmd and "--target v6_backward --dtype bfloat16" in cmd
    assert "bwd_dkdv" in profile.kernel_names("v6_backward")
    from flashattn.measure.ncu import version_of
    assert version_of(stem + ".ncu-rep") == "v6_backward"


def test_profile_missing_ncu_message(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(profile, "find_ncu", lambda explicit=None: None)
    assert profile.main(["v4", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "ncu" in err and "/usr/local/cuda/bin" in err and "--ncu" in err


def test_find_ncu_looks_in_cuda_home(monkeypatch, tmp_path):
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert profile.find_ncu() == str(fake)


def test_counter_permission_and_empty_profile_are_explained():
    assert "ERR_NVGPUCTRPERM" in profile.diagnose("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert "filter" in profile.diagnose("==WARNING== No kernels were profiled.")
    assert profile.diagnose("==PROF== Disconnected") is None


def test_kernel_names_from_source():
    src = """
    // __global__ void commented_out(int)
    template <int D>
    __global__ void __launch_bounds__(256, 2) flash_fwd_kernel(const float* q) {}
    __global__ void helper_kernel(float* o) {}
    __device__ void not_a_kernel() {}
    """
    assert profile.kernel_names_in(src) == ["flash_fwd_kernel", "helper_kernel"]


def test_ncu_command_shape(tmp_path):
    args = profile.build_parser().parse_args(["v4", "--kernel-regex", "regex:flash"])
    cmd = profile.ncu_command("/x/ncu", "v4", args, tmp_path / "flash_v4_s2048_profile", ["SpeedOfLight", "Occupancy"])
    joined = " ".join(cmd)
    for part in ("--clock-control none", "--launch-count 1", "--launch-skip 1", "--kernel-name regex:flash",
                 "--section SpeedOfLight", "--section Occupancy", "-m flashattn.measure.profile --target v4",
                 "--dtype float32", "--seq-len 2048"):
        assert part in joined


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_short_benchmark_of_every_version(tmp_path):
    out = tmp_path / "bench.json"
    names = list(VERSIONS) + list(bench.SDPA_BACKENDS)
    assert bench.main(names + ["-B", "1", "-H", "2", "-D", "64", "--seq-lens", "128", "--warmup", "2",
                               "--repetitions", "3", "--json", str(out)]) == 0
    run = results.runs(results.read(out, "bench"))[0]
    assert run["meta"]["device"]["name"] and run["meta"]["torch"] == torch.__version__
    rows = {r["version"]: r for r in run["rows"]}
    assert set(rows) == set(names)
    for name in VERSIONS:                           # every version with an fp32 mode takes it at D=64
        r = rows[name]
        if torch.float32 not in INFO[name].dtypes:  # 16-bit only (v7): a row that says why, before any launch
            assert r["status"] == "unsupported" and "dtype" in r["message"], (name, r["message"])
            continue
        assert r["status"] == "ok", (name, r["message"])
        assert r["calls_timed"] == 3 and r["warmups"] == 2 and r["median_us"] > 0
        assert r["rel_error"] < (1e-2 if name == "v6" else 1e-4), name
    assert rows["sdpa_flash"]["status"] == "failed"  # the flash backend refuses float32: a row, not a crash


@pytest.mark.gpu
def test_unsupported_dtype_is_a_row_not_a_crash(tmp_path):
    result = bench.run(bench.parse_args(["v4", "v6", "--dtype", "bfloat16", "-B", "1", "-H", "1", "--seq-lens", "64",
                                         "--warmup", "1", "--repetitions", "2"]))
    rows = {r["version"]: r for r in result["rows"]}
    assert rows["v4"]["status"] == "unsupported" and "dtype" in rows["v4"]["message"]
    assert rows["v6"]["status"] == "ok"


@pytest.mark.gpu
def test_one_profile_run(tmp_path):
    ncu = profile.find_ncu()
    if ncu is None:
        pytest.fail("a GPU machine should have ncu: " + profile.MISSING_NCU)
    proc = subprocess.run([sys.executable, "-m", "flashattn.measure.profile", "v4", "--out", str(tmp_path), "-B", "1",
                           "-H", "4", "--seq-len", "256"], capture_output=True, text=True, cwd=REPO)
    if "ERR_NVGPUCTRPERM" in proc.stdout + proc.stderr:
        pytest.skip("this machine does not let users read GPU performance counters")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = tmp_path / "flash_v4_s256_profile.ncu-rep"
    assert report.exists()
    for suffix in (".details.csv", ".details.txt", ".raw.csv"):
        assert (tmp_path / f"flash_v4_s256_profile{suffix}").stat().st_size > 0
    pytest.importorskip("ncu_report")
    from flashattn.measure import ncu as ncu_parse
    from flashattn.measure import ncu_pages
    s = ncu_parse.summarize(report)
    assert s["registers_per_thread"] > 0 and s["duration_s"] > 0
    problems = ncu_parse.compare_with_exports(
        s, ncu_pages.read_details_csv(tmp_path / "flash_v4_s256_profile.details.csv"),
        ncu_pages.read_raw_csv(tmp_path / "flash_v4_s256_profile.raw.csv"), ncu_parse.load_action(report))
    assert not problems, problems


@pytest.mark.gpu
def test_short_backward_benchmark(tmp_path):
    """--backward: one row per name with "direction": "backward", gradients checked against float64, the
    FLOPs 2.5x the forward's; the backward chapter's reader takes the file."""
    out = tmp_path / "bench_backward.json"
    names = ["v6", "v6_deterministic", "sdpa", "sdpa_flash", "sdpa_cudnn"]
    assert bench.main(["--backward", *names, "-B", "1", "-H", "2", "--seq-lens", "203", "--causal",
                       "--warmup", "1", "--repetitions", "3", "--rounds", "1", "--json", str(out)]) == 0
    run = results.runs(results.read(out, "bench"))[0]
    assert run["settings"]["direction"] == "backward"
    rows = {r["version"]: r for r in run["rows"]}
    assert set(rows) == set(names)
    for name in ("v6", "v6_deterministic", "sdpa_flash"):
        r = rows[name]
        assert r["status"] == "ok" and r["direction"] == "backward", (name, r["message"])
        assert r["flops"] == 2.5 * bench.attention_flops(1, 2, 203, 203, 64, True)
        assert r["median_us"] > 0 and r["rel_error"] < 2e-2, name
    from flashattn.measure.table import load, select_rows
    assert {r["version"] for r in select_rows(load(out), causal=True, direction="backward")[0]} == set(rows)
