// v0: naive CUDA attention -- three unfused kernels.
//
// What it does: S = scale * Q K^T is written to global memory in full ([B, H, N, N] floats), a second
// kernel turns each row of S into probabilities P in place, and a third computes O = P V. Every score
// makes a round trip through DRAM, which is exactly the cost FlashAttention removes: at B=4, H=12,
// N=2048 the score matrix alone is 805 MB, written once and read twice.
//
// Contract: float32, contiguous; self-attention only (M == N: the naive version keeps the simplest
// contract; v1 and later take M != N); any N >= 1; 1 <= D <= 128 (the limit only mirrors the other
// versions: nothing here depends on it); non-causal; any GPU PyTorch supports. Workspace: B*H*N*N
// floats for S/P, allocated by the binding through PyTorch.
// Launches: scores 16x16-thread tiles, one thread per score; softmax one warp per row; PV one thread
// per output element. No shared memory.
//
// Results: results/h200/bench.json (python -m flashattn.measure.bench all), the DRAM traffic in
// results/h200/v0_memory.ncu-rep; the chapter is book/v0.ipynb.
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cstddef>
#include <cmath>

// One thread per score: S[i][j] = scale * <Q_i, K_j>. Row-major S, so threadIdx.x walks j.
__global__ void scores_kernel(const float* __restrict__ Q, const float* __restrict__ K, float* __restrict__ S,
                              int N, int D, float scale) {
  const size_t bh = blockIdx.z;
  const int i = blockIdx.y * blockDim.y + threadIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N || j >= N) return;
  const float* q = Q + (bh * N + i) * D;
  const float* k = K + (bh * N + j) * D;
  float acc = 0.f;
  for (int d = 0; d < D; ++d) acc += q[d] * k[d];
  S[(bh * N + i) * N + j] = acc * scale;
}

// One warp per row: subtract the row max before exponentiating (so large logits cannot overflow),
// then normalise by the row sum. Three passes over the row, all coalesced.
__global__ void softmax_kernel(float* __restrict__ S, size_t rows, int N) {
  const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* s = S + row * N;
  float m = -INFINITY;
  for (int j = lane; j < N; j += 32) m = fmaxf(m, s[j]);
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float l = 0.f;
  for (int j = lane; j < N; j += 32) {
    const float p = expf(s[j] - m);
    s[j] = p;
    l += p;
  }
  for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
  const float inv_l = 1.f / l;
  for (int j = lane; j < N; j += 32) s[j] *= inv_l;
}

// One thread per output element: O[i][d] = sum_j P[i][j] V[j][d]; threadIdx.x walks d so that the
// reads of V are coalesced and the reads of P are broadcasts.
__global__ void pv_kernel(const float* __restrict__ P, const float* __restrict__ V, float* __restrict__ O,
                          int N, int D) {
  const size_t bh = blockIdx.z;
  const int i = blockIdx.y * blockDim.y + threadIdx.y;
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N || d >= D) return;
  const float* p = P + (bh * N + i) * N;
  const float* v = V + bh * N * D + d;
  float acc = 0.f;
  for (int j = 0; j < N; ++j) acc += p[j] * v[(size_t)j * D];
  O[(bh * N + i) * D + d] = acc;
}

size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D) {
  return (size_t)B * H * M * N * sizeof(float);
}

const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int D,
                                    cudaStream_t stream) {
  if (M != N) return "v0 computes self-attention only: q and k need the same sequence length";
  if (D < 1 || D > 128) return "v0 takes head_dim 1 <= D <= 128";
  if ((size_t)B * H > 65535) return "v0 launches one grid slice per (batch, head): B * H must be <= 65535";
  if (N > 16 * 65535) return "v0 tiles the score matrix with a 2-D grid: N must be <= 1048560";
  float* S = static_cast<float*>(workspace);
  const float scale = 1.f / sqrtf((float)D);
  const dim3 tile(16, 16);
  scores_kernel<<<dim3((N + 15) / 16, (N + 15) / 16, B * H), tile, 0, stream>>>(q, k, S, N, D, scale);
  const size_t rows = (size_t)B * H * N;
  const int warps_per_block = 8;
  softmax_kernel<<<(unsigned)((rows + warps_per_block - 1) / warps_per_block), 32 * warps_per_block, 0,
                   stream>>>(S, rows, N);
  pv_kernel<<<dim3((D + 15) / 16, (N + 15) / 16, B * H), tile, 0, stream>>>(S, v, o, N, D);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

#else  // ---- PyTorch binding: compiled by the host C++ compiler, which does not define __CUDACC__ ----
// Only the headers the binding uses: <torch/extension.h> would double this file's build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>     // torch::wrap_pybind_function, used by load_inline's module code
#include <torch/csrc/utils/pybind.h>   // at::Tensor <-> torch.Tensor for pybind11

size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D);
const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int D,
                                    cudaStream_t stream);

// q: [B, H, M, D], k and v: [B, H, N, D], contiguous float32 on one CUDA device. Returns o like q.
// Messages carry no numbers: on the H200 host (host compiler GCC 13.3, torch 2.11) streaming an integer
// into a TORCH_CHECK message from an extension crashed the process; flashattn's Python checks, which
// run first, give the details.
// `causal` keeps one signature, forward(q, k, v, causal), across every version's binding.
at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal) {
  TORCH_CHECK(!causal, "causal=True is not implemented by this kernel (flashattn.INFO says which versions take it)");
  for (auto [name, t] : {std::pair<const char*, at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t->scalar_type() == at::kFloat, name, " must be float32");
    TORCH_CHECK(t->dim() == 4, name, " must have rank 4 [B, H, L, D]");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->numel() > 0, name, " has an empty dimension");
    TORCH_CHECK(t->device() == q.device(), name, " must be on the same device as q");
    for (int d = 0; d < 4; ++d)   // the launcher takes int sizes
      TORCH_CHECK(t->size(d) < (int64_t{1} << 31), name, ": every dimension must be below 2^31");
  }
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k must match q in batch, heads and head_dim");
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have the shape of k [B, H, N, D]");
  const int B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), D = q.size(3);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = at::empty_like(q);
  auto workspace = at::empty({(int64_t)flash_attention_workspace_bytes(B, H, M, N, D)},
                                q.options().dtype(at::kByte));
  const char* error = flash_attention_forward(q.data_ptr<float>(), k.data_ptr<float>(),
                                              v.data_ptr<float>(), o.data_ptr<float>(),
                                              workspace.data_ptr(), B, H, M, N, D,
                                              c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(error == nullptr, error);
  return o;
}
#endif
