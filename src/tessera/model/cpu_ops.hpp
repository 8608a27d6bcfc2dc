// The CPU op table of the one block (model/gpt_block.hpp): kernels::cpu in fp32. The CPU model
// (model/gpt.cpp) trains through it; RoutedOps sends the block's linears elsewhere (a quantized
// model's packed weights: the decoder's prompt prefill, the quantization runner, which also sees
// the input of every linear). Also one block's activations in a buffer, and the views of a layer's
// parameters and gradients that the block reads, from a block of the ParamStore protocol (laid out
// from the layer's `begin`).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/profile.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_block.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::model {

// The op table of model/gpt_block.hpp on the CPU kernels (fp32; the residual add is a copy and an
// accumulating GEMM, the GELU a kernel of its own).
class CpuOps {
 public:
  using A = float;
  using W = float;
  CpuOps(kernels::GemmLibrary lib, kernels::Profile* profile, ParamStore* store = nullptr)
      : lib_(lib), profile_(profile), store_(store) {}
  ~CpuOps() { finish(); }

  void mark(kernels::OpFamily f) {
    if (!profile_) return;
    finish();
    current_ = f;
    t0_ = std::chrono::steady_clock::now();
  }
  void finish() {
    if (!profile_ || current_ == kernels::OpFamily::Count) return;
    (*profile_)[current_] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    current_ = kernels::OpFamily::Count;
  }
  void progress() {
    if (store_) store_->progress();
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, std::int64_t N, int C) {
    kernels::cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* /*dinp_a: dinp itself*/, float* dw, float* db,
                          const float* dout, const float* inp, const float* w, const float* mean,
                          const float* rstd, std::int64_t N, int C) {
    kernels::cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void linear(float* out, const float* inp, const float* w, const float* b, std::int64_t N, int IC,
              int OC) {
    kernels::cpu::linear_forward(lib_, out, inp, w, b, N, IC, OC);
  }
  void linear_residual(float* out, const float* residual, const float* inp, const float* w,
                       const float* b, std::int64_t N, int IC, int OC) {
    kernels::cpu::copy(out, residual, N * OC);
    kernels::cpu::linear_forward(lib_, out, inp, w, b, N, IC, OC, true);
  }
  void linear_gelu(float* out, float* pre, const float* inp, const float* w, const float* b,
                   std::int64_t N, int IC, int OC) {
    kernels::cpu::linear_forward(lib_, pre, inp, w, b, N, IC, OC);
    kernels::cpu::gelu_forward(out, pre, N * OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, std::int64_t N, int IC, int OC) {
    kernels::cpu::linear_backward(lib_, dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void linear_backward_input_dgelu(float* dinp, const float* dout, const float* w, const float* pre,
                                   std::int64_t N, int IC, int OC) {
    kernels::cpu::linear_backward_input(lib_, dinp, dout, w, N, IC, OC);
    kernels::cpu::gelu_backward(dinp, pre, dinp, N * IC);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                       int C, float eps) {
    kernels::cpu::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* /*dinp_a: dinp itself*/, float* dw, const float* dout,
                        const float* inp, const float* w, const float* rstd, std::int64_t N,
                        int C) {
    kernels::cpu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void swiglu_forward(float* out, const float* inp, std::int64_t N, int F) {
    kernels::cpu::swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F) {
    kernels::cpu::swiglu_backward(dinp, dout, inp, N, F);
  }
  void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
    kernels::cpu::rope_forward(qkv, B, T, NH, KV, hs, inv_freq);
  }
  void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
    kernels::cpu::rope_backward(dqkv, B, T, NH, KV, hs, inv_freq);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KV,
                         int hs) {
    kernels::cpu::attention_forward(lib_, out, lse, qkv, B, T, NH, KV, hs);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int NH, int KV, int hs) {
    kernels::cpu::attention_backward(lib_, dqkv, dout, qkv, out, lse, B, T, NH, KV, hs);
  }

 private:
  kernels::GemmLibrary lib_;
  kernels::Profile* profile_;
  ParamStore* store_;
  kernels::OpFamily current_ = kernels::OpFamily::Count;
  std::chrono::steady_clock::time_point t0_;
};

// The op table of bf16 mixed precision on the CPU: every linear reads bf16 (its input rounded to
// bf16 in a scratch buffer, the weights' bf16 copy W) and accumulates and writes fp32
// (kernels::gemm_bf16); the biases of the fused q/k/v and the first MLP GEMM are bf16 (W), the
// residual projections' fp32. Activations stay fp32 (A = float), so the norms, attention, GELU,
// SwiGLU, RoPE and every gradient are CpuOps' fp32 kernels: the only rounding is of the GEMM
// operands (the activations and output gradients they read, and the weights).
class CpuBf16Ops : public CpuOps {
 public:
  using A = float;
  using W = std::uint16_t;
  CpuBf16Ops(kernels::GemmLibrary lib, kernels::Profile* profile, kernels::cpu::Bf16Scratch& s,
             ParamStore* store = nullptr)
      : CpuOps(lib, profile, store), s_(s) {}

  void linear(float* out, const float* inp, const W* w, const W* b, std::int64_t N, int IC,
              int OC) {
    kernels::cpu::linear_forward_bf16(s_, out, inp, w, b, nullptr, N, IC, OC);
  }
  void linear_residual(float* out, const float* residual, const float* inp, const W* w,
                       const float* b, std::int64_t N, int IC, int OC) {
    kernels::cpu::copy(out, residual, N * OC);
    kernels::cpu::linear_forward_bf16(s_, out, inp, w, nullptr, b, N, IC, OC, true);
  }
  void linear_gelu(float* out, float* pre, const float* inp, const W* w, const W* b, std::int64_t N,
                   int IC, int OC) {
    kernels::cpu::linear_forward_bf16(s_, pre, inp, w, b, nullptr, N, IC, OC);
    kernels::cpu::gelu_forward(out, pre, N * OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const W* w, std::int64_t N, int IC, int OC) {
    kernels::cpu::linear_backward_bf16(s_, dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void linear_backward_input_dgelu(float* dinp, const float* dout, const W* w, const float* pre,
                                   std::int64_t N, int IC, int OC) {
    kernels::cpu::linear_backward_input_bf16(s_, dinp, dout, w, N, IC, OC);
    kernels::cpu::gelu_backward(dinp, pre, dinp, N * IC);
  }

 private:
  kernels::cpu::Bf16Scratch& s_;
};

// CpuOps whose linears go to a BlockLinear (model/gpt.hpp: 0 the q/k/v projection, 1 the
// attention's output projection, 2 the MLP's first linear, 3 its output projection) when one is set
// (else to the fp32 weights), each input first through input() (the identity here; a derived table
// may capture or round it).
class RoutedOps : public CpuOps {
 public:
  RoutedOps(kernels::GemmLibrary lib, const BlockLinear& fn, int layer,
            const BlockWeights<float>& w)
      : CpuOps(lib, nullptr), fn_(fn), layer_(layer), w_(w) {}
  virtual ~RoutedOps() = default;

  void linear(float* out, const float* inp, const float* w, const float* b, std::int64_t N, int IC,
              int OC) {
    const float* x = input(site(w), inp, N, IC);
    if (fn_)
      fn_(layer_, site(w), out, x, b, N);
    else
      CpuOps::linear(out, x, w, b, N, IC, OC);
  }
  void linear_residual(float* out, const float* residual, const float* inp, const float* w,
                       const float* b, std::int64_t N, int IC, int OC) {
    const float* x = input(site(w), inp, N, IC);
    if (!fn_) {
      CpuOps::linear_residual(out, residual, x, w, b, N, IC, OC);
      return;
    }
    std::vector<float> y(static_cast<std::size_t>(N) * OC);  // out may be the residual itself
    fn_(layer_, site(w), y.data(), x, b, N);
    for (std::size_t i = 0; i < y.size(); ++i) out[i] = residual[i] + y[i];
  }
  void linear_gelu(float* out, float* pre, const float* inp, const float* w, const float* b,
                   std::int64_t N, int IC, int OC) {
    const float* x = input(site(w), inp, N, IC);
    if (!fn_) {
      CpuOps::linear_gelu(out, pre, x, w, b, N, IC, OC);
      return;
    }
    fn_(layer_, site(w), pre, x, b, N);
    kernels::cpu::gelu_forward(out, pre, N * OC);
  }

 protected:
  // x (N, cols), the input of linear `site`: what the linear reads.
  virtual const float* input(int /*site*/, const float* x, std::int64_t /*N*/, int /*cols*/) {
    return x;
  }
  int layer() const { return layer_; }

 private:
  int site(const float* w) const {  // the linear by its weight
    if (w == w_.qkv_w) return 0;
    if (w == w_.attproj_w) return 1;
    if (w == w_.fc_w) return 2;
    TESSERA_CHECK(w == w_.fcproj_w, "a linear of the block that is not one of its four sites");
    return 3;
  }
  const BlockLinear& fn_;
  int layer_;
  const BlockWeights<float>& w_;
};

// Where one block's fp32 activations for N rows lie in one buffer of end floats (each tensor at a
// multiple of 16 floats), for callers that run the model a block at a time over one buffer.
struct BlockActOffsets {
  std::size_t ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, act,
      res3, end;
  BlockActOffsets(const ModelConfig& cfg, std::size_t N) {
    std::size_t off = 0;
    auto take = [&](std::size_t n) { return std::exchange(off, off + (n + 15) / 16 * 16); };
    const std::size_t C = cfg.n_embd;
    ln1 = take(N * C), ln1_mean = take(N), ln1_rstd = take(N), qkv = take(N * cfg.qkv_rows());
    atty = take(N * C), lse = take(N * cfg.n_head), res2 = take(N * C), ln2 = take(N * C);
    ln2_mean = take(N), ln2_rstd = take(N), fch = take(N * cfg.fc_rows());
    act = take(N * cfg.ffn()), res3 = take(N * C);
    end = off;
  }
  BlockActs<float> view(float* a) const {
    return {a + ln1, a + ln1_mean, a + ln1_rstd, a + qkv, a + atty, a + lse, a + res2,
            a + ln2, a + ln2_mean, a + ln2_rstd, a + fch, a + act,  a + res3};
  }
};

// A layer's parameters (a block from the store, laid out from `w.begin`) and activations.
inline BlockWeights<float> block_weights(const LayerOffsets& w, const float* blk) {
  auto P = [&](std::size_t off) { return off == k_absent ? nullptr : blk + (off - w.begin); };
  return {P(w.ln1_w), P(w.ln1_b), P(w.qkv_w), P(w.qkv_b), P(w.attproj_w), P(w.attproj_b),
          P(w.ln2_w), P(w.ln2_b), P(w.fc_w),  P(w.fc_b),  P(w.fcproj_w),  P(w.fcproj_b)};
}
// The same for CpuBf16Ops: the GEMM weights and the biases added in A from the bf16 copy of the
// block (blk16, laid out as blk), the norms and the residual projections' biases from blk.
inline BlockWeights<std::uint16_t> block_weights_bf16(const LayerOffsets& w, const float* blk,
                                                      const std::uint16_t* blk16) {
  auto P = [&](std::size_t off) { return off == k_absent ? nullptr : blk + (off - w.begin); };
  auto H = [&](std::size_t off) { return off == k_absent ? nullptr : blk16 + (off - w.begin); };
  return {P(w.ln1_w), P(w.ln1_b), H(w.qkv_w), H(w.qkv_b), H(w.attproj_w), P(w.attproj_b),
          P(w.ln2_w), P(w.ln2_b), H(w.fc_w),  H(w.fc_b),  H(w.fcproj_w),  P(w.fcproj_b)};
}
inline BlockGrads block_grads(const LayerOffsets& w, float* gblk) {
  auto G = [&](std::size_t off) { return off == k_absent ? nullptr : gblk + (off - w.begin); };
  return {G(w.ln1_w), G(w.ln1_b), G(w.qkv_w), G(w.qkv_b), G(w.attproj_w), G(w.attproj_b),
          G(w.ln2_w), G(w.ln2_b), G(w.fc_w),  G(w.fc_b),  G(w.fcproj_w),  G(w.fcproj_b)};
}
}  // namespace tessera::model
