// The attention sub-block of GPT-2, y = x + proj(attention(qkv(ln1(x)))), composed directly from
// the tensor-parallel layers (tensor_linear.hpp, tensor_layernorm.hpp) and the attention kernel on
// the rank's heads: the building block of the layer tests. Training runs the one block
// (model/gpt_block.hpp) through the grid's op table (parallel/tensor_ops.hpp) instead; this
// composition lives with the tests so that the library has one forward and backward of each
// sub-block. Layouts, collectives and gradient conventions: parallel/tensor_attention.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/parallel/tensor_attention.hpp"
#include "tessera/parallel/tensor_linear.hpp"

namespace tessera::parallel {

// This rank's parameters (pointers into the caller's buffers).
struct TensorAttentionParams {
  const float* ln_w = nullptr;    // (c_local) ln1 weight slice
  const float* ln_b = nullptr;    // (c_local) ln1 bias slice
  const float* qkv_w = nullptr;   // (qkv.shard_numel) head-grouped c_attn weight shard
  const float* qkv_b = nullptr;   // (qkv.out_local = 3C/ty) head-grouped c_attn bias slice
  const float* proj_w = nullptr;  // (proj.shard_numel) c_proj weight shard
  const float* proj_b = nullptr;  // (proj.out_local = C/tx) c_proj bias slice
};
// Their gradients, same shapes; accumulated (+=).
struct TensorAttentionGrads {
  float* ln_w = nullptr;
  float* ln_b = nullptr;
  float* qkv_w = nullptr;
  float* qkv_b = nullptr;
  float* proj_w = nullptr;
  float* proj_b = nullptr;
};

// What the forward saves for the backward, for a global batch of B sequences of T tokens.
struct TensorAttentionActivations {
  TensorAttentionActivations() = default;
  TensorAttentionActivations(const TensorAttentionLayout& l, int B, int T);
  std::vector<float> ln_out;   // (n, c_local)
  std::vector<float> ln_mean;  // (n)
  std::vector<float> ln_rstd;  // (n)
  std::vector<float> qkv;      // (n, 3*att_local) [q | k | v] of this rank's heads
  std::vector<float> att;      // (n, att_local) attention output of this rank's heads
  std::vector<float> lse;      // (B/tz, heads_local, T)
};

// Scratch, reusable across calls and blocks of the same shape.
struct TensorAttentionWorkspace {
  TensorAttentionWorkspace() = default;
  TensorAttentionWorkspace(const TensorAttentionLayout& l, int B, int T);
  TensorLinearWorkspace qkv, proj;  // qkv.w_block / proj.w_block: gathered blocks (fwd -> bwd)
  std::vector<float> row_stats;     // (2n) LayerNorm partial row sums
  std::vector<float> proj_out;      // (n, c_local) proj output before the residual add
  std::vector<float> d_att;         // (n, att_local)
  std::vector<float> d_qkv;         // (n, 3*att_local)
  std::vector<float> d_ln;          // (n, c_local)
  std::vector<float> d_ln_params;   // (2*c_local) ln weight | bias gradients before the tz sum
};

// y (n, c_local) = x + proj(attention(qkv(ln1(x)))) on this rank's slices; B, T global.
// Fills acts and leaves the gathered weight blocks in ws for the backward.
void tensor_attention_forward(kernels::GemmLibrary lib, const TensorAttentionLayout& l,
                              const TensorAttentionComms& c, float* y, const float* x,
                              const TensorAttentionParams& p, int B, int T,
                              TensorAttentionActivations& acts, TensorAttentionWorkspace& ws,
                              int key = -1);  // weight-cache key (tensor_linear.hpp)

// dx (n, c_local) = dy + d(ln1 path) (overwrite); parameter gradients +=. x, p, acts as given to
// the forward; ws.qkv.w_block and ws.proj.w_block must still hold the gathered blocks (re-gather
// with tensor_linear_gather_weight otherwise).
void tensor_attention_backward(kernels::GemmLibrary lib, const TensorAttentionLayout& l,
                               const TensorAttentionComms& c, float* dx,
                               const TensorAttentionGrads& g, const float* dy, const float* x,
                               const TensorAttentionParams& p, int B, int T,
                               const TensorAttentionActivations& acts,
                               TensorAttentionWorkspace& ws);

}  // namespace tessera::parallel
