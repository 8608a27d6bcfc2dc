#include "tessera/model/gpt_device.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/cudnn_attention.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/model/gpt_block.hpp"

namespace tessera::model {

namespace cu = kernels::cuda;
using kernels::OpFamily;
using bf16 = std::uint16_t;  // bf16 bit patterns, the op table's convention

const char* precision_name(DevicePrecision p) {
  return p == DevicePrecision::Bf16 ? "bf16" : "fp32";
}

namespace {

// ---- the op table by element type: fp32 everywhere, or bf16 activations with fp32 residuals --
// GEMM C (M,N) = alpha op(A) op(B) + beta C in the row-major convention of kernels::gemm.
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
          std::int64_t ldc, void* st) {
  cu::gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, st);
}
template <class Out>
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const bf16* A,
          std::int64_t lda, const bf16* B, std::int64_t ldb, float beta, Out* C, std::int64_t ldc,
          void* st) {
  cu::gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, st);
}

// out (N,OC) = inp (N,IC) @ w^T (OC,IC) + b [+ residual (N,OC), read in the GEMM's epilogue]
void linear(float* out, const float* inp, const float* w, const float* b, std::int64_t N, int IC,
            int OC, void* st, const float* residual = nullptr) {
  cu::GemmEpilogue e;
  e.bias = b;
  e.c_in = residual;
  cu::gemm_ex(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, residual ? 1.0f : 0.0f, out, OC, e, st);
}
void linear(bf16* out, const bf16* inp, const bf16* w, const bf16* b, std::int64_t N, int IC,
            int OC, void* st) {
  cu::GemmEpilogue e;
  e.bias = b;
  cu::gemm_bf16_ex(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC, e, st);
}
void linear(float* out, const bf16* inp, const bf16* w, const float* b, std::int64_t N, int IC,
            int OC, void* st, const float* residual = nullptr) {
  cu::GemmEpilogue e;
  e.bias = b;
  e.c_in = residual;
  cu::gemm_bf16_ex(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, residual ? 1.0f : 0.0f, out, OC, e,
                   st);
}

// out = gelu(pre), pre (N,OC) = inp @ w^T + b. fp32: a GEMM, then the GELU kernel (the
// reference path); bf16: one GEMM with the GELU in its epilogue, pre kept for the backward.
void linear_gelu(float* out, float* pre, const float* inp, const float* w, const float* b,
                 std::int64_t N, int IC, int OC, void* st) {
  linear(pre, inp, w, b, N, IC, OC, st);
  cu::gelu_forward(out, pre, N * OC, st);
}
void linear_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* w, const bf16* b,
                 std::int64_t N, int IC, int OC, void* st) {
  cu::GemmEpilogue e;
  e.bias = b;
  e.act = cu::GemmEpilogue::Act::Gelu;
  e.aux = pre;
  cu::gemm_bf16_ex(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC, e, st);
}

// dinp (N,IC) = (dout (N,OC) @ w (OC,IC)) * gelu'(pre (N,IC)): the input gradient of a linear
// layer whose input was gelu(pre), with the GELU backward fused in bf16.
void linear_backward_input_dgelu(float* dinp, const float* dout, const float* w, const float* pre,
                                 std::int64_t N, int IC, int OC, void* st) {
  cu::gemm(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dinp, IC, st);
  cu::gelu_backward(dinp, pre, dinp, N * IC, st);
}
void linear_backward_input_dgelu(bf16* dinp, const bf16* dout, const bf16* w, const bf16* pre,
                                 std::int64_t N, int IC, int OC, void* st) {
  cu::GemmEpilogue e;
  e.act = cu::GemmEpilogue::Act::DGelu;
  e.aux = const_cast<bf16*>(pre);
  cu::gemm_bf16_ex(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dinp, IC, e, st);
}

void bias_backward(float* db, const float* dout, std::int64_t N, int OC, void* st) {
  cu::bias_backward(db, dout, N, OC, st);
}
void bias_backward(float* db, const bf16* dout, std::int64_t N, int OC, void* st) {
  cu::bias_backward_bf16(db, dout, N, OC, st);
}

// dinp (N,IC) = dout @ w (skipped if null); dw (OC,IC) += dout^T @ inp; db (OC) += (if non-null)
template <class A>
void linear_backward(A* dinp, float* dw, float* db, const A* dout, const A* inp, const A* w,
                     std::int64_t N, int IC, int OC, void* st) {
  if (dinp) gemm(false, false, N, IC, OC, dout, OC, w, IC, 0.0f, dinp, IC, st);
  gemm(true, false, OC, IC, N, dout, OC, inp, IC, 1.0f, dw, IC, st);
  if (db) bias_backward(db, dout, N, OC, st);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, std::int64_t N, int C, void* st) {
  cu::layernorm_forward(out, mean, rstd, inp, w, b, N, C, st);
}
void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, std::int64_t N, int C, void* st) {
  cu::layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C, st);
}
// dinp (fp32) +=; in bf16 also dinp_copy = bf16(dinp) for the GEMMs that read it next.
void layernorm_backward(float* dinp, float* /*dinp_copy: dinp itself*/, float* dw, float* db,
                        const float* dout, const float* inp, const float* w, const float* mean,
                        const float* rstd, std::int64_t N, int C, void* st) {
  cu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, st);
}
void layernorm_backward(float* dinp, bf16* dinp_copy, float* dw, float* db, const bf16* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        std::int64_t N, int C, void* st) {
  cu::layernorm_backward_bf16(dinp, dinp_copy, dw, db, dout, inp, w, mean, rstd, N, C, st);
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KV,
                       int hs, void* st) {
  cu::attention_forward(out, lse, qkv, B, T, NH, KV, hs, st);
}
// bf16 without cuDNN: tessera's flash kernels (as many kv heads as heads only).
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int KV, int hs,
                       void* st) {
  TESSERA_CHECK(KV == NH, "the flash kernels have no grouped kv heads (DeviceGpt needs cuDNN)");
  cu::flash_attention_forward(out, lse, qkv, B, T, NH * hs, NH, st);
}
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* /*workspace*/, int B, int T, int NH, int KV,
                        int hs, void* st) {
  cu::attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, KV, hs, st);
}
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, float* workspace, int B, int T, int NH, int KV, int hs,
                        void* st) {
  TESSERA_CHECK(KV == NH, "the flash kernels have no grouped kv heads (DeviceGpt needs cuDNN)");
  cu::flash_attention_backward(dqkv, dout, qkv, out, lse, workspace, B, T, NH * hs, NH, st);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     int C, float eps, void* st) {
  cu::rmsnorm_forward(out, rstd, inp, w, N, C, eps, st);
}
void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     int C, float eps, void* st) {
  cu::rmsnorm_forward_bf16(out, rstd, inp, w, N, C, eps, st);
}
void rmsnorm_backward(float* dinp, float* /*dinp_copy: dinp itself*/, float* dw, const float* dout,
                      const float* inp, const float* w, const float* rstd, std::int64_t N, int C,
                      void* st) {
  cu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, st);
}
void rmsnorm_backward(float* dinp, bf16* dinp_copy, float* dw, const bf16* dout, const float* inp,
                      const float* w, const float* rstd, std::int64_t N, int C, void* st) {
  cu::rmsnorm_backward_bf16(dinp, dinp_copy, dw, dout, inp, w, rstd, N, C, st);
}
// The rows of qkv are positions pos0, pos0 + 1, ... (pos0: null for 0, or in device memory; the
// forward only: decoding never goes back).
void rope(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq, bool back,
          void* st, const int* pos0 = nullptr) {
  if (back)
    cu::rope_backward(qkv, B, T, NH, KV, hs, inv_freq, st);
  else
    cu::rope_forward(qkv, B, T, NH, KV, hs, inv_freq, st, pos0);
}
void rope(bf16* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq, bool back,
          void* st, const int* pos0 = nullptr) {
  if (back)
    cu::rope_backward_bf16(qkv, B, T, NH, KV, hs, inv_freq, st);
  else
    cu::rope_forward_bf16(qkv, B, T, NH, KV, hs, inv_freq, st, pos0);
}

// A KV cache of one layer (positions in device memory): append T rows of qkv's keys and values at
// *pos; one query row's attention over positions 0 .. *pos.
void kv_cache_append(float* kc, float* vc, const float* qkv, int T, int NH, int KV, int hs,
                     const int* pos, void* st) {
  cu::kv_cache_append(kc, vc, qkv, T, NH, KV, hs, pos, st);
}
void kv_cache_append(bf16* kc, bf16* vc, const bf16* qkv, int T, int NH, int KV, int hs,
                     const int* pos, void* st) {
  cu::kv_cache_append_bf16(kc, vc, qkv, T, NH, KV, hs, pos, st);
}
void decode_attention(float* out, const float* qkv, const float* kc, const float* vc,
                      const int* pos, int capacity, int NH, int KV, int hs, float* scratch,
                      void* st) {
  cu::decode_attention(out, qkv, kc, vc, pos, capacity, NH, KV, hs, scratch, st);
}
void decode_attention(bf16* out, const bf16* qkv, const bf16* kc, const bf16* vc, const int* pos,
                      int capacity, int NH, int KV, int hs, float* scratch, void* st) {
  cu::decode_attention_bf16(out, qkv, kc, vc, pos, capacity, NH, KV, hs, scratch, st);
}
void swiglu_forward(float* out, const float* inp, std::int64_t N, int F, void* st) {
  cu::swiglu_forward(out, inp, N, F, st);
}
void swiglu_forward(bf16* out, const bf16* inp, std::int64_t N, int F, void* st) {
  cu::swiglu_forward_bf16(out, inp, N, F, st);
}
void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F,
                     void* st) {
  cu::swiglu_backward(dinp, dout, inp, N, F, st);
}
void swiglu_backward(bf16* dinp, const bf16* dout, const bf16* inp, std::int64_t N, int F,
                     void* st) {
  cu::swiglu_backward_bf16(dinp, dout, inp, N, F, st);
}

void cross_entropy(float* losses, float* logits, const std::int32_t* targets, std::int64_t N, int V,
                   int Vp, bool training, float dloss, void* st) {
  if (training)
    cu::cross_entropy_forward_backward(losses, logits, targets, N, V, Vp, dloss, st);
  else
    cu::cross_entropy_forward(losses, logits, targets, N, V, Vp, st);
}
void cross_entropy(float* losses, bf16* logits, const std::int32_t* targets, std::int64_t N, int V,
                   int Vp, bool training, float dloss, void* st) {
  if (training)
    cu::cross_entropy_forward_backward_bf16(losses, logits, targets, N, V, Vp, dloss, st);
  else
    cu::cross_entropy_forward_bf16(losses, logits, targets, N, V, Vp, st);
}

// Byte offsets of the activations of one micro-batch (B, T) in one device buffer; A is the
// element type of the GEMM-side tensors (float or bf16), every offset 256-byte aligned.
struct ActOffsets {
  struct Layer {
    std::size_t ln1, ln1_mean, ln1_rstd;  // A (N,C), f32 (N), f32 (N)
    std::size_t qkv;                      // A (N,qkv_rows)
    std::size_t atty, lse;                // A (N,C), f32 (B,NH,T)
    std::size_t res2;                     // f32 (N,C)
    std::size_t ln2, ln2_mean, ln2_rstd;  // A (N,C), f32 (N), f32 (N)
    std::size_t fch, fch_gelu;            // A (N,fc_rows), A (N,ffn)
    std::size_t res3;                     // f32 (N,C)
  };
  std::size_t encoded = 0;  // f32 (N,C)
  std::vector<Layer> layers;
  std::size_t lnf = 0, lnf_mean = 0, lnf_rstd = 0;  // A (N,C), f32 (N), f32 (N)
  std::size_t logits = 0;                           // A (N,Vp); dlogits after training
  std::size_t losses = 0;                           // f32 (N)
  std::size_t inputs = 0, targets = 0;              // i32 (N)
  // backward scratch, reused by every layer
  std::size_t d_res = 0;                  // f32 (N,C) gradient of the residual stream
  std::size_t d_res_a = 0;                // A (N,C) its copy in A (bf16 only)
  std::size_t d_ln = 0;                   // A (N,C)
  std::size_t d_atty = 0;                 // A (N,C)
  std::size_t d_qkv = 0;                  // A (N,qkv_rows)
  std::size_t d_fch = 0;                  // A (N,fc_rows)
  std::size_t d_act = 0;                  // A (N,ffn), llama only
  std::size_t attn_ws = 0;                // flash attention backward workspace (bf16 only)
  std::size_t norm_ws = 0, norm_out = 0;  // gradient norm
  std::size_t bytes = 0;

  ActOffsets(const ModelConfig& cfg, int B, int T, std::size_t a) {
    const std::size_t N = static_cast<std::size_t>(B) * T, C = cfg.n_embd, NH = cfg.n_head;
    const std::size_t Vp = cfg.padded_vocab(), f = sizeof(float);
    const std::size_t QKV = cfg.qkv_rows(), FC = cfg.fc_rows(), F = cfg.ffn();
    auto take = [&](std::size_t n) {
      std::size_t o = bytes;
      bytes += (n + 255) / 256 * 256;
      return o;
    };
    encoded = take(N * C * f);
    layers.resize(cfg.n_layer);
    for (auto& l : layers) {
      l.ln1 = take(N * C * a);
      l.ln1_mean = take(N * f);
      l.ln1_rstd = take(N * f);
      l.qkv = take(N * QKV * a);
      l.atty = take(N * C * a);
      l.lse = take(N * NH * f);
      l.res2 = take(N * C * f);
      l.ln2 = take(N * C * a);
      l.ln2_mean = take(N * f);
      l.ln2_rstd = take(N * f);
      l.fch = take(N * FC * a);
      l.fch_gelu = take(N * F * a);
      l.res3 = take(N * C * f);
    }
    lnf = take(N * C * a);
    lnf_mean = take(N * f);
    lnf_rstd = take(N * f);
    logits = take(N * Vp * a);
    losses = take(N * f);
    inputs = take(N * sizeof(std::int32_t));
    targets = take(N * sizeof(std::int32_t));
    d_res = take(N * C * f);
    d_res_a = a == f ? d_res : take(N * C * a);
    d_ln = take(N * C * a);
    d_atty = take(N * C * a);
    d_qkv = take(N * QKV * a);
    d_fch = take(N * FC * a);
    d_act = take(cfg.llama() ? N * F * a : 0);
    attn_ws = take(a == f || cfg.llama()
                       ? 0
                       : cu::flash_attention_workspace_bytes(B, T, cfg.n_embd, cfg.n_head));
    norm_ws = take(cu::sum_of_squares_workspace_bytes());
    norm_out = take(f);
  }
};

// The op table of model/gpt_block.hpp on the CUDA kernels, in fp32 (A = float) or bf16 mixed
// precision (A = bf16 bits: the GEMM weights are the optimizer's bf16 copy, W = A).
template <class Act>
class DeviceOps {
 public:
  using A = Act;
  using W = Act;
  // cudnn: cuDNN's attention for bf16 where it has an engine for the shape (null: never).
  DeviceOps(cu::DeviceProfiler* profiler, void* stream, float* attention_workspace,
            cu::CudnnAttention* cudnn)
      : profiler_(profiler), st_(stream), attn_ws_(attention_workspace), cudnn_(cudnn) {}
  void mark(OpFamily f) {
    if (profiler_) profiler_->mark(f);
  }
  void finish() {}    // an interval of the device profiler ends at the next mark
  void progress() {}  // no communication to drive

  void layernorm_forward(A* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, std::int64_t N, int C) {
    model::layernorm_forward(out, mean, rstd, inp, w, b, N, C, st_);
  }
  void layernorm_backward(float* dinp, A* dinp_a, float* dw, float* db, const A* dout,
                          const float* inp, const float* w, const float* mean, const float* rstd,
                          std::int64_t N, int C) {
    model::layernorm_backward(dinp, dinp_a, dw, db, dout, inp, w, mean, rstd, N, C, st_);
  }
  void linear(A* out, const A* inp, const W* w, const W* b, std::int64_t N, int IC, int OC) {
    model::linear(out, inp, w, b, N, IC, OC, st_);
  }
  void linear_residual(float* out, const float* residual, const A* inp, const W* w, const float* b,
                       std::int64_t N, int IC, int OC) {
    model::linear(out, inp, w, b, N, IC, OC, st_, residual);
  }
  void linear_gelu(A* out, A* pre, const A* inp, const W* w, const W* b, std::int64_t N, int IC,
                   int OC) {
    model::linear_gelu(out, pre, inp, w, b, N, IC, OC, st_);
  }
  void linear_backward(A* dinp, float* dw, float* db, const A* dout, const A* inp, const W* w,
                       std::int64_t N, int IC, int OC) {
    model::linear_backward<A>(dinp, dw, db, dout, inp, w, N, IC, OC, st_);
  }
  void linear_backward_input_dgelu(A* dinp, const A* dout, const W* w, const A* pre, std::int64_t N,
                                   int IC, int OC) {
    model::linear_backward_input_dgelu(dinp, dout, w, pre, N, IC, OC, st_);
  }
  void attention_forward(A* out, float* lse, const A* qkv, int B, int T, int NH, int KV, int hs) {
    if constexpr (std::is_same_v<A, bf16>)
      if (cudnn_ && cudnn_->supports(B, T)) return cudnn_->forward(out, lse, qkv, B, T, st_);
    model::attention_forward(out, lse, qkv, B, T, NH, KV, hs, st_);
  }
  // The same kernels as the forward of the shape (their lse conventions differ).
  void attention_backward(A* dqkv, const A* dout, const A* qkv, const A* out, const float* lse,
                          int B, int T, int NH, int KV, int hs) {
    if constexpr (std::is_same_v<A, bf16>)
      if (cudnn_ && cudnn_->supports(B, T))
        return cudnn_->backward(dqkv, dout, qkv, out, lse, B, T, st_);
    model::attention_backward(dqkv, dout, qkv, out, lse, attn_ws_, B, T, NH, KV, hs, st_);
  }
  void rmsnorm_forward(A* out, float* rstd, const float* inp, const float* w, std::int64_t N, int C,
                       float eps) {
    model::rmsnorm_forward(out, rstd, inp, w, N, C, eps, st_);
  }
  void rmsnorm_backward(float* dinp, A* dinp_a, float* dw, const A* dout, const float* inp,
                        const float* w, const float* rstd, std::int64_t N, int C) {
    model::rmsnorm_backward(dinp, dinp_a, dw, dout, inp, w, rstd, N, C, st_);
  }
  void swiglu_forward(A* out, const A* inp, std::int64_t N, int F) {
    model::swiglu_forward(out, inp, N, F, st_);
  }
  void swiglu_backward(A* dinp, const A* dout, const A* inp, std::int64_t N, int F) {
    model::swiglu_backward(dinp, dout, inp, N, F, st_);
  }
  void rope_forward(A* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
    model::rope(qkv, B, T, NH, KV, hs, inv_freq, false, st_);
  }
  void rope_backward(A* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
    model::rope(dqkv, B, T, NH, KV, hs, inv_freq, true, st_);
  }

 protected:
  cu::DeviceProfiler* profiler_;
  void* st_;
  float* attn_ws_;
  cu::CudnnAttention* cudnn_;
};

// The buffers of decoding with a KV cache (DeviceDecoder): every layer's keys and values
// (capacity positions each), the attention's scratch, and the tokens and position of the rows fed.
template <class A>
struct DecodeState {
  A* keys;         // (L, capacity, KV hs)
  A* values;       // (L, capacity, KV hs)
  float* scratch;  // the attention's partial sums (decode_attention_scratch_bytes)
  const std::int32_t* tokens;
  const int* pos;  // the first row's position in device memory; null: a prompt at position 0
  int capacity;
};

// The op table for decoding: the rows are positions pos, pos + 1, ...; a block's keys and values
// go into its layer's cache, and the attention reads the cache. A prompt (at position 0) runs the
// training forward's causal attention over its own rows; a token after it, the attention of its
// one row over the cache. Positions are read from device memory, so a step can be a CUDA graph.
template <class Act>
class DecodeOps : public DeviceOps<Act> {
 public:
  using A = Act;
  DecodeOps(const DeviceOps<A>& base, const DecodeState<A>& d, std::size_t layer_offset)
      : DeviceOps<A>(base), d_(d), k_(d.keys + layer_offset), v_(d.values + layer_offset) {}
  void rope_forward(A* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
    model::rope(qkv, B, T, NH, KV, hs, inv_freq, false, this->st_, d_.pos);
  }
  void attention_forward(A* out, float* lse, const A* qkv, int B, int T, int NH, int KV, int hs) {
    kv_cache_append(k_, v_, qkv, T, NH, KV, hs, d_.pos, this->st_);
    if (!d_.pos) return DeviceOps<A>::attention_forward(out, lse, qkv, B, T, NH, KV, hs);
    TESSERA_CHECK(B == 1 && T == 1, "decoding after the prompt takes one token at a time");
    decode_attention(out, qkv, k_, v_, d_.pos, d_.capacity, NH, KV, hs, d_.scratch, this->st_);
  }

 private:
  DecodeState<A> d_;
  A *k_, *v_;
};

}  // namespace

struct DeviceGpt::Impl {
  ModelConfig cfg;
  ParamLayout layout;
  DevicePrecision precision;
  int B_max, T_max;
  int B = 0, T = 0;      // the last forward's
  bool trained = false;  // the last forward was a training one
  ActOffsets off;
  cu::DeviceBuffer params, grads, moments, params16, acts;
  std::vector<float> host_losses;
  std::unique_ptr<cu::DeviceProfiler> profiler;
  std::unique_ptr<cu::CudnnAttention> cudnn;  // bf16 with cuDNN's attention
  std::string cudnn_why_not;                  // Auto fell back to flash: why
  kernels::Profile* profile = nullptr;
  void* st = nullptr;  // the legacy default stream

  Impl(const ModelConfig& c, DevicePrecision p, int Bm, int Tm)
      : cfg(c),
        layout(c),
        precision(p),
        B_max(Bm),
        T_max(Tm),
        off(c, Bm, Tm, p == DevicePrecision::Bf16 ? sizeof(bf16) : sizeof(float)) {}

  void mark(OpFamily f) {
    if (profiler) profiler->mark(f);
  }
  // cuDNN's attention if it loads and has an engine for the largest micro-batch; otherwise the
  // flash kernels, or (required) an error saying why.
  void use_cudnn(bool required) {
    cudnn = cu::CudnnAttention::create(cfg.n_head, cfg.kv_heads(), cfg.head_dim(), &cudnn_why_not);
    if (cudnn && !cudnn->supports(B_max, T_max)) {
      cudnn_why_not = fmt::format("{} has no fused attention engine for B={} T={} head size {}",
                                  cudnn->version(), B_max, T_max, cfg.head_dim());
      cudnn.reset();
    }
    if (cudnn) cudnn_why_not.clear();
    if (!cudnn && required)
      throw Error("cuDNN attention unavailable: " + cudnn_why_not,
                  "use the flash kernels (attention auto or flash), or put cuDNN 9's "
                  "libcudnn.so.9 on the library path");
  }
  template <class T>
  T* at(std::size_t byte_offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(acts.data()) + byte_offset);
  }
  // fp32 masters and gradients; null for a tensor the family does not have (k_absent)
  float* P(std::size_t o) const { return o == k_absent ? nullptr : params.as<float>() + o; }
  float* G(std::size_t o) const { return o == k_absent ? nullptr : grads.as<float>() + o; }
  // the parameters as the GEMMs read them
  template <class A>
  const A* W(std::size_t o) const {
    if (o == k_absent) return nullptr;
    if constexpr (std::is_same_v<A, float>)
      return params.as<float>() + o;
    else
      return params16.as<bf16>() + o;
  }

  template <class A>
  BlockWeights<A> block_weights(int l) const {
    const auto& w = layout.layers[l];
    return {P(w.ln1_w), P(w.ln1_b), W<A>(w.qkv_w), W<A>(w.qkv_b), W<A>(w.attproj_w), P(w.attproj_b),
            P(w.ln2_w), P(w.ln2_b), W<A>(w.fc_w),  W<A>(w.fc_b),  W<A>(w.fcproj_w),  P(w.fcproj_b)};
  }
  BlockGrads block_grads(int l) const {
    const auto& w = layout.layers[l];
    return {G(w.ln1_w), G(w.ln1_b), G(w.qkv_w), G(w.qkv_b), G(w.attproj_w), G(w.attproj_b),
            G(w.ln2_w), G(w.ln2_b), G(w.fc_w),  G(w.fc_b),  G(w.fcproj_w),  G(w.fcproj_b)};
  }
  template <class A>
  BlockActs<A> block_acts(int l) const {
    const auto& s = off.layers[l];
    return {at<A>(s.ln1),          at<float>(s.ln1_mean), at<float>(s.ln1_rstd), at<A>(s.qkv),
            at<A>(s.atty),         at<float>(s.lse),      at<float>(s.res2),     at<A>(s.ln2),
            at<float>(s.ln2_mean), at<float>(s.ln2_rstd), at<A>(s.fch),          at<A>(s.fch_gelu),
            at<float>(s.res3)};
  }
  // The op table on the model's stream with its profiler, or on another stream without one.
  template <class A>
  DeviceOps<A> ops(void* stream = nullptr) const {
    return stream ? DeviceOps<A>(nullptr, stream, at<float>(off.attn_ws), cudnn.get())
                  : DeviceOps<A>(profiler.get(), st, at<float>(off.attn_ws), cudnn.get());
  }

  template <class A>
  void forward(bool with_targets, bool training, float dloss);
  template <class A>
  void backward();
  template <class A>
  void decode(int n, const DecodeState<A>& d, void* stream);
  template <class A>
  void final_norm(const float* residual, std::int64_t rows, void* stream);
  template <class A>
  void head(std::int64_t rows, void* stream);
  void logits_row_to_host(std::int64_t row, float* host, void* stream) const;
};

template <class A>
void DeviceGpt::Impl::forward(bool with_targets, bool training, float dloss) {
  const int C = cfg.n_embd, V = cfg.vocab_size, Vp = cfg.padded_vocab();
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const auto* inp = at<std::int32_t>(off.inputs);
  mark(OpFamily::Embedding);
  cu::embedding_forward(at<float>(off.encoded), inp, P(layout.wte), P(layout.wpe), B, T, C, st);
  const float* residual = at<float>(off.encoded);
  const BlockShape shape = block_shape(cfg, B, T);
  auto block_ops = ops<A>();
  for (int l = 0; l < cfg.n_layer; ++l) {
    block_forward(block_ops, block_weights<A>(l), block_acts<A>(l), residual, shape);
    residual = at<float>(off.layers[l].res3);
  }
  mark(OpFamily::LayerNorm);
  final_norm<A>(residual, N, st);
  mark(OpFamily::Gemm);
  head<A>(N, st);
  if (with_targets) {
    mark(OpFamily::CrossEntropy);
    cross_entropy(at<float>(off.losses), at<A>(off.logits), at<std::int32_t>(off.targets), N, V, Vp,
                  training, dloss, st);
  }
}

// lnf (rows, C) = the final norm of rows of the residual stream.
template <class A>
void DeviceGpt::Impl::final_norm(const float* residual, std::int64_t rows, void* stream) {
  const int C = cfg.n_embd;
  if (cfg.llama())
    rmsnorm_forward(at<A>(off.lnf), at<float>(off.lnf_rstd), residual, P(layout.lnf_w), rows, C,
                    static_cast<float>(cfg.norm_eps), stream);
  else
    layernorm_forward(at<A>(off.lnf), at<float>(off.lnf_mean), at<float>(off.lnf_rstd), residual,
                      P(layout.lnf_w), P(layout.lnf_b), rows, C, stream);
}

// LM head (tied: the token embedding): logits (rows, Vp) = lnf (rows, C) @ head^T (C, Vp)
template <class A>
void DeviceGpt::Impl::head(std::int64_t rows, void* stream) {
  const int C = cfg.n_embd, Vp = cfg.padded_vocab();
  gemm(false, true, rows, Vp, C, at<A>(off.lnf), C, W<A>(layout.head), C, 0.0f, at<A>(off.logits),
       Vp, stream);
}

// n tokens at positions pos .. pos + n - 1 through every block on `stream`, their keys and values
// into the cache; logits row 0 = those after the last. Nothing here waits for the host.
template <class A>
void DeviceGpt::Impl::decode(int n, const DecodeState<A>& d, void* stream) {
  const int C = cfg.n_embd;
  const std::size_t layer = static_cast<std::size_t>(d.capacity) * cfg.kv_heads() * cfg.head_dim();
  cu::embedding_forward(at<float>(off.encoded), d.tokens, P(layout.wte), P(layout.wpe), 1, n, C,
                        stream, d.pos);
  const float* residual = at<float>(off.encoded);
  const BlockShape shape = block_shape(cfg, 1, n);
  const auto base = ops<A>(stream);
  for (int l = 0; l < cfg.n_layer; ++l) {
    DecodeOps<A> block_ops(base, d, l * layer);
    block_forward(block_ops, block_weights<A>(l), block_acts<A>(l), residual, shape);
    residual = at<float>(off.layers[l].res3);
  }
  final_norm<A>(residual + static_cast<std::size_t>(n - 1) * C, 1, stream);
  head<A>(1, stream);
}

template <class A>
void DeviceGpt::Impl::backward() {
  const int C = cfg.n_embd, Vp = cfg.padded_vocab();
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  float* d_res = at<float>(off.d_res);
  A* d_res_a = at<A>(off.d_res_a);  // == d_res in fp32
  A* d_ln = at<A>(off.d_ln);
  // LM head: the logits hold dlogits (N,Vp)
  mark(OpFamily::Gemm);
  linear_backward<A>(d_ln, G(layout.head), nullptr, at<A>(off.logits), at<A>(off.lnf),
                     W<A>(layout.head), N, C, Vp, st);
  mark(OpFamily::Elementwise);
  cu::memset_zero(d_res, static_cast<std::size_t>(N) * C * sizeof(float), st);
  const float* last = cfg.n_layer > 0 ? at<float>(off.layers.back().res3) : at<float>(off.encoded);
  mark(OpFamily::LayerNorm);
  if (cfg.llama())
    rmsnorm_backward(d_res, d_res_a, G(layout.lnf_w), d_ln, last, P(layout.lnf_w),
                     at<float>(off.lnf_rstd), N, C, st);
  else
    layernorm_backward(d_res, d_res_a, G(layout.lnf_w), G(layout.lnf_b), d_ln, last,
                       P(layout.lnf_w), at<float>(off.lnf_mean), at<float>(off.lnf_rstd), N, C, st);
  const BlockShape shape = block_shape(cfg, B, T);
  const BlockScratch<A> scratch{d_res,
                                d_res_a,
                                d_ln,
                                at<A>(off.d_atty),
                                at<A>(off.d_qkv),
                                at<A>(off.d_fch),
                                cfg.llama() ? at<A>(off.d_act) : nullptr};
  auto block_ops = ops<A>();
  for (int l = cfg.n_layer - 1; l >= 0; --l) {
    const float* x = l == 0 ? at<float>(off.encoded) : at<float>(off.layers[l - 1].res3);
    block_backward(block_ops, block_weights<A>(l), block_grads(l), block_acts<A>(l), scratch, x,
                   shape);
  }
  mark(OpFamily::Embedding);
  cu::embedding_backward(G(layout.wte), G(layout.wpe), d_res, at<std::int32_t>(off.inputs), B, T, C,
                         st);
}

DeviceGpt::DeviceGpt(const ModelConfig& cfg, DevicePrecision precision, int B, int T,
                     DeviceAttention attention) {
  if (cu::device_count() == 0)
    throw Error("no CUDA device: " + cu::describe_devices(),
                "run on a machine with an NVIDIA GPU and its driver, or on the CPU");
  if (cfg.llama() && precision == DevicePrecision::Bf16 && attention == DeviceAttention::Flash &&
      cfg.kv_heads() != cfg.n_head)
    throw Error("the flash kernels have no grouped-query attention",
                "use the cuDNN attention (attention auto), or fp32");
  if (B <= 0 || T <= 0 || T > cfg.block_size)
    throw Error(fmt::format("micro-batch ({}, {}) does not fit the model (block_size {})", B, T,
                            cfg.block_size));
  if (precision == DevicePrecision::Bf16 && !cfg.llama() &&
      !cu::flash_attention_supports(cfg.n_embd, cfg.n_head))
    throw Error(fmt::format("bf16 on the GPU needs a head size of 32, 64 or 128 (this model: {})",
                            cfg.head_dim()),
                "use precision fp32, or a model whose n_embd / n_head is one of those");
  p_ = std::make_unique<Impl>(cfg, precision, B, T);
  // llama in bf16: cuDNN's attention (grouped kv heads) is required.
  if (precision == DevicePrecision::Bf16 && attention != DeviceAttention::Flash)
    p_->use_cudnn(attention == DeviceAttention::Cudnn || cfg.llama());
  const std::size_t n = p_->layout.total();
  p_->params = cu::DeviceBuffer(n * sizeof(float));
  p_->grads = cu::DeviceBuffer(n * sizeof(float));
  p_->moments = cu::DeviceBuffer(2 * n * sizeof(float));
  if (precision == DevicePrecision::Bf16) p_->params16 = cu::DeviceBuffer(n * sizeof(bf16));
  p_->acts = cu::DeviceBuffer(p_->off.bytes);
  cu::memset_zero(p_->params.data(), p_->params.bytes());
  cu::memset_zero(p_->grads.data(), p_->grads.bytes());
  cu::memset_zero(p_->moments.data(), p_->moments.bytes());
  if (precision == DevicePrecision::Bf16)
    cu::memset_zero(p_->params16.data(), p_->params16.bytes());
  cu::synchronize();
}

DeviceGpt::~DeviceGpt() = default;

std::string DeviceGpt::attention_backend() const {
  if (p_->precision == DevicePrecision::Fp32) return "reference (fp32)";
  return p_->cudnn ? p_->cudnn->version() : "flash";
}
std::string DeviceGpt::attention_fallback_reason() const {
  return p_->cudnn_why_not;
}

const ParamLayout& DeviceGpt::layout() const {
  return p_->layout;
}
DevicePrecision DeviceGpt::precision() const {
  return p_->precision;
}
std::size_t DeviceGpt::device_bytes() const {
  return p_->params.bytes() + p_->grads.bytes() + p_->moments.bytes() + p_->params16.bytes() +
         p_->acts.bytes() + (p_->cudnn ? p_->cudnn->workspace_bytes() : 0);
}

void DeviceGpt::upload_params(const float* host) {
  const std::size_t n = p_->layout.total();
  cu::to_device(p_->params.data(), host, n * sizeof(float));
  if (p_->precision == DevicePrecision::Bf16)
    cu::float_to_bf16(p_->params16.as<bf16>(), p_->params.as<float>(), n, p_->st);
  cu::synchronize();
}
void DeviceGpt::download_params(float* host) const {
  cu::to_host(host, p_->params.data(), p_->params.bytes());
}
void DeviceGpt::download_grads(float* host) const {
  cu::to_host(host, p_->grads.data(), p_->grads.bytes());
}
void DeviceGpt::upload_moments(const float* m_host, const float* v_host) {
  const std::size_t n = p_->layout.total();
  cu::to_device(p_->moments.as<float>(), m_host, n * sizeof(float));
  cu::to_device(p_->moments.as<float>() + n, v_host, n * sizeof(float));
}
void DeviceGpt::download_moments(float* m_host, float* v_host) const {
  const std::size_t n = p_->layout.total();
  cu::to_host(m_host, p_->moments.as<float>(), n * sizeof(float));
  cu::to_host(v_host, p_->moments.as<float>() + n, n * sizeof(float));
}
float* DeviceGpt::device_grads() {
  return p_->grads.as<float>();
}

void* DeviceGpt::stream() const {
  return p_->st;
}

void DeviceGpt::zero_grads() {
  cu::memset_zero(p_->grads.data(), p_->grads.bytes(), p_->st);
}

float DeviceGpt::forward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
                         bool training, float dloss) {
  Impl& p = *p_;
  if (B <= 0 || T <= 0 || B > p.B_max || T > p.T_max)
    throw Error(fmt::format("micro-batch ({}, {}) is larger than this device model's ({}, {})", B,
                            T, p.B_max, p.T_max));
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const int V = p.cfg.vocab_size;
  for (std::int64_t i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V)
      throw Error(
          fmt::format("input token id {} is outside the model's vocabulary of {}", inputs[i], V));
    if (targets && (targets[i] >= V || targets[i] < -1))
      throw Error(
          fmt::format("target token id {} is outside the model's vocabulary of {}", targets[i], V));
  }
  if (training && !targets) throw Error("a training forward needs targets");
  p.B = B;
  p.T = T;
  p.trained = training;
  cu::to_device(p.at<void>(p.off.inputs), inputs, N * sizeof(std::int32_t));
  if (targets) cu::to_device(p.at<void>(p.off.targets), targets, N * sizeof(std::int32_t));
  if (p.precision == DevicePrecision::Bf16)
    p.forward<bf16>(targets != nullptr, training, dloss);
  else
    p.forward<float>(targets != nullptr, training, dloss);
  if (p.profiler) p.profiler->finish(*p.profile);
  if (!targets) return 0.0f;
  p.host_losses.resize(N);
  cu::to_host(p.host_losses.data(), p.at<void>(p.off.losses), N * sizeof(float));
  double sum = 0.0;
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    sum += p.host_losses[i];
    ++count;
  }
  return count ? static_cast<float>(sum / count) : 0.0f;
}

void DeviceGpt::backward() {
  Impl& p = *p_;
  TESSERA_CHECK(p.trained, "DeviceGpt::backward() needs a training forward() just before");
  if (p.precision == DevicePrecision::Bf16)
    p.backward<bf16>();
  else
    p.backward<float>();
  p.trained = false;  // the dlogits are consumed
  if (p.profiler) p.profiler->finish(*p.profile);
}

namespace {
void bf16_bits_to_float(const std::uint16_t* bits, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = static_cast<std::uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &b, 4);
  }
}
}  // namespace

std::vector<float> DeviceGpt::download_logits() const {
  const Impl& p = *p_;
  const std::size_t n = static_cast<std::size_t>(p.B) * p.T * p.cfg.padded_vocab();
  std::vector<float> out(n);
  if (p.precision == DevicePrecision::Bf16) {
    std::vector<bf16> bits(n);
    cu::to_host(bits.data(), p.at<void>(p.off.logits), n * sizeof(bf16));
    bf16_bits_to_float(bits.data(), out.data(), n);
  } else {
    cu::to_host(out.data(), p.at<void>(p.off.logits), n * sizeof(float));
  }
  return out;
}

void DeviceGpt::Impl::logits_row_to_host(std::int64_t row, float* host, void* stream) const {
  TESSERA_CHECK(row >= 0 && row < static_cast<std::int64_t>(B) * T, "logits row out of range");
  const std::size_t Vp = cfg.padded_vocab(), first = static_cast<std::size_t>(row) * Vp;
  if (precision == DevicePrecision::Bf16) {
    std::vector<bf16> bits(Vp);
    cu::to_host(bits.data(), at<bf16>(off.logits) + first, Vp * sizeof(bf16), stream);
    bf16_bits_to_float(bits.data(), host, Vp);
  } else {
    cu::to_host(host, at<float>(off.logits) + first, Vp * sizeof(float), stream);
  }
}

void DeviceGpt::download_logits_row(std::int64_t row, float* host) const {
  p_->logits_row_to_host(row, host, p_->st);
}

double DeviceGpt::grad_norm() {
  Impl& p = *p_;
  cu::sum_of_squares(p.at<float>(p.off.norm_out), p.grads.as<float>(),
                     static_cast<std::int64_t>(p.layout.total()), p.at<float>(p.off.norm_ws), p.st);
  float s = 0.0f;
  cu::to_host(&s, p.at<void>(p.off.norm_out), sizeof(float));
  return std::sqrt(static_cast<double>(s));
}

void DeviceGpt::adamw_step(const optim::AdamWConfig& cfg, float lr, std::int64_t step,
                           float grad_scale) {
  Impl& p = *p_;
  const std::size_t n = p.layout.total();
  float* m = p.moments.as<float>();
  float* v = m + n;
  bf16* p16 = p.precision == DevicePrecision::Bf16 ? p.params16.as<bf16>() : nullptr;
  p.mark(OpFamily::Optimizer);
  for (const auto& t : p.layout.tensors())
    cu::adamw_update_mixed(p.P(t.offset), p16 ? p16 + t.offset : nullptr, p.G(t.offset),
                           m + t.offset, v + t.offset, static_cast<std::int64_t>(t.numel), lr,
                           cfg.beta1, cfg.beta2, cfg.eps, t.decay ? cfg.weight_decay : 0.0f, step,
                           grad_scale, p.st);
  if (p.profiler) p.profiler->finish(*p.profile);
}

namespace {
// Byte offsets in a device decoder's buffer: keys and values (A elements), the attention's
// scratch, the fed rows' tokens and their first position.
struct DecodeOffsets {
  std::size_t values, scratch, tokens, pos, bytes;
  DecodeOffsets(const ModelConfig& cfg, int capacity, std::size_t a) {
    const std::size_t cache = a * cfg.n_layer * capacity * cfg.kv_heads() * cfg.head_dim();
    values = cache;
    scratch = (2 * cache + 255) / 256 * 256;
    tokens = scratch + cu::decode_attention_scratch_bytes(cfg.n_head, cfg.head_dim(), capacity);
    pos = tokens + sizeof(std::int32_t);
    bytes = pos + sizeof(int);
  }
};
}  // namespace

DeviceDecoder::DeviceDecoder(DeviceGpt& model, int capacity, bool graphs)
    : model_(model), capacity_(capacity), graphs_(graphs), logits_(model.p_->cfg.padded_vocab()) {
  const auto& p = *model.p_;
  if (capacity <= 0 || capacity > p.T_max)
    throw Error(fmt::format("a KV cache of {} positions does not fit this device model (T {})",
                            capacity, p.T_max),
                "build the DeviceGpt with T at least the context to decode");
  cache_ = cu::DeviceBuffer(DecodeOffsets(p.cfg, capacity, element_bytes()).bytes);
}

std::size_t DeviceDecoder::element_bytes() const {
  return model_.p_->precision == DevicePrecision::Bf16 ? sizeof(bf16) : sizeof(float);
}

std::size_t DeviceDecoder::kv_cache_bytes() const {
  return 2 * DecodeOffsets(model_.p_->cfg, capacity_, element_bytes()).values;
}

const float* DeviceDecoder::prefill(const std::int32_t* tokens, int n) {
  if (pos_ != 0)
    throw Error(fmt::format("the device decoder takes a prompt at position 0 only ({} held)", pos_),
                "reset() first, or step() one token at a time");
  if (n <= 0 || n > capacity_)
    throw Error(fmt::format("a prompt of {} tokens for a context of {}", n, capacity_));
  return run(tokens, n);
}

const float* DeviceDecoder::step(std::int32_t token) {
  if (pos_ >= capacity_)
    throw Error(fmt::format("the context is full ({} tokens)", capacity_), "generate fewer tokens");
  return run(&token, 1);
}

// A prompt runs as queued; a step after the prompt reads its token and position from the
// buffer, so it is captured once as a CUDA graph (after one step run as queued: the GEMMs' plans
// and workspaces exist by then) and replayed for every later step.
const float* DeviceDecoder::run(const std::int32_t* tokens, int n) {
  auto& p = *model_.p_;
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= p.cfg.vocab_size)
      throw Error(fmt::format("input token id {} is outside the model's vocabulary of {}",
                              tokens[i], p.cfg.vocab_size));
  const DecodeOffsets o(p.cfg, capacity_, element_bytes());
  auto* base = static_cast<char*>(cache_.data());
  const bool prompt = pos_ == 0;
  const auto* fed = prompt ? p.at<std::int32_t>(p.off.inputs)
                           : reinterpret_cast<const std::int32_t*>(base + o.tokens);
  if (prompt) {
    cu::to_device(p.at<void>(p.off.inputs), tokens, n * sizeof(std::int32_t), stream_.get());
  } else {
    const std::int32_t io[2] = {tokens[0], pos_};  // tokens, then pos, adjacent in the buffer
    cu::to_device(base + o.tokens, io, sizeof(io), stream_.get());
  }
  auto queue_as = [&](auto element) {  // element: the precision's element type
    using A = decltype(element);
    const DecodeState<A> d{reinterpret_cast<A*>(base),
                           reinterpret_cast<A*>(base + o.values),
                           reinterpret_cast<float*>(base + o.scratch),
                           fed,
                           prompt ? nullptr : reinterpret_cast<const int*>(base + o.pos),
                           capacity_};
    p.decode<A>(n, d, stream_.get());
  };
  auto queue = [&] {
    if (p.precision == DevicePrecision::Bf16)
      queue_as(bf16{});
    else
      queue_as(float{});
  };
  if (prompt || !graphs_ || !stepped_) {
    queue();
    stepped_ = stepped_ || !prompt;
  } else {
    if (!graph_.ready()) graph_.capture(stream_.get(), queue);
    graph_.launch(stream_.get());
  }
  p.B = 1;  // logits row 0: those after the last token fed
  p.T = 1;
  p.trained = false;  // the activations are the decoder's now
  p.logits_row_to_host(0, logits_.data(), stream_.get());
  pos_ += n;
  return logits_.data();
}

void DeviceGpt::set_profile(kernels::Profile* profile) {
  p_->profile = profile;
  if (profile && !p_->profiler) p_->profiler = std::make_unique<cu::DeviceProfiler>(p_->st);
  if (!profile) p_->profiler.reset();
}

void DeviceGpt::synchronize() {
  cu::synchronize(p_->st);
}

}  // namespace tessera::model
