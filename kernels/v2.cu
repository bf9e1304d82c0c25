// v2: simplified FlashAttention-2 -- a grid of query tiles, state in shared memory.
//
// What changed from v1: the loops are swapped (FlashAttention-2, Dao 2023). Each block owns one query
// tile Q_i of B_r rows and streams every K/V tile past it, so O_i, m_i and l_i never leave the SM
// until the end, and the grid grows from B*H blocks to ceil(M / B_r) * B*H. The output is kept
// unnormalised (O_i = sum_j exp(S_ij - m_i) V_j) and divided by l_i once, after the last tile, instead
// of after every tile.
//
// Why it is still slow: the running state m_i, l_i, the rescale factors, O_i and the score tile all sit
// in shared memory next to Q_i, K_j and V_j: 58 KB per block at D = 64, so only three blocks (12 warps)
// fit on an SM, and every O_i update is a shared-memory read-modify-write. Lane c reads row c of K_j
// with a stride of D floats, so the 32 lanes of a warp hit the same bank (D = 64 is a multiple of 32).
//
// Contract: float32, contiguous; Q [B, H, M, D], K and V [B, H, N, D]; any M, N >= 1; 1 <= D <= 128;
// B*H <= 65535 (grid y); non-causal; any GPU PyTorch supports.
// Tiles: B_r = 64, B_c = 32, 128 threads (4 warps, 16 query rows each).
// Shared memory (dynamic): Q_i, O_i (64 x D), K_j, V_j (32 x D), S_ij (64 x 32), m_i, l_i, alpha
// (64 each) floats = 58,112 B at D = 64, 107,264 B at D = 128.
//
// Results: results/h200/bench.json (python -m flashattn.measure.bench all) and
// results/h200/flash_v2_s2048_profile.*; the chapter is book/v2.ipynb.
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cstddef>
#include <cmath>

constexpr int B_r = 64;
constexpr int B_c = 32;  // one key column per lane
constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
constexpr int ROWS_PER_WARP = B_r / WARPS;

__device__ float warp_max(float x) {
  for (int off = 16; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ float warp_sum(float x) {
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Copies `rows` rows of a [*, D] matrix into a [tile_rows, D] shared tile, zero-filling the rest.
__device__ void load_tile(float* tile, const float* src, int rows, int tile_rows, int D) {
  for (int idx = threadIdx.x; idx < tile_rows * D; idx += THREADS)
    tile[idx] = idx / D < rows ? src[idx] : 0.f;
}

size_t shared_bytes(int D) {
  return (size_t)(2 * B_r * D + 2 * B_c * D + B_r * B_c + 3 * B_r) * sizeof(float);
}

__global__ void __launch_bounds__(THREADS)
flash_v2_kernel(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
                float* __restrict__ O, int M, int N, int D, float scale) {
  extern __shared__ float smem[];
  float* Q_i = smem;
  float* O_i = Q_i + B_r * D;
  float* K_j = O_i + B_r * D;
  float* V_j = K_j + B_c * D;
  float* P_ij = V_j + B_c * D;  // [B_r, B_c]
  float* m_i = P_ij + B_r * B_c;
  float* l_i = m_i + B_r;
  float* alpha = l_i + B_r;     // exp(m_old - m_new) per row, for the O_i rescale

  const int i0 = blockIdx.x * B_r;
  const size_t bh = blockIdx.y;
  const int rows = min(B_r, M - i0);
  const float* K_bh = K + bh * N * D;
  const float* V_bh = V + bh * N * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile(Q_i, Q + (bh * M + i0) * D, rows, B_r, D);
  for (int idx = threadIdx.x; idx < B_r * D; idx += THREADS) O_i[idx] = 0.f;
  for (int r = threadIdx.x; r < B_r; r += THREADS) {
    m_i[r] = -INFINITY;
    l_i[r] = 0.f;
  }

  for (int j0 = 0; j0 < N; j0 += B_c) {
    const int cols = min(B_c, N - j0);
    __syncthreads();  // the previous K_j, V_j are no longer read
    load_tile(K_j, K_bh + (size_t)j0 * D, cols, B_c, D);
    load_tile(V_j, V_bh + (size_t)j0 * D, cols, B_c, D);
    __syncthreads();
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
      const int r = warp * ROWS_PER_WARP + rr;  // rows past M compute on zeros and are never stored
      float s = -INFINITY;
      if (lane < cols) {
        float acc = 0.f;
        for (int d = 0; d < D; ++d) acc += Q_i[r * D + d] * K_j[lane * D + d];
        s = acc * scale;
      }
      const float m_old = m_i[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float p = lane < cols ? expf(s - m_new) : 0.f;
      P_ij[r * B_c + lane] = p;
      const float l_tile = warp_sum(p);
      __syncwarp();  // all lanes have read m_i[r] before lane 0 replaces it
      if (lane == 0) {
        alpha[r] = expf(m_old - m_new);
        l_i[r] = alpha[r] * l_i[r] + l_tile;
        m_i[r] = m_new;
      }
      __syncwarp();  // alpha[r] and the whole P_ij row are visible to every lane
      for (int d = lane; d < D; d += 32) {
        float pv = 0.f;
        for (int c = 0; c < cols; ++c) pv += P_ij[r * B_c + c] * V_j[c * D + d];
        O_i[r * D + d] = alpha[r] * O_i[r * D + d] + pv;
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * D; idx += THREADS)
    O[(bh * M + i0) * D + idx] = O_i[idx] / l_i[idx / D];
}

size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D) { return 0; }

const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int D,
                                    cudaStream_t stream) {
  if (D < 1 || D > 128) return "v2 takes head_dim 1 <= D <= 128";
  if ((size_t)B * H > 65535) return "v2 puts (batch, head) on grid y: B * H must be <= 65535";
  const size_t smem = shared_bytes(D);
  cudaError_t err = cudaFuncSetAttribute(flash_v2_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const dim3 grid((M + B_r - 1) / B_r, B * H);
  flash_v2_kernel<<<grid, THREADS, smem, stream>>>(q, k, v, o, M, N, D, 1.f / sqrtf((float)D));
  err = cudaGetLastError();
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
