"""flashattn.loader without a GPU: which architectures a version is built for, what a GPU it cannot run on
is told, one binding signature for every kernel file exported with named arguments and causal=False by
default, and torch's no-GPU notice kept out of the output; on a GPU, `load(v).forward(q, k, v)` as the seed
wrote it."""
from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest
import torch

import flashattn
from flashattn import loader, versions
from flashattn.autograd import TRAINING_VERSIONS

ROOT = Path(__file__).resolve().parent.parent


def binding(version: str) -> str:
    """The host-compiler half of kernels/<version>.cu (after `#else  // ---- PyTorch binding`)."""
    text = (ROOT / "kernels" / f"{version}.cu").read_text()
    return text[text.index("#else  // ---- PyTorch binding"):]


def test_fp32_bindings_share_one_text():
    """v0 ... v4 differ only in their kernels: `diff kernels/v3.cu kernels/v4.cu` shows kernel changes."""
    assert len({binding(v) for v in ("v0", "v1", "v2", "v3", "v4")}) == 1
    forward = re.search(r"at::Tensor forward\(.*?\n}\n", binding("v0"), re.S).group(0)
    assert forward in binding("v5")


@pytest.mark.parametrize("version", flashattn.KERNEL_VERSIONS)
def test_every_binding_takes_causal(version):
    assert re.search(r"at::Tensor forward\(at::Tensor q, at::Tensor k, at::Tensor v, bool causal", binding(version))


@pytest.fixture
def hopper_only(monkeypatch):
    """A version built for sm_90a only, in INFO for the length of one test."""
    v = dataclasses.replace(versions.INFO["v6"], name="vh", archs=("9.0a",), backward="vh_backward")
    monkeypatch.setitem(versions.INFO, "vh", v)
    return v


def test_exact_architectures_ignore_the_arch_list(hopper_only, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert loader.version_archs("vh") == ["9.0a"] and loader.version_archs("vh_backward") == ["9.0a"]
    assert loader.gencode_flags(loader.version_archs("vh")) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert loader.version_archs("v4") is None


def test_build_passes_exact_gencode_and_linker_flags(hopper_only, monkeypatch):
    seen = {}
    ext = loader.cpp_extension()
    monkeypatch.setattr(ext, "load_inline", lambda **kw: seen.update(kw) or "module")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    src = "at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal) {}"
    assert loader.build("vh", src=src, extra_ldflags=["-lcuda"]) == "module"
    assert "-gencode=arch=compute_90a,code=sm_90a" in seen["extra_cuda_cflags"]
    assert not any("compute_80" in f for f in seen["extra_cuda_cflags"])
    assert seen["extra_ldflags"] == ["-lcuda"]


@pytest.mark.parametrize("have,refused", [((8, 0), True), ((9, 0), False), ((10, 0), True)])
def test_exact_architecture_is_required(hopper_only, monkeypatch, have, refused):
    monkeypatch.setattr(loader.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loader.torch.cuda, "get_device_capability", lambda *a: have)
    monkeypatch.setattr(loader.torch.cuda, "get_device_name", lambda *a: "Some GPU")
    if refused:
        with pytest.raises(RuntimeError, match=r"vh needs Hopper \(compute capability 9\.0: wgmma, TMA\)"):
            loader.check_device("vh")
    else:
        loader.check_device("vh")


def test_older_gpu_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(loader.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loader.torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(loader.torch.cuda, "get_device_name", lambda *a: "Some GPU")
    with pytest.raises(RuntimeError, match=r"v6 needs a GPU of compute capability 8\.0 or newer"):
        loader.check_device("v6")
    loader.check_device("v4")


def test_no_cuda_runtime_notice_is_dropped_and_nothing_else(caplog):
    loader.cpp_extension()
    log = logging.getLogger("torch.utils.cpp_extension")
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'")
        log.warning("another warning")
    assert "No CUDA runtime" not in caplog.text and "another warning" in caplog.text


@pytest.mark.parametrize("version", ["v4", "v7"])
def test_shown_load_inline_call_is_the_one_build_makes(version, monkeypatch, tmp_path):
    """The load_inline call a chapter shows (loader.load_inline_call), run as written, passes exactly what
    build() passes; both with a stub load_inline, so nothing compiles."""
    calls = []
    monkeypatch.setattr(loader.cpp_extension(), "load_inline", lambda **kw: calls.append(kw))
    loader.build(version)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / f"{version}.cu").write_text(loader.source(version))
    monkeypatch.chdir(tmp_path)
    exec(loader.load_inline_call(version), {})
    built, shown = calls
    assert built.pop("verbose") is False and "verbose" not in shown
    shown.setdefault("extra_ldflags", [])          # the shown call leaves out an empty linker list
    assert shown == built
    assert built["cpp_sources"] == [loader.source(version), loader.module_def(loader.source(version))]
    assert built["cuda_sources"] == loader.source(version) and "functions" not in built
    assert loader.gencode_flags(loader.version_archs(version) or loader.arch_list())[0] in shown["extra_cuda_cflags"]


# ------------------------------------------------------------------------------------------ module_def
SEED_CALL = 'py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false);'
# every binding the package exports, by kernel file (the training builds add forward_lse, see autograd.py)
EXPORTED = {**{v: ("forward",) for v in flashattn.KERNEL_VERSIONS}, "v5": ("forward", "kernel_info"),
            **{v: ("forward", "forward_lse") for v in TRAINING_VERSIONS},
            "v8": ("forward", "forward_lse", "forward_trace", "forward_varlen", "forward_varlen_lse"),
            "v6_backward": ("backward",)}


@pytest.mark.parametrize("kernel", sorted(EXPORTED))
def test_module_def_names_every_parameter_of_the_binding(kernel):
    """The generated block names each parameter as the .cu file does, in order, so `forward(q=..., k=...,
    v=...)` works; the trailing flags default to false."""
    src = loader.source(kernel)
    text = loader.module_def(src, EXPORTED[kernel])
    assert text.startswith("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n") and text.endswith("}\n")
    for name in EXPORTED[kernel]:
        line = next(li for li in text.splitlines() if li.strip().startswith(f'm.def("{name}"'))
        assert f"torch::wrap_pybind_function({name})" in line
        signature = re.search(rf"^[\w:<>, ]+\b{name}\(([^)]*)\)", src, re.M).group(1)
        assert re.findall(r'py::arg\("(\w+)"\)', line) == [re.findall(r"\w+", p)[-1] for p in signature.split(",")]
        if name.startswith("forward") and name != "forward_trace":   # v6 to v8 also take the scale and window
            info = flashattn.INFO.get(kernel)
            seed = SEED_CALL[:-2] if "varlen" not in name else 'py::arg("max_seqlen_q"), py::arg("causal") = false'
            tail = seed + (', py::arg("scale") = py::none()' if info and info.scale else "")
            tail += ', py::arg("window_left") = -1, py::arg("window_right") = -1' if info and info.window else ""
            assert line.endswith(tail + ");")


def test_defaults_only_where_every_later_parameter_has_one():
    backward = loader.module_def(loader.source("v6_backward"), ("backward",))
    assert backward.count(" = false") == 2
    assert ('py::arg("causal") = false, py::arg("deterministic") = false, py::arg("scale") = py::none(), '
            'py::arg("window_left") = -1, py::arg("window_right") = -1)') in backward
    trace = loader.module_def(loader.source("v8"), ("forward_trace",))
    assert " = false" not in trace and trace.rstrip().endswith('py::arg("causal"), py::arg("trace"));\n}')
    with pytest.raises(ValueError, match="defines no binding kernel_info"):
        loader.module_def(loader.source("v4"), ("kernel_info",))
    assert loader.binding_params("std::tuple<at::Tensor, at::Tensor> f(const at::Tensor& a, std::vector<int, A> b,\n"
                                 "                                      bool c) {", "f") == ["a", "b", "c"]


def test_shown_call_carries_the_bindings():
    shown = loader.load_inline_call("v4")
    assert "cpp_sources=[src, bindings], cuda_sources=src" in shown and SEED_CALL in shown


@pytest.mark.gpu
@pytest.mark.parametrize("version", flashattn.KERNEL_VERSIONS)
def test_seed_call_defaults_to_non_causal(version):
    """`flashattn.load(v).forward(q, k, v)` as the seed wrote it equals forward(q, k, v, False), and the
    arguments go by name too."""
    from test_v7 import is_hopper
    if versions.INFO[version].archs and not is_hopper():
        pytest.skip(f"{version} needs a Hopper GPU")
    dtype = versions.INFO[version].dtypes[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 3, 64, 64, device="cuda", generator=g).to(dtype) for _ in range(3))
    module = flashattn.load(version)
    out = module.forward(q, k, v)
    assert torch.equal(out, module.forward(q, k, v, False))
    assert torch.equal(out, module.forward(q=q, k=k, v=v, causal=False))
    assert torch.isfinite(out).all() and out.abs().sum() > 0
