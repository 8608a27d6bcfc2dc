// Text generation: with the KV-cache decoder, or recomputing the context per token for models
// without one; greedy (temperature 0), temperature and top-k.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/core/rng.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::eval {

struct SampleOptions {
  int max_new_tokens = 64;
  float temperature = 1.0f;      // 0 = greedy
  int top_k = 40;                // 0 = whole vocabulary
  std::int32_t stop_token = -1;  // stop after generating it (e.g. <|endoftext|>); -1 = never
  kernels::GemmLibrary gemm = kernels::GemmLibrary::OneDnn;
  model::DecoderKernels kernels;  // generate(): packed weights (see Decoder); empty = fp32 params
  model::KvCache kv_cache = model::KvCache::F32;  // generate(): the cache's element type
};

// Picks the next token from logits (V real entries). Deterministic for a given rng state.
std::int32_t pick_token(const float* logits, int V, float temperature, int top_k, Rng& rng);

// Generates after `prompt` (non-empty). The context is capped at the model's block_size.
// on_token (optional) is called with each new token as it is produced.
std::vector<std::int32_t> generate(const model::ParamLayout& layout, const float* params,
                                   const std::vector<std::int32_t>& prompt,
                                   const SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token = {});

// The same on the GPU: the device decoder (model/gpt_device.hpp) over `model`, whose parameters
// are uploaded and whose T is at least decode_capacity(block size, prompt.size(), opt).
// opt.gemm, opt.kernels and opt.kv_cache are the CPU decoder's and are not used here.
std::vector<std::int32_t> generate(model::DeviceGpt& model, const std::vector<std::int32_t>& prompt,
                                   const SampleOptions& opt, Rng& rng,
                                   const std::function<void(std::int32_t)>& on_token = {});

// The KV cache's positions generate() needs: the prompt's last block_size tokens and the new
// ones, at most the model's context (a long context's cache would be mostly untouched memory).
int decode_capacity(int block_size, std::size_t prompt_tokens, const SampleOptions& opt);

// Generation where each token recomputes the whole context: next_logits(context, T) returns the
// logits (V real entries) that follow the T tokens of `context`. For models without an
// incremental decoder (simulated activation quantization). Same choices as
// generate(): the context is the last block_size tokens; when it is full the model continues on
// the most recent half window. O(context) forward per token: for sampling, not serving.
using NextLogitsFn = std::function<const float*(const std::int32_t* context, int T)>;
std::vector<std::int32_t> generate_recompute(
    int vocab_size, int block_size, const std::vector<std::int32_t>& prompt,
    const SampleOptions& opt, Rng& rng, const NextLogitsFn& next_logits,
    const std::function<void(std::int32_t)>& on_token = {});

}  // namespace tessera::eval
