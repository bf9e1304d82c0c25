"""v7 (wgmma + TMA, sm_90a): what the compiler made of it, and what it computes on a Hopper GPU.

CPU tests (nvcc, no GPU): the file compiles for sm_90a in every tile variant the chapter times; ptxas
reports no spills and no stack frame; the SASS of every kernel has HGMMA (both products on wgmma),
UTMALDG (TMA loads) and no local memory (LDL/STL); no warning such as C7508 (ignored setmaxnreg) or a
serialised wgmma; and the file, copied alone into another directory, builds with load_inline.

GPU tests (a GPU of compute capability 9.0 only): the kernel against a float64 reference, error at most
twice what PyTorch's SDPA makes in the same dtype; odd shapes, M != N both ways, causal rows with no key
equal to 0; poisoned outputs; refusals; and a compute-sanitizer run (memcheck, racecheck, synccheck) of
this same file as its own small driver (`python tests/test_v7.py --sanitize`).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "v7.cu"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import conftest  # noqa: E402

from flashattn.measure.resources import nvcc  # noqa: E402
from flashattn.measure.sass import find_tool  # noqa: E402
from flashattn.measure.variants import SETS  # noqa: E402
from flashattn.reference import attention_reference, window_mask  # noqa: E402
from flashattn.versions import INFO  # noqa: E402

GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
# The builds checked here: the default and one build per kind of step the chapter times (both head dims each).
BUILDS = {name: v.flags for name, v in SETS["v7-builds"].items()}


def cuobjdump() -> str:
    tool = find_tool("cuobjdump")   # CUDA_HOME, PATH, or the copy in Triton's wheel on GPU-less machines
    if tool is None:
        pytest.fail("cuobjdump not found (CUDA toolkit at CUDA_HOME, PATH or the triton wheel)")
    return tool


def compile_v7(tmp_path: Path, flags: list[str]) -> tuple[str, str]:
    """nvcc on the kernel half alone; returns (ptxas report with warnings, SASS)."""
    obj = tmp_path / "v7.o"
    res = subprocess.run([nvcc(), GENCODE, "-O3", "-std=c++17", "-Xptxas", "-v", "-c", "-x", "cu",
                          str(KERNEL), "-o", str(obj), *flags], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    sass = subprocess.run([cuobjdump(), "--dump-sass", str(obj)], capture_output=True, text=True,
                          timeout=300)
    assert sass.returncode == 0, sass.stderr[-2000:]
    return res.stderr + res.stdout, sass.stdout


def sass_functions(sass: str) -> dict[str, str]:
    """SASS text per kernel (cuobjdump prints 'Function : <mangled name>' before each)."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def kernel_count(version: str) -> int:
    """Entry functions in `version`'s default build: one per dtype, head dim and mask (causal or not)."""
    info = INFO[version]
    return len(info.dtypes) * len(info.head_dims) * 2


def ptxas_entries(report: str, version: str = "v7", spills_allowed=False) -> list[tuple[str, int]]:
    """(kernel, registers) of each entry function of `version`'s build (kernel_count of them) in ptxas's
    verbose report, checking that none has a stack frame or spills and that ptxas warned of nothing (C7508:
    setmaxnreg ignored, C7510: wgmma serialised, ...); `spills_allowed` for a control build that spills on
    purpose: True, or a function of the kernel's name saying which kernels may. test_v8 uses it too."""
    entries = re.findall(r"Compiling entry function '(\S+)'.*?Used (\d+) registers", report, re.S)
    assert len(entries) == kernel_count(version), \
        f"expected {version}'s dtypes x head dims x causal/not kernels, got {entries}"
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(frames) == len(entries)
    for (name, _), frame in zip(entries, frames):   # ptxas reports an entry's frame before its registers
        allowed = spills_allowed(name) if callable(spills_allowed) else spills_allowed
        assert allowed or frame == ("0", "0", "0"), f"{name}: stack frame or spills: {frame}"
    for line in report.splitlines():
        assert "warning" not in line.lower(), line
    return [(name, int(regs)) for name, regs in entries]


SPILLING = {"tma0_minb2"}


@pytest.mark.parametrize("variant", list(BUILDS))
def test_compiles_for_sm90a_without_spills(variant, tmp_path):
    report, sass = compile_v7(tmp_path, BUILDS[variant])
    entries = ptxas_entries(report, spills_allowed=variant in SPILLING)
    assert max(regs for _, regs in entries) <= 255

    funcs = {name: text for name, text in sass_functions(sass).items() if "flash_fwd_wgmma" in name}
    assert len(funcs) == len(entries)
    for name, text in funcs.items():
        assert "HGMMA" in text, f"{name}: no wgmma in the SASS"
        # the P V product takes P from registers: an HGMMA whose A operand is a register, not gdesc
        assert re.search(r"HGMMA\.\S+ R\d+, R\d+, gdesc", text), f"{name}: no register-A HGMMA"
        assert re.search(r"HGMMA\.\S+ R\d+, gdesc", text), f"{name}: no shared-memory HGMMA"
        if "-DV7_TMA=0" in BUILDS[variant]:
            assert "LDGSTS" in text and "UTMALDG" not in text, f"{name}: expected cp.async, not TMA"
        else:
            assert "UTMALDG" in text, f"{name}: no TMA load"
        if variant in SPILLING:
            # the TMA step's control asks __launch_bounds__ for two blocks per SM at D=64: ptxas fits it in 128
            # registers by spilling, which the chapter reports; the D=128 instances keep their registers
            spills = bool(re.search(r"\b(LDL|STL)\b", text))
            assert spills == ("Li64E" in name or ", 64," in name), f"{name}: spills {spills}"
        else:
            assert not re.search(r"\b(LDL|STL)\b", text), f"{name} uses local memory"
        assert "HMMA" not in text.replace("HGMMA", ""), f"{name} still has mma.sync"


COPY_SCRIPT = r"""
import torch
from torch.utils.cpp_extension import load_inline

src = open("attention.cu").read()
mod = load_inline("my_attention_v7", cpp_sources=src, cuda_sources=src, functions=["forward"],
                  extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], no_implicit_headers=True)
print("BUILT", mod.forward.__doc__ is not None)
if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
    q = torch.randn(2, 3, 113, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 3, 203, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 3, 203, 128, device="cuda", dtype=torch.bfloat16)
    out = mod.forward(q, k, v, False, None, -1, -1)   # causal, scale (None: 1/sqrt(D)), window (-1: no bound)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 128 ** 0.5, -1) @ v.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print("RELERR", err)
    assert err < 1e-2
"""


def test_copied_file_builds_alone(tmp_path):
    """A reader copies kernels/v7.cu into their own project and builds it with load_inline alone, naming
    the sm_90a target themselves (no flashattn on the path, no -lcuda)."""
    shutil.copy(KERNEL, tmp_path / "attention.cu")
    (tmp_path / "reader.py").write_text(COPY_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    env["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    if not env.get("CUDA_HOME") and Path("/usr/local/cuda/bin/nvcc").exists():
        env["CUDA_HOME"] = "/usr/local/cuda"
    res = subprocess.run([sys.executable, "reader.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "BUILT True" in res.stdout
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        assert "RELERR" in res.stdout


# ================================================================ GPU tests
def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not is_hopper(), reason="v7 needs a GPU of compute capability 9.0")
DTYPES = conftest.HALF_DTYPES


def build_v7(variant: str = "default"):
    from flashattn.loader import build
    return build("v7", archs=["9.0a"], module_name=f"flashattn_v7_{variant}", extra_cuda_cflags=BUILDS[variant])


@pytest.fixture(scope="module")
def v7():
    return build_v7()


def sdpa(q, k, v, causal, scale=None, window=(-1, -1)):
    """PyTorch's own result in the input dtype (its default backend choice; k and v with fewer heads than
    q through its enable_gqa; causal and a sliding window as an explicit boolean mask); rows with no key
    -> 0."""
    mask = window_mask(q.shape[2], k.shape[2], causal, window, q.device)
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)
    return torch.nan_to_num(out, nan=0.0)


def check(v7, B, H, M, N, D, dtype, causal, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, H, M, D, device="cuda", generator=g) * q_scale).to(dtype)
    k = torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype)
    conftest.poison_allocator(q)   # the output's future memory holds NaN: a forgotten element stays NaN
    out = v7.forward(q, k, v, causal)
    torch.cuda.synchronize()
    return check_output(out, q, k, v, causal)


def check_output(out, q, k, v, causal, scale=None, window=(-1, -1)):
    """`out`, an attention output of q, k, v (causal, softmax scale, sliding window), against float64: max
    abs error at most twice SDPA's in the same dtype + 1e-5, every element written and finite, rows that
    see no key 0. Returns (ours, SDPA's)."""
    M, N = q.shape[2], k.shape[2]
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.isfinite(out).all(), "non-finite output (unwritten or NaN element)"
    ref = attention_reference(q, k, v, causal=causal, dtype=torch.float64, scale=scale, window=window)
    ours = (out.double() - ref).abs().max().item()
    theirs = (sdpa(q, k, v, causal, scale, window).double() - ref).abs().max().item()
    assert ours <= 2 * theirs + 1e-5, f"max abs error {ours:.3e} > 2 x SDPA's {theirs:.3e} + 1e-5"
    mask = window_mask(M, N, causal, window, q.device)
    if mask is not None:   # rows that see no key (causal with M > N, or a window past the keys): 0
        assert (out[:, :, ~mask.any(1)] == 0).all()
    return ours, theirs


SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (1023, 1025), (1025, 1023), (1, 1025), (1024, 1),
          (2048, 2048)]


def correctness_tests(version: str, fixture: str, build, variants, variant_shapes, logit_seed: int, tag=()):
    """The three float64 comparisons a Hopper version's tests share (test_v8 takes them too): the default
    build (`fixture`, a module-scoped fixture of the test file) at every shape of SHAPES, both dtypes, head
    dims and masks, B and H of 1 and more; large logits; and every step variant but the default (`build`)
    at `variant_shapes`. `tag` goes into the seeds, so each file draws its own inputs. Assign the result
    to three test_ names at module level for pytest to collect them."""
    needs_sm90 = pytest.mark.skipif(not is_hopper(), reason=f"{version} needs a GPU of compute capability 9.0")

    @pytest.mark.gpu
    @needs_sm90
    @pytest.mark.parametrize("B,H", [(1, 1), (2, 3)])
    @pytest.mark.parametrize("M,N", SHAPES)
    @conftest.every_half_case
    def test_matches_float64(request, dtype, causal, D, M, N, B, H):
        seed = zlib.crc32(repr(tag + (dtype, causal, D, M, N, B, H)).encode())
        check(request.getfixturevalue(fixture), B, H, M, N, D, DTYPES[dtype], causal, seed)

    @pytest.mark.gpu
    @needs_sm90
    @conftest.every_half_case
    def test_large_logits(request, dtype, D, causal):
        # q x 20: scores far beyond exp's range without the running max
        check(request.getfixturevalue(fixture), 2, 2, 300, 517, D, DTYPES[dtype], causal, seed=logit_seed + D,
              q_scale=20.0)

    @pytest.mark.gpu
    @needs_sm90
    @pytest.mark.parametrize("variant", [v for v in variants if v != "default"])
    def test_variants_match_float64(variant):
        """Every step variant the chapter times computes the same thing (fewer shapes than the default)."""
        mod = build(variant)
        for M, N in variant_shapes:
            for D in (64, 128):
                for causal in (False, True):
                    for dtype in DTYPES.values():
                        seed = zlib.crc32(repr(tag + (variant, M, N, D, causal, dtype)).encode())
                        check(mod, 2, 3, M, N, D, dtype, causal, seed)

    return test_matches_float64, test_large_logits, test_variants_match_float64


test_matches_float64, test_large_logits, test_variants_match_float64 = correctness_tests(
    "v7", "v7", build_v7, BUILDS, [(113, 203), (1025, 1023), (17, 1), (300, 1100)], logit_seed=11)


@pytest.mark.gpu
@needs_hopper
def test_many_heads_tail_tiles_stay_in_their_head(v7):
    """N = 129 leaves a one-key tail tile in every head; the 3-D tensor map must zero-fill it rather than
    read the next head's first keys (which here are huge, so a leak would show)."""
    B, H, M, N, D = 2, 5, 70, 129, 128
    q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) * 100
    out = v7.forward(q, k, v, False)
    ref = attention_reference(q, k, v, dtype=torch.float64)
    theirs = (sdpa(q, k, v, False).double() - ref).abs().max().item()
    assert (out.double() - ref).abs().max().item() <= 2 * theirs + 1e-5


def refuses_bad_inputs_then_runs(mod, refused_dims) -> None:
    """conftest.bad_inputs, float32, an empty sequence, and q, k, v at each head dim of `refused_dims` (ones
    the binding has no kernel for) are refused; a good call after them works. Shared with test_v8, whose
    refused head dims differ."""
    good, cases = conftest.bad_inputs()
    q, k, v = good
    cases.update({"float32": tuple(t.float() for t in good),
                  "empty": tuple(torch.empty(1, 2, 0, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))})
    cases.update({f"D={D}": tuple(torch.randn(1, 2, 33, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                  for D in refused_dims})
    conftest.assert_refused(mod.forward, cases)
    out = mod.forward(q, k, v, False)
    ref = attention_reference(q, k, v, dtype=torch.float64)
    assert (out.double() - ref).abs().max().item() < 2e-2


@pytest.mark.gpu
@needs_hopper
def test_bad_inputs_refused_then_good_call_works(v7):
    refuses_bad_inputs_then_runs(v7, refused_dims=[256])


# ---------------------------------------------------------------- compute-sanitizer
SANITIZE_SHAPES = [(1, 2, 64, 64), (2, 1, 17, 113), (1, 2, 130, 67), (1, 1, 200, 333)]   # B, H, M, N


def sanitizer_tests(version: str, build, variants, shapes, driver: Path):
    """(sanitize_target, test_sanitizer_clean) of a Hopper version, shared with test_v8. The target is what
    the sanitizer runs in `driver` (the test file as its own program, `--sanitize VARIANT`): both head dims
    and masks at `shapes` (B, H, M, N), one line per call so that a report names the call before it; the
    default build in both dtypes, the other variants in bf16 (the dtype changes no address or barrier).
    The test runs memcheck, racecheck and synccheck on every variant and counts the calls that ran."""
    def sanitize_target(variant: str) -> None:
        dtypes = list(DTYPES.values()) if variant == "default" else [torch.bfloat16]
        conftest.sanitizer_cases(build(variant).forward, version, shapes, dtypes)

    @pytest.mark.gpu
    @pytest.mark.skipif(not is_hopper(), reason=f"{version} needs a GPU of compute capability 9.0")
    @pytest.mark.parametrize("variant", list(variants))
    @pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
    def test_sanitizer_clean(tool, variant):
        build(variant)   # outside the sanitizer: nvcc under it is slow
        out, ran = conftest.run_sanitized(tool, driver, "--sanitize", variant, tag=f"ran {version} ")
        assert len(ran) == len(shapes) * 2 * 2 * (2 if variant == "default" else 1), out[-4000:]

    return sanitize_target, test_sanitizer_clean


# tail tiles, M > N, fully masked rows
sanitize_target, test_sanitizer_clean = sanitizer_tests("v7", build_v7, BUILDS, SANITIZE_SHAPES,
                                                        Path(__file__).resolve())


if __name__ == "__main__" and "--sanitize" in sys.argv:
    sanitize_target(sys.argv[sys.argv.index("--sanitize") + 1])
