from pathlib import Path

import pytest
import torch

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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


@pytest.fixture(autouse=True)
def _free_gpu_memory():
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def write_bench_file(folder: Path, old_keys: bool = False) -> None:
    """A bench.json with baseline, sdpa and v4 at one shape; `old_keys`: as files recorded before the
    rename (impl, ran_as)."""
    import json

    from flashattn.bench import add_comparisons
    rows = []
    for version, us in (("baseline", 2000.0), ("sdpa", 1500.0), ("v4", 1200.0)):
        rows.append(dict(version=version, batch_size=4, num_heads=12, seq_len_q=2048, seq_len_kv=2048, head_dim=64,
                         dtype="float32", causal=False, status="ok", message=None, runs_as=version, rel_error=1e-7,
                         median_us=us, min_us=us - 1, max_us=us + 1, calls_timed=100, requested_repetitions=100,
                         tflops=51.5e9 / (us * 1e-6) / 1e12, flops=51.5e9))
    add_comparisons(rows)
    if old_keys:
        rows = [{{"version": "impl", "runs_as": "ran_as"}.get(k, k): v for k, v in r.items()} for r in rows]
    doc = {"schema": 1, "runs": [{"meta": {"device": {"name": "NVIDIA H200"}, "torch": "2.11",
                                           "git": {"commit": "abcdef1234567"}},
                                  "settings": {"repetitions": 100, "warmup": 25}, "rows": rows}]}
    (folder / "bench.json").write_text(json.dumps(doc))
