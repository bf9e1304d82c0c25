"""A reader copies one kernel file into their own project and builds it with torch.utils.cpp_extension
alone -- no flashattn, no other file from this repository."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

READER_SCRIPT = r"""
import torch
from torch.utils.cpp_extension import load_inline

src = open("attention.cu").read()
mod = load_inline("my_attention", cpp_sources=src, cuda_sources=src, functions=["forward"],
                  extra_cuda_cflags=["-O3"], no_implicit_headers=True)
print("BUILT", mod.forward.__doc__ is not None)
if torch.cuda.is_available():
    q = torch.randn(2, 3, 113, 64, device="cuda")
    k = torch.randn(2, 3, 203, 64, device="cuda")
    v = torch.randn(2, 3, 203, 64, device="cuda")
    out = mod.forward(q, k, v, False)   # every binding: forward(q, k, v, causal)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8.0, -1) @ v.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print("RELERR", err)
    assert err < 1e-5
"""


@pytest.mark.parametrize("name", ["v4"])
def test_copied_file_builds_alone(name, tmp_path):
    shutil.copy(ROOT / "kernels" / f"{name}.cu", tmp_path / "attention.cu")
    (tmp_path / "reader.py").write_text(READER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    if not env.get("CUDA_HOME") and Path("/usr/local/cuda/bin/nvcc").exists():
        env["CUDA_HOME"] = "/usr/local/cuda"
    res = subprocess.run([sys.executable, "reader.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "BUILT True" in res.stdout
    import torch
    if torch.cuda.is_available():
        assert "RELERR" in res.stdout
