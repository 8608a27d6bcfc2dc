#include "tessera/quant/generate.hpp"

#include <algorithm>

#include "tessera/core/error.hpp"

namespace tessera::quant {

std::vector<std::int32_t> generate(const model::ParamLayout& layout, const float* params,
                                   const ActQuant& act, const std::vector<std::int32_t>& prompt,
                                   const eval::SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token) {
  const auto& cfg = layout.config();
  const int Vp = cfg.padded_vocab();
  Runner run(layout, opt.gemm);
  Hooks hooks;
  hooks.act = act;
  std::vector<float> logits(static_cast<std::size_t>(cfg.block_size) * Vp);
  return eval::generate_recompute(
      cfg.vocab_size, cfg.block_size, prompt, opt, rng,
      [&](const std::int32_t* context, int T) {
        run.logits(params, context, 1, T, logits.data(), hooks);
        return logits.data() + static_cast<std::size_t>(T - 1) * Vp;
      },
      on_token);
}

}  // namespace tessera::quant
