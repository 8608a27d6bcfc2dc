// Incremental decoding on the GPU: a layer's keys and values kept in a cache, and the attention of
// one new query row over it (ops.hpp), split over the keys so that a short context still spreads
// over many blocks (decoding at batch 1 is a chain of small kernels: each one's latency counts).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/layernorm_rows.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

constexpr int k_split_keys = 64;      // keys per block of the split attention
constexpr int k_split_threads = 128;  // threads per block (a thread per key, and two spare warps)

int max_splits(int capacity) {
  return (capacity + k_split_keys - 1) / k_split_keys;
}

// V consecutive values as fp32 (V = 8: one 16-byte load of bf16, two of fp32; 16-byte aligned).
template <int V, class T>
__device__ inline void load_v(float (&x)[V], const T* p) {
  if constexpr (V == 8)
    load8(x, p);
  else
    x[0] = to_float(p[0]);
}

// The attention of one query row over positions 0 .. *pos, split over the keys (flash decoding):
// block (h, s) takes keys 64 s .. 64 s + 63 of query head h: their scores (a thread per key),
// their exponentials against the block's maximum m, and the weighted sum of their values (the
// threads as key groups x V-wide column chunks), written unnormalized with m and the
// exponentials' sum l to part[h][s] (hs + 2 floats). Blocks past the last key return at once.
template <class T, int V>
__global__ void decode_attention_split_kernel(const T* qkv, const T* kc, const T* vc,
                                              const int* pos, int capacity, int NH, int KV, int hs,
                                              float* part, float scale) {
  extern __shared__ float smem[];  // q (hs) | exponentials (k_split_keys) | partial sums
  __shared__ float scratch[32];
  const int h = blockIdx.x, split = blockIdx.y, g = h / (NH / KV), tid = threadIdx.x;
  const int n = min(*pos, capacity - 1) + 1, j0 = split * k_split_keys;
  if (j0 >= n) return;
  const int keys = min(k_split_keys, n - j0);
  const std::int64_t kvw = static_cast<std::int64_t>(KV) * hs;
  float* q = smem;
  float* p = smem + hs;
  float* sums = p + k_split_keys;
  for (int c = tid; c < hs; c += blockDim.x) q[c] = to_float(qkv[h * hs + c]);
  __syncthreads();
  float score = -INFINITY;
  if (tid < keys) {
    const T* k = kc + (j0 + tid) * kvw + g * hs;
    float d = 0.0f;
    for (int c = 0; c < hs; c += V) {
      float x[V];
      load_v<V>(x, k + c);
#pragma unroll
      for (int e = 0; e < V; ++e) d += q[c + e] * x[e];
    }
    score = scale * d;
  }
  const float m = block_max(score, scratch);
  const float ex = tid < keys ? expf(score - m) : 0.0f;
  if (tid < k_split_keys) p[tid] = ex;
  const float l = block_sum(ex, scratch);  // synchronizes: p is written
  const int chunks = hs / V, groups = max(1, static_cast<int>(blockDim.x) / chunks);
  for (int idx = tid; idx < groups * chunks; idx += blockDim.x) {
    const int grp = idx / chunks, c = (idx - grp * chunks) * V;
    float acc[V] = {};
    for (int j = grp; j < keys; j += groups) {
      float x[V];
      load_v<V>(x, vc + (j0 + j) * kvw + g * hs + c);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += p[j] * x[e];
    }
#pragma unroll
    for (int e = 0; e < V; ++e) sums[grp * hs + c + e] = acc[e];
  }
  __syncthreads();
  float* out = part + (static_cast<std::int64_t>(h) * gridDim.y + split) * (hs + 2);
  for (int c = tid; c < hs; c += blockDim.x) {
    float t = 0.0f;
    for (int grp = 0; grp < groups; ++grp) t += sums[grp * hs + c];
    out[c] = t;
  }
  if (tid == 0) out[hs] = m, out[hs + 1] = l;
}

// out (head h) = the splits' sums rescaled to their common maximum, over the common total.
template <class T>
__global__ void decode_attention_combine_kernel(T* out, const float* part, const int* pos,
                                                int capacity, int hs, int splits_max) {
  const int h = blockIdx.x, n = min(*pos, capacity - 1) + 1;
  const int splits = (n + k_split_keys - 1) / k_split_keys;
  const float* ph = part + static_cast<std::int64_t>(h) * splits_max * (hs + 2);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, ph[s * (hs + 2) + hs]);
  float L = 0.0f;
  for (int s = 0; s < splits; ++s) L += ph[s * (hs + 2) + hs + 1] * expf(ph[s * (hs + 2) + hs] - M);
  for (int c = threadIdx.x; c < hs; c += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) o += ph[s * (hs + 2) + c] * expf(ph[s * (hs + 2) + hs] - M);
    out[h * hs + c] = from_float<T>(o / L);
  }
}

// Rows pos .. pos + rows - 1 of the caches from the k and v heads of qkv's rows.
template <class T>
__global__ void kv_append_kernel(T* kc, T* vc, const T* qkv, int rows, int NH, int KV, int hs,
                                 const int* pos) {
  const std::int64_t kvw = static_cast<std::int64_t>(KV) * hs, width = (NH + 2 * KV) * hs;
  const std::int64_t first = pos ? *pos : 0, total = 2 * rows * kvw;
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    const std::int64_t r = i / (2 * kvw), rest = i - r * 2 * kvw;  // rest < kvw: k, else v
    const T x = qkv[r * width + NH * hs + rest];
    (rest < kvw ? kc : vc)[(first + r) * kvw + rest % kvw] = x;
  }
}

template <class T>
void kv_append(T* kc, T* vc, const T* qkv, int rows, int NH, int KV, int hs, const int* pos,
               void* st) {
  if (rows <= 0 || KV <= 0) return;
  const std::int64_t total = 2 * static_cast<std::int64_t>(rows) * KV * hs;
  kv_append_kernel<T>
      <<<grid_for(total), k_block, 0, as_stream(st)>>>(kc, vc, qkv, rows, NH, KV, hs, pos);
  TESSERA_CUDA_CHECK_LAUNCH();
}

template <class T>
void decode_attend(T* out, const T* qkv, const T* kc, const T* vc, const int* pos, int capacity,
                   int NH, int KV, int hs, float* scratch, void* st) {
  if (capacity <= 0 || NH <= 0) return;
  TESSERA_CUDA_REQUIRE(KV > 0 && NH % KV == 0,
                       "decode_attention: heads not a multiple of kv heads");
  const bool vec = hs % 8 == 0 && aligned16(kc) && aligned16(vc);
  const int chunks = vec ? hs / 8 : hs, groups = std::max(1, k_split_threads / chunks);
  const std::size_t smem = (static_cast<std::size_t>(hs) * (1 + groups) + k_split_keys) * 4;
  TESSERA_CUDA_REQUIRE(smem <= 48 * 1024, "decode_attention: head size too large");
  const dim3 grid(NH, max_splits(capacity));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  if (vec)
    decode_attention_split_kernel<T, 8><<<grid, k_split_threads, smem, as_stream(st)>>>(
        qkv, kc, vc, pos, capacity, NH, KV, hs, scratch, scale);
  else
    decode_attention_split_kernel<T, 1><<<grid, k_split_threads, smem, as_stream(st)>>>(
        qkv, kc, vc, pos, capacity, NH, KV, hs, scratch, scale);
  TESSERA_CUDA_CHECK_LAUNCH();
  decode_attention_combine_kernel<T><<<NH, std::min(hs, 1024), 0, as_stream(st)>>>(
      out, scratch, pos, capacity, hs, max_splits(capacity));
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, int T, int NH, int KV,
                     int hs, const int* pos, void* stream) {
  kv_append(k_cache, v_cache, qkv, T, NH, KV, hs, pos, stream);
}
void kv_cache_append_bf16(std::uint16_t* k_cache, std::uint16_t* v_cache, const std::uint16_t* qkv,
                          int T, int NH, int KV, int hs, const int* pos, void* stream) {
  kv_append(as_bf16(k_cache), as_bf16(v_cache), as_bf16(qkv), T, NH, KV, hs, pos, stream);
}
std::size_t decode_attention_scratch_bytes(int NH, int hs, int capacity) {
  return static_cast<std::size_t>(NH) * max_splits(capacity) * (hs + 2) * sizeof(float);
}
void decode_attention(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                      const int* pos, int capacity, int NH, int KV, int hs, float* scratch,
                      void* stream) {
  decode_attend(out, qkv, k_cache, v_cache, pos, capacity, NH, KV, hs, scratch, stream);
}
void decode_attention_bf16(std::uint16_t* out, const std::uint16_t* qkv,
                           const std::uint16_t* k_cache, const std::uint16_t* v_cache,
                           const int* pos, int capacity, int NH, int KV, int hs, float* scratch,
                           void* stream) {
  decode_attend(as_bf16(out), as_bf16(qkv), as_bf16(k_cache), as_bf16(v_cache), pos, capacity, NH,
                KV, hs, scratch, stream);
}

// ---------------------------------------------------------------- streams and graphs
Stream::Stream() {
  cudaStream_t s = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  s_ = s;
}
Stream::~Stream() {
  if (s_) cudaStreamDestroy(as_stream(s_));
}

Graph::~Graph() {
  release();
}
void Graph::release() noexcept {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}
void Graph::begin_capture(void* stream) {
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
}
void Graph::end_capture(void* stream) {
  cudaGraph_t g = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(as_stream(stream), &g));
  cudaGraphExec_t e = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  if (err != cudaSuccess) cudaGraphDestroy(g);
  TESSERA_CUDA_CHECK(err);
  release();
  graph_ = g;
  exec_ = e;
}
void Graph::abandon_capture(void* stream) noexcept {
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(as_stream(stream), &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();  // the failed capture's error is the one being thrown
}
void Graph::launch(void* stream) {
  TESSERA_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), as_stream(stream)));
}

}  // namespace tessera::kernels::cuda
