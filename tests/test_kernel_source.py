"""flashattn.measure.kernel_source: a kernel file with its build switches resolved to the defaults is the
same kernel (the same SASS, function by function, compiled as the loader compiles the file) and holds no
switch and no trace stamp. No GPU needed; the SASS comparison needs nvcc and cuobjdump."""
from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flashattn.loader import KERNELS_DIR
from flashattn.measure import kernel_source, sass
from flashattn.measure.resources import nvcc

SWITCHED = [v for v in kernel_source.versions() if kernel_source.family((KERNELS_DIR / f"{v}.cu").read_text())]


def missing_tool() -> str | None:
    if shutil.which(nvcc()) is None and not Path(nvcc()).is_file():
        return "nvcc not found (set CUDA_HOME)"
    if sass.find_tool("cuobjdump") is None:
        return "cuobjdump not found: not in CUDA_HOME/bin, PATH, the triton wheel or an nvidia-* pip package"
    return None


def function_bodies(cubin: Path) -> dict[str, list[str]]:
    """{mangled name: its SASS lines (instructions and encodings)} of a cubin, from `cuobjdump -sass`."""
    out = subprocess.run([sass.find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                         check=True).stdout
    bodies, name = {}, None
    for line in out.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            name = m.group(1)
            bodies[name] = []
        elif name is not None and line.strip().startswith("/*"):
            bodies[name].append(line.strip())
    return bodies


def compile_cubin(version: str, source: Path, cubin: Path) -> Path:
    """`source` compiled as measure.sass compiles kernels/<version>.cu: the loader's flags and target,
    the kernel half only."""
    cmd = sass.compile_command(version, cubin)
    assert cmd[-1] == str(KERNELS_DIR / f"{version}.cu")
    res = subprocess.run([*cmd[:-1], str(source)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return cubin


@pytest.mark.parametrize("version", SWITCHED)
def test_resolved_file_compiles_to_the_same_sass(version, tmp_path):
    if reason := missing_tool():
        pytest.skip(reason)
    clean = tmp_path / f"{version}.cu"
    clean.write_text(kernel_source.kernel_source(version))
    with ThreadPoolExecutor(2) as pool:
        before, after = pool.map(lambda a: function_bodies(compile_cubin(version, *a)),
                                 [(KERNELS_DIR / f"{version}.cu", tmp_path / "file.cubin"),
                                  (clean, tmp_path / "clean.cubin")])
    assert before and all(before.values())
    assert sorted(after) == sorted(before)
    for name, body in before.items():
        assert after[name] == body, f"{version}: {name} differs"


@pytest.mark.parametrize("version", SWITCHED)
def test_resolved_file_has_no_switch_and_no_trace(version):
    text = kernel_source.kernel_source(version)
    prefixes = kernel_source.family((KERNELS_DIR / f"{version}.cu").read_text())
    assert prefixes
    names = "|".join(re.escape(p) for p in prefixes)
    assert not re.search(rf"^\s*#\s*(if|ifdef|ifndef|elif)\b.*\b({names})", text, re.M)
    assert not re.search(rf"^\s*#\s*define\s+({names})\w*\s", text, re.M)    # function-like ones may stay
    assert not any(name.startswith(prefixes) for name in kernel_source.switches(text))
    assert not re.search(r"\b(V8_STAMP|V8_HEADS?|V8_TAIL|V8_TRACE_ROW|V8_TRACE_PARAMS|V8_TRACE_ARGS|trace_store|"
                         r"clock_now)\b", text)
    assert text.startswith(f"// kernels/{version}.cu with every build switch at its default")


def test_v8_keeps_only_its_wgmma_operand_macros():
    """The family's function-like macros with a body (the asm operand lists) are code, not switches."""
    defined = re.findall(r"^\s*#\s*define\s+(V8_\w+)", kernel_source.kernel_source("v8"), re.M)
    assert defined and all(re.fullmatch(r"V8_ACC\d+", name) for name in defined)


def test_files_without_switches_are_printed_as_they_are():
    assert "v4" not in SWITCHED
    assert kernel_source.kernel_source("v4") == (KERNELS_DIR / "v4.cu").read_text()


def test_unknown_version_is_refused_by_name(capsys):
    with pytest.raises(ValueError, match="'v9'"):
        kernel_source.kernel_source("v9")
    with pytest.raises(SystemExit):
        kernel_source.main(["v9"])
    assert "'v9'" in capsys.readouterr().err


def test_out_writes_the_file(tmp_path):
    out = tmp_path / "v7.cu"
    assert kernel_source.main(["v7", "--out", str(out)]) == 0
    assert out.read_text() == kernel_source.kernel_source("v7")


SNIPPET = """\
// The step's switch.
#ifndef X_ON
#define X_ON 1
#endif
#ifndef X_WIDTH
#define X_WIDTH (X_ON ? 3 : 2)
#endif
#if X_TRACE
#define X_STAMP(t) store(t)
#define X_PARAMS , int* trace
#else
#define X_STAMP(t) ((void)0)
#define X_PARAMS
#endif
#ifdef __CUDACC__
int width = X_WIDTH;   // X_WIDTH stays in comments
const char* s = "X_ON";
#if X_ON && X_WIDTH == 3
int a = 1;
#elif X_ON
int a = 2;
#else
int a = 3;
#endif
// a comment about the code below
X_STAMP(0);
int g(int x X_PARAMS);
#endif
"""


def test_resolve_evaluates_defaults_values_and_no_ops():
    out = kernel_source.resolve(SNIPPET, ("X_",))
    assert out == ("#ifdef __CUDACC__\n"
                   "int width = 3;   // X_WIDTH stays in comments\n"
                   'const char* s = "X_ON";\n'
                   "int a = 1;\n"
                   "// a comment about the code below\n"
                   "int g(int x);\n"
                   "#endif\n")
