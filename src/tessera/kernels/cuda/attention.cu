// Causal grouped-query attention, the contract of kernels::cpu::attention_forward/backward,
// written as three straightforward kernels (one block per query or key row, a warp per score);
// no scratch memory, no tensor cores. O(T^2 hs) work per head like the CPU path, far from a flash
// kernel's speed: a correctness baseline for the GPU path.
//
// A qkv row is (NH + 2 KV) hs wide: q of head h at h*hs, k of key-value head g at (NH+g)*hs, v
// at (NH+KV+g)*hs; query head h reads g = h / (NH/KV). out rows are NH*hs wide.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

constexpr int k_attn_block = 128;  // 4 warps
constexpr int k_default_smem = 48 * 1024;

struct Heads {
  int NH, KV, hs;
  __host__ __device__ std::int64_t width() const {
    return static_cast<std::int64_t>(NH + 2 * KV) * hs;
  }
  __host__ __device__ std::int64_t q(int h) const { return static_cast<std::int64_t>(h) * hs; }
  __host__ __device__ std::int64_t k(int g) const { return static_cast<std::int64_t>(NH + g) * hs; }
  __host__ __device__ std::int64_t v(int g) const {
    return static_cast<std::int64_t>(NH + KV + g) * hs;
  }
  __host__ __device__ int group(int h) const { return h / (NH / KV); }
};

// Forward, block (i, h, b): s_j = scale * q_i.k_j for j <= i (a warp per j), softmax over them,
// out_i = sum_j p_j v_j. Shared: q_i (hs) and the scores (i+1 <= T).
__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, int T, Heads H,
                                         float scale) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = H.hs, g = H.group(h);
  const std::int64_t W = H.width(), OC = static_cast<std::int64_t>(H.NH) * hs;
  const float* base = qkv + static_cast<std::int64_t>(b) * T * W;
  float* sq = smem;
  float* s = smem + hs;
  for (int c = threadIdx.x; c < hs; c += blockDim.x) sq[c] = base[i * W + H.q(h) + c];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int j = warp; j <= i; j += nwarps) {
    const float* k = base + j * W + H.k(g);
    float d = 0.0f;
    for (int c = lane; c < hs; c += 32) d += sq[c] * k[c];
    d = warp_sum(d);
    if (lane == 0) s[j] = scale * d;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);  // synchronizes: the exps in s are visible below
  const float inv = 1.0f / sum;
  float* o = out + (static_cast<std::int64_t>(b) * T + i) * OC + H.q(h);
  for (int c = threadIdx.x; c < hs; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= i; ++j) acc += s[j] * base[j * W + H.v(g) + c];
    o[c] = acc * inv;
  }
  if (threadIdx.x == 0) lse[(static_cast<std::int64_t>(b) * H.NH + h) * T + i] = mx + logf(sum);
}

// Backward for dq, block (i, h, b): for j <= i, p = exp(scale q_i.k_j - lse_i),
// dp = dO_i.v_j, ds_j = p (dp - D_i) scale with D_i = dO_i.O_i; dq_i = sum_j ds_j k_j.
// Shared: q_i, dO_i (hs each) and ds (i+1).
__global__ void attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                             const float* out, const float* lse, int T, Heads H,
                                             float scale) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = H.hs, g = H.group(h);
  const std::int64_t W = H.width(), OC = static_cast<std::int64_t>(H.NH) * hs;
  const float* base = qkv + static_cast<std::int64_t>(b) * T * W;
  const std::int64_t row1 = (static_cast<std::int64_t>(b) * T + i) * OC + H.q(h);
  float* sq = smem;
  float* sg = smem + hs;
  float* ds = smem + 2 * hs;
  float d_part = 0.0f;
  for (int c = threadIdx.x; c < hs; c += blockDim.x) {
    sq[c] = base[i * W + H.q(h) + c];
    sg[c] = dout[row1 + c];
    d_part += out[row1 + c] * dout[row1 + c];
  }
  const float D = block_sum(d_part, scratch);  // synchronizes: sq, sg visible
  const float li = lse[(static_cast<std::int64_t>(b) * H.NH + h) * T + i];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int j = warp; j <= i; j += nwarps) {
    const float* k = base + j * W + H.k(g);
    const float* v = base + j * W + H.v(g);
    float qk = 0.0f, gv = 0.0f;
    for (int c = lane; c < hs; c += 32) {
      qk += sq[c] * k[c];
      gv += sg[c] * v[c];
    }
    qk = warp_sum(qk);
    gv = warp_sum(gv);
    if (lane == 0) {
      float p = expf(scale * qk - li);
      ds[j] = p * (gv - D) * scale;
    }
  }
  __syncthreads();
  float* dq = dqkv + static_cast<std::int64_t>(b) * T * W + i * W + H.q(h);
  for (int c = threadIdx.x; c < hs; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= i; ++j) acc += ds[j] * base[j * W + H.k(g) + c];
    dq[c] = acc;
  }
}

// Backward for dk, dv, block (j, g, b): for each query head h of the group and i >= j the same
// p, ds (D_i recomputed per i); dv_j = sum_h sum_i p_i dO_i, dk_j = sum_h sum_i ds_i q_i (the
// block owns the row: no atomics). Shared: k_j, v_j (hs each), p and ds (T-j each).
__global__ void attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv,
                                              const float* out, const float* lse, int T, Heads H,
                                              float scale) {
  extern __shared__ float smem[];
  const int j = blockIdx.x, g = blockIdx.y, b = blockIdx.z, hs = H.hs;
  const std::int64_t W = H.width(), OC = static_cast<std::int64_t>(H.NH) * hs;
  const float* base = qkv + static_cast<std::int64_t>(b) * T * W;
  float* sk = smem;
  float* sv = smem + hs;
  float* sp = smem + 2 * hs;
  float* sds = sp + (T - j);
  for (int c = threadIdx.x; c < hs; c += blockDim.x) {
    sk[c] = base[j * W + H.k(g) + c];
    sv[c] = base[j * W + H.v(g) + c];
  }
  float* dk = dqkv + static_cast<std::int64_t>(b) * T * W + j * W + H.k(g);
  float* dv = dqkv + static_cast<std::int64_t>(b) * T * W + j * W + H.v(g);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int per = H.NH / H.KV;
  for (int h = g * per; h < (g + 1) * per; ++h) {
    __syncthreads();  // sk, sv written; the previous head's sp, sds read
    const float* obase = out + static_cast<std::int64_t>(b) * T * OC + H.q(h);
    const float* gbase = dout + static_cast<std::int64_t>(b) * T * OC + H.q(h);
    const float* l = lse + (static_cast<std::int64_t>(b) * H.NH + h) * T;
    for (int i = j + warp; i < T; i += nwarps) {
      const float* q = base + i * W + H.q(h);
      const float* gr = gbase + static_cast<std::int64_t>(i) * OC;
      const float* o = obase + static_cast<std::int64_t>(i) * OC;
      float qk = 0.0f, gv = 0.0f, go = 0.0f;
      for (int c = lane; c < hs; c += 32) {
        qk += q[c] * sk[c];
        gv += gr[c] * sv[c];
        go += gr[c] * o[c];
      }
      qk = warp_sum(qk);
      gv = warp_sum(gv);
      go = warp_sum(go);
      if (lane == 0) {
        float p = expf(scale * qk - l[i]);
        sp[i - j] = p;
        sds[i - j] = p * (gv - go) * scale;
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < hs; c += blockDim.x) {
      float ak = 0.0f, av = 0.0f;
      for (int i = j; i < T; ++i) {
        ak += sds[i - j] * base[i * W + H.q(h) + c];
        av += sp[i - j] * gbase[static_cast<std::int64_t>(i) * OC + c];
      }
      dk[c] = h == g * per ? ak : dk[c] + ak;
      dv[c] = h == g * per ? av : dv[c] + av;
    }
  }
}

template <class Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(k_default_smem))
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
}

Heads check_shapes(int B, int T, int NH, int KV, int hs) {
  TESSERA_CUDA_REQUIRE(B > 0 && T > 0 && NH > 0 && KV > 0 && hs > 0 && NH % KV == 0,
                       "attention: NH % KV != 0");
  TESSERA_CUDA_REQUIRE(B <= 65535 && NH <= 65535, "attention: grid (T, NH, B) limits");
  return {NH, KV, hs};
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KV,
                       int hs, void* stream) {
  const Heads H = check_shapes(B, T, NH, KV, hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t smem = static_cast<std::size_t>(hs + T) * sizeof(float);
  allow_smem(attention_forward_kernel, smem);
  attention_forward_kernel<<<dim3(T, NH, B), k_attn_block, smem, as_stream(stream)>>>(out, lse, qkv,
                                                                                      T, H, scale);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int NH, int KV, int hs, void* stream) {
  const Heads H = check_shapes(B, T, NH, KV, hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  auto s = as_stream(stream);
  const std::size_t smem_dq = static_cast<std::size_t>(2 * hs + T) * sizeof(float);
  allow_smem(attention_backward_dq_kernel, smem_dq);
  attention_backward_dq_kernel<<<dim3(T, NH, B), k_attn_block, smem_dq, s>>>(dqkv, dout, qkv, out,
                                                                             lse, T, H, scale);
  TESSERA_CUDA_CHECK_LAUNCH();
  const std::size_t smem_dkv = static_cast<std::size_t>(2 * hs + 2 * T) * sizeof(float);
  allow_smem(attention_backward_dkv_kernel, smem_dkv);
  attention_backward_dkv_kernel<<<dim3(T, KV, B), k_attn_block, smem_dkv, s>>>(dqkv, dout, qkv, out,
                                                                               lse, T, H, scale);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
