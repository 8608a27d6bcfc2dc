// Text generation from a model with simulated activation quantization (W8A8, LLM.int8()): the
// KV-cache decoder of model/ has no hooks, so each token recomputes the whole context with the
// quantization Runner (eval::generate_recompute).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/core/rng.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

std::vector<std::int32_t> generate(const model::ParamLayout& layout, const float* params,
                                   const ActQuant& act, const std::vector<std::int32_t>& prompt,
                                   const eval::SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token = {});

}  // namespace tessera::quant
