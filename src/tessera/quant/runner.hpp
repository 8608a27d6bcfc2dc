// A block-by-block forward for quantization, for both families: each block is the one block of
// model/gpt_block.hpp run through the CPU op table, as a separate call over a residual stream the
// caller keeps, and the input of every linear passes through hooks (statistics capture; simulated
// activation quantization). Memory is bounded by one block's activations for the tokens of one
// call.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::quant {

// The four linears of a block, in execution order. A llama block's q, k and v projections are
// one linear (Qkv: rows [q | k | v]) and so are its gate and up projections (Fc: rows
// [gate | up]), as the block computes them.
enum class Lin { Qkv = 0, AttnProj = 1, Fc = 2, FcProj = 3 };
inline constexpr int k_num_lin = 4;
// gpt2: "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj";
// llama: "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj".
const char* lin_hf_name(const model::ModelConfig& cfg, Lin k);
// "h.3.attn.c_attn" (gpt2), "model.layers.3.self_attn.qkv_proj" (llama)
std::string linear_name(const model::ModelConfig& cfg, int layer, Lin k);
int lin_rows(const model::ModelConfig& cfg, Lin k);  // out features
int lin_cols(const model::ModelConfig& cfg, Lin k);  // in features
std::size_t lin_weight_offset(const model::ParamLayout& layout, int layer, Lin k);
// Whether t is (a part of) a block linear's weight: q k v, o, gate up, down; c_attn, ...
bool is_linear_weight(const model::ParamTensor& t);
std::size_t lin_bias_offset(const model::ParamLayout& layout, int layer, Lin k);

// Simulated (fake) activation quantization of linear inputs, applied just before the GEMM.
enum class ActMode {
  None,
  PerToken,   // dynamic absmax INT8 per token (row)
  PerTensor,  // dynamic absmax INT8 over the whole input of the call
  Int8Mixed,  // LLM.int8(): columns with some |x| >= threshold stay fp32, the rest per token
};
struct ActQuant {
  ActMode mode = ActMode::None;
  float threshold = 6.0f;  // Int8Mixed outlier threshold
};
const char* act_mode_name(ActMode m);  // "none", "per-token", "per-tensor", "int8-mixed"
ActMode parse_act_mode(const std::string& s);
// Applies the fake quantization in place to x (N, cols).
void fake_quant_activations(const ActQuant& aq, float* x, std::int64_t N, int cols);

struct Hooks {
  // Called with the (unquantized) input of every linear: x (N, cols).
  std::function<void(int layer, Lin k, const float* x, std::int64_t N, int cols)> capture;
  ActQuant act;
  // Called with the residual stream after each block (N, C) (massive activations).
  std::function<void(int layer, const float* x, std::int64_t N, int C)> residual;
  // Stop the block right after capturing this linear's input (Lin as int; -1 = run it all).
  // The residual stream is then left partly updated: use on a scratch copy.
  int stop_after = -1;
  // Computes out (N, rows) = x W^T + bias (bias may be null) for linear k of layer in place of
  // the fp32 weights (a quantized model's packed weights); x is the input after capture and act.
  std::function<void(int layer, Lin k, float* out, const float* x, const float* bias,
                     std::int64_t N)>
      linear;
  // The LM head in place of the fp32 one: logits (N, Vp) = x (N, C) W_head^T.
  std::function<void(float* logits, const float* x, std::int64_t N)> head;
  // A token's embedding row x (C) in place of the fp32 one (a quantized embedding).
  std::function<void(std::int32_t token, float* x)> embed;
};

class Runner {
 public:
  Runner(const model::ParamLayout& layout, kernels::GemmLibrary gemm = kernels::GemmLibrary::OneDnn)
      : layout_(layout), gemm_(gemm) {}
  // x (B*T, C) = token embeddings (+ position embeddings for gpt2) of tokens (B, T); the token
  // rows from hooks->embed where it is set.
  void embed(const float* params, const std::int32_t* tokens, int B, int T, float* x,
             const Hooks* hooks = nullptr);
  // One transformer block in place on the residual stream x (B*T, C).
  void block(const float* params, int layer, float* x, int B, int T, const Hooks& hooks);
  // The final norm and the LM head (tied or not; hooks->head in its place when set): logits
  // (B*T, Vp).
  void head(const float* params, const float* x, std::int64_t N, float* logits,
            const Hooks* hooks = nullptr);
  // Everything: logits (B*T, Vp) of tokens (B, T).
  void logits(const float* params, const std::int32_t* tokens, int B, int T, float* logits,
              const Hooks& hooks);

 private:
  void ensure(std::int64_t N);
  const model::ParamLayout& layout_;
  kernels::GemmLibrary gemm_;
  std::int64_t cap_ = 0;  // rows the buffers hold
  // One block's activations (model::BlockActs carved from acts_ by offsets), the fake-quantized
  // copy of a linear's input, the residual stream of logits().
  Buffer<float> acts_, tmp_, x_;
};

}  // namespace tessera::quant
