// One GPT-2 block's forward and backward, written once over an op table. The CPU model
// (model/gpt.cpp: kernels::cpu, fp32) and the GPU model (model/gpt_device.cpp: kernels::cuda, fp32
// or bf16 mixed precision) both run these functions, each with its own `Ops`.
//
// A block (pre-LayerNorm):
//   res2 = x    + attproj(attention(qkv(ln1(x))))
//   res3 = res2 + fcproj(gelu(fc(ln2(res2))))
//
// Types. `Ops::A` is the element type of the tensors GEMMs and attention read (float, or bf16 bit
// patterns on the GPU); `Ops::W` that of the GEMM weights and the biases added in A (float, or the
// optimizer's bf16 copy of the parameters). The residual stream and its gradient, LayerNorm
// statistics, the residual projections' biases, LayerNorm parameters and every gradient are
// fp32.
//
// The op table (an Ops value; N = B*T rows, shapes in the comments of the calls below):
//   mark(OpFamily f)              the ops that follow count as f in a profile; finish() closes it
//   progress()                    between ops: drives non-blocking communication (CPU data
//                                 parallelism), or nothing
//   layernorm_forward(out A, mean, rstd, inp f32, w, b, N, C)
//   layernorm_backward(dinp f32 +=, dinp_a A (= bf16(dinp), or dinp itself in fp32), dw +=,
//                      db +=, dout A, inp, w, mean, rstd, N, C)
//   linear(out A, inp A, w W, b W, N, IC, OC)                          out = inp w^T + b
//   linear_residual(out f32, residual f32, inp A, w W, b f32, ...)    out = residual + inp w^T + b
//   linear_gelu(out A, pre A, inp A, w W, b W, ...)                   pre = inp w^T + b; out =
//   gelu(pre) linear_backward(dinp A or null, dw +=, db += or null, dout A, inp A, w W, N, IC, OC)
//   linear_backward_input_dgelu(dinp A, dout A, w W, pre A, N, IC, OC)  dinp = (dout w) gelu'(pre)
//   attention_forward(out A, lse f32, qkv A, B, T, C, NH)
//   attention_backward(dqkv A, dout A, qkv A, out A, lse, B, T, C, NH)
#pragma once

#include <cstdint>

#include "tessera/kernels/profile.hpp"

namespace tessera::model {

struct BlockShape {
  int B = 0, T = 0, C = 0, NH = 0;
  std::int64_t N() const { return static_cast<std::int64_t>(B) * T; }
};

// A block's parameters as the ops read them.
template <class W>
struct BlockWeights {
  const float *ln1_w, *ln1_b;  // (C)
  const W *qkv_w, *qkv_b;      // (3C, C), (3C)
  const W* attproj_w;          // (C, C)
  const float* attproj_b;      // (C)
  const float *ln2_w, *ln2_b;  // (C)
  const W *fc_w, *fc_b;        // (4C, C), (4C)
  const W* fcproj_w;           // (C, 4C)
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
  float *ln1_mean, *ln1_rstd;  // (N)
  A* qkv;                      // (N, 3C)
  A* atty;                     // (N, C) attention output before the projection
  float* lse;                  // (B, NH, T)
  float* res2;                 // (N, C) residual after attention
  A* ln2;                      // (N, C)
  float *ln2_mean, *ln2_rstd;  // (N)
  A *fch, *fch_gelu;           // (N, 4C)
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
  A* d_qkv;      // (N, 3C)
  A* d_fch;      // (N, 4C)
};

template <class Ops>
void block_forward(Ops& ops, const BlockWeights<typename Ops::W>& w,
                   const BlockActs<typename Ops::A>& s, const float* x, const BlockShape& sh) {
  using kernels::OpFamily;
  const std::int64_t N = sh.N();
  const int C = sh.C;
  ops.mark(OpFamily::LayerNorm);
  ops.layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, x, w.ln1_w, w.ln1_b, N, C);
  ops.mark(OpFamily::Gemm);
  ops.linear(s.qkv, s.ln1, w.qkv_w, w.qkv_b, N, C, 3 * C);
  ops.mark(OpFamily::Attention);
  ops.attention_forward(s.atty, s.lse, s.qkv, sh.B, sh.T, C, sh.NH);
  ops.mark(OpFamily::Gemm);
  ops.linear_residual(s.res2, x, s.atty, w.attproj_w, w.attproj_b, N, C, C);
  ops.mark(OpFamily::LayerNorm);
  ops.layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, w.ln2_w, w.ln2_b, N, C);
  ops.mark(OpFamily::Gemm);
  ops.linear_gelu(s.fch_gelu, s.fch, s.ln2, w.fc_w, w.fc_b, N, C, 4 * C);
  ops.linear_residual(s.res3, s.res2, s.fch_gelu, w.fcproj_w, w.fcproj_b, N, 4 * C, C);
  ops.finish();
}

// x is the block's input (the previous block's res3, or the embeddings).
template <class Ops>
void block_backward(Ops& ops, const BlockWeights<typename Ops::W>& w, const BlockGrads& g,
                    const BlockActs<typename Ops::A>& s, const BlockScratch<typename Ops::A>& d,
                    const float* x, const BlockShape& sh) {
  using kernels::OpFamily;
  const std::int64_t N = sh.N();
  const int C = sh.C;
  // d_res is the gradient w.r.t. res3 = res2 + fcproj(gelu(fc(ln2(res2))))
  ops.mark(OpFamily::Gemm);
  ops.linear_backward_input_dgelu(d.d_fch, d.d_res_a, w.fcproj_w, s.fch, N, 4 * C, C);
  ops.linear_backward(nullptr, g.fcproj_w, g.fcproj_b, d.d_res_a, s.fch_gelu, w.fcproj_w, N, 4 * C,
                      C);
  ops.progress();
  ops.linear_backward(d.d_ln, g.fc_w, g.fc_b, d.d_fch, s.ln2, w.fc_w, N, C, 4 * C);
  ops.progress();
  ops.mark(OpFamily::LayerNorm);
  ops.layernorm_backward(d.d_res, d.d_res_a, g.ln2_w, g.ln2_b, d.d_ln, s.res2, w.ln2_w, s.ln2_mean,
                         s.ln2_rstd, N, C);
  // d_res is now the gradient w.r.t. res2 = x + attproj(attention(qkv(ln1(x))))
  ops.mark(OpFamily::Gemm);
  ops.linear_backward(d.d_atty, g.attproj_w, g.attproj_b, d.d_res_a, s.atty, w.attproj_w, N, C, C);
  ops.progress();
  ops.mark(OpFamily::Attention);
  ops.attention_backward(d.d_qkv, d.d_atty, s.qkv, s.atty, s.lse, sh.B, sh.T, C, sh.NH);
  ops.progress();
  ops.mark(OpFamily::Gemm);
  ops.linear_backward(d.d_ln, g.qkv_w, g.qkv_b, d.d_qkv, s.ln1, w.qkv_w, N, C, 3 * C);
  ops.mark(OpFamily::LayerNorm);
  ops.layernorm_backward(d.d_res, d.d_res_a, g.ln1_w, g.ln1_b, d.d_ln, x, w.ln1_w, s.ln1_mean,
                         s.ln1_rstd, N, C);
  ops.finish();
}

}  // namespace tessera::model
