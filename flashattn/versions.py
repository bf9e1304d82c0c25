"""The implementations the book walks through, in chapter order, and what each one accepts.

Everything here is plain data, so the validation in `flashattn.validate` and the tables in the book and
README can be derived from one place without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

FP32 = (torch.float32,)
HALF = (torch.bfloat16, torch.float16)

# What an architecture-specific build ("9.0a" style, see Version.archs) offers, for the message that
# refuses any other GPU: name of the architecture and the instructions that tie a kernel to it.
ARCH_FEATURES: dict[str, tuple[str, str]] = {
    "9.0a": ("Hopper", "wgmma, TMA"),
}


@dataclass(frozen=True)
class Version:
    name: str
    title: str
    description: str
    kernel: bool = True                    # a kernels/<name>.cu exists
    dtypes: tuple = FP32
    head_dims: tuple | None = None         # None: any D in 1..max_head_dim
    max_head_dim: int = 128
    fallback: str | None = None            # version that takes the head dims this one does not
    self_attention_only: bool = False      # M must equal N
    causal: bool = False                   # takes causal=True
    gqa: bool = False                      # takes k, v with fewer heads than q (grouped-query attention)
    scale: bool = False                    # takes scale= (the softmax scale; the others use 1/sqrt(D))
    window: bool = False                   # takes window=(left, right) (a sliding window, bottom-right aligned)
    min_sm: tuple = (7, 0)                 # oldest GPU architecture the kernel is written for
    fused: bool = True                     # one kernel launch per forward (what the profiler can read)
    archs: tuple[str, ...] | None = None   # build exactly these ("9.0a"), ignoring TORCH_CUDA_ARCH_LIST
    backward: str | None = None            # kernel file of this version's backward pass, e.g. "v6_backward"
    backwards: tuple[str, ...] = ()        # other backward kernel files it can train on: attention(backward=...)
    extra: dict = field(default_factory=dict)

    @property
    def backward_head_dims(self) -> tuple | None:
        """The D its own backward file takes (BACKWARD_HEAD_DIMS), where fewer than head_dims; None otherwise."""
        dims = BACKWARD_HEAD_DIMS.get(self.backward)
        return dims if dims is not None and self.head_dims is not None and set(self.head_dims) - set(dims) else None


INFO: dict[str, Version] = {v.name: v for v in (
    Version("baseline", "Naive PyTorch",
            "Explicit PyTorch matmul, softmax, matmul: the correctness and latency reference",
            kernel=False, dtypes=FP32 + HALF, max_head_dim=1 << 16, causal=True, gqa=True, scale=True, window=True,
            fused=False),
    Version("sdpa", "PyTorch SDPA",
            "torch.nn.functional.scaled_dot_product_attention with its automatic backend choice",
            kernel=False, dtypes=FP32 + HALF, max_head_dim=1 << 16, causal=True, gqa=True, scale=True, window=True,
            fused=False),
    Version("v0", "Naive CUDA",
            "Three unfused kernels that write the full attention matrix to memory",
            self_attention_only=True, fused=False),
    Version("v1", "FlashAttention-1",
            "Fused, tiled online softmax; one block per (batch, head), state kept in global memory"),
    Version("v2", "Simplified FlashAttention-2",
            "Query-tile grid; running max, sum, output and scores in shared memory"),
    Version("v3", "Warp-local FlashAttention-2",
            "Each warp owns 8 query rows; m, l and O live in registers; K and V share one tile",
            head_dims=(64,), fallback="v2"),
    Version("v4", "Optimized V3",
            "V3 plus 16-byte copies, forced inlining, padded K rows and 32-bit loop indices",
            head_dims=(64,), fallback="v2"),
    Version("v5", "Register-tiled FP32",
            "SGEMM-style register tiles for both products, cp.async double buffering, exp2 softmax",
            head_dims=(64, 128), fallback="v2", min_sm=(8, 0)),
    Version("v6", "Tensor cores (mma.sync)",
            "bf16/fp16 FlashAttention-2 on mma.sync with ldmatrix, swizzled tiles, P in registers; "
            "causal; TF32 mode for fp32",
            dtypes=HALF + FP32, head_dims=(64, 128), causal=True, gqa=True, scale=True, window=True, min_sm=(8, 0),
            backward="v6_backward"),
    Version("v7", "Hopper: wgmma + TMA",
            "Both products on wgmma (warpgroups, operands from swizzled shared memory), K and V tiles by "
            "TMA in a multi-stage mbarrier pipeline; causal; needs an sm_90a build and a Hopper GPU",
            dtypes=HALF, head_dims=(64, 128), causal=True, gqa=True, scale=True, window=True, min_sm=(9, 0),
            archs=("9.0a",), backward="v8_backward", backwards=("v6_backward",), extra={"tensor_cores": True}),
    Version("v8", "Hopper: warp specialization",
            "V7 plus FlashAttention-3's scheduling: a producer warpgroup issuing TMA, setmaxnreg moving "
            "registers to the consumers, ping-pong between consumer warpgroups and the softmax of one tile "
            "overlapped with the products of the next; causal; needs an sm_90a build and a Hopper GPU",
            dtypes=HALF, head_dims=(64, 96, 128, 192, 256), max_head_dim=256, causal=True, gqa=True, scale=True,
            window=True, min_sm=(9, 0), archs=("9.0a",), backward="v8_backward", backwards=("v6_backward",),
            extra={"tensor_cores": True}),
)}

# The head dims each backward kernel file takes (attention(backward=...) can pick another file than the version's
# own; Version.backward_head_dims derives from these).
BACKWARD_HEAD_DIMS: dict[str, tuple[int, ...]] = {"v6_backward": (64, 128), "v8_backward": (64, 96, 128)}

VERSIONS: tuple[str, ...] = tuple(INFO)
KERNEL_VERSIONS: tuple[str, ...] = tuple(n for n, v in INFO.items() if v.kernel)
FUSED_VERSIONS: tuple[str, ...] = tuple(n for n, v in INFO.items() if v.kernel and v.fused)
