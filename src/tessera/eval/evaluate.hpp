// Loss and perplexity of a model on a token shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"

namespace tessera::eval {

struct EvalResult {
  double loss = 0.0;        // mean cross-entropy (nats per token)
  double perplexity = 0.0;  // exp(loss)
  std::int64_t tokens = 0;  // tokens scored
  int batches = 0;
};

// Scores `batches` consecutive non-overlapping (B, T) windows from the start of the shard
// (0 = as many as fit). Every token of every window is scored.
EvalResult evaluate_shard(const model::ParamLayout& layout, const float* params,
                          model::Activations& acts, const std::filesystem::path& shard, int B,
                          int T, int batches, kernels::GemmLibrary gemm,
                          bool show_progress = false);

// The same protocol with any model: score(x, y, B, T) returns the mean loss of one window
// (e.g. the GPU model's evaluation forward).
using ScoreFn =
    std::function<float(const std::int32_t* inputs, const std::int32_t* targets, int B, int T)>;
EvalResult evaluate_shard(int vocab_size, const std::filesystem::path& shard, int B, int T,
                          int batches, const ScoreFn& score, bool show_progress = false);

}  // namespace tessera::eval
