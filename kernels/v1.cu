// v1: FlashAttention-1 -- one fused kernel, tiled online softmax, one block per (batch, head).
//
// What changed from v0: no score matrix in DRAM. A block walks over K/V tiles (outer loop, index j) and,
// for each, over all query tiles (inner loop, index i), the loop order of FlashAttention-1 (Algorithm 1
// of Dao et al., 2022). Each query row keeps a running max m_i, a running sum l_i and a normalised output
// O_i; they live in global memory because one block owns all M rows of its (batch, head), however many
// that is. When a new tile of scores S_ij arrives, the old O_i is rescaled by exp(m_old - m_new) and the
// new contribution added, so the result equals softmax(S) V without ever holding a full row of S.
// Row maximum and row sum are warp reductions (__shfl_xor_sync): lane c owns column c of the tile.
//
// Why it is still slow: the grid has only B*H blocks (48 at B=4, H=12) for 132 SMs, and each block
// re-reads and re-writes O_i, m_i and l_i from global memory once per K/V tile.
//
// Contract: float32, contiguous; Q [B, H, M, D], K and V [B, H, N, D]; any M, N >= 1; 1 <= D <= 128;
// non-causal; any GPU PyTorch supports.
// Tiles: B_r = B_c = 32 rows, 128 threads (4 warps, 8 query rows each).
// Shared memory (dynamic): Q_i, K_j, V_j (32 x D each) + S_ij (32 x 32) floats = 28,672 B at D = 64,
// 53,248 B at D = 128 (above 48 KB, so the launcher raises the kernel's limit).
// Workspace: m and l, 2 * B*H*M floats.
//
// Results: results/h200/bench.json (python -m flashattn.measure.bench all) and
// results/h200/flash_v1_s2048_profile.*; the chapter is book/v1.ipynb.
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cstddef>
#include <cmath>

constexpr int B_r = 32;
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

// Copies `rows` rows of a [*, D] matrix into a [tile_rows, D] shared tile, zero-filling the rest so
// that tail tiles compute on zeros rather than on whatever the previous tile left behind.
__device__ void load_tile(float* tile, const float* src, int rows, int tile_rows, int D) {
  for (int idx = threadIdx.x; idx < tile_rows * D; idx += THREADS)
    tile[idx] = idx / D < rows ? src[idx] : 0.f;
}

__global__ void __launch_bounds__(THREADS)
flash_v1_kernel(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
                float* __restrict__ O, float* __restrict__ m_global, float* __restrict__ l_global,
                int M, int N, int D, float scale) {
  extern __shared__ float smem[];
  float* Q_i = smem;
  float* K_j = Q_i + B_r * D;
  float* V_j = K_j + B_c * D;
  float* P_ij = V_j + B_c * D;  // [B_r, B_c]: exp(S_ij - rowmax), one row per query

  const size_t bh = blockIdx.x;
  const float* Q_bh = Q + bh * M * D;
  const float* K_bh = K + bh * N * D;
  const float* V_bh = V + bh * N * D;
  float* O_bh = O + bh * M * D;
  float* m_bh = m_global + bh * M;
  float* l_bh = l_global + bh * M;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int j0 = 0; j0 < N; j0 += B_c) {
    const int cols = min(B_c, N - j0);
    load_tile(K_j, K_bh + (size_t)j0 * D, cols, B_c, D);
    load_tile(V_j, V_bh + (size_t)j0 * D, cols, B_c, D);
    for (int i0 = 0; i0 < M; i0 += B_r) {
      const int rows = min(B_r, M - i0);
      load_tile(Q_i, Q_bh + (size_t)i0 * D, rows, B_r, D);
      __syncthreads();  // Q_i (and, on the first i, K_j and V_j) are complete
      for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
        const int r = warp * ROWS_PER_WARP + rr;
        if (r >= rows) break;  // warp-uniform: the rest of the warp's rows are past M
        float s = -INFINITY;   // columns past N take no part in the softmax
        if (lane < cols) {
          float acc = 0.f;
          for (int d = 0; d < D; ++d) acc += Q_i[r * D + d] * K_j[lane * D + d];
          s = acc * scale;
        }
        const float m_tile = warp_max(s);  // finite: every tile has at least one column
        const float p = lane < cols ? expf(s - m_tile) : 0.f;
        const float l_tile = warp_sum(p);
        P_ij[r * B_c + lane] = p;
        __syncwarp();

        const size_t row = (size_t)i0 + r;
        const float m_old = j0 == 0 ? -INFINITY : m_bh[row];
        const float l_old = j0 == 0 ? 0.f : l_bh[row];
        const float m_new = fmaxf(m_old, m_tile);
        const float alpha = expf(m_old - m_new);  // 0 on the first tile
        const float beta = expf(m_tile - m_new);
        const float l_new = alpha * l_old + beta * l_tile;
        for (int d = lane; d < D; d += 32) {
          float pv = 0.f;
          for (int c = 0; c < cols; ++c) pv += P_ij[r * B_c + c] * V_j[c * D + d];
          const float o_old = j0 == 0 ? 0.f : O_bh[row * D + d];
          O_bh[row * D + d] = (alpha * l_old * o_old + beta * pv) / l_new;
        }
        __syncwarp();  // every lane has read m_old and l_old before lane 0 replaces them
        if (lane == 0) {
          m_bh[row] = m_new;
          l_bh[row] = l_new;
        }
      }
      __syncthreads();  // all warps are done with Q_i (and K_j, V_j) before they are overwritten
    }
  }
}

size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D) {
  return 2 * (size_t)B * H * M * sizeof(float);
}

const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int D,
                                    cudaStream_t stream) {
  if (D < 1 || D > 128) return "v1 takes head_dim 1 <= D <= 128";
  float* m = static_cast<float*>(workspace);
  float* l = m + (size_t)B * H * M;
  const size_t smem = (size_t)(B_r * D + 2 * B_c * D + B_r * B_c) * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(flash_v1_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  flash_v1_kernel<<<(unsigned)((size_t)B * H), THREADS, smem, stream>>>(q, k, v, o, m, l, M, N, D,
                                                                        1.f / sqrtf((float)D));
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
