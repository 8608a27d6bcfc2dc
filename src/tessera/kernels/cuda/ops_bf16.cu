// The bf16 side of the op table (ops.hpp): kernels of the mixed-precision model, where the
// tensors that feed GEMMs and attention are bf16, while the residual stream, normalization
// statistics, softmax, losses, gradients and optimizer state stay fp32. Every reduction
// accumulates in fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/layernorm_rows.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr float k_gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)

// ---------------------------------------------------------------- norms, a warp per row
// LayerNorm and RMSNorm over fp32 rows with bf16 outputs, for C % 8 == 0 and C <= 8 * 32 *
// k_ln_max_cpl (and 16-byte aligned rows): each lane holds chunks of 8 columns (lane, lane + 32,
// ...) of its row in registers, read and written 16 bytes at a time; the statistics and the
// backward's row sums are warp reductions. The backward also accumulates the weight (and bias)
// gradients: per block in shared memory, then one atomicAdd per column and block. RMSNorm is
// LayerNorm without the centring and the shift: n = x r, r = 1 / sqrt(mean(x^2) + eps), and its
// input gradient r (w g - n mean(w g n)) lacks LayerNorm's - mean(w g) term.
constexpr int k_ln_max_cpl = 8;  // chunks of 8 columns per lane: C <= 2048
constexpr int k_ln_warps = 8;    // rows in flight per block

// One call's tensors. Forward: out (bf16), mean (LayerNorm only), rstd from inp, weight, bias
// (LayerNorm only). Backward: dinp +=, out (if not null) = bf16(dinp), dweight (and dbias) +=,
// from dout (bf16) and the forward's inp, weight, mean and rstd.
struct NormRows {
  std::uint16_t* out = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  const float* inp = nullptr;
  const float* weight = nullptr;
  const float* bias = nullptr;
  float* dinp = nullptr;
  float* dweight = nullptr;
  float* dbias = nullptr;
  const std::uint16_t* dout = nullptr;
  std::int64_t N = 0;
  int C = 0;
  float eps = 0.0f;
};

bool norm_warp_path(const NormRows& a) {
  return a.C % 8 == 0 && a.C <= 8 * 32 * k_ln_max_cpl && aligned16(a.inp) && aligned16(a.out) &&
         aligned16(a.weight) && aligned16(a.dinp) && aligned16(a.dout) && aligned16(a.bias);
}
unsigned norm_blocks(std::int64_t N) {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const std::int64_t want = std::max(1, sms) * 8;  // several waves of 8-warp blocks
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((N + k_ln_warps - 1) / k_ln_warps, 1, want));
}

template <int CPL, bool Rms>
__global__ void __launch_bounds__(32 * k_ln_warps) norm_forward_warp_kernel(NormRows a) {
  bf16* out = as_bf16(a.out);
  const int C = a.C, lane = threadIdx.x & 31, nchunks = C / 8;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * k_ln_warps;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * k_ln_warps + (threadIdx.x >> 5);
       row < a.N; row += warps) {
    float x[CPL][8];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      const int ch = lane + 32 * k;
      if (ch < nchunks) {
        load8(x[k], a.inp + row * C + 8 * ch);
#pragma unroll
        for (int e = 0; e < 8; ++e) s += x[k][e];
      }
    }
    const float m = Rms ? 0.0f : warp_sum(s) / C;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < CPL; ++k)
      if (lane + 32 * k < nchunks)
#pragma unroll
        for (int e = 0; e < 8; ++e) v += (x[k][e] - m) * (x[k][e] - m);
    const float r = rsqrtf(warp_sum(v) / C + a.eps);
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      const int ch = lane + 32 * k;
      if (ch >= nchunks) continue;
      float w[8], o[8];
      load8(w, a.weight + 8 * ch);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = (x[k][e] - m) * r * w[e];
      if constexpr (!Rms) {
        float b[8];
        load8(b, a.bias + 8 * ch);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] += b[e];
      }
      store8(out + row * C + 8 * ch, o);
    }
    if (lane == 0) {
      if constexpr (!Rms) a.mean[row] = m;
      a.rstd[row] = r;
    }
  }
}

// dynamic shared memory: the block's dweight (and, LayerNorm, dbias) partial sums, C (2 C) floats
template <int CPL, bool Rms>
__global__ void __launch_bounds__(32 * k_ln_warps) norm_backward_warp_kernel(NormRows a) {
  extern __shared__ float part[];  // [0, C): dweight, [C, 2C): dbias
  const bf16* dout = as_bf16(a.dout);
  bf16* dinp_bf16 = a.out ? as_bf16(a.out) : nullptr;
  const int C = a.C, lane = threadIdx.x & 31, nchunks = C / 8;
  for (int c = threadIdx.x; c < (Rms ? 1 : 2) * C; c += blockDim.x) part[c] = 0.0f;
  __syncthreads();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * k_ln_warps;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * k_ln_warps + (threadIdx.x >> 5);
       row < a.N; row += warps) {
    const float m = Rms ? 0.0f : a.mean[row], r = a.rstd[row];
    float n[CPL][8], dn[CPL][8];
    float sum_dn = 0.0f, sum_dn_n = 0.0f;
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      const int ch = lane + 32 * k;
      if (ch >= nchunks) continue;
      float g[8], w[8];
      load8(n[k], a.inp + row * C + 8 * ch);
      load8(g, dout + row * C + 8 * ch);
      load8(w, a.weight + 8 * ch);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        n[k][e] = (n[k][e] - m) * r;
        dn[k][e] = w[e] * g[e];
        sum_dn += dn[k][e];
        sum_dn_n += dn[k][e] * n[k][e];
        // shared-memory atomics, laid out [e][chunk] so that a warp's lanes (consecutive
        // chunks) hit distinct banks
        atomicAdd(&part[e * nchunks + ch], n[k][e] * g[e]);
        if constexpr (!Rms) atomicAdd(&part[C + e * nchunks + ch], g[e]);
      }
    }
    const float mean_dn = Rms ? 0.0f : warp_sum(sum_dn) / C, mean_dn_n = warp_sum(sum_dn_n) / C;
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      const int ch = lane + 32 * k;
      if (ch >= nchunks) continue;
      float d[8];
      float* dst = a.dinp + row * C + 8 * ch;
      load8(d, dst);
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e] += (dn[k][e] - mean_dn - n[k][e] * mean_dn_n) * r;
      store8(dst, d);
      if (dinp_bf16) store8(dinp_bf16 + row * C + 8 * ch, d);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int at = (c % 8) * nchunks + c / 8;  // column c = 8 chunk + e
    atomicAdd(a.dweight + c, part[at]);
    if constexpr (!Rms) atomicAdd(a.dbias + c, part[C + at]);
  }
}

template <bool Rms, int CPL = 1>
void launch_norm_warp(bool forward, const NormRows& a, cudaStream_t s) {
  if (a.C > 8 * 32 * CPL) {  // the fewest chunks per lane that hold the row
    if constexpr (CPL < k_ln_max_cpl) launch_norm_warp<Rms, CPL + 1>(forward, a, s);
    return;
  }
  const unsigned blocks = norm_blocks(a.N);
  if (forward) {
    norm_forward_warp_kernel<CPL, Rms><<<blocks, 32 * k_ln_warps, 0, s>>>(a);
  } else {
    const int smem = (Rms ? 1 : 2) * a.C * static_cast<int>(sizeof(float));
    norm_backward_warp_kernel<CPL, Rms><<<blocks, 32 * k_ln_warps, smem, s>>>(a);
  }
  TESSERA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- gelu (8 elements a thread)
__device__ inline float gelu(float x) {
  const float u = k_gelu_scale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ inline float gelu_grad(float x) {
  const float u = k_gelu_scale * (x + 0.044715f * x * x * x);
  const float th = tanhf(u);
  const float du = k_gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

__global__ void gelu_forward_bf16_kernel(std::uint16_t* out_, const std::uint16_t* inp_,
                                         std::int64_t n) {
  bf16* out = as_bf16(out_);
  const bf16* inp = as_bf16(inp_);
  const std::int64_t n8 = n / 8;
  for (std::int64_t i = global_index(); i < n8; i += global_stride()) {
    uint4 v = reinterpret_cast<const uint4*>(inp)[i];
    auto* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      h[k] = __floats2bfloat162_rn(gelu(f.x), gelu(f.y));
    }
    reinterpret_cast<uint4*>(out)[i] = v;
  }
  for (std::int64_t i = n8 * 8 + global_index(); i < n; i += global_stride())
    out[i] = __float2bfloat16(gelu(__bfloat162float(inp[i])));
}

__global__ void gelu_backward_bf16_kernel(std::uint16_t* dinp_, const std::uint16_t* inp_,
                                          const std::uint16_t* dout_, std::int64_t n) {
  bf16* dinp = as_bf16(dinp_);
  const bf16* inp = as_bf16(inp_);
  const bf16* dout = as_bf16(dout_);
  const std::int64_t n8 = n / 8;
  for (std::int64_t i = global_index(); i < n8; i += global_stride()) {
    uint4 x = reinterpret_cast<const uint4*>(inp)[i];
    uint4 g = reinterpret_cast<const uint4*>(dout)[i];
    const auto* hx = reinterpret_cast<const __nv_bfloat162*>(&x);
    auto* hg = reinterpret_cast<__nv_bfloat162*>(&g);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 fx = __bfloat1622float2(hx[k]), fg = __bfloat1622float2(hg[k]);
      hg[k] = __floats2bfloat162_rn(fg.x * gelu_grad(fx.x), fg.y * gelu_grad(fx.y));
    }
    reinterpret_cast<uint4*>(dinp)[i] = g;
  }
  for (std::int64_t i = n8 * 8 + global_index(); i < n; i += global_stride())
    dinp[i] = __float2bfloat16(__bfloat162float(dout[i]) * gelu_grad(__bfloat162float(inp[i])));
}

// ---------------------------------------------------------------- cross-entropy
// One block per row of bf16 logits: an online max / sum-of-exp pass over the real vocabulary
// (fp32), loss = lse - logit[target]; with a gradient, the row is overwritten by
// dloss * (softmax - onehot) in bf16, padded columns zeroed.
__device__ inline void online_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// Rows are read and written 8 bf16 (16 bytes) at a time: Vp is a multiple of 128, so every row
// starts 256-byte aligned.
__global__ void cross_entropy_bf16_kernel(float* losses, std::uint16_t* logits_, bool write_grad,
                                          const std::int32_t* targets, int V, int Vp, float dloss) {
  __shared__ float sm_m[32], sm_s[32];
  bf16* logits = as_bf16(logits_);
  const std::int64_t row = blockIdx.x;
  bf16* x = logits + row * Vp;
  uint4* x8 = reinterpret_cast<uint4*>(x);
  const int n8 = Vp / 8;
  const std::int32_t t = targets[row];
  if (t < 0) {  // uniform over the block
    if (write_grad)
      for (int j = threadIdx.x; j < n8; j += blockDim.x) x8[j] = make_uint4(0, 0, 0, 0);
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  const float xt = __bfloat162float(x[t]);
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < n8; j += blockDim.x) {
    uint4 v = x8[j];
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
    float f[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 p = __bfloat1622float2(h[k]);
      f[2 * k] = p.x;
      f[2 * k + 1] = p.y;
    }
    float mx = m;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (8 * j + k < V) mx = fmaxf(mx, f[k]);
    if (mx == -INFINITY) continue;  // only padded columns
    float acc = s * expf(m - mx);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (8 * j + k < V) acc += expf(f[k] - mx);
    s = acc;
    m = mx;
  }
  // warp, then block merge of (max, sum)
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();  // also: every thread has read x[t] before any overwrite below
  m = lane < nwarps ? sm_m[lane] : -INFINITY;
  s = lane < nwarps ? sm_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  if (threadIdx.x == 0) losses[row] = m + logf(s) - xt;
  if (!write_grad) return;
  const float scale = dloss / s;
  for (int j = threadIdx.x; j < n8; j += blockDim.x) {
    uint4 v = x8[j];
    auto* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 p = __bfloat1622float2(h[k]);
      const int c0 = 8 * j + 2 * k;
      float g0 = c0 < V ? scale * expf(p.x - m) : 0.0f;
      float g1 = c0 + 1 < V ? scale * expf(p.y - m) : 0.0f;
      if (c0 == t) g0 -= dloss;
      if (c0 + 1 == t) g1 -= dloss;
      h[k] = __floats2bfloat162_rn(g0, g1);
    }
    x8[j] = v;
  }
}

// ---------------------------------------------------------------- optimizer
// The AdamW of adamw_kernel (ops.cu) with the gradient scaled by grad_scale (clipping) and the
// updated parameter also written as bf16 (the copy the bf16 GEMMs read), when p16 is set.
__global__ void adamw_mixed_kernel(float* p, std::uint16_t* p16_, const float* g, float* m,
                                   float* v, std::int64_t n, float lr, float b1, float b2,
                                   float eps, float wd, float bc1, float bc2, float grad_scale) {
  bf16* p16 = p16_ ? as_bf16(p16_) : nullptr;
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const float gi = g[i] * grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    const float pi = p[i] * (1.0f - lr * wd);
    const float out = pi - lr * mhat / (sqrtf(vhat) + eps);
    p[i] = out;
    if (p16) p16[i] = __float2bfloat16(out);
  }
}

// Sum of squares: partial sums per block (fixed grid, fixed order), then one block adds them:
// the same result on every run.
constexpr int k_norm_blocks = 1024;
__global__ void sumsq_partial_kernel(float* partial, const float* x, std::int64_t n) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (std::int64_t i = global_index(); i < n; i += global_stride()) s += x[i] * x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials_kernel(float* out, const float* partial, int n) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void layernorm_forward_bf16(std::uint16_t* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, std::int64_t N, int C,
                            void* stream) {
  if (N <= 0) return;
  const NormRows a{.out = out,
                   .mean = mean,
                   .rstd = rstd,
                   .inp = inp,
                   .weight = weight,
                   .bias = bias,
                   .N = N,
                   .C = C,
                   .eps = k_layernorm_eps};
  if (norm_warp_path(a)) return launch_norm_warp<false>(true, a, as_stream(stream));
  launch_layernorm_forward_rows(as_bf16(out), mean, rstd, inp, weight, bias, N, C,
                                as_stream(stream));
}

void layernorm_backward_bf16(float* dinp, std::uint16_t* dinp_bf16, float* dweight, float* dbias,
                             const std::uint16_t* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, std::int64_t N, int C,
                             void* stream) {
  if (N <= 0) return;
  auto s = as_stream(stream);
  const NormRows a{.out = dinp_bf16,
                   .mean = const_cast<float*>(mean),
                   .rstd = const_cast<float*>(rstd),
                   .inp = inp,
                   .weight = weight,
                   .dinp = dinp,
                   .dweight = dweight,
                   .dbias = dbias,
                   .dout = dout,
                   .N = N,
                   .C = C};
  if (norm_warp_path(a)) return launch_norm_warp<false>(false, a, s);
  launch_layernorm_backward_rows(dinp, dinp_bf16 ? as_bf16(dinp_bf16) : nullptr, dweight, dbias,
                                 as_bf16(dout), inp, weight, mean, rstd, N, C, s);
}

void rmsnorm_forward_bf16(std::uint16_t* out, float* rstd, const float* inp, const float* w,
                          std::int64_t N, int C, float eps, void* stream) {
  if (N <= 0) return;
  const NormRows a{.out = out, .rstd = rstd, .inp = inp, .weight = w, .N = N, .C = C, .eps = eps};
  if (norm_warp_path(a)) return launch_norm_warp<true>(true, a, as_stream(stream));
  launch_rmsnorm_forward_rows(as_bf16(out), rstd, inp, w, N, C, eps, as_stream(stream));
}

void rmsnorm_backward_bf16(float* dinp, std::uint16_t* dinp_bf16, float* dw,
                           const std::uint16_t* dout, const float* inp, const float* w,
                           const float* rstd, std::int64_t N, int C, void* stream) {
  if (N <= 0) return;
  auto s = as_stream(stream);
  const NormRows a{.out = dinp_bf16,
                   .rstd = const_cast<float*>(rstd),
                   .inp = inp,
                   .weight = w,
                   .dinp = dinp,
                   .dweight = dw,
                   .dout = dout,
                   .N = N,
                   .C = C};
  if (norm_warp_path(a)) return launch_norm_warp<true>(false, a, s);
  launch_rmsnorm_backward_rows(dinp, dinp_bf16 ? as_bf16(dinp_bf16) : nullptr, dw, as_bf16(dout),
                               inp, w, rstd, N, C, s);
}

void bias_backward_bf16(float* dbias, const std::uint16_t* dout, std::int64_t N, int OC,
                        void* stream) {
  if (N <= 0 || OC <= 0) return;
  launch_column_sums(nullptr, dbias, reinterpret_cast<const bf16*>(dout), nullptr, nullptr, nullptr,
                     N, OC, as_stream(stream));
}

void bias_backward(float* dbias, const float* dout, std::int64_t N, int OC, void* stream) {
  if (N <= 0 || OC <= 0) return;
  launch_column_sums(nullptr, dbias, dout, nullptr, nullptr, nullptr, N, OC, as_stream(stream));
}

void gelu_forward_bf16(std::uint16_t* out, const std::uint16_t* inp, std::int64_t n, void* stream) {
  if (n <= 0) return;
  gelu_forward_bf16_kernel<<<grid_for(std::max<std::int64_t>(n / 8, 1)), k_block, 0,
                             as_stream(stream)>>>(out, inp, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void gelu_backward_bf16(std::uint16_t* dinp, const std::uint16_t* inp, const std::uint16_t* dout,
                        std::int64_t n, void* stream) {
  if (n <= 0) return;
  gelu_backward_bf16_kernel<<<grid_for(std::max<std::int64_t>(n / 8, 1)), k_block, 0,
                              as_stream(stream)>>>(dinp, inp, dout, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward_bf16(float* losses, std::uint16_t* logits, const std::int32_t* targets,
                                std::int64_t N, int V, int Vp, void* stream) {
  if (N <= 0) return;
  TESSERA_CUDA_REQUIRE(N <= 0x7fffffff && V <= Vp, "cross_entropy_forward_bf16: N < 2^31, V <= Vp");
  TESSERA_CUDA_REQUIRE(Vp % 8 == 0, "cross_entropy_forward_bf16: Vp % 8 == 0");
  cross_entropy_bf16_kernel<<<static_cast<unsigned>(N), 512, 0, as_stream(stream)>>>(
      losses, logits, false, targets, V, Vp, 0.0f);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward_backward_bf16(float* losses, std::uint16_t* logits,
                                         const std::int32_t* targets, std::int64_t N, int V, int Vp,
                                         float dloss, void* stream) {
  if (N <= 0) return;
  TESSERA_CUDA_REQUIRE(N <= 0x7fffffff && V <= Vp,
                       "cross_entropy_forward_backward_bf16: N < 2^31, V <= Vp");
  TESSERA_CUDA_REQUIRE(Vp % 8 == 0, "cross_entropy_forward_backward_bf16: Vp % 8 == 0");
  cross_entropy_bf16_kernel<<<static_cast<unsigned>(N), 512, 0, as_stream(stream)>>>(
      losses, logits, true, targets, V, Vp, dloss);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void adamw_update_mixed(float* params, std::uint16_t* params_bf16, const float* grads, float* m,
                        float* v, std::int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, std::int64_t step, float grad_scale, void* stream) {
  if (n <= 0) return;
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamw_mixed_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(
      params, params_bf16, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2,
      grad_scale);
  TESSERA_CUDA_CHECK_LAUNCH();
}

std::size_t sum_of_squares_workspace_bytes() {
  return k_norm_blocks * sizeof(float);
}

void sum_of_squares(float* out, const float* x, std::int64_t n, float* workspace, void* stream) {
  auto s = as_stream(stream);
  if (n <= 0) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), s));
    return;
  }
  sumsq_partial_kernel<<<k_norm_blocks, k_block, 0, s>>>(workspace, x, n);
  TESSERA_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, 1024, 0, s>>>(out, workspace, k_norm_blocks);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
