"""compute-sanitizer memcheck and racecheck are clean for every kernel (small and odd shapes)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_gpu
from sanitizer_target import head_dims

import flashattn

ROOT = Path(__file__).resolve().parent.parent
pytestmark = needs_gpu


def sanitizer():
    for candidate in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer"):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("compute-sanitizer not found on a GPU machine (install the CUDA toolkit's sanitizer)")


@pytest.fixture(scope="module")
def built():
    for version in flashattn.KERNEL_VERSIONS:  # build outside the sanitizer: nvcc under it is slow
        flashattn.load(version)


def run_sanitized(tool: str, target: str) -> tuple[str, list[str]]:
    """Run tests/<target> under compute-sanitizer's `tool` in one process, check that it is clean, and
    return its output and the "ran ..." lines the target prints per case (so a failure names the case
    before it)."""
    cmd = [sanitizer(), f"--tool={tool}", "--error-exitcode=99", sys.executable, str(ROOT / "tests" / target)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-4000:]
    return out, [line for line in out.splitlines() if line.startswith("ran ")]


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_sanitizer_clean(built, tool):
    """One sanitized process per tool runs every kernel (starting CUDA under the sanitizer is the slow
    part)."""
    out, ran = run_sanitized(tool, "sanitizer_target.py")
    for version in flashattn.KERNEL_VERSIONS:
        for D in head_dims(flashattn.INFO[version]):   # every head dim the kernel has its own code for
            assert any(line.startswith(f"ran {version} ") and line.endswith(f" D={D}") for line in ran), \
                f"{version} at D={D} did not run under {tool}"
