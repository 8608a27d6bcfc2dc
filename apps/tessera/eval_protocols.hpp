// `tessera eval` for quantized models and the labelled protocols: perplexity by non-overlapping
// windows and by llama.cpp-style second-half chunks, and KL divergence against a reference.
#pragma once

#include <algorithm>
#include <string>

#include "tessera/eval/perplexity.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::app {

struct ProtocolEvalArgs {
  std::string data, protocol, reference;
  int seq = 0, batch = 4, windows = 0;
  bool json = false;
  std::string kernels = "packed";  // quantized files: "packed" or "fp32" (dequantized weights)
};
void eval_protocols(const quant::AnyModel& m, const ProtocolEvalArgs& args);

// The logits of whole windows of m: a quantized file through its packed weights when kernels is
// "packed" and the file packs (pm keeps them; a note on stderr when it does not), else the
// dequantized weights (and the file's simulated activation rounding). layout (m's) and pm must
// outlive the function.
eval::LogitsFn model_logits(const quant::AnyModel& m, const model::ParamLayout& layout,
                            const std::string& kernels, quant::PackedModel& pm);

// The evaluation window of `--seq 0`: the model's context, at most 1024 tokens (a pretrained
// model's context of 8192 would need tens of GB of activations on the CPU for one batch).
inline int default_eval_window(const model::ModelConfig& cfg) {
  return std::min(cfg.block_size, 1024);
}

}  // namespace tessera::app
