"""How fast can anything read a buffer once from HBM: the floor that a decoding kernel's time is judged by
in practice, beside the datasheet's 4.8 TB/s.

Two plain read kernels, each built from this file's CUDA source with load_inline, no arithmetic on what they
read:

* `loads`: every thread keeps `unroll` 16-byte loads in flight (ld.global.nc, not kept in L1), grid-stride
  over the buffer, `blocks` blocks of 512 threads;
* `bulk`: persistent blocks, one per SM or more, each streaming its own contiguous share of the buffer in
  chunks of `chunk` bytes through a ring of `stages` shared-memory slots, one bulk copy (cp.async.bulk, the
  copy engine of sm_90's TMA) per chunk, completing on the slot's mbarrier; one thread issues and waits,
  so up to stages x chunk bytes per block are in flight with no instruction stream to speak of.

With `check=True` the kernels add up every 32-bit word they read, as floats, into one number per block
(`checksum`), so a test can see that every byte was read; timed calls pass check=False and add nothing.
flashattn.measure.decode_bench's `floor` part times them beside the decoding kernel.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>

__device__ __forceinline__ float word_sum(uint4 v) {
  return __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
}

template <int UNROLL>
__global__ void __launch_bounds__(512) read_loads(const uint4* __restrict__ x, int64_t n, float* sums, int check) {
  float acc = 0.f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * UNROLL;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x; base < n; base += stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = base + int64_t(u) * blockDim.x;
      v[u] = make_uint4(0, 0, 0, 0);
      if (i < n)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(x + i));
    }
    if (check) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) acc += word_sum(v[u]);
    }
  }
  if (check) atomicAdd(sums + blockIdx.x, acc);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Block b streams bytes [b * share, min((b + 1) * share, bytes)) in chunks of `chunk` bytes, stage s of the
// ring holding chunks s, s + stages, ...; thread 0 issues every copy and waits for each before reusing its
// slot. check: all threads add up each chunk before its slot is refilled.
__global__ void __launch_bounds__(128) read_bulk(const char* __restrict__ x, int64_t bytes, int64_t share,
                                                 int chunk, int stages, float* sums, int check) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  unsigned char* ring = smem + 128;
  const int64_t begin = int64_t(blockIdx.x) * share;
  const int64_t end = begin + share < bytes ? begin + share : bytes;
  const int64_t n_chunks = begin < end ? (end - begin + chunk - 1) / chunk : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(full + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int64_t c) {
    const int s = int(c % stages);
    const int64_t at = begin + c * chunk;
    const uint32_t size = uint32_t(at + chunk <= end ? chunk : end - at);
    const uint32_t bar = smem_u32(full + s);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(size) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(ring + size_t(s) * chunk)), "l"(x + at), "r"(size), "r"(bar) : "memory");
  };
  if (threadIdx.x == 0)
    for (int64_t c = 0; c < stages && c < n_chunks; ++c) issue(c);
  float acc = 0.f;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int s = int(c % stages);
    if (threadIdx.x == 0 || check) {
      const uint32_t bar = smem_u32(full + s), parity = uint32_t((c / stages) & 1);
      uint32_t done = 0;
      while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
    if (check) {
      const int64_t at = begin + c * chunk;
      const int size = int(at + chunk <= end ? chunk : end - at);
      const uint4* slot = reinterpret_cast<const uint4*>(ring + size_t(s) * chunk);
      for (int i = threadIdx.x; i < size / 16; i += blockDim.x) acc += word_sum(slot[i]);
      __syncthreads();                 // everyone is done with the slot before it is refilled
    }
    if (threadIdx.x == 0 && c + stages < n_chunks) issue(c + stages);
  }
  if (check) atomicAdd(sums + blockIdx.x, acc);
}

void launch_loads(const void* x, int64_t bytes, float* sums, int blocks, int unroll, bool check, cudaStream_t st) {
  const auto* p = static_cast<const uint4*>(x);
  if (unroll == 4) read_loads<4><<<blocks, 512, 0, st>>>(p, bytes / 16, sums, check);
  else read_loads<8><<<blocks, 512, 0, st>>>(p, bytes / 16, sums, check);
}
const char* launch_bulk(const void* x, int64_t bytes, float* sums, int blocks, int chunk, int stages, bool check,
                        cudaStream_t st) {
  const size_t smem = 128 + size_t(chunk) * stages;
  cudaError_t err = cudaFuncSetAttribute(read_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return cudaGetErrorString(err);
  int64_t share = (bytes + blocks - 1) / blocks;
  share = (share + 15) / 16 * 16;      // every copy starts 16-byte aligned
  read_bulk<<<blocks, 128, smem, st>>>(static_cast<const char*>(x), bytes, share, chunk, stages, sums, check);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}
"""

BINDING = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
void launch_loads(const void*, int64_t, float*, int, int, bool, cudaStream_t);
const char* launch_bulk(const void*, int64_t, float*, int, int, int, bool, cudaStream_t);

void loads(at::Tensor x, at::Tensor sums, int64_t blocks, int64_t unroll, bool check) {
  launch_loads(x.data_ptr(), x.numel() * x.element_size(), sums.data_ptr<float>(), int(blocks), int(unroll), check,
               c10::cuda::getCurrentCUDAStream());
}
void bulk(at::Tensor x, at::Tensor sums, int64_t blocks, int64_t chunk, int64_t stages, bool check) {
  const char* err = launch_bulk(x.data_ptr(), x.numel() * x.element_size(), sums.data_ptr<float>(), int(blocks),
                                int(chunk), int(stages), check, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("loads", &loads);
  m.def("bulk", &bulk);
}
"""


@functools.cache
def module():
    return load_inline("flashattn_read_floor", BINDING, cuda_sources=SOURCE,
                       extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])


def _checked(x: torch.Tensor, blocks: int) -> torch.Tensor:
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1; got {blocks}")
    if not (x.is_cuda and x.is_contiguous() and x.data_ptr() % 16 == 0 and x.numel() * x.element_size() % 16 == 0):
        raise ValueError("x must be a contiguous CUDA tensor, 16-byte aligned, a multiple of 16 bytes long")
    return torch.zeros(blocks, device=x.device, dtype=torch.float32)


def loads(x: torch.Tensor, blocks: int, unroll: int = 4, check: bool = False) -> torch.Tensor | None:
    """Read x once with 16-byte loads; with check, the per-block sums of its 32-bit words as floats."""
    if unroll not in (4, 8):
        raise ValueError(f"unroll must be 4 or 8; got {unroll}")
    sums = _checked(x, blocks)
    module().loads(x, sums, blocks, unroll, check)
    return sums if check else None


def bulk(x: torch.Tensor, blocks: int, chunk: int = 32768, stages: int = 6, check: bool = False) -> torch.Tensor | None:
    """Read x once with bulk copies into a ring of `stages` slots of `chunk` bytes per block."""
    if chunk % 16 or not 16 <= chunk or stages < 1 or 128 + chunk * stages > 227 * 1024:
        raise ValueError(f"chunk must be a multiple of 16 and the ring (chunk x stages = {chunk * stages} bytes) fit "
                         "in 227 KB of shared memory")
    sums = _checked(x, blocks)
    module().bulk(x, sums, blocks, chunk, stages, check)
    return sums if check else None


def word_sum(x: torch.Tensor) -> float:
    """What the kernels' checksums add up to: x's 32-bit words as float32, summed in float64."""
    return x.contiguous().view(torch.float32).double().sum().item()
