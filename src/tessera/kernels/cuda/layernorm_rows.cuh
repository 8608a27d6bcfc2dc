// The general norm kernels over fp32 or bf16 tensors: LayerNorm a block per row with the column
// sums of its parameter gradients, and RMSNorm a warp per row. The fp32 ops (ops.cu,
// llama_ops.cu) and the bf16 ops' fallback for widths the 16-byte warp-per-row kernels do not
// take (ops_bf16.cu) share them. Statistics and sums are fp32 throughout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr float k_layernorm_eps = 1e-5f;  // = kernels::cpu::k_layernorm_eps
constexpr int k_layernorm_threads = 256;  // threads per row

__device__ inline float to_float(float x) {
  return x;
}
__device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ inline T from_float(float x) {
  if constexpr (sizeof(T) == sizeof(float))
    return x;
  else
    return __float2bfloat16(x);
}

// One block per row: mean, then the variance of (x - mean) (two passes, as the CPU kernel).
template <class Out>
__global__ void layernorm_forward_rows_kernel(Out* out, float* mean, float* rstd, const float* inp,
                                              const float* weight, const float* bias, int C) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = block_sum(s, scratch) / C;
  float v = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float r = rsqrtf(block_sum(v, scratch) / C + k_layernorm_eps);
  Out* o = out + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    o[c] = from_float<Out>((x[c] - m) * r * weight[c] + bias[c]);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp (fp32) += the input gradient, one block per row; with `copy`, the updated dinp is also
// written there in Copy's type (the next GEMM's input).
template <class G, class Copy>
__global__ void layernorm_backward_rows_kernel(float* dinp, Copy* copy, const G* dout,
                                               const float* inp, const float* weight,
                                               const float* mean, const float* rstd, int C) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const G* g = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float sum_dn = 0.0f, sum_dn_n = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (x[c] - m) * r;
    const float dn = weight[c] * to_float(g[c]);
    sum_dn += dn;
    sum_dn_n += dn * n;
  }
  const float mean_dn = block_sum(sum_dn, scratch) / C;
  const float mean_dn_n = block_sum(sum_dn_n, scratch) / C;
  float* dx = dinp + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (x[c] - m) * r;
    const float dn = weight[c] * to_float(g[c]);
    const float v = dx[c] + (dn - mean_dn - n * mean_dn_n) * r;
    dx[c] = v;
    if (copy) copy[row * C + c] = from_float<Copy>(v);
  }
}

// Column sums over rows (32 columns x 8 row-threads per block, a slice of rows per blockIdx.y,
// one atomicAdd per column and block): dbias += sum_i dout[i][c] and, with inp, the LayerNorm
// weight gradient dweight += sum_i dout[i][c] * (inp[i][c] - mean[i]) * rstd[i].
constexpr int k_cols = 32, k_rows = 8;
template <class T>
__global__ void column_sums_kernel(float* dweight, float* dbias, const T* dout, const float* inp,
                                   const float* mean, const float* rstd, std::int64_t N, int C) {
  __shared__ float sw[k_rows][k_cols];
  __shared__ float sb[k_rows][k_cols];
  const int c = blockIdx.x * k_cols + threadIdx.x;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.y) * k_rows + threadIdx.y; i < N;
         i += static_cast<std::int64_t>(gridDim.y) * k_rows) {
      const float g = to_float(dout[i * C + c]);
      db += g;
      if (inp) dw += (inp[i * C + c] - mean[i]) * rstd[i] * g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = dw;
  sb[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < k_rows; ++k) {
      dw += sw[k][threadIdx.x];
      db += sb[k][threadIdx.x];
    }
    if (dweight) atomicAdd(dweight + c, dw);
    atomicAdd(dbias + c, db);
  }
}

template <class T>
void launch_column_sums(float* dweight, float* dbias, const T* dout, const float* inp,
                        const float* mean, const float* rstd, std::int64_t N, int C,
                        cudaStream_t s) {
  const unsigned col_blocks = static_cast<unsigned>((C + k_cols - 1) / k_cols);
  const std::int64_t row_tiles = (N + k_rows - 1) / k_rows;
  // about 8192 blocks in all (several waves on any current GPU), at most 256 atomics per column
  const std::int64_t want = std::max<std::int64_t>(1, 8192 / col_blocks);
  const unsigned row_blocks = static_cast<unsigned>(
      std::clamp<std::int64_t>(row_tiles, 1, std::min<std::int64_t>(want, 256)));
  column_sums_kernel<T><<<dim3(col_blocks, row_blocks), dim3(k_cols, k_rows), 0, s>>>(
      dweight, dbias, dout, inp, mean, rstd, N, C);
  TESSERA_CUDA_CHECK_LAUNCH();
}

template <class Out>
void launch_layernorm_forward_rows(Out* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, std::int64_t N, int C,
                                   cudaStream_t s) {
  TESSERA_CUDA_REQUIRE(N <= 0x7fffffff, "layernorm_forward: one block per row, N < 2^31");
  layernorm_forward_rows_kernel<Out><<<static_cast<unsigned>(N), k_layernorm_threads, 0, s>>>(
      out, mean, rstd, inp, weight, bias, C);
  TESSERA_CUDA_CHECK_LAUNCH();
}

// dinp +=, copy = bf16(dinp) if given; dweight, dbias += (column sums)
template <class G, class Copy>
void launch_layernorm_backward_rows(float* dinp, Copy* copy, float* dweight, float* dbias,
                                    const G* dout, const float* inp, const float* weight,
                                    const float* mean, const float* rstd, std::int64_t N, int C,
                                    cudaStream_t s) {
  TESSERA_CUDA_REQUIRE(N <= 0x7fffffff, "layernorm_backward: one block per row, N < 2^31");
  layernorm_backward_rows_kernel<G, Copy><<<static_cast<unsigned>(N), k_layernorm_threads, 0, s>>>(
      dinp, copy, dout, inp, weight, mean, rstd, C);
  TESSERA_CUDA_CHECK_LAUNCH();
  launch_column_sums(dweight, dbias, dout, inp, mean, rstd, N, C, s);
}

// RMSNorm, a warp per row: out = x r w, r = 1 / sqrt(mean(x^2) + eps).
constexpr int k_rms_rows_per_block = 8;

template <class Out>
__global__ void rmsnorm_forward_rows_kernel(Out* out, float* rstd, const float* inp, const float* w,
                                            std::int64_t N, int C, float eps) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * k_rms_rows_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / C + eps);
  if (lane == 0) rstd[row] = r;
  for (int c = lane; c < C; c += 32) out[row * C + c] = from_float<Out>(x[c] * r * w[c]);
}

// dx += r (w g - n mean(w g n)), n = x r; dw += g n: per-block sums in shared memory, then one
// atomic per column and block. copy, if not null, = dinp after the update, in Copy's type.
template <class G, class Copy>
__global__ void rmsnorm_backward_rows_kernel(float* dinp, Copy* copy, float* dw, const G* dout,
                                             const float* inp, const float* w, const float* rstd,
                                             std::int64_t N, int C) {
  extern __shared__ float sdw[];
  for (int c = threadIdx.x; c < C; c += blockDim.x) sdw[c] = 0.0f;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * k_rms_rows_per_block + warp;
       row < N; row += static_cast<std::int64_t>(gridDim.x) * k_rms_rows_per_block) {
    const float* x = inp + row * C;
    const float r = rstd[row];
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += w[c] * to_float(dout[row * C + c]) * x[c] * r;
    const float mean = warp_sum(s) / C;
    for (int c = lane; c < C; c += 32) {
      const float g = to_float(dout[row * C + c]), n = x[c] * r;
      atomicAdd(sdw + c, g * n);
      const float d = dinp[row * C + c] + (w[c] * g - n * mean) * r;
      dinp[row * C + c] = d;
      if (copy) copy[row * C + c] = from_float<Copy>(d);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dw + c, sdw[c]);
}

inline unsigned rmsnorm_rows_blocks(std::int64_t N) {
  return static_cast<unsigned>((N + k_rms_rows_per_block - 1) / k_rms_rows_per_block);
}

template <class Out>
void launch_rmsnorm_forward_rows(Out* out, float* rstd, const float* inp, const float* w,
                                 std::int64_t N, int C, float eps, cudaStream_t s) {
  if (N <= 0) return;
  rmsnorm_forward_rows_kernel<Out>
      <<<rmsnorm_rows_blocks(N), 32 * k_rms_rows_per_block, 0, s>>>(out, rstd, inp, w, N, C, eps);
  TESSERA_CUDA_CHECK_LAUNCH();
}

template <class G, class Copy>
void launch_rmsnorm_backward_rows(float* dinp, Copy* copy, float* dw, const G* dout,
                                  const float* inp, const float* w, const float* rstd,
                                  std::int64_t N, int C, cudaStream_t s) {
  if (N <= 0) return;
  const unsigned blocks = std::min(rmsnorm_rows_blocks(N), 1024u);
  rmsnorm_backward_rows_kernel<G, Copy>
      <<<blocks, 32 * k_rms_rows_per_block, static_cast<std::size_t>(C) * sizeof(float), s>>>(
          dinp, copy, dw, dout, inp, w, rstd, N, C);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace tessera::kernels::cuda
