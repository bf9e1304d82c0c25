"""Small C++ programs built from code cut out of kernels/*.cu, compiled for the CPU and run: how the concept
figures check their worked examples against the kernel's own arithmetic without a GPU."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

COMPILER = shutil.which("g++") or shutil.which("nvcc")
MISSING = "needs a C++ compiler (g++, or nvcc as one) to run the kernel's code on the CPU"


def run(source: str, stdin: str = "", what: str = "the kernel's code") -> str:
    """Compile `source` (C++17) for the CPU, run it with `stdin` and return what it prints. A compile error
    raises with the program and the compiler's message, naming `what` was cut out of the kernel."""
    if COMPILER is None:
        raise RuntimeError(MISSING)
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "host.cpp", Path(tmp) / "host"
        src.write_text(source)
        language = ["-x", "c++"] if Path(COMPILER).name == "nvcc" else []
        built = subprocess.run([COMPILER, *language, "-std=c++17", "-O1", "-o", str(exe), str(src)],
                               capture_output=True, text=True)
        if built.returncode:
            raise RuntimeError(f"could not compile {what} for the CPU:\n{source}\n{built.stderr}")
        return subprocess.run([str(exe)], input=stdin, check=True, capture_output=True, text=True).stdout
