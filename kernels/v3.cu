// v3: warp-local FlashAttention-2 -- the running state moves from shared memory into registers.
//
// What changed from v2: the head dimension is fixed at compile time (D = 64), so each lane can hold its
// slice of the output in a fixed-size array that the compiler keeps in registers. Each of the 8 warps
// owns 8 query rows for the whole kernel; lane c computes column c of the warp's 8 x 32 score tile and
// owns output columns c and c + 32 of its 8 rows. m_i and l_i are kept, replicated, in every lane of
// the owning warp (the shuffles that reduce a row hand the result to all 32 lanes), so no row state
// touches shared memory and no __syncthreads is needed for the softmax. K_j and V_j take turns in a
// single shared tile, because S_ij needs only K_j and O_i += P_ij V_j needs only V_j.
//
// What still limits it: lane c reads row c of K_j with a stride of 64 floats, so all 32 lanes of a
// warp hit one shared-memory bank (a 32-way conflict) in the hottest loop; tiles are copied one float
// at a time; loop indices are 64-bit, which costs extra integer instructions in the inner loops.
//
// Contract: float32, contiguous; Q [B, H, M, D], K and V [B, H, N, D] with D = 64 only (other head
// dims are refused here; flashattn routes them to v2); any M, N >= 1; B*H <= 65535 (grid y);
// non-causal; any GPU PyTorch supports.
// Tiles: B_r = 64, B_c = 32, 256 threads (8 warps x 8 rows).
// Shared memory (static): Q_i 64 x 64 + K_j/V_j 32 x 64 + P_ij 64 x 32 floats = 32,768 B.
//
// Results: results/h200/bench.json (python -m flashattn.measure.bench all) and
// results/h200/flash_v3_s2048_profile.*; the chapter is book/v3.ipynb.
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cstddef>
#include <cmath>

constexpr int D = 64;
constexpr int B_r = 64;
constexpr int B_c = 32;  // one key column per lane
constexpr int WARPS = 8;
constexpr int THREADS = 32 * WARPS;
constexpr int ROWS = B_r / WARPS;  // query rows per warp
constexpr int COLS = D / 32;       // output columns per lane

__device__ float warp_max(float x) {
  for (int off = 16; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ float warp_sum(float x) {
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Copies `rows` rows of a [*, D] matrix into a [tile_rows, D] shared tile, zero-filling the rest.
__device__ void load_tile(float* tile, const float* src, size_t rows, size_t tile_rows) {
  for (size_t idx = threadIdx.x; idx < tile_rows * D; idx += THREADS)
    tile[idx] = idx / D < rows ? src[idx] : 0.f;
}

__global__ void __launch_bounds__(THREADS)
flash_v3_kernel(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
                float* __restrict__ O, int M, int N, float scale) {
  __shared__ float Q_i[B_r * D];
  __shared__ float KV_j[B_c * D];  // K_j, then V_j
  __shared__ float P_ij[B_r * B_c];

  const size_t i0 = (size_t)blockIdx.x * B_r;
  const size_t bh = blockIdx.y;
  const size_t rows = min((size_t)B_r, M - i0);
  const float* K_bh = K + bh * N * D;
  const float* V_bh = V + bh * N * D;
  const size_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile(Q_i, Q + (bh * M + i0) * D, rows, B_r);

  float o[ROWS][COLS] = {};
  float m[ROWS], l[ROWS];
  for (size_t rr = 0; rr < ROWS; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.f;
  }

  for (size_t j0 = 0; j0 < (size_t)N; j0 += B_c) {
    const size_t cols = min((size_t)B_c, N - j0);
    load_tile(KV_j, K_bh + j0 * D, cols, B_c);
    __syncthreads();  // K_j (and, on the first tile, Q_i) complete

    // S_ij for the warp's 8 rows and this lane's column: 8 dot products share each K_j element.
    float s[ROWS] = {};
    for (size_t d = 0; d < D; ++d) {
      const float k = KV_j[lane * D + d];
      for (size_t rr = 0; rr < ROWS; ++rr) s[rr] += Q_i[(warp * ROWS + rr) * D + d] * k;
    }
    for (size_t rr = 0; rr < ROWS; ++rr) {
      const float s_rc = lane < cols ? s[rr] * scale : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s_rc));
      const float alpha = expf(m[rr] - m_new);  // rescales what O_i and l_i hold so far
      const float p = expf(s_rc - m_new);       // 0 for masked columns
      l[rr] = alpha * l[rr] + warp_sum(p);
      m[rr] = m_new;
      for (size_t c = 0; c < COLS; ++c) o[rr][c] *= alpha;
      P_ij[(warp * ROWS + rr) * B_c + lane] = p;
    }
    __syncthreads();  // every warp is done with K_j before V_j replaces it
    load_tile(KV_j, V_bh + j0 * D, cols, B_c);
    __syncthreads();

    for (size_t c = 0; c < B_c; ++c) {
      float v[COLS];
      for (size_t k = 0; k < COLS; ++k) v[k] = KV_j[c * D + lane + 32 * k];
      for (size_t rr = 0; rr < ROWS; ++rr) {
        const float p = P_ij[(warp * ROWS + rr) * B_c + c];
        for (size_t k = 0; k < COLS; ++k) o[rr][k] += p * v[k];
      }
    }
    __syncthreads();  // V_j and P_ij are consumed before the next K_j lands
  }

  for (size_t rr = 0; rr < ROWS; ++rr) {
    const size_t r = warp * ROWS + rr;
    if (r >= rows) break;
    float* out = O + (bh * M + i0 + r) * D;
    for (size_t k = 0; k < COLS; ++k) out[lane + 32 * k] = o[rr][k] / l[rr];
  }
}

size_t flash_attention_workspace_bytes(int B, int H, int M, int N, int D) { return 0; }

const char* flash_attention_forward(const float* q, const float* k, const float* v, float* o,
                                    void* workspace, int B, int H, int M, int N, int head_dim,
                                    cudaStream_t stream) {
  if (head_dim != D) return "v3 is compiled for head_dim 64 only (flashattn.forward routes other sizes to v2)";
  if ((size_t)B * H > 65535) return "v3 puts (batch, head) on grid y: B * H must be <= 65535";
  const dim3 grid((M + B_r - 1) / B_r, B * H);
  flash_v3_kernel<<<grid, THREADS, 0, stream>>>(q, k, v, o, M, N, 1.f / sqrtf((float)D));
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
