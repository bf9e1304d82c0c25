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
