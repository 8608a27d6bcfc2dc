// The calibration study's evaluation: windows of the evaluation texts, the unquantized model's
// next-token distributions of a batch of windows, and each model's scores against them.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/eval/perplexity.hpp"
#include "tessera/quant/study.hpp"

namespace tessera::quant::study_eval {

// Windows of ctx tokens: the first is `bos`, the other ctx - 1 the next tokens of the text
// (consecutive windows cover consecutive stretches of it). Per text: the first `short_n` windows
// are short, and the text gives max(short_n, long_n) windows, or as many as it holds (at least
// short_n, else an error).
struct Windows {
  int ctx = 0;
  std::vector<std::int32_t> tokens;  // (n, ctx)
  std::vector<WindowInfo> info;      // (n)
  int n() const { return static_cast<int>(info.size()); }
  const std::int32_t* window(int i) const {
    return tokens.data() + static_cast<std::size_t>(i) * ctx;
  }
};
Windows make_windows(const std::vector<std::vector<std::int32_t>>& texts,
                     const std::vector<EvalText>& names, int ctx, int short_n, int long_n,
                     std::int32_t bos);

// The reference model's distribution at each position of some windows: p (the softmax, in place
// of the logits) and its negative entropy sum p log p, and its argmax.
struct Reference {
  int V = 0, Vp = 0, ctx = 0;
  std::vector<float> p;  // (windows * ctx, Vp)
  std::vector<double> neg_entropy;
  std::vector<int> argmax;
  // Turns logits (B * ctx, Vp) of windows `tokens` (B, ctx) into the reference of those windows;
  // returns the reference model's own scores of them (its NLL; KL 0, every top-1 agreeing).
  std::vector<WindowScore> set(std::vector<float>&& logits, int B, const std::int32_t* tokens);
  const float* at(int b, int t) const {
    return p.data() + (static_cast<std::size_t>(b) * ctx + t) * Vp;
  }
};

// Scores window b of a batch: the model's logits (ctx, Vp) against the reference, and its NLL of
// the window's tokens (both protocols).
WindowScore score_window(const Reference& ref, int b, const float* logits,
                         const std::int32_t* tokens);

}  // namespace tessera::quant::study_eval
