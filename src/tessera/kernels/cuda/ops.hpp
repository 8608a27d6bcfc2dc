// CUDA fp32 kernels of the GPT forward and backward passes: the kernels::cpu op table
// (kernels/cpu/ops.hpp) on DEVICE pointers. Plain C++: no CUDA types, usable from .cpp files.
// Conventions (those of kernels::cpu unless stated):
//  - Every pointer argument is device memory unless its name ends in `_host`.
//  - `stream` is a cudaStream_t passed as void*; nullptr is the legacy default stream. Every op
//    is asynchronous on that stream (it only enqueues work), except to_host/to_device/synchronize.
//  - Shapes, the "+=" / "=" contract of every gradient output and the formulas are those of the
//    CPU op of the same name. Unlike the CPU ops, reductions that use atomics (embedding and
//    LayerNorm parameter gradients) are NOT bit-reproducible from run to run.
//  - Errors of the CUDA runtime / cuBLASLt throw tessera::Error (the call, the error string and a
//    hint); a build without CUDA throws tessera::Error("built without CUDA") from every op.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::kernels::cuda {

// ---- device memory ----
// One cudaMalloc per buffer (allocate one per tensor family, e.g. all parameters, and carve views
// from it). Move-only; cudaFree on destruction (which waits for the device, as cudaFree does).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // bytes == 0: an empty buffer, no allocation
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Copies that return when the data has arrived (cudaMemcpyAsync on `stream`, then a stream
// synchronize), so pageable host memory is fine and the host side may be reused at once.
void to_device(void* dst, const void* src_host, std::size_t bytes, void* stream = nullptr);
void to_host(void* dst_host, const void* src, std::size_t bytes, void* stream = nullptr);
void memset_zero(void* dst, std::size_t bytes, void* stream = nullptr);  // asynchronous
void synchronize(void* stream = nullptr);  // cudaStreamSynchronize; throws on pending errors

// ---- GEMM, row-major, the convention of kernels::gemm (kernels/gemm.hpp) ----
//   C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C,   op(X) = X or X^T
// lda/ldb/ldc are row strides in elements of the row-major matrices as stored (A is (M,K) if
// !transa else (K,M), likewise B). Implemented with cuBLASLt (fp32 compute, no TF32).
void gemm(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
          const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
          std::int64_t ldc, void* stream);
// dbias (OC) += column sums of dout (N,OC) (atomics: not bit-reproducible).
void bias_backward(float* dbias, const float* dout, std::int64_t N, int OC, void* stream);
// bf16 inputs (__nv_bfloat16 bit patterns as uint16_t), fp32 accumulation and scaling; output
// fp32 or bf16 (beta reads C in its own type).
void gemm_bf16(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
               std::int64_t ldb, float beta, float* C, std::int64_t ldc, void* stream);
void gemm_bf16(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
               std::int64_t ldb, float beta, std::uint16_t* C, std::int64_t ldc, void* stream);
// What cuBLASLt's epilogue adds to a GEMM, in the same pass over C:
//  - bias (N), in C's type, added to every row of C;
//  - c_in: the beta term reads this (M,N) matrix (row stride ldc) instead of C itself, so
//    C = A B + b + residual needs no copy of the residual first;
//  - Gelu: C = gelu(A B + bias) (tanh approximation), the pre-activation written to aux;
//    DGelu: C = (A B) * gelu'(aux), the GELU backward fused into the GEMM that produces its
//    input gradient. aux is (M,N) in C's type with row stride ldc (ldc % 8 == 0).
struct GemmEpilogue {
  enum class Act { None, Gelu, DGelu };
  const void* bias = nullptr;
  const void* c_in = nullptr;
  Act act = Act::None;
  void* aux = nullptr;
};
void gemm_ex(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
             const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
             float* C, std::int64_t ldc, const GemmEpilogue& epi, void* stream);
void gemm_bf16_ex(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
                  std::int64_t ldb, float beta, float* C, std::int64_t ldc, const GemmEpilogue& epi,
                  void* stream);
void gemm_bf16_ex(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
                  std::int64_t ldb, float beta, std::uint16_t* C, std::int64_t ldc,
                  const GemmEpilogue& epi, void* stream);
// out (n) = bf16(in) with round-to-nearest-even; and back (exact).
void float_to_bf16(std::uint16_t* out, const float* in, std::int64_t n, void* stream);
void bf16_to_float(float* out, const std::uint16_t* in, std::int64_t n, void* stream);

// ---- token + position embedding ----
// out (B,T,C) = wte[inp[b,t]] + wpe[pos0 + t] (wpe null: no learned positions); inp (B,T).
// pos0: null (0), or where device memory holds the first row's position (decoding with a KV
// cache, the position read when the kernel runs, so a captured graph can be replayed).
void embedding_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe,
                       int B, int T, int C, void* stream, const int* pos0 = nullptr);
// dwte (V,C) +=, dwpe (maxT,C) += (if not null) from dout (B,T,C) (atomicAdd: not
// bit-reproducible)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                        int T, int C, void* stream);

// ---- LayerNorm over the last dim, eps = kernels::cpu::k_layernorm_eps ----
// out (N,C); mean, rstd (N) saved for backward
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t N, int C, void* stream);
// dinp (N,C) +=; dweight, dbias (C) += (atomicAdd of per-block partial sums)
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        std::int64_t N, int C, void* stream);

// ---- GELU, tanh approximation ----
void gelu_forward(float* out, const float* inp, std::int64_t n, void* stream);
// dinp = dout * gelu'(inp) (overwrite; dinp may alias dout)
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n, void* stream);

// ---- the llama family: RMSNorm, rotary positions, SwiGLU (kernels::cpu's contracts) ----
// out (N,C) fp32 or bf16; rstd (N) saved for backward
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t N,
                     int C, float eps, void* stream);
void rmsnorm_forward_bf16(std::uint16_t* out, float* rstd, const float* inp, const float* weight,
                          std::int64_t N, int C, float eps, void* stream);
// dinp (N,C) fp32 +=; dweight (C) += (atomics); dout fp32, or bf16 with dinp_bf16 (if not null)
// = the updated dinp rounded to bf16
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, std::int64_t N, int C, void* stream);
void rmsnorm_backward_bf16(float* dinp, std::uint16_t* dinp_bf16, float* dweight,
                           const std::uint16_t* dout, const float* inp, const float* weight,
                           const float* rstd, std::int64_t N, int C, void* stream);
// In place on the q and k heads of qkv rows (NH + 2 KV) hs wide; backward rotates back.
// inv_freq: hs/2 rotary inverse frequencies in HOST memory (model::rope_inv_freq), copied into
// the launch's parameters; hs at most 512. The rows of a batch row are positions pos0, pos0 + 1,
// ... (pos0 as in embedding_forward: null, or the position in device memory).
void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                  void* stream, const int* pos0 = nullptr);
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                   void* stream);
void rope_forward_bf16(std::uint16_t* qkv, int B, int T, int NH, int KV, int hs,
                       const double* inv_freq, void* stream, const int* pos0 = nullptr);
void rope_backward_bf16(std::uint16_t* dqkv, int B, int T, int NH, int KV, int hs,
                        const double* inv_freq, void* stream);
// out (N,F) = silu(gate) up from inp (N,2F) = [gate | up]; backward: dinp (N,2F) = (overwrite)
void swiglu_forward(float* out, const float* inp, std::int64_t N, int F, void* stream);
void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F,
                     void* stream);
void swiglu_forward_bf16(std::uint16_t* out, const std::uint16_t* inp, std::int64_t N, int F,
                         void* stream);
void swiglu_backward_bf16(std::uint16_t* dinp, const std::uint16_t* dout, const std::uint16_t* inp,
                          std::int64_t N, int F, void* stream);

// ---- causal grouped-query self-attention (a straightforward kernel, not a flash kernel) ----
// qkv (B,T,(NH+2KV)*hs) holds q (NH heads), k and v (KV heads each); query head h reads
// key-value head h / (NH/KV) (GPT-2: KV = NH). out (B,T,NH*hs); lse (B,NH,T).
// Needs T * 4 bytes of shared memory per block (T <= ~50k on sm_80+).
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KV,
                       int hs, void* stream);
// dqkv = (overwrite) from dout (B,T,NH*hs); needs out and lse from the forward.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int NH, int KV, int hs, void* stream);

// ---- incremental decoding: a KV cache of one layer, (positions, KV*hs), fp32 or bf16 ----
// Positions come from device memory (`pos`: null for 0), read when the kernel runs, so that one
// captured graph of a decoding step serves every position.
// Rows pos .. pos + T - 1 of k_cache and v_cache = the k and v heads of qkv's T rows ((NH + 2 KV)
// hs wide, as attention_forward reads them; llama's k already rotated).
void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, int T, int NH, int KV,
                     int hs, const int* pos, void* stream);
void kv_cache_append_bf16(std::uint16_t* k_cache, std::uint16_t* v_cache, const std::uint16_t* qkv,
                          int T, int NH, int KV, int hs, const int* pos, void* stream);
// out (NH*hs) = the attention of qkv's one row at position *pos (its q heads; query head h reads
// kv head h / (NH/KV)) over the cache's positions 0 .. *pos (capacity > *pos), softmax in fp32
// (out rounded to bf16 in the bf16 form), in blocks of 64 keys whose partial sums are then
// combined. scratch: decode_attention_scratch_bytes of device memory.
std::size_t decode_attention_scratch_bytes(int NH, int hs, int capacity);
void decode_attention(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                      const int* pos, int capacity, int NH, int KV, int hs, float* scratch,
                      void* stream);
void decode_attention_bf16(std::uint16_t* out, const std::uint16_t* qkv,
                           const std::uint16_t* k_cache, const std::uint16_t* v_cache,
                           const int* pos, int capacity, int NH, int KV, int hs, float* scratch,
                           void* stream);

// A stream of its own (non-blocking: it does not wait for the legacy default stream), and a CUDA
// graph of the work one call queues on it: capture() records instead of running, launch() replays
// the recording (the same kernels on the same buffers, with the values those hold at launch).
// A graph saves the host's launch overhead per kernel, which bounds a step of small kernels.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return s_; }

 private:
  void* s_ = nullptr;
};
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // Captures what `queue` enqueues on `stream` (nothing runs), replacing an earlier capture.
  template <class F>
  void capture(void* stream, F&& queue) {
    begin_capture(stream);
    try {
      queue();
    } catch (...) {
      abandon_capture(stream);
      throw;
    }
    end_capture(stream);
  }
  bool ready() const { return exec_ != nullptr; }
  void launch(void* stream);  // asynchronous

 private:
  void begin_capture(void* stream);
  void end_capture(void* stream);
  void abandon_capture(void* stream) noexcept;
  void release() noexcept;
  void* graph_ = nullptr;
  void* exec_ = nullptr;
};

// ---- causal flash attention in bf16 (tensor cores, fp32 accumulation and softmax) ----
// The contract of attention_forward/backward with bf16 qkv (B,T,3C), out (B,T,C), dout, dqkv;
// lse (B,NH,T) stays fp32. Head sizes 32, 64 and 128 (flash_attention_supports). The backward
// pass needs flash_attention_workspace_bytes of device scratch (fp32 dq accumulator and the
// row sums D = rowsum(dout * out)); its dq accumulation uses atomics (not bit-reproducible).
bool flash_attention_supports(int C, int NH);
std::size_t flash_attention_workspace_bytes(int B, int T, int C, int NH);
void flash_attention_forward(std::uint16_t* out, float* lse, const std::uint16_t* qkv, int B, int T,
                             int C, int NH, void* stream);
// dqkv (B,T,3C) = (overwrite) the gradients of q, k and v.
void flash_attention_backward(std::uint16_t* dqkv, const std::uint16_t* dout,
                              const std::uint16_t* qkv, const std::uint16_t* out, const float* lse,
                              float* workspace, int B, int T, int C, int NH, void* stream);

// ---- fused softmax + cross-entropy over the real vocabulary V of padded rows Vp ----
// losses (N); logits (N,Vp); targets (N), targets < 0 are ignored (loss 0, no gradient).
void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets,
                           std::int64_t N, int V, int Vp, void* stream);
// Same, and overwrites logits (N,Vp) with dloss * (softmax - onehot) (padded columns zeroed,
// rows with target < 0 zeroed).
void cross_entropy_forward_backward(float* losses, float* logits, const std::int32_t* targets,
                                    std::int64_t N, int V, int Vp, float dloss, void* stream);

// ---- AdamW (the formula of optim::adamw_update_range) ----
// params, m, v (n) updated in place from grads (n). step is 1-based (bias correction);
// weight_decay is the effective decay of this range (0 for tensors without decay).
void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, std::int64_t step,
                  void* stream);

// ---- bf16 mixed precision: bf16 activations that feed GEMMs, fp32 everything else ----
// LayerNorm from the fp32 residual stream to a bf16 output (the next GEMM's input).
void layernorm_forward_bf16(std::uint16_t* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, std::int64_t N, int C,
                            void* stream);
// dinp (N,C) fp32 +=; dinp_bf16, if not null, = the updated dinp rounded to bf16; dweight,
// dbias (C) += (atomics); dout (N,C) is bf16.
void layernorm_backward_bf16(float* dinp, std::uint16_t* dinp_bf16, float* dweight, float* dbias,
                             const std::uint16_t* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, std::int64_t N, int C,
                             void* stream);
// dbias (OC) += column sums of dout (N,OC) (fp32 accumulation, atomics).
void bias_backward_bf16(float* dbias, const std::uint16_t* dout, std::int64_t N, int OC,
                        void* stream);
void gelu_forward_bf16(std::uint16_t* out, const std::uint16_t* inp, std::int64_t n, void* stream);
// dinp = dout * gelu'(inp) (dinp may alias dout)
void gelu_backward_bf16(std::uint16_t* dinp, const std::uint16_t* inp, const std::uint16_t* dout,
                        std::int64_t n, void* stream);
// The cross-entropy ops over bf16 logits (softmax and losses in fp32); the _backward variant
// overwrites the logits with the bf16 gradient.
void cross_entropy_forward_bf16(float* losses, std::uint16_t* logits, const std::int32_t* targets,
                                std::int64_t N, int V, int Vp, void* stream);
void cross_entropy_forward_backward_bf16(float* losses, std::uint16_t* logits,
                                         const std::int32_t* targets, std::int64_t N, int V, int Vp,
                                         float dloss, void* stream);
// adamw_update on fp32 masters with the gradient multiplied by grad_scale (clipping), also
// writing the updated parameters as bf16 into params_bf16 when it is not null.
void adamw_update_mixed(float* params, std::uint16_t* params_bf16, const float* grads, float* m,
                        float* v, std::int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, std::int64_t step, float grad_scale, void* stream);
// *out (one device float) = sum of x[i]^2, in a fixed order (the same on every run); workspace
// holds sum_of_squares_workspace_bytes().
std::size_t sum_of_squares_workspace_bytes();
void sum_of_squares(float* out, const float* x, std::int64_t n, float* workspace, void* stream);

// ---- elementwise ----
void add(float* out, const float* a, const float* b, std::int64_t n, void* stream);  // out = a+b
void add_inplace(float* out, const float* a, std::int64_t n, void* stream);          // out += a
void copy(float* out, const float* a, std::int64_t n, void* stream);

}  // namespace tessera::kernels::cuda
