// `tessera eval` for quantized models and the labelled protocols: perplexity by non-overlapping
// windows and by llama.cpp-style second-half chunks, and KL divergence against a reference.
#pragma once

#include <string>

#include "tessera/quant/quantize.hpp"

namespace tessera::app {

struct ProtocolEvalArgs {
  std::string data, protocol, reference;
  int seq = 0, batch = 4, windows = 0;
  bool json = false;
};
void eval_protocols(const quant::AnyModel& m, const ProtocolEvalArgs& args);

}  // namespace tessera::app
