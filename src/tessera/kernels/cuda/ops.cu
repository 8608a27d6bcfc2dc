// CUDA kernels of the op table (ops.hpp): memory, elementwise ops, embedding, LayerNorm, GELU,
// cross-entropy and AdamW. GEMM is in gemm.cu, attention in attention.cu.
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

// ---------------------------------------------------------------- memory
DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  TESSERA_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  // No throw from a destructor. A failed free is dropped from the last-error slot so that it does
  // not fail the next, unrelated launch check; a sticky (context) error resurfaces anyway.
  if (ptr_ && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void to_device(void* dst, const void* src_host, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto s = as_stream(stream);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, s));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
}

void to_host(void* dst_host, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto s = as_stream(stream);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, s));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
}

void memset_zero(void* dst, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  TESSERA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)));
}

void synchronize(void* stream) {
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

// ---------------------------------------------------------------- elementwise
namespace {

__global__ void add_kernel(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) out[i] = a[i] + b[i];
}

__global__ void add_inplace_kernel(float* out, const float* a, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) out[i] += a[i];
}

__global__ void copy_kernel(float* out, const float* a, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) out[i] = a[i];
}

__global__ void float_to_bf16_kernel(__nv_bfloat16* out, const float* in, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride())
    out[i] = __float2bfloat16(in[i]);
}

__global__ void bf16_to_float_kernel(float* out, const __nv_bfloat16* in, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride())
    out[i] = __bfloat162float(in[i]);
}

}  // namespace

void add(float* out, const float* a, const float* b, std::int64_t n, void* stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(out, a, b, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* out, const float* a, std::int64_t n, void* stream) {
  if (n <= 0) return;
  add_inplace_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(out, a, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void copy(float* out, const float* a, std::int64_t n, void* stream) {
  if (n <= 0) return;
  copy_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(out, a, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void float_to_bf16(std::uint16_t* out, const float* in, std::int64_t n, void* stream) {
  if (n <= 0) return;
  float_to_bf16_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(
      reinterpret_cast<__nv_bfloat16*>(out), in, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void bf16_to_float(float* out, const std::uint16_t* in, std::int64_t n, void* stream) {
  if (n <= 0) return;
  bf16_to_float_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(
      out, reinterpret_cast<const __nv_bfloat16*>(in), n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- embedding
namespace {

__global__ void embedding_forward_kernel(float* out, const std::int32_t* inp, const float* wte,
                                         const float* wpe, int T, int C, std::int64_t total,
                                         const int* pos0) {
  const int first = pos0 ? *pos0 : 0;
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    std::int64_t row = i / C;  // b*T + t
    int c = static_cast<int>(i - row * C);
    int t = first + static_cast<int>(row % T);
    out[i] = wte[static_cast<std::int64_t>(inp[row]) * C + c] +
             (wpe ? wpe[static_cast<std::int64_t>(t) * C + c] : 0.0f);
  }
}

__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout,
                                          const std::int32_t* inp, int T, int C,
                                          std::int64_t total) {
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    std::int64_t row = i / C;
    int c = static_cast<int>(i - row * C);
    int t = static_cast<int>(row % T);
    float d = dout[i];
    atomicAdd(dwte + static_cast<std::int64_t>(inp[row]) * C + c, d);
    if (dwpe) atomicAdd(dwpe + static_cast<std::int64_t>(t) * C + c, d);
  }
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe,
                       int B, int T, int C, void* stream, const int* pos0) {
  std::int64_t total = static_cast<std::int64_t>(B) * T * C;
  if (total <= 0) return;
  embedding_forward_kernel<<<grid_for(total), k_block, 0, as_stream(stream)>>>(out, inp, wte, wpe,
                                                                               T, C, total, pos0);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                        int T, int C, void* stream) {
  std::int64_t total = static_cast<std::int64_t>(B) * T * C;
  if (total <= 0) return;
  embedding_backward_kernel<<<grid_for(total), k_block, 0, as_stream(stream)>>>(dwte, dwpe, dout,
                                                                                inp, T, C, total);
  TESSERA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- layernorm
// The block-per-row kernels of layernorm_rows.cuh, on fp32 tensors.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t N, int C, void* stream) {
  if (N <= 0) return;
  launch_layernorm_forward_rows(out, mean, rstd, inp, weight, bias, N, C, as_stream(stream));
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        std::int64_t N, int C, void* stream) {
  if (N <= 0) return;
  launch_layernorm_backward_rows(dinp, static_cast<float*>(nullptr), dweight, dbias, dout, inp,
                                 weight, mean, rstd, N, C, as_stream(stream));
}

// ---------------------------------------------------------------- gelu
namespace {

constexpr float k_gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)

__global__ void gelu_forward_kernel(float* out, const float* inp, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float x = inp[i];
    float u = k_gelu_scale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout,
                                     std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float x = inp[i];
    float u = k_gelu_scale * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float du = k_gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, std::int64_t n, void* stream) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(out, inp, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n, void* stream) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(dinp, inp, dout, n);
  TESSERA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- cross-entropy
namespace {

constexpr int k_ce_threads = 512;  // threads per row

// One block per row: max over the real vocabulary, sum of exp, loss = lse - logit[target];
// with dlogits (may alias logits) writes dloss * (softmax - onehot), padded columns zeroed.
__global__ void cross_entropy_kernel(float* losses, const float* logits, float* dlogits,
                                     const std::int32_t* targets, int V, int Vp, float dloss) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* x = logits + row * Vp;
  const std::int32_t t = targets[row];
  if (t < 0) {  // uniform over the block: no thread reaches a __syncthreads below
    if (dlogits)
      for (int j = threadIdx.x; j < Vp; j += blockDim.x) dlogits[row * Vp + j] = 0.0f;
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  const float xt = x[t];  // read before the row is overwritten
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - mx);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) losses[row] = mx + logf(sum) - xt;
  if (dlogits) {
    float* d = dlogits + row * Vp;
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
      float g = j < V ? dloss * expf(x[j] - mx) * inv : 0.0f;
      if (j == t) g -= dloss;
      d[j] = g;
    }
  }
}

}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets,
                           std::int64_t N, int V, int Vp, void* stream) {
  if (N <= 0) return;
  TESSERA_CUDA_REQUIRE(N <= 0x7fffffff && V <= Vp, "cross_entropy_forward: N < 2^31, V <= Vp");
  cross_entropy_kernel<<<static_cast<unsigned>(N), k_ce_threads, 0, as_stream(stream)>>>(
      losses, logits, nullptr, targets, V, Vp, 0.0f);
  TESSERA_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward_backward(float* losses, float* logits, const std::int32_t* targets,
                                    std::int64_t N, int V, int Vp, float dloss, void* stream) {
  if (N <= 0) return;
  TESSERA_CUDA_REQUIRE(N <= 0x7fffffff && V <= Vp,
                       "cross_entropy_forward_backward: N < 2^31, V <= Vp");
  cross_entropy_kernel<<<static_cast<unsigned>(N), k_ce_threads, 0, as_stream(stream)>>>(
      losses, logits, logits, targets, V, Vp, dloss);
  TESSERA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- adamw
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, float lr,
                             float b1, float b2, float eps, float wd, float bc1, float bc2) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    // decoupled decay first (as torch.optim.AdamW does), then the Adam step
    float pi = p[i] * (1.0f - lr * wd);
    p[i] = pi - lr * mhat / (sqrtf(vhat) + eps);
  }
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
                  void* stream) {
  if (n <= 0) return;
  // bias corrections on the host, with the same float std::pow as optim::adamw_update_range
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamw_kernel<<<grid_for(n), k_block, 0, as_stream(stream)>>>(params, grads, m, v, n, lr, beta1,
                                                               beta2, eps, weight_decay, bc1, bc2);
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
