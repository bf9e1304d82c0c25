"""Build time as a reader meets it: a cold build of one version, then a cached load in a new process.

Both run in subprocesses with a private TORCH_EXTENSIONS_DIR so that nothing cached by other tests
counts. The limits (30 s cold on a 2-core machine, 2 s cached) are the project's budget.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMED_LOAD = """
import time, flashattn
t = time.perf_counter()
flashattn.loader._cached("{name}")
print("SECONDS", time.perf_counter() - t)
"""


def timed_load(name, ext_dir):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext_dir), PYTHONPATH=str(ROOT))
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    res = subprocess.run([sys.executable, "-c", TIMED_LOAD.format(name=name)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return float(res.stdout.split("SECONDS")[-1])


@pytest.mark.parametrize("name", ["v4"])
def test_cold_build_then_cached_load(name, tmp_path):
    cold = timed_load(name, tmp_path)
    cached = timed_load(name, tmp_path)
    print(f"{name}: cold build {cold:.1f} s, cached load {cached:.2f} s")
    assert cold <= 30, f"cold build took {cold:.1f} s"
    assert cached < 2, f"cached load took {cached:.2f} s"
    assert cached < cold / 5
