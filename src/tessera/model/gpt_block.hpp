// One block's forward and backward, written once over an op table, for both families. The CPU
// model (model/gpt.cpp: kernels::cpu, fp32) and the GPU model (model/gpt_device.cpp:
// kernels::cuda, fp32 or bf16 mixed precision) both run these functions, each with its own `Ops`.
//
// A block (pre-norm):
//   gpt2:  res2 = x    + attproj(attention(qkv(ln1(x))))
//          res3 = res2 + fcproj(gelu(fc(ln2(res2))))
//   llama: res2 = x    + o(attention(rope(qkv(rmsnorm1(x)))))    (no biases; grouped kv heads)
//          res3 = res2 + down(silu(gate(rmsnorm2(res2))) * up(rmsnorm2(res2)))
// llama's q, k, v projections are one GEMM (they lie back to back in the layout), and so are gate
// and up; `fch` then holds [gate | up] per row and `fch_gelu` the SwiGLU output.
//
// Types. `Ops::A` is the element type of the tensors GEMMs and attention read (float, or bf16 bit
// patterns on the GPU); `Ops::W` that of the GEMM weights and the biases added in A (float, or the
// optimizer's bf16 copy of the parameters). The residual stream and its gradient, norm
// statistics, the residual projections' biases, norm parameters and every gradient are fp32.
// Absent tensors (llama's biases) are null pointers.
//
// The op table (an Ops value; N = B*T rows, shapes in the comments of the calls below):
//   mark(OpFamily f)              the ops that follow count as f in a profile; finish() closes it
//   progress()                    between ops: drives non-blocking communication (CPU data
//                                 parallelism), or nothing
//   layernorm_forward(out A, mean, rstd, inp f32, w, b, N, C)
//   layernorm_backward(dinp f32 +=, dinp_a A (= bf16(dinp), or dinp itself in fp32), dw +=,
//                      db +=, dout A, inp, w, mean, rstd, N, C)
//   rmsnorm_forward(out A, rstd, inp f32, w, N, C, eps)
//   rmsnorm_backward(dinp f32 +=, dinp_a A, dw +=, dout A, inp, w, rstd, N, C)
//   linear(out A, inp A, w W, b W or null, N, IC, OC)                 out = inp w^T + b
//   linear_residual(out f32, residual f32, inp A, w W, b f32 or null, ...)
//                                                                     out = residual + inp w^T + b
//   linear_gelu(out A, pre A, inp A, w W, b W, ...)    pre = inp w^T + b; out = gelu(pre)
//   linear_backward(dinp A or null, dw +=, db += or null, dout A, inp A, w W, N, IC, OC)
//   linear_backward_input_dgelu(dinp A, dout A, w W, pre A, N, IC, OC)  dinp = (dout w) gelu'(pre)
//   swiglu_forward(out A, inp A, N, F) / swiglu_backward(dinp A, dout A, inp A, N, F)
//   rope_forward(qkv A, B, T, NH, KV, hs, inv_freq) / rope_backward(dqkv A, ...)   in place;
//                                 inv_freq: hs/2 host values (model::rope_inv_freq)
//   attention_forward(out A, lse f32, qkv A, B, T, NH, KV, hs)
//   attention_backward(dqkv A, dout A, qkv A, out A, lse, B, T, NH, KV, hs)
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/kernels/profile.hpp"
#include "tessera/model/config.hpp"

namespace tessera::model {

struct BlockShape {
  int B = 0, T = 0, C = 0, NH = 0;
  int KV = 0, hs = 0;  // key-value heads and head size
  int F = 0;           // the MLP's hidden width (gpt2: 4C; llama: intermediate_size)
  bool llama = false;
  float eps = 1e-5f;             // llama's RMSNorm epsilon
  std::vector<double> inv_freq;  // llama's rotary inverse frequencies (hs/2; rope_inv_freq)
  std::int64_t N() const { return static_cast<std::int64_t>(B) * T; }
  int qkv_rows() const { return (NH + 2 * KV) * hs; }
  int fc_rows() const { return llama ? 2 * F : F; }
};

// The shape of a micro-batch (B, T) of a model, for the blocks.
inline BlockShape block_shape(const ModelConfig& cfg, int B, int T) {
  BlockShape sh;
  sh.B = B;
  sh.T = T;
  sh.C = cfg.n_embd;
  sh.NH = cfg.n_head;
  sh.KV = cfg.kv_heads();
  sh.hs = cfg.head_dim();
  sh.F = cfg.ffn();
  sh.llama = cfg.llama();
  sh.eps = static_cast<float>(cfg.norm_eps);
  if (sh.llama) sh.inv_freq = rope_inv_freq(cfg);
  return sh;
}

// A block's parameters as the ops read them (null: absent in the family).
template <class W>
struct BlockWeights {
  const float *ln1_w, *ln1_b;  // (C)
  const W *qkv_w, *qkv_b;      // (qkv_rows, C), (qkv_rows)
  const W* attproj_w;          // (C, C)
  const float* attproj_b;      // (C)
  const float *ln2_w, *ln2_b;  // (C)
  const W *fc_w, *fc_b;        // (fc_rows, C), (fc_rows)
  const W* fcproj_w;           // (C, F)
  const float* fcproj_b;       // (C)
};

// Where a block's parameter gradients accumulate (same shapes as BlockWeights).
struct BlockGrads {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

// The activations of one block for one micro-batch, kept from forward for backward.
template <class A>
struct BlockActs {
  A* ln1;                      // (N, C)
  float *ln1_mean, *ln1_rstd;  // (N) (RMSNorm: rstd only)
  A* qkv;                      // (N, qkv_rows); llama: q and k after the rotation
  A* atty;                     // (N, C) attention output before the projection
  float* lse;                  // (B, NH, T)
  float* res2;                 // (N, C) residual after attention
  A* ln2;                      // (N, C)
  float *ln2_mean, *ln2_rstd;  // (N)
  A *fch, *fch_gelu;           // (N, fc_rows), (N, F): before and after the activation
  float* res3;                 // (N, C) the block's output
};

// Backward scratch shared by every block. d_res holds the gradient w.r.t. the block's output on
// entry and w.r.t. its input on return; d_res_a is its copy in A (the same buffer in fp32).
template <class A>
struct BlockScratch {
  float* d_res;  // (N, C)
  A* d_res_a;    // (N, C)
  A* d_ln;       // (N, C)
  A* d_atty;     // (N, C)
  A* d_qkv;      // (N, qkv_rows)
  A* d_fch;      // (N, fc_rows)
  A* d_act;      // (N, F): llama's gradient w.r.t. the SwiGLU output (null for gpt2)
};

// The norms of a block, each family's kind.
template <class Ops>
void norm_forward(Ops& ops, typename Ops::A* out, float* mean, float* rstd, const float* inp,
                  const float* w, const float* b, const BlockShape& sh) {
  if (sh.llama)
    ops.rmsnorm_forward(out, rstd, inp, w, sh.N(), sh.C, sh.eps);
  else
    ops.layernorm_forward(out, mean, rstd, inp, w, b, sh.N(), sh.C);
}
template <class Ops>
void norm_backward(Ops& ops, float* dinp, typename Ops::A* dinp_a, float* dw, float* db,
                   const typename Ops::A* dout, const float* inp, const float* w, const float* mean,
                   const float* rstd, const BlockShape& sh) {
  if (sh.llama)
    ops.rmsnorm_backward(dinp, dinp_a, dw, dout, inp, w, rstd, sh.N(), sh.C);
  else
    ops.layernorm_backward(dinp, dinp_a, dw, db, dout, inp, w, mean, rstd, sh.N(), sh.C);
}

template <class Ops>
void block_forward(Ops& ops, const BlockWeights<typename Ops::W>& w,
                   const BlockActs<typename Ops::A>& s, const float* x, const BlockShape& sh) {
  using kernels::OpFamily;
  const std::int64_t N = sh.N();
  const int C = sh.C, F = sh.F;
  ops.mark(OpFamily::LayerNorm);
  norm_forward(ops, s.ln1, s.ln1_mean, s.ln1_rstd, x, w.ln1_w, w.ln1_b, sh);
  ops.mark(OpFamily::Gemm);
  ops.linear(s.qkv, s.ln1, w.qkv_w, w.qkv_b, N, C, sh.qkv_rows());
  ops.mark(OpFamily::Attention);
  if (sh.llama) ops.rope_forward(s.qkv, sh.B, sh.T, sh.NH, sh.KV, sh.hs, sh.inv_freq.data());
  ops.attention_forward(s.atty, s.lse, s.qkv, sh.B, sh.T, sh.NH, sh.KV, sh.hs);
  ops.mark(OpFamily::Gemm);
  ops.linear_residual(s.res2, x, s.atty, w.attproj_w, w.attproj_b, N, C, C);
  ops.mark(OpFamily::LayerNorm);
  norm_forward(ops, s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, w.ln2_w, w.ln2_b, sh);
  ops.mark(OpFamily::Gemm);
  if (sh.llama) {
    ops.linear(s.fch, s.ln2, w.fc_w, nullptr, N, C, 2 * F);
    ops.mark(OpFamily::Elementwise);
    ops.swiglu_forward(s.fch_gelu, s.fch, N, F);
    ops.mark(OpFamily::Gemm);
  } else {
    ops.linear_gelu(s.fch_gelu, s.fch, s.ln2, w.fc_w, w.fc_b, N, C, F);
  }
  ops.linear_residual(s.res3, s.res2, s.fch_gelu, w.fcproj_w, w.fcproj_b, N, F, C);
  ops.finish();
}

// x is the block's input (the previous block's res3, or the embeddings).
template <class Ops>
void block_backward(Ops& ops, const BlockWeights<typename Ops::W>& w, const BlockGrads& g,
                    const BlockActs<typename Ops::A>& s, const BlockScratch<typename Ops::A>& d,
                    const float* x, const BlockShape& sh) {
  using kernels::OpFamily;
  const std::int64_t N = sh.N();
  const int C = sh.C, F = sh.F;
  // d_res is the gradient w.r.t. res3 = res2 + fcproj(act(fc(norm2(res2))))
  ops.mark(OpFamily::Gemm);
  if (sh.llama) {
    ops.linear_backward(d.d_act, g.fcproj_w, nullptr, d.d_res_a, s.fch_gelu, w.fcproj_w, N, F, C);
    ops.mark(OpFamily::Elementwise);
    ops.swiglu_backward(d.d_fch, d.d_act, s.fch, N, F);
    ops.mark(OpFamily::Gemm);
  } else {
    ops.linear_backward_input_dgelu(d.d_fch, d.d_res_a, w.fcproj_w, s.fch, N, F, C);
    ops.linear_backward(nullptr, g.fcproj_w, g.fcproj_b, d.d_res_a, s.fch_gelu, w.fcproj_w, N, F,
                        C);
  }
  ops.progress();
  ops.linear_backward(d.d_ln, g.fc_w, g.fc_b, d.d_fch, s.ln2, w.fc_w, N, C, sh.fc_rows());
  ops.progress();
  ops.mark(OpFamily::LayerNorm);
  norm_backward(ops, d.d_res, d.d_res_a, g.ln2_w, g.ln2_b, d.d_ln, s.res2, w.ln2_w, s.ln2_mean,
                s.ln2_rstd, sh);
  // d_res is now the gradient w.r.t. res2 = x + attproj(attention(qkv(norm1(x))))
  ops.mark(OpFamily::Gemm);
  ops.linear_backward(d.d_atty, g.attproj_w, g.attproj_b, d.d_res_a, s.atty, w.attproj_w, N, C, C);
  ops.progress();
  ops.mark(OpFamily::Attention);
  ops.attention_backward(d.d_qkv, d.d_atty, s.qkv, s.atty, s.lse, sh.B, sh.T, sh.NH, sh.KV, sh.hs);
  if (sh.llama) ops.rope_backward(d.d_qkv, sh.B, sh.T, sh.NH, sh.KV, sh.hs, sh.inv_freq.data());
  ops.progress();
  ops.mark(OpFamily::Gemm);
  ops.linear_backward(d.d_ln, g.qkv_w, g.qkv_b, d.d_qkv, s.ln1, w.qkv_w, N, C, sh.qkv_rows());
  ops.mark(OpFamily::LayerNorm);
  norm_backward(ops, d.d_res, d.d_res_a, g.ln1_w, g.ln1_b, d.d_ln, x, w.ln1_w, s.ln1_mean,
                s.ln1_rstd, sh);
  ops.finish();
}

}  // namespace tessera::model
