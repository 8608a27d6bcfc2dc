// The op table of model/gpt_block.hpp on the tx x ty x tz tensor grid: the one block's forward and
// backward (both families) run on a rank's slices, each op the parallel form of the single-process
// op. The tensor-parallel model (tensor_model.hpp) runs every layer through it.
//
// Layouts (n = B*T/tz rows of the rank's whole sequences, cl = C/tx):
//  - the residual stream, the norms' inputs and outputs: (n, cl), replicated over ty. The norms
//    (LayerNorm; RMSNorm for llama) all-reduce their per-row statistics over tx
//    (tensor_layernorm.hpp).
//  - qkv and fc are NORMAL 3D linears (tensor_linear.hpp: in over tx, out over ty), attproj and
//    fcproj TRANSPOSED ones (in over ty, out over tx), so that a normal linear's output layout
//    (n, out/ty) is the next transposed linear's input and the transposed linear gives back the
//    residual layout. The rows of qkv ([q | k | v]) and of llama's fc ([gate | up]) are given to
//    the linear in ty-grouped order (tensor_attention.hpp, grouped_source_row), so that ty rank j
//    holds its heads' q, k and v (its q heads' kv heads: n_kv_head % ty == 0) and matching gate and
//    up slices. Attention, RoPE (position and dimension only), GELU and SwiGLU then run on the
//    rank's columns unchanged, replicated over tx.
//  - sequence parallelism (1D: ty = tz = 1, the weights are whole blocks): the region between a
//    normal and a transposed linear is split by rows over tx (whole sequences, n/tx rows). A
//    normal linear's partial outputs are reduce-scattered over rows (not all-reduced) and a
//    transposed linear all-gathers its input rows; in the backward the transposed linear's input
//    gradient is reduce-scattered, the normal linear all-gathers its output gradient, and the
//    inputs all-gathered for weight gradients are gathered again (as in Megatron-LM).
//
// Which linear a call is: the op table is made for one layer and knows its weight pointers.
// Overlaps: the weight blocks come from the workspace (prefetched or cached under `key`, the
// layer index); the input gradient's all-reduce runs during the weight-gradient GEMM, also for
// GPT-2's fcproj, whose backward the block asks in two calls (dx with GELU's derivative, then
// dw): the first starts the all-reduce, the second waits for it after the dw GEMM and applies
// GELU's derivative. Deferred weight-gradient reductions are completed by the model
// (tensor_linear_finish). Collectives start in the same order on every rank: the block's order.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/profile.hpp"
#include "tessera/model/gpt_block.hpp"
#include "tessera/parallel/tensor_linear.hpp"

namespace tessera::parallel {

enum class BlockLinear { Qkv, Proj, Fc, FcProj };

// The block's four linears on the grid and the norms' communicators.
struct TensorBlockGrid {
  TensorLinearLayout qkv, proj, fc, fcproj;
  TensorLinearComms qkv_c, proj_c, fc_c, fcproj_c;
  comm::Communicator* tx = nullptr;  // norm row statistics; sequence parallelism
  comm::Communicator* tz = nullptr;  // norm parameter gradients
  int C = 0, c_local = 0;
  const TensorLinearLayout& layout(BlockLinear k) const;
  const TensorLinearComms& comms(BlockLinear k) const;
};

// One layer's linear workspaces (gathered weight blocks, gradient reductions in flight).
struct TensorBlockWorkspace {
  TensorBlockWorkspace() = default;
  explicit TensorBlockWorkspace(const TensorBlockGrid& g)
      : qkv(g.qkv), proj(g.proj), fc(g.fc), fcproj(g.fcproj) {}
  TensorLinearWorkspace qkv, proj, fc, fcproj;
  TensorLinearWorkspace& of(BlockLinear k);
  std::vector<TensorLinearWorkspace*> linears() { return {&qkv, &proj, &fc, &fcproj}; }
};

// Scratch shared by the layers (sized by TensorOpsScratch::resize).
struct TensorOpsScratch {
  std::vector<float> row_stats;    // (2n) norm row statistics
  std::vector<float> norm_params;  // (2 cl) norm parameter gradients before the tz sum
  std::vector<float> proj_out;     // (n, cl) a transposed linear's output before the residual add
  std::vector<float> sp_full, sp_part;  // sequence parallelism: (n, the widest linear)
  // sequence parallelism's reduce-scatters and all-gathers in bf16 (TensorLinearWorkspace::
  // bf16_wire), through these
  bool bf16_wire = false;
  std::vector<std::uint16_t> wire_full, wire_part;
  void resize(const TensorBlockGrid& g, std::int64_t n, bool sequence_parallel);
};

class TensorOps {
 public:
  using A = float;
  using W = float;
  // The bf16 copies of a layer's GEMM inputs kept for its backward (bf16 without sequence
  // parallelism; null: the linear keeps none), in BlockLinear's order.
  using KeptInputs = std::array<std::uint16_t*, 4>;
  // w: the layer's local parameters (identify the linears); key: the layer (weight cache);
  // progress: drives the non-blocking communication in flight (the store's, the workspaces').
  TensorOps(const TensorBlockGrid& g, TensorBlockWorkspace& ws, TensorOpsScratch& s,
            kernels::GemmLibrary lib, std::int64_t n, bool sequence_parallel,
            const model::BlockWeights<float>& w, int key, std::function<void()> progress,
            KeptInputs kept = {})
      : g_(g),
        ws_(ws),
        s_(s),
        lib_(lib),
        n_(n),
        sp_(sequence_parallel),
        w_(w),
        key_(key),
        progress_(std::move(progress)),
        kept_(kept) {}

  void mark(kernels::OpFamily) {}
  void finish() {}
  void progress() {
    if (progress_) progress_();
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, std::int64_t N, int C);
  void layernorm_backward(float* dinp, float* dinp_a, float* dw, float* db, const float* dout,
                          const float* inp, const float* w, const float* mean, const float* rstd,
                          std::int64_t N, int C);
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                       int C, float eps);
  void rmsnorm_backward(float* dinp, float* dinp_a, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, std::int64_t N, int C);
  void linear(float* out, const float* inp, const float* w, const float* b, std::int64_t N, int IC,
              int OC);
  void linear_residual(float* out, const float* residual, const float* inp, const float* w,
                       const float* b, std::int64_t N, int IC, int OC);
  void linear_gelu(float* out, float* pre, const float* inp, const float* w, const float* b,
                   std::int64_t N, int IC, int OC);
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, std::int64_t N, int IC, int OC);
  void linear_backward_input_dgelu(float* dinp, const float* dout, const float* w, const float* pre,
                                   std::int64_t N, int IC, int OC);
  // On the rank's columns (and, with sequence parallelism, its rows): the block passes the local
  // shape.
  void swiglu_forward(float* out, const float* inp, std::int64_t N, int F);
  void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F);
  void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq);
  void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq);
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KV,
                         int hs);
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int NH, int KV, int hs);

 private:
  BlockLinear which(const float* w) const;
  std::int64_t sp_rows() const;  // rows of the region split by sequence parallelism
  void sp_normal_forward(float* out, const float* inp, const float* w, const float* b, int OC);
  void sp_transposed_forward(float* out, const float* inp, const float* w, const float* b, int IC);
  void sp_normal_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, int OC);
  void sp_transposed_backward_input(float* dinp, const float* dout, const float* w, int IC);
  void sp_transposed_backward_weight(BlockLinear id, float* dw, float* db, const float* dout,
                                     const float* inp, int IC);
  // tx's reduce-scatter (part: tx x n values) and all-gather (in: n values), in fp32 or bf16
  void sp_reduce_scatter(const float* part, float* out, std::size_t n);
  void sp_all_gather(const float* in, float* full, std::size_t n);

  const TensorBlockGrid& g_;
  TensorBlockWorkspace& ws_;
  TensorOpsScratch& s_;
  kernels::GemmLibrary lib_;
  std::int64_t n_;
  bool sp_;
  model::BlockWeights<float> w_;
  int key_;
  std::function<void()> progress_;
  KeptInputs kept_;
  // Points linear id's workspace at its kept input for one call (TensorLinearWorkspace::x16).
  struct KeepInput {
    KeepInput(TensorLinearWorkspace& ws, std::uint16_t* x16) : ws_(ws) { ws_.x16 = x16; }
    ~KeepInput() { ws_.x16 = nullptr; }
    KeepInput(const KeepInput&) = delete;
    KeepInput& operator=(const KeepInput&) = delete;
    TensorLinearWorkspace& ws_;
  };
  KeepInput keep(BlockLinear id) { return KeepInput(ws_.of(id), kept_[static_cast<int>(id)]); }
  // GPT-2's fcproj between its two backward calls: dx's all-reduce in flight, GELU's derivative
  // still to apply.
  comm::Request dx_pending_;
  float* dgelu_dinp_ = nullptr;
  const float* dgelu_pre_ = nullptr;
};

}  // namespace tessera::parallel
