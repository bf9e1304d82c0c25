"""Build kernels/<name>.cu with torch.utils.cpp_extension.load_inline and cache the result.

The same file text goes to both compilers (see kernels/README.md): nvcc compiles the kernel half and
never sees PyTorch's headers; the host compiler compiles the small binding half. Passing
`no_implicit_headers=True` keeps load_inline from prepending <torch/types.h> to the CUDA half, which is
what makes a cold build take seconds instead of a minute.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from flashattn.versions import ARCH_FEATURES, INFO, KERNEL_VERSIONS

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS_DIR = REPO_ROOT / "kernels"
NVCC_FLAGS = ["-O3", "-lineinfo", "-std=c++17"]
# Defaults of the bindings' trailing arguments, as C++ (pybind11) and as Python reads them, so that
# `forward(q, k, v)` reads as the seed wrote it (causal=False); scale=None is 1/sqrt(D) (v6 to v8), and a
# sliding-window side -1 bounds nothing (window_left, window_right: v6 to v8 and v6_backward).
ARG_DEFAULTS = {"causal": ("false", "False"), "deterministic": ("false", "False"), "scale": ("py::none()", "None"),
                "window_left": ("-1", "-1"), "window_right": ("-1", "-1")}
# Kernel files whose bindings are not `forward` (nor a version's `backward`): the functions they export.
KERNEL_FUNCTIONS = {"decode": ("decode", "tile_keys"), "v8_backward": ("backward",)}
# Kernel files no version names yet (flashattn.versions) that must be built for exact architectures: a
# Hopper backward written before its GPU tests, which is no version's backward until it passes them.
KERNEL_ARCHS = {"v8_backward": ("9.0a",)}


class _NoRuntimeNotice(logging.Filter):
    """Drops torch's "No CUDA runtime is found, using CUDA_HOME=..." warning, logged when
    torch.utils.cpp_extension is imported on a machine without a GPU. Compiling without a GPU is what
    this package does on purpose there (the kernels are checked by building them), so the notice would
    only repeat itself in every notebook output; every other message of that logger still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No CUDA runtime is found")


def cpp_extension():
    """torch.utils.cpp_extension, imported with the one notice above filtered out (the only place this
    package imports it)."""
    log = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoRuntimeNotice) for f in log.filters):
        log.addFilter(_NoRuntimeNotice())
    # imported here, not at the top: it is slow to import and logs the notice above, and only a build needs it
    from torch.utils import cpp_extension as module
    return module


def find_cuda_home() -> str | None:
    """Torch guesses CUDA_HOME from `which nvcc`, which is wrong when nvcc is a wrapper script in
    /usr/local/bin; follow the real toolkit instead."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    for candidate in ("/usr/local/cuda",):
        if (Path(candidate) / "bin" / "nvcc").exists():
            return candidate
    nvcc = shutil.which("nvcc")
    return str(Path(nvcc).resolve().parent.parent) if nvcc else None


def arch_list() -> list[str]:
    """Compute capabilities to compile for, as "8.0"-style strings.

    TORCH_CUDA_ARCH_LIST wins when set; otherwise the GPU in this machine; with neither, sm_90 (the H200
    the book was measured on), which is enough to check that the kernel compiles.
    """
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(",", ";").replace(" ", ";")
    archs = [a for a in env.split(";") if a]
    if archs:
        return archs
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return [f"{major}.{minor}"]
    return ["9.0"]


def gencode_flags(archs: list[str]) -> list[str]:
    flags = []
    for arch in archs:
        ptx = arch.endswith("+PTX")
        num = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def source(kernel: str) -> str:
    path = KERNELS_DIR / f"{kernel}.cu"
    if not path.exists():
        raise ValueError(f"no kernel file {kernel!r} (looked for {path})")
    return path.read_text()


def excerpt(kernel: str, first: str, last: str | None = None, text: str | None = None) -> str:
    """The lines of kernels/<kernel>.cu (or of `text`) from the first that contains `first` to the first after
    it that contains `last` (only that line when `last` is None): what a chapter quotes of a kernel, cut by
    text so that it follows the file. ValueError naming the missing line when the file no longer has it."""
    lines = (source(kernel) if text is None else text).splitlines()
    start = next((n for n, s in enumerate(lines) if first in s), None)
    if start is None:
        raise ValueError(f"kernels/{kernel}.cu has no line containing {first!r}: update the excerpt")
    if last is None:
        return lines[start]
    end = next((n for n in range(start, len(lines)) if last in lines[n]), None)
    if end is None:
        raise ValueError(f"kernels/{kernel}.cu has no line containing {last!r} after {first!r}: update the excerpt")
    return "\n".join(lines[start:end + 1])


def _owner(kernel: str):
    """The Version a kernel file belongs to: itself, or the version whose backward it is."""
    if kernel in INFO:
        return INFO[kernel]
    return next((v for v in INFO.values() if v.backward == kernel), None)


def version_archs(kernel: str) -> list[str] | None:
    """The exact architectures kernel file `kernel` must be built for, or None for arch_list()."""
    owner = _owner(kernel)
    if owner is None and kernel in KERNEL_ARCHS:
        return list(KERNEL_ARCHS[kernel])
    return list(owner.archs) if owner is not None and owner.archs else None


def _capability(arch: str) -> tuple[int, int]:
    major, minor = arch.removesuffix("+PTX").rstrip("a").split(".")
    return int(major), int(minor)


def check_device(kernel: str) -> None:
    """Refuse, with the reason, a GPU the kernel cannot run on: older than the instructions it uses, or,
    for an architecture-specific build ("9.0a"), any other architecture."""
    if not torch.cuda.is_available():
        return
    have = torch.cuda.get_device_capability()
    owner = _owner(kernel)
    label = owner.name if owner is not None else kernel
    exact = version_archs(kernel)
    if exact:
        if have not in {_capability(a) for a in exact}:
            needs = "; ".join(
                f"{ARCH_FEATURES[a][0]} (compute capability {'.'.join(map(str, _capability(a)))}: "
                f"{ARCH_FEATURES[a][1]})" if a in ARCH_FEATURES else f"compute capability {a}" for a in exact)
            raise RuntimeError(f"{label} needs {needs}; this {torch.cuda.get_device_name()} is "
                               f"{have[0]}.{have[1]}")
        return
    need = owner.min_sm if owner is not None else (7, 0)
    if have < need:
        raise RuntimeError(f"{label} needs a GPU of compute capability {need[0]}.{need[1]} or newer "
                           f"(it uses cp.async/mma.sync); this {torch.cuda.get_device_name()} is "
                           f"{have[0]}.{have[1]}")


def binding_params(src: str, function: str) -> list[str]:
    """Parameter names of `function` as the binding half of a kernel file defines it (the last definition
    in the text: the binding comes after the kernels), e.g. ["q", "k", "v", "causal"]."""
    found = re.findall(rf"^[A-Za-z_][\w:<>, ]*?\b{function}\(([^)]*)\)\s*\{{", src, re.M)
    if not found:
        raise ValueError(f"the kernel source defines no binding {function}(...) to export")
    pieces, depth = [""], 0
    for ch in found[-1]:                       # split at the commas outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            pieces.append("")
        else:
            pieces[-1] += ch
    return [re.findall(r"\w+", piece)[-1] for piece in pieces if piece.strip()]


def module_def(src: str, functions=("forward",)) -> str:
    """The PYBIND11_MODULE block that exports `functions` with named arguments and the defaults of
    ARG_DEFAULTS, so that `forward(q, k, v)` means causal=False. load_inline's own `functions=` would
    export them positional-only, without defaults. A default is given only where every later parameter
    has one too, as Python requires."""
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for name in functions:
        args, tail_defaults = [], True
        for param in reversed(binding_params(src, name)):
            tail_defaults = tail_defaults and param in ARG_DEFAULTS
            args.append(f'py::arg("{param}")' + (f" = {ARG_DEFAULTS[param][0]}" if tail_defaults else ""))
        named = "".join(f", {a}" for a in reversed(args))
        lines.append(f'  m.def("{name}", torch::wrap_pybind_function({name}){named});')
    return "\n".join(lines + ["}"]) + "\n"


def load_inline_kwargs(kernel: str, extra_cuda_cflags=None, module_name: str | None = None, archs=None,
                       extra_ldflags=None) -> dict:
    """The keyword arguments `build` passes to torch.utils.cpp_extension.load_inline, less the sources
    (cpp_sources: the file's text and its module_def; cuda_sources: the file's text) and `verbose`."""
    # FLASHATTN_CUDA_FLAGS (space-separated, e.g. "-DV6_D128_STAGES=3") lets an experiment rebuild every
    # kernel with other tile macros without editing the files.
    env_flags = os.environ.get("FLASHATTN_CUDA_FLAGS", "").split()
    archs = archs or version_archs(kernel) or arch_list()
    return dict(name=module_name or f"flashattn_{kernel}", extra_cflags=["-O2"],
                extra_cuda_cflags=NVCC_FLAGS + gencode_flags(archs) + env_flags + list(extra_cuda_cflags or []),
                extra_ldflags=list(extra_ldflags or []), no_implicit_headers=True)


def python_signature(src: str, name: str) -> str:
    """How the module's `name` reads from Python, e.g. "forward(q, k, v, causal=False)" (module_def's defaults)."""
    params, tail = [], True
    for param in reversed(binding_params(src, name)):
        tail = tail and param in ARG_DEFAULTS
        params.append(f"{param}={ARG_DEFAULTS[param][1]}" if tail else param)
    return f"{name}({', '.join(reversed(params))})"


def load_inline_call(kernel: str, functions=None) -> str:
    """The Python a reader can run without this package to build kernels/<kernel>.cu as `load` does: the
    same load_inline call with the same arguments (from load_inline_kwargs and module_def, so the two
    cannot drift). `functions`: the binding's functions, by default ("backward",) for a version's backward
    file (flashattn.versions: `backward`), KERNEL_FUNCTIONS's for the files it names and ("forward",) for
    every other."""
    if functions is None:
        functions = KERNEL_FUNCTIONS.get(kernel) or (
            ("backward",) if any(i.backward == kernel for i in INFO.values()) else ("forward",))
    src = source(kernel)
    kw = load_inline_kwargs(kernel)
    if not kw["extra_ldflags"]:
        del kw["extra_ldflags"]
    args = ",\n    ".join(f"{k}={v!r}" for k, v in kw.items())
    names = ", ".join(python_signature(src, name) for name in functions)
    return ("from pathlib import Path\nfrom torch.utils.cpp_extension import load_inline\n\n"
            f'src = Path("kernels/{kernel}.cu").read_text()   # nvcc and the host compiler get the same text\n'
            f"# the Python module: {names}, arguments by name or position\n"
            f'bindings = """\\\n{module_def(src, functions)}"""\n'
            f"module = load_inline(\n    cpp_sources=[src, bindings], cuda_sources=src,\n    {args})\n")


def build(kernel: str, extra_cuda_cflags: list[str] | None = None, verbose: bool = False,
          module_name: str | None = None, src: str | None = None, functions=("forward",),
          archs: list[str] | None = None, extra_ldflags: list[str] | None = None):
    """Compile (or fetch from torch's extension cache) one kernel file; returns the extension module.

    torch rebuilds when the source text or the flags change, so editing a .cu and calling this again is
    enough. `extra_cuda_cflags` (for example -D macros of a tile sweep) and `module_name` let scripts
    build variants side by side; `functions` names the binding's functions to export (v5 also has
    `kernel_info`). `archs` overrides the architectures: by default a version's own `archs` (built
    exactly, e.g. "9.0a" gives -gencode=arch=compute_90a,code=sm_90a), else `arch_list()`.
    `extra_ldflags` goes to the linker (e.g. -lcuda for the driver API).
    """
    cuda_home = find_cuda_home()
    if cuda_home:
        os.environ["CUDA_HOME"] = cuda_home
    ext = cpp_extension()
    if cuda_home:
        ext.CUDA_HOME = cuda_home
    src = source(kernel) if src is None else src
    kw = load_inline_kwargs(kernel, extra_cuda_cflags, module_name, archs, extra_ldflags)
    return ext.load_inline(cpp_sources=[src, module_def(src, functions)], cuda_sources=src, verbose=verbose, **kw)


@functools.cache
def _cached(kernel: str):
    return build(kernel)


def load(version: str):
    """The compiled extension of kernel version `version` (flashattn.KERNEL_VERSIONS); built once per process.

    The returned module's `forward(q, k, v, causal=False)` is the raw binding: it checks its inputs in C++
    and refuses head dims its kernel does not take, and causal=True where the kernel has no mask.
    `flashattn.forward` adds the friendlier Python checks and routes such head dims to the fallback
    version.
    """
    if version not in INFO or not INFO[version].kernel:
        raise ValueError(f"load() builds CUDA kernels: version must be one of {', '.join(KERNEL_VERSIONS)}; "
                         f"got {version!r}")
    check_device(version)
    return _cached(version)
