// CPU fp32 kernels of the model's forward and backward passes (both families). Every op is a plain
// function over raw pointers and shape integers. Conventions:
//  - N = B*T rows; C channels; shapes are in the comments next to each argument.
//  - Parameter gradients ACCUMULATE (+=), so gradient accumulation over micro-batches is free.
//  - Activation gradients: documented per function ("+=" accumulates into the caller's buffer,
//    "=" overwrites).
//  - Reductions are done in a fixed order for a given thread count, so runs are bit-reproducible.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels::cpu {

inline constexpr float k_layernorm_eps = 1e-5f;

// ---- token + position embedding ----
// out (B,T,C) = wte[inp[b,t]] + wpe[t] (wpe null: no learned positions, llama)
void embedding_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe,
                       int B, int T, int C);
// dwte (V,C) +=, dwpe (maxT,C) += (if non-null) from dout (B,T,C)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                        int T, int C);

// ---- LayerNorm over the last dim ----
// out (N,C); mean, rstd (N) saved for backward
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t N, int C);
// one row of it on the calling thread (decoding inside a thread team)
void layernorm_row(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                   const float* bias, int C);
// dinp (N,C) +=; dweight, dbias (C) +=
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        std::int64_t N, int C);

// ---- linear: out (N,OC) = inp (N,IC) @ weight^T (OC,IC) + bias (OC) ----
// accumulate_out: out += (used to fuse the residual add); bias may be null.
void linear_forward(GemmLibrary lib, float* out, const float* inp, const float* weight,
                    const float* bias, std::int64_t N, int IC, int OC, bool accumulate_out = false);
// dinp (N,IC) = dout (N,OC) @ weight (OC,IC) (overwrite): the input gradient alone
void linear_backward_input(GemmLibrary lib, float* dinp, const float* dout, const float* weight,
                           std::int64_t N, int IC, int OC);
// dinp (N,IC) = dout @ weight (overwrite; skipped if null); dweight (OC,IC) +=; dbias (OC) += (if
// non-null)
void linear_backward(GemmLibrary lib, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, std::int64_t N, int IC, int OC);

// ---- GELU, tanh approximation (GPT-2's "gelu_new") ----
void gelu_forward(float* out, const float* inp, std::int64_t n);
// the same on the calling thread alone (a slice of a row, decoding inside a thread team)
void gelu_slice(float* out, const float* inp, std::int64_t n);
// dinp = dout * gelu'(inp) (overwrite; dinp may alias dout)
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

// ---- RMSNorm over the last dim (llama) ----
// out (N,C) = inp * rstd * weight with rstd (N) = 1 / sqrt(mean(inp^2) + eps), saved for backward
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t N,
                     int C, float eps);
// one row of it on the calling thread; returns its rstd
float rmsnorm_row(float* out, const float* inp, const float* weight, int C, float eps);
// dinp (N,C) +=; dweight (C) +=
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, std::int64_t N, int C);

// ---- rotary position embedding on q and k (Hugging Face's rotate-half layout) ----
// qkv rows as in attention_forward. In place, each head of q (NH) and k (KV) at position t: for
// i < hs/2 with angle a = t * inv_freq[i] (computed in double), (x_i, x_{i+hs/2}) ->
// (x_i cos a - x_{i+hs/2} sin a, x_{i+hs/2} cos a + x_i sin a). inv_freq holds hs/2 inverse
// frequencies (model::rope_inv_freq; unscaled: theta^(-2i/hs)). backward: the gradient through
// it, the rotation by -a, in place. The rows of a batch row are positions pos0, pos0 + 1, ...
// (pos0 > 0: decoding with a cache).
void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                  int pos0 = 0);
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq);
// The rotation's table for positions pos0 .. pos0 + T - 1: cs, sn (T, hs/2) = cos a, sign * sin a
// (a computed in double, then rounded to fp32: what rope_forward and rope_backward use).
void rope_table(float* cs, float* sn, int T, int hs, const double* inv_freq, int pos0,
                float sign = 1.0f);
// Heads h0 .. h1 - 1 of one position's heads (hs values each, back to back) rotated in place by
// that position's table row (cs, sn: hs/2 each).
void rope_rotate_heads(float* heads, int h0, int h1, int hs, const float* cs, const float* sn);

// ---- SwiGLU (llama's MLP activation) ----
// out (N,F) = silu(gate) * up, with inp (N,2F) holding [gate | up] in each row
void swiglu_forward(float* out, const float* inp, std::int64_t N, int F);
// out (n) = silu(gate) * up: one row's slice (no threads)
void swiglu_slice(float* out, const float* gate, const float* up, int n);
// dinp (N,2F) = (overwrite) from dout (N,F)
void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F);

// ---- causal multi-head self-attention, grouped-query ----
// qkv (B,T,(NH+2KV)*hs) holds in each row q (NH heads), k (KV heads) and v (KV heads), hs each;
// query head h reads key-value head h / (NH/KV) (GPT-2: KV = NH). out (B,T,NH*hs).
// Only the log-sum-exp of each score row is kept, lse (B,NH,T); backward recomputes the
// probabilities, so memory is O(B*NH*T) instead of O(B*NH*T*T).
void attention_forward(GemmLibrary lib, float* out, float* lse, const float* qkv, int B, int T,
                       int NH, int KV, int hs);
// The same for Tq query rows at positions p .. p + Tq - 1 after p earlier ones (a prompt fed to a
// KV cache in chunks): q (Tq rows ldq apart, NH heads of hs), k and v (p + Tq rows ldkv apart, KV
// heads each: the cache); row i sees positions 0 .. p + i. out (Tq, NH*hs), lse (NH, Tq). p = 0
// with q, k, v in one qkv row is attention_forward over one batch row.
void attention_rows(GemmLibrary lib, float* out, float* lse, const float* q, std::int64_t ldq,
                    const float* k, const float* v, std::int64_t ldkv, int Tq, int p, int NH,
                    int KV, int hs);
// dqkv (B,T,(NH+2KV)*hs) = (overwrite) from dout (B,T,NH*hs); needs out and lse from the forward.
void attention_backward(GemmLibrary lib, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int NH, int KV, int hs);

// ---- fused softmax + cross-entropy over the real vocabulary V of padded rows Vp ----
// losses (N) = -log softmax(logits[:, :V])[target]. Targets < 0 are ignored (loss 0, no grad).
void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets,
                           std::int64_t N, int V, int Vp);
// Same, and overwrites logits (N,Vp) with dloss * (softmax - onehot) (padded columns zeroed).
// dloss is the gradient of the total loss w.r.t. each row's loss (e.g. 1/(B*T*accum)).
void cross_entropy_forward_backward(float* losses, float* logits, const std::int32_t* targets,
                                    std::int64_t N, int V, int Vp, float dloss);

// ---- elementwise ----
void add(float* out, const float* a, const float* b, std::int64_t n);  // out = a + b
void add_inplace(float* out, const float* a, std::int64_t n);          // out += a
void copy(float* out, const float* a, std::int64_t n);

}  // namespace tessera::kernels::cpu
