#include "tessera/quant/generate.hpp"

#include <algorithm>

#include "tessera/core/error.hpp"

namespace tessera::quant {

std::vector<std::int32_t> generate(const model::ParamLayout& layout, const float* params,
                                   const ActQuant& act, const std::vector<std::int32_t>& prompt,
                                   const eval::SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token) {
  const auto& cfg = layout.config();
  if (prompt.empty()) throw Error("the prompt is empty", "give at least one token");
  const int ctx = cfg.block_size, Vp = cfg.padded_vocab();
  std::vector<std::int32_t> window(prompt.end() - std::min<std::ptrdiff_t>(prompt.size(), ctx),
                                   prompt.end());
  Runner run(layout, opt.gemm);
  Hooks hooks;
  hooks.act = act;
  std::vector<float> logits(static_cast<std::size_t>(ctx) * Vp);
  std::vector<std::int32_t> out;
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const int T = static_cast<int>(window.size());
    run.logits(params, window.data(), 1, T, logits.data(), hooks);
    std::int32_t next = eval::pick_token(logits.data() + static_cast<std::size_t>(T - 1) * Vp,
                                         cfg.vocab_size, opt.temperature, opt.top_k, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == opt.stop_token) break;
    if (T == ctx) window.erase(window.begin(), window.end() - (ctx / 2 - 1));
    window.push_back(next);
  }
  return out;
}

}  // namespace tessera::quant
