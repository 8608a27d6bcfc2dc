// CUDA kernels of the llama family's ops (ops.hpp): RMSNorm, rotary positions and SwiGLU, in
// fp32 and with bf16 activations (statistics and arithmetic in fp32). Straightforward kernels: a
// warp per row for the norm, one thread per element (pair) for the rest.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

__device__ inline float load(const float* p, std::int64_t i) {
  return p[i];
}
__device__ inline float load(const std::uint16_t* p, std::int64_t i) {
  return __bfloat162float(reinterpret_cast<const bf16*>(p)[i]);
}
__device__ inline void store(float* p, std::int64_t i, float v) {
  p[i] = v;
}
__device__ inline void store(std::uint16_t* p, std::int64_t i, float v) {
  reinterpret_cast<bf16*>(p)[i] = __float2bfloat16(v);
}

constexpr int k_rows_per_block = 8;  // a warp per row

// out = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps); a warp per row.
template <class Out>
__global__ void rmsnorm_forward_kernel(Out* out, float* rstd, const float* inp, const float* w,
                                       std::int64_t N, int C, float eps) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * k_rows_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / C + eps);
  if (lane == 0) rstd[row] = r;
  for (int c = lane; c < C; c += 32) store(out, row * C + c, x[c] * r * w[c]);
}

// dx += r (w g - n mean(w g n)), n = x r; dw += g n: per-block sums in shared memory, then one
// atomic per column and block. dinp_copy, if not null, = bf16(dinp) after the update.
template <class G>
__global__ void rmsnorm_backward_kernel(float* dinp, std::uint16_t* dinp_copy, float* dw,
                                        const G* dout, const float* inp, const float* w,
                                        const float* rstd, std::int64_t N, int C) {
  extern __shared__ float sdw[];
  for (int c = threadIdx.x; c < C; c += blockDim.x) sdw[c] = 0.0f;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * k_rows_per_block + warp; row < N;
       row += static_cast<std::int64_t>(gridDim.x) * k_rows_per_block) {
    const float* x = inp + row * C;
    const float r = rstd[row];
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += w[c] * load(dout, row * C + c) * x[c] * r;
    const float mean = warp_sum(s) / C;
    for (int c = lane; c < C; c += 32) {
      const float g = load(dout, row * C + c), n = x[c] * r;
      atomicAdd(sdw + c, g * n);
      const float d = dinp[row * C + c] + (w[c] * g - n * mean) * r;
      dinp[row * C + c] = d;
      if (dinp_copy) store(dinp_copy, row * C + c, d);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dw + c, sdw[c]);
}

// The rotary inverse frequencies, passed to the kernel by value (kernel parameters live in
// constant memory; 2 KiB of them stay well under the 4 KiB limit of parameters).
constexpr int k_rope_max_half = 256;  // head sizes up to 512
struct RopeFreqs {
  double v[k_rope_max_half];
};

// Rotates (x_i, x_{i+half}) of every q and k head by +-angle (t * inv_freq[i]). The block first
// copies the table to shared memory: neighbouring threads read different entries, which the
// parameters' constant bank would serve one address at a time.
template <class T>
__global__ void rope_kernel(T* qkv, int B, int Tn, int NH, int KV, int hs, RopeFreqs f,
                            float sign) {
  const int half = hs / 2, heads = NH + KV;
  __shared__ double inv_freq[k_rope_max_half];
  for (int j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = f.v[j];
  __syncthreads();
  const std::int64_t W = static_cast<std::int64_t>(NH + 2 * KV) * hs;
  const std::int64_t total = static_cast<std::int64_t>(B) * Tn * heads * half;
  for (std::int64_t e = global_index(); e < total; e += global_stride()) {
    const int i = static_cast<int>(e % half);
    const std::int64_t rest = e / half;
    const int h = static_cast<int>(rest % heads);
    const std::int64_t row = rest / heads;  // b * Tn + t
    const int t = static_cast<int>(row % Tn);
    // the angle in double, as the CPU kernel computes it, then cos and sin in fp32
    const double a = t * inv_freq[i];
    const float c = static_cast<float>(cos(a)), s = sign * static_cast<float>(sin(a));
    const std::int64_t o = row * W + static_cast<std::int64_t>(h) * hs + i;
    const float x1 = load(qkv, o), x2 = load(qkv, o + half);
    store(qkv, o, x1 * c - x2 * s);
    store(qkv, o + half, x2 * c + x1 * s);
  }
}

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, std::int64_t N, int F) {
  const std::int64_t total = N * F;
  for (std::int64_t e = global_index(); e < total; e += global_stride()) {
    const std::int64_t row = e / F, c = e - row * F;
    const float g = load(inp, row * 2 * F + c), u = load(inp, row * 2 * F + F + c);
    store(out, e, g / (1.0f + expf(-g)) * u);
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, std::int64_t N,
                                       int F) {
  const std::int64_t total = N * F;
  for (std::int64_t e = global_index(); e < total; e += global_stride()) {
    const std::int64_t row = e / F, c = e - row * F;
    const float g = load(inp, row * 2 * F + c), u = load(inp, row * 2 * F + F + c);
    const float d = load(dout, e), sig = 1.0f / (1.0f + expf(-g));
    store(dinp, row * 2 * F + c, d * u * sig * (1.0f + g * (1.0f - sig)));
    store(dinp, row * 2 * F + F + c, d * g * sig);
  }
}

unsigned norm_blocks(std::int64_t N) {
  return static_cast<unsigned>((N + k_rows_per_block - 1) / k_rows_per_block);
}
unsigned norm_backward_blocks(std::int64_t N) {
  return static_cast<unsigned>(std::min<std::int64_t>(norm_blocks(N), 1024));
}

template <class T>
void rope(T* qkv, int B, int Tn, int NH, int KV, int hs, const double* inv_freq, float sign,
          void* st) {
  const std::int64_t total = static_cast<std::int64_t>(B) * Tn * (NH + KV) * (hs / 2);
  if (total <= 0) return;
  TESSERA_CUDA_REQUIRE(hs / 2 <= k_rope_max_half, "rope: head size above 512");
  RopeFreqs f{};
  for (int i = 0; i < hs / 2; ++i) f.v[i] = inv_freq[i];
  rope_kernel<<<grid_for(total), k_block, 0, as_stream(st)>>>(qkv, B, Tn, NH, KV, hs, f, sign);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     int C, float eps, void* stream) {
  if (N <= 0) return;
  rmsnorm_forward_kernel<<<norm_blocks(N), 32 * k_rows_per_block, 0, as_stream(stream)>>>(
      out, rstd, inp, w, N, C, eps);
  TESSERA_CUDA_CHECK_LAUNCH();
}
void rmsnorm_forward_bf16(std::uint16_t* out, float* rstd, const float* inp, const float* w,
                          std::int64_t N, int C, float eps, void* stream) {
  if (N <= 0) return;
  rmsnorm_forward_kernel<<<norm_blocks(N), 32 * k_rows_per_block, 0, as_stream(stream)>>>(
      out, rstd, inp, w, N, C, eps);
  TESSERA_CUDA_CHECK_LAUNCH();
}
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, std::int64_t N, int C, void* stream) {
  if (N <= 0) return;
  rmsnorm_backward_kernel<<<norm_backward_blocks(N), 32 * k_rows_per_block,
                            static_cast<std::size_t>(C) * sizeof(float), as_stream(stream)>>>(
      dinp, nullptr, dw, dout, inp, w, rstd, N, C);
  TESSERA_CUDA_CHECK_LAUNCH();
}
void rmsnorm_backward_bf16(float* dinp, std::uint16_t* dinp_bf16, float* dw,
                           const std::uint16_t* dout, const float* inp, const float* w,
                           const float* rstd, std::int64_t N, int C, void* stream) {
  if (N <= 0) return;
  rmsnorm_backward_kernel<<<norm_backward_blocks(N), 32 * k_rows_per_block,
                            static_cast<std::size_t>(C) * sizeof(float), as_stream(stream)>>>(
      dinp, dinp_bf16, dw, dout, inp, w, rstd, N, C);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                  void* stream) {
  rope(qkv, B, T, NH, KV, hs, inv_freq, 1.0f, stream);
}
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                   void* stream) {
  rope(dqkv, B, T, NH, KV, hs, inv_freq, -1.0f, stream);
}
void rope_forward_bf16(std::uint16_t* qkv, int B, int T, int NH, int KV, int hs,
                       const double* inv_freq, void* stream) {
  rope(qkv, B, T, NH, KV, hs, inv_freq, 1.0f, stream);
}
void rope_backward_bf16(std::uint16_t* dqkv, int B, int T, int NH, int KV, int hs,
                        const double* inv_freq, void* stream) {
  rope(dqkv, B, T, NH, KV, hs, inv_freq, -1.0f, stream);
}

void swiglu_forward(float* out, const float* inp, std::int64_t N, int F, void* stream) {
  if (N * F <= 0) return;
  swiglu_forward_kernel<<<grid_for(N * F), k_block, 0, as_stream(stream)>>>(out, inp, N, F);
  TESSERA_CUDA_CHECK_LAUNCH();
}
void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F,
                     void* stream) {
  if (N * F <= 0) return;
  swiglu_backward_kernel<<<grid_for(N * F), k_block, 0, as_stream(stream)>>>(dinp, dout, inp, N, F);
  TESSERA_CUDA_CHECK_LAUNCH();
}
void swiglu_forward_bf16(std::uint16_t* out, const std::uint16_t* inp, std::int64_t N, int F,
                         void* stream) {
  if (N * F <= 0) return;
  swiglu_forward_kernel<<<grid_for(N * F), k_block, 0, as_stream(stream)>>>(out, inp, N, F);
  TESSERA_CUDA_CHECK_LAUNCH();
}
void swiglu_backward_bf16(std::uint16_t* dinp, const std::uint16_t* dout, const std::uint16_t* inp,
                          std::int64_t N, int F, void* stream) {
  if (N * F <= 0) return;
  swiglu_backward_kernel<<<grid_for(N * F), k_block, 0, as_stream(stream)>>>(dinp, dout, inp, N, F);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
