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
};
// The model `tessera eval` evaluates: on the CPU with the packed kernels, a quantized file packed
// as it loads (a GGUF file from its own blocks), or dequantized where the kernels do not take it
// (note says why); else (kernels "fp32", the GPU) dequantized.
struct EvaluatedModel {
  quant::AnyModel any;
  quant::PackedModel packed;  // empty unless the packed kernels evaluate it
  std::string note;
};
EvaluatedModel load_evaluated(const std::filesystem::path& path, const std::string& kernels,
                              bool on_cpu);

void eval_protocols(const EvaluatedModel& m, const ProtocolEvalArgs& args);

// The logits of whole windows of m: through its packed weights where it holds them, else the
// dequantized weights (and the file's simulated activation rounding); prints m's note on stderr
// (called once the input is checked). layout (m's) and m must outlive the function.
eval::LogitsFn model_logits(const EvaluatedModel& m, const model::ParamLayout& layout);

// The evaluation window of `--seq 0`: the model's context, at most 1024 tokens (a pretrained
// model's context of 8192 would need tens of GB of activations on the CPU for one batch).
inline int default_eval_window(const model::ModelConfig& cfg) {
  return std::min(cfg.block_size, 1024);
}

}  // namespace tessera::app
