// CUDA kernels of the llama family's ops (ops.hpp): rotary positions and SwiGLU, in fp32 and with
// bf16 activations (arithmetic in fp32), and the fp32 RMSNorm (layernorm_rows.cuh; the bf16 one
// is ops_bf16.cu's warp-per-row norm). A block takes a position (rotation) or a row (SwiGLU) at
// a time, so that a position's angles are computed once and rows are read in 16-byte pieces.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/layernorm_rows.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

// The rotary inverse frequencies, passed to the kernel by value (kernel parameters live in
// constant memory; 2 KiB of them stay well under the 4 KiB limit of parameters) and copied to
// shared memory by each block.
constexpr int k_rope_max_half = 256;  // head sizes up to 512
struct RopeFreqs {
  double v[k_rope_max_half];
};

// A block takes a position t at a time, for every sequence of the batch: the position's cos and
// sin (half of each, the angle t * inv_freq[i] in double as the CPU kernel computes it, then
// rounded to fp32) are computed once into shared memory, then the block's threads rotate the
// pairs (x_i, x_{i+half}) of every q and k head of the B rows by +-angle, V consecutive i at a
// time (8 for 16-byte accesses where half % 8 == 0).
template <class T, int V>
__global__ void rope_kernel(T* qkv, int B, int Tn, int NH, int KV, int hs, RopeFreqs f, float sign,
                            const int* pos0) {
  const int half = hs / 2, per_row = (NH + KV) * (half / V), items = B * per_row;
  __shared__ double inv_freq[k_rope_max_half];  // neighbouring threads read different entries,
  __shared__ float cs[2 * k_rope_max_half];     // which the parameters' bank serves one at a time
  for (int j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = f.v[j];
  const std::int64_t W = static_cast<std::int64_t>(NH + 2 * KV) * hs;
  const int first = pos0 ? *pos0 : 0;
  for (int t = blockIdx.x; t < Tn; t += gridDim.x) {
    __syncthreads();  // the previous position's readers are done with cs
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      const double a = static_cast<double>(first + t) * inv_freq[i];
      cs[i] = static_cast<float>(cos(a));
      cs[half + i] = sign * static_cast<float>(sin(a));
    }
    __syncthreads();
    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int b = item / per_row, p = item - b * per_row;
      const int h = p / (half / V), i = (p - h * (half / V)) * V;
      T* x = qkv + (static_cast<std::int64_t>(b) * Tn + t) * W + h * hs + i;
      float x1[V], x2[V];
      if constexpr (V == 8) {
        load8(x1, x);
        load8(x2, x + half);
      } else {
        x1[0] = to_float(x[0]), x2[0] = to_float(x[half]);
      }
      float y1[V], y2[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float c = cs[i + e], s = cs[half + i + e];
        y1[e] = x1[e] * c - x2[e] * s;
        y2[e] = x2[e] * c + x1[e] * s;
      }
      if constexpr (V == 8) {
        store8(x, y1);
        store8(x + half, y2);
      } else {
        x[0] = from_float<T>(y1[0]), x[half] = from_float<T>(y2[0]);
      }
    }
  }
}

// SwiGLU over rows of [gate | up] (2 F wide): out = silu(gate) up. A block per row at a time,
// its threads over the columns, 8 at a time (16-byte accesses) where Vec.
__device__ inline float silu_of(float g) {
  return g / (1.0f + expf(-g));
}

template <class T, bool Vec>
__global__ void swiglu_forward_kernel(T* out, const T* inp, std::int64_t N, int F) {
  constexpr int V = Vec ? 8 : 1;
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* gate = inp + row * 2 * F;
    const T* up = gate + F;
    T* o = out + row * F;
    for (int c = threadIdx.x * V; c < F; c += blockDim.x * V) {
      if constexpr (Vec) {
        float g[8], u[8];
        load8(g, gate + c);
        load8(u, up + c);
#pragma unroll
        for (int e = 0; e < 8; ++e) g[e] = silu_of(g[e]) * u[e];
        store8(o + c, g);
      } else {
        o[c] = from_float<T>(silu_of(to_float(gate[c])) * to_float(up[c]));
      }
    }
  }
}

// d gate = d out up sig (1 + g (1 - sig)), d up = d out silu(g)
template <class T, bool Vec>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, std::int64_t N,
                                       int F) {
  constexpr int V = Vec ? 8 : 1;
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* gate = inp + row * 2 * F;
    const T* up = gate + F;
    const T* d = dout + row * F;
    T* dgate = dinp + row * 2 * F;
    T* dup = dgate + F;
    for (int c = threadIdx.x * V; c < F; c += blockDim.x * V) {
      float g[V], u[V], dd[V], dg[V], du[V];
      if constexpr (Vec) {
        load8(g, gate + c);
        load8(u, up + c);
        load8(dd, d + c);
      } else {
        g[0] = to_float(gate[c]), u[0] = to_float(up[c]), dd[0] = to_float(d[c]);
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float sig = 1.0f / (1.0f + expf(-g[e]));
        dg[e] = dd[e] * u[e] * sig * (1.0f + g[e] * (1.0f - sig));
        du[e] = dd[e] * g[e] * sig;
      }
      if constexpr (Vec) {
        store8(dgate + c, dg);
        store8(dup + c, du);
      } else {
        dgate[c] = from_float<T>(dg[0]), dup[c] = from_float<T>(du[0]);
      }
    }
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>(std::min<std::int64_t>(rows, 65536));
}

template <class T>
void rope(T* qkv, int B, int Tn, int NH, int KV, int hs, const double* inv_freq, float sign,
          void* st, const int* pos0 = nullptr) {
  if (B <= 0 || Tn <= 0 || NH + KV <= 0 || hs < 2) return;
  TESSERA_CUDA_REQUIRE(hs / 2 <= k_rope_max_half, "rope: head size above 512");
  TESSERA_CUDA_REQUIRE(static_cast<std::int64_t>(B) * (NH + KV) * hs <= 0x7fffffff,
                       "rope: batch x heads x head size above 2^31");
  RopeFreqs f{};
  for (int i = 0; i < hs / 2; ++i) f.v[i] = inv_freq[i];
  const unsigned blocks = row_blocks(Tn);
  if ((hs / 2) % 8 == 0 && aligned16(qkv))
    rope_kernel<T, 8><<<blocks, k_block, 0, as_stream(st)>>>(qkv, B, Tn, NH, KV, hs, f, sign, pos0);
  else
    rope_kernel<T, 1><<<blocks, k_block, 0, as_stream(st)>>>(qkv, B, Tn, NH, KV, hs, f, sign, pos0);
  TESSERA_CUDA_CHECK_LAUNCH();
}

template <class T>
void swiglu_forward_rows(T* out, const T* inp, std::int64_t N, int F, void* st) {
  if (N <= 0 || F <= 0) return;
  const bool vec = F % 8 == 0 && aligned16(out) && aligned16(inp);
  if (vec)
    swiglu_forward_kernel<T, true><<<row_blocks(N), k_block, 0, as_stream(st)>>>(out, inp, N, F);
  else
    swiglu_forward_kernel<T, false><<<row_blocks(N), k_block, 0, as_stream(st)>>>(out, inp, N, F);
  TESSERA_CUDA_CHECK_LAUNCH();
}

template <class T>
void swiglu_backward_rows(T* dinp, const T* dout, const T* inp, std::int64_t N, int F, void* st) {
  if (N <= 0 || F <= 0) return;
  const bool vec = F % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp);
  if (vec)
    swiglu_backward_kernel<T, true>
        <<<row_blocks(N), k_block, 0, as_stream(st)>>>(dinp, dout, inp, N, F);
  else
    swiglu_backward_kernel<T, false>
        <<<row_blocks(N), k_block, 0, as_stream(st)>>>(dinp, dout, inp, N, F);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     int C, float eps, void* stream) {
  launch_rmsnorm_forward_rows(out, rstd, inp, w, N, C, eps, as_stream(stream));
}
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, std::int64_t N, int C, void* stream) {
  launch_rmsnorm_backward_rows(dinp, static_cast<float*>(nullptr), dw, dout, inp, w, rstd, N, C,
                               as_stream(stream));
}

void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                  void* stream, const int* pos0) {
  rope(qkv, B, T, NH, KV, hs, inv_freq, 1.0f, stream, pos0);
}
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                   void* stream) {
  rope(dqkv, B, T, NH, KV, hs, inv_freq, -1.0f, stream);
}
void rope_forward_bf16(std::uint16_t* qkv, int B, int T, int NH, int KV, int hs,
                       const double* inv_freq, void* stream, const int* pos0) {
  rope(as_bf16(qkv), B, T, NH, KV, hs, inv_freq, 1.0f, stream, pos0);
}
void rope_backward_bf16(std::uint16_t* dqkv, int B, int T, int NH, int KV, int hs,
                        const double* inv_freq, void* stream) {
  rope(as_bf16(dqkv), B, T, NH, KV, hs, inv_freq, -1.0f, stream);
}

void swiglu_forward(float* out, const float* inp, std::int64_t N, int F, void* stream) {
  swiglu_forward_rows(out, inp, N, F, stream);
}
void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F,
                     void* stream) {
  swiglu_backward_rows(dinp, dout, inp, N, F, stream);
}
void swiglu_forward_bf16(std::uint16_t* out, const std::uint16_t* inp, std::int64_t N, int F,
                         void* stream) {
  swiglu_forward_rows(as_bf16(out), as_bf16(inp), N, F, stream);
}
void swiglu_backward_bf16(std::uint16_t* dinp, const std::uint16_t* dout, const std::uint16_t* inp,
                          std::int64_t N, int F, void* stream) {
  swiglu_backward_rows(as_bf16(dinp), as_bf16(dout), as_bf16(inp), N, F, stream);
}

}  // namespace tessera::kernels::cuda
