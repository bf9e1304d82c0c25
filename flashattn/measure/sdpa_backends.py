"""PyTorch's SDPA with one backend forced: the bench-only names of the tensor-core comparisons.

They are not versions of the book, so they are not in flashattn.VERSIONS; flashattn.measure.bench times them
forward and flashattn.measure.backward backward.
"""
from __future__ import annotations

from torch.nn.attention import SDPBackend, sdpa_kernel

# bench-only name -> the torch.nn.attention.SDPBackend member sdpa_kernel forces
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}


def sdpa_backend_context(name: str):
    """A factory of fresh contexts that force the backend of the bench-only name `name` (SDPA_BACKENDS; each
    context can be entered only once)."""
    return lambda: sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])])
