// The op table of ops.hpp in a build without CUDA: every function exists (so the CPU-only build
// links) and throws tessera::Error. Compiled in every configuration, empty with CUDA.
#include "tessera/kernels/cuda/ops.hpp"

#ifndef TESSERA_WITH_CUDA
#include "tessera/core/error.hpp"

namespace tessera::kernels::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(std::string("built without CUDA: kernels::cuda::") + op + " is unavailable",
              "reconfigure with -DWITH_CUDA=ON on a machine with the CUDA toolkit (nvcc), or use "
              "the CPU backend");
}
}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes != 0) no_cuda("DeviceBuffer");
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  ptr_ = o.ptr_;
  bytes_ = o.bytes_;
  o.ptr_ = nullptr;
  o.bytes_ = 0;
  return *this;
}

void to_device(void*, const void*, std::size_t, void*) {
  no_cuda("to_device");
}
void to_host(void*, const void*, std::size_t, void*) {
  no_cuda("to_host");
}
void memset_zero(void*, std::size_t, void*) {
  no_cuda("memset_zero");
}
void synchronize(void*) {
  no_cuda("synchronize");
}

void gemm(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
          const float*, std::int64_t, float, float*, std::int64_t, void*) {
  no_cuda("gemm");
}
void gemm_bf16(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*,
               std::int64_t, const std::uint16_t*, std::int64_t, float, float*, std::int64_t,
               void*) {
  no_cuda("gemm_bf16");
}
void gemm_bf16(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*,
               std::int64_t, const std::uint16_t*, std::int64_t, float, std::uint16_t*,
               std::int64_t, void*) {
  no_cuda("gemm_bf16");
}
void float_to_bf16(std::uint16_t*, const float*, std::int64_t, void*) {
  no_cuda("float_to_bf16");
}
void bf16_to_float(float*, const std::uint16_t*, std::int64_t, void*) {
  no_cuda("bf16_to_float");
}

void embedding_forward(float*, const std::int32_t*, const float*, const float*, int, int, int,
                       void*, const int*) {
  no_cuda("embedding_forward");
}
void embedding_backward(float*, float*, const float*, const std::int32_t*, int, int, int, void*) {
  no_cuda("embedding_backward");
}
void layernorm_forward(float*, float*, float*, const float*, const float*, const float*,
                       std::int64_t, int, void*) {
  no_cuda("layernorm_forward");
}
void layernorm_backward(float*, float*, float*, const float*, const float*, const float*,
                        const float*, const float*, std::int64_t, int, void*) {
  no_cuda("layernorm_backward");
}
void gelu_forward(float*, const float*, std::int64_t, void*) {
  no_cuda("gelu_forward");
}
void gelu_backward(float*, const float*, const float*, std::int64_t, void*) {
  no_cuda("gelu_backward");
}
void rmsnorm_forward(float*, float*, const float*, const float*, std::int64_t, int, float, void*) {
  no_cuda("rmsnorm_forward");
}
void rmsnorm_forward_bf16(std::uint16_t*, float*, const float*, const float*, std::int64_t, int,
                          float, void*) {
  no_cuda("rmsnorm_forward_bf16");
}
void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*,
                      std::int64_t, int, void*) {
  no_cuda("rmsnorm_backward");
}
void rmsnorm_backward_bf16(float*, std::uint16_t*, float*, const std::uint16_t*, const float*,
                           const float*, const float*, std::int64_t, int, void*) {
  no_cuda("rmsnorm_backward_bf16");
}
void rope_forward(float*, int, int, int, int, int, const double*, void*, const int*) {
  no_cuda("rope_forward");
}
void rope_backward(float*, int, int, int, int, int, const double*, void*) {
  no_cuda("rope_backward");
}
void rope_forward_bf16(std::uint16_t*, int, int, int, int, int, const double*, void*, const int*) {
  no_cuda("rope_forward_bf16");
}
void rope_backward_bf16(std::uint16_t*, int, int, int, int, int, const double*, void*) {
  no_cuda("rope_backward_bf16");
}
void swiglu_forward(float*, const float*, std::int64_t, int, void*) {
  no_cuda("swiglu_forward");
}
void swiglu_backward(float*, const float*, const float*, std::int64_t, int, void*) {
  no_cuda("swiglu_backward");
}
void swiglu_forward_bf16(std::uint16_t*, const std::uint16_t*, std::int64_t, int, void*) {
  no_cuda("swiglu_forward_bf16");
}
void swiglu_backward_bf16(std::uint16_t*, const std::uint16_t*, const std::uint16_t*, std::int64_t,
                          int, void*) {
  no_cuda("swiglu_backward_bf16");
}
void attention_forward(float*, float*, const float*, int, int, int, int, int, void*) {
  no_cuda("attention_forward");
}
void attention_backward(float*, const float*, const float*, const float*, const float*, int, int,
                        int, int, int, void*) {
  no_cuda("attention_backward");
}
void cross_entropy_forward(float*, const float*, const std::int32_t*, std::int64_t, int, int,
                           void*) {
  no_cuda("cross_entropy_forward");
}
void cross_entropy_forward_backward(float*, float*, const std::int32_t*, std::int64_t, int, int,
                                    float, void*) {
  no_cuda("cross_entropy_forward_backward");
}
void adamw_update(float*, const float*, float*, float*, std::int64_t, float, float, float, float,
                  float, std::int64_t, void*) {
  no_cuda("adamw_update");
}
void add(float*, const float*, const float*, std::int64_t, void*) {
  no_cuda("add");
}
void add_inplace(float*, const float*, std::int64_t, void*) {
  no_cuda("add_inplace");
}
void copy(float*, const float*, std::int64_t, void*) {
  no_cuda("copy");
}

void kv_cache_append(float*, float*, const float*, int, int, int, int, const int*, void*) {
  no_cuda("kv_cache_append");
}
void kv_cache_append_bf16(std::uint16_t*, std::uint16_t*, const std::uint16_t*, int, int, int, int,
                          const int*, void*) {
  no_cuda("kv_cache_append_bf16");
}
std::size_t decode_attention_scratch_bytes(int, int, int) {
  return 0;
}
void decode_attention(float*, const float*, const float*, const float*, const int*, int, int, int,
                      int, float*, void*) {
  no_cuda("decode_attention");
}
void decode_attention_bf16(std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                           const std::uint16_t*, const int*, int, int, int, int, float*, void*) {
  no_cuda("decode_attention_bf16");
}
Stream::Stream() {
  no_cuda("Stream");
}
Stream::~Stream() = default;
Graph::~Graph() = default;
void Graph::release() noexcept {}
void Graph::launch(void*) {
  no_cuda("Graph::launch");
}
void Graph::begin_capture(void*) {
  no_cuda("Graph::capture");
}
void Graph::end_capture(void*) {}
void Graph::abandon_capture(void*) noexcept {}
bool flash_attention_supports(int, int) {
  return false;
}
std::size_t flash_attention_workspace_bytes(int, int, int, int) {
  return 0;
}
void flash_attention_forward(std::uint16_t*, float*, const std::uint16_t*, int, int, int, int,
                             void*) {
  no_cuda("flash_attention_forward");
}
void flash_attention_backward(std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                              const std::uint16_t*, const float*, float*, int, int, int, int,
                              void*) {
  no_cuda("flash_attention_backward");
}

void gemm_ex(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
             std::int64_t, const float*, std::int64_t, float, float*, std::int64_t,
             const GemmEpilogue&, void*) {
  no_cuda("gemm_ex");
}
void gemm_bf16_ex(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*,
                  std::int64_t, const std::uint16_t*, std::int64_t, float, float*, std::int64_t,
                  const GemmEpilogue&, void*) {
  no_cuda("gemm_bf16_ex");
}
void gemm_bf16_ex(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*,
                  std::int64_t, const std::uint16_t*, std::int64_t, float, std::uint16_t*,
                  std::int64_t, const GemmEpilogue&, void*) {
  no_cuda("gemm_bf16_ex");
}
void layernorm_forward_bf16(std::uint16_t*, float*, float*, const float*, const float*,
                            const float*, std::int64_t, int, void*) {
  no_cuda("layernorm_forward_bf16");
}
void layernorm_backward_bf16(float*, std::uint16_t*, float*, float*, const std::uint16_t*,
                             const float*, const float*, const float*, const float*, std::int64_t,
                             int, void*) {
  no_cuda("layernorm_backward_bf16");
}
void bias_backward_bf16(float*, const std::uint16_t*, std::int64_t, int, void*) {
  no_cuda("bias_backward_bf16");
}
void gelu_forward_bf16(std::uint16_t*, const std::uint16_t*, std::int64_t, void*) {
  no_cuda("gelu_forward_bf16");
}
void gelu_backward_bf16(std::uint16_t*, const std::uint16_t*, const std::uint16_t*, std::int64_t,
                        void*) {
  no_cuda("gelu_backward_bf16");
}
void cross_entropy_forward_bf16(float*, std::uint16_t*, const std::int32_t*, std::int64_t, int, int,
                                void*) {
  no_cuda("cross_entropy_forward_bf16");
}
void cross_entropy_forward_backward_bf16(float*, std::uint16_t*, const std::int32_t*, std::int64_t,
                                         int, int, float, void*) {
  no_cuda("cross_entropy_forward_backward_bf16");
}
void adamw_update_mixed(float*, std::uint16_t*, const float*, float*, float*, std::int64_t, float,
                        float, float, float, float, std::int64_t, float, void*) {
  no_cuda("adamw_update_mixed");
}
std::size_t sum_of_squares_workspace_bytes() {
  return 0;
}
void sum_of_squares(float*, const float*, std::int64_t, float*, void*) {
  no_cuda("sum_of_squares");
}

void bias_backward(float*, const float*, std::int64_t, int, void*) {
  no_cuda("bias_backward");
}

}  // namespace tessera::kernels::cuda
#endif
