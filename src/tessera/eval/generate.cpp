#include "tessera/eval/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessera/core/error.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"

namespace tessera::eval {

std::int32_t pick_token(const float* logits, int V, float temperature, int top_k, Rng& rng) {
  if (temperature <= 0.0f)
    return static_cast<std::int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<std::int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int k = (top_k > 0 && top_k < V) ? top_k : V;
  if (k < V)
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](std::int32_t a, std::int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  float mx = -INFINITY;
  for (int i = 0; i < k; ++i) mx = std::max(mx, logits[idx[i]]);
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / temperature);
  double r = rng.uniform() * sum, acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[i];
    if (r < acc) return idx[i];
  }
  return idx[k - 1];
}

int decode_capacity(int block_size, std::size_t prompt_tokens, const SampleOptions& opt) {
  const auto reach = static_cast<std::int64_t>(std::min<std::size_t>(prompt_tokens, block_size)) +
                     std::max(opt.max_new_tokens, 1);
  return static_cast<int>(std::min<std::int64_t>(block_size, reach));
}

namespace {

// The sampling loop over an incremental decoder (the CPU's Decoder or the GPU's DeviceDecoder,
// which share prefill / step / position / capacity / reset), its cache empty.
template <class Dec>
std::vector<std::int32_t> decode_loop(Dec& dec, int vocab_size, int ctx,
                                      const std::vector<std::int32_t>& prompt,
                                      const SampleOptions& opt, Rng& rng,
                                      const std::function<void(std::int32_t)>& on_token) {
  // Keep the last block_size tokens of the prompt (older context cannot be attended to).
  std::vector<std::int32_t> window(prompt.end() - std::min<std::ptrdiff_t>(prompt.size(), ctx),
                                   prompt.end());
  std::vector<std::int32_t> out;
  const float* logits = dec.prefill(window.data(), static_cast<int>(window.size()));
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    std::int32_t next = pick_token(logits, vocab_size, opt.temperature, opt.top_k, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == opt.stop_token) break;
    if (i + 1 == opt.max_new_tokens) break;
    if (dec.position() == dec.capacity()) {
      // Context full: restart the cache on the most recent half-window (sliding context; at
      // least the newest token, for a context of one).
      std::vector<std::int32_t> all(prompt);
      all.insert(all.end(), out.begin(), out.end());
      std::vector<std::int32_t> recent(all.end() - std::max(ctx / 2, 1), all.end());
      dec.reset();
      logits = dec.prefill(recent.data(), static_cast<int>(recent.size()));
    } else {
      logits = dec.step(next);
    }
  }
  return out;
}

}  // namespace

std::vector<std::int32_t> generate(const model::ParamLayout& layout, const float* params,
                                   const std::vector<std::int32_t>& prompt,
                                   const SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token) {
  const auto& cfg = layout.config();
  if (prompt.empty()) throw Error("the prompt is empty", "give at least one token");
  model::Decoder dec(layout, params, decode_capacity(cfg.block_size, prompt.size(), opt), opt.gemm,
                     opt.kernels, opt.kv_cache);
  return decode_loop(dec, cfg.vocab_size, cfg.block_size, prompt, opt, rng, on_token);
}

std::vector<std::int32_t> generate(model::DeviceGpt& model, const std::vector<std::int32_t>& prompt,
                                   const SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token) {
  const auto& cfg = model.layout().config();
  if (prompt.empty()) throw Error("the prompt is empty", "give at least one token");
  model::DeviceDecoder dec(model, decode_capacity(cfg.block_size, prompt.size(), opt));
  return decode_loop(dec, cfg.vocab_size, cfg.block_size, prompt, opt, rng, on_token);
}

std::vector<std::int32_t> generate_recompute(int vocab_size, int block_size,
                                             const std::vector<std::int32_t>& prompt,
                                             const SampleOptions& opt, Rng& rng,
                                             const NextLogitsFn& next_logits,
                                             const std::function<void(std::int32_t)>& on_token) {
  if (prompt.empty()) throw Error("the prompt is empty", "give at least one token");
  const int ctx = block_size;
  std::vector<std::int32_t> window(prompt.end() - std::min<std::ptrdiff_t>(prompt.size(), ctx),
                                   prompt.end());
  std::vector<std::int32_t> out;
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const int T = static_cast<int>(window.size());
    const float* logits = next_logits(window.data(), T);
    std::int32_t next = pick_token(logits, vocab_size, opt.temperature, opt.top_k, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == opt.stop_token) break;
    if (T == ctx)  // full: keep the newest half-window, the new token included
      window.erase(window.begin(), window.end() - std::max(ctx / 2 - 1, 0));
    window.push_back(next);
  }
  return out;
}

}  // namespace tessera::eval
