import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def every_half_case(test):
    """Parametrize `test` over dtype (bf16, fp16), head dim D (64, 128) and causal (no, yes): the cases
    every 16-bit tensor-core kernel (v6, v7, v8) is checked in."""
    for name, values in (("dtype", list(HALF_DTYPES)), ("D", [64, 128]), ("causal", [False, True])):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def bad_inputs(dtype=torch.bfloat16) -> tuple[list[torch.Tensor], dict]:
    """Good q, k, v [1, 2, 33, 64] on the GPU and the bad calls every 16-bit binding must refuse, by name:
    CPU tensors, an integer dtype, rank 3, mixed dtypes, mismatched head dim and length, an unsupported
    head dim, a non-contiguous view."""
    good = [torch.randn(1, 2, 33, 64, device="cuda", dtype=dtype) for _ in range(3)]
    q, k, v = good
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    return good, {
        "cpu": (q.cpu(), k.cpu(), v.cpu()),
        "int32": tuple(t.to(torch.int32) for t in good),
        "rank3": (q[0], k[0], v[0]),
        "mixed dtype": (q, k.to(other), v),
        "k head_dim": (q, torch.randn(1, 2, 33, 128, device="cuda", dtype=dtype), v),
        "v length": (q, k, torch.randn(1, 2, 34, 64, device="cuda", dtype=dtype)),
        "D=80": tuple(torch.randn(1, 2, 33, 80, device="cuda", dtype=dtype) for _ in range(3)),
        "non-contiguous": (q.transpose(2, 3).contiguous().transpose(2, 3), k, v),
    }


def assert_refused(forward, cases: dict) -> None:
    """Every case of `cases` (name: (q, k, v)) makes the binding `forward(q, k, v, False)` raise."""
    for name, (q, k, v) in cases.items():
        try:
            forward(q, k, v, False)
        except RuntimeError:
            continue
        pytest.fail(f"the binding accepted bad input: {name}")


def sanitizer_cases(forward, name: str, shapes, dtypes) -> None:
    """What a sanitizer target runs for a 16-bit binding `forward(q, k, v, causal)`: each (B, H, M, N) of
    `shapes` at D = 64 and 128, each dtype, both masks, output finite, one "ran NAME ..." line per call so
    that a report names the call before it."""
    for B, H, M, N in shapes:
        for D in (64, 128):
            for dtype in dtypes:
                for causal in (False, True):
                    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype) for L in (M, N, N))
                    out = forward(q, k, v, causal)
                    torch.cuda.synchronize()
                    assert torch.isfinite(out).all()
                    print(f"ran {name} {dtype} causal={causal} B={B} H={H} M={M} N={N} D={D}", flush=True)


def sanitizer() -> str:
    """compute-sanitizer from PATH or the toolkit; on a GPU machine its absence is a failure."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for candidate in (shutil.which("compute-sanitizer"), f"{home}/bin/compute-sanitizer",
                      "/usr/local/cuda/bin/compute-sanitizer"):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("compute-sanitizer not found on a GPU machine (install the CUDA toolkit's sanitizer)")


def run_sanitized(tool: str, target, *args: str, tag: str = "ran ") -> tuple[str, list[str]]:
    """Run the script `target` (a path, or a name in tests/) with `args` under compute-sanitizer's `tool`
    in one process, check that it is clean, and return its output and the lines starting with `tag`
    that the script prints per case (so a failure names the case before it). Build the kernels before:
    nvcc under the sanitizer is slow."""
    cmd = [sanitizer(), f"--tool={tool}", "--error-exitcode=99", sys.executable, str(ROOT / "tests" / target), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-4000:]
    return out, [line for line in out.splitlines() if line.startswith(tag)]


def randn(*shape, dtype=torch.float32, device="cuda", scale=1.0, seed=None):
    """Fresh random data per call; `seed` only to make a failing case reproducible."""
    gen = torch.Generator(device=device)
    gen.manual_seed(torch.seed() if seed is None else seed)
    return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def poison_allocator(*like, value=float("nan")):
    """Fill the blocks PyTorch's caching allocator will hand out next with NaN.

    The kernels allocate their output with torch.empty_like, which reuses freed blocks of the same size;
    filling and freeing blocks of that size first means an element the kernel forgets to write shows up
    as NaN instead of as a plausible stale value.
    """
    junk = [torch.full_like(t, value) for t in like for _ in range(2)]
    del junk


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, with that reason, only where torch sees no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _free_gpu_memory():
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def write_bench_file(folder: Path) -> None:
    """A bench.json (flashattn.measure.results, kind bench) with baseline, sdpa and v4 at one shape."""
    from flashattn.measure import results
    from flashattn.measure.bench import add_comparisons
    rows = []
    for version, us in (("baseline", 2000.0), ("sdpa", 1500.0), ("v4", 1200.0)):
        rows.append(dict(version=version, batch_size=4, num_heads=12, seq_len_q=2048, seq_len_kv=2048, head_dim=64,
                         dtype="float32", causal=False, status="ok", message=None, runs_as=version, rel_error=1e-7,
                         median_us=us, min_us=us - 1, max_us=us + 1, calls_timed=100, requested_repetitions=100,
                         tflops=51.5e9 / (us * 1e-6) / 1e12, flops=51.5e9))
    add_comparisons(rows)
    meta = {"device": {"name": "NVIDIA H200"}, "torch": "2.11", "git": {"commit": "abcdef1234567"}}
    results.write(folder / "bench.json", "bench", rows, meta, {"repetitions": 100, "warmup": 25})
