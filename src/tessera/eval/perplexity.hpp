// Perplexity by the two protocols of the quantization literature, and KL divergence of a model's
// next-token distributions against a reference model. Models are given as a function that fills
// logits, so the same code scores fp32 models, dequantized models and simulated W8A8 models.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera::eval {

// Fills logits (B*T, Vp) for tokens (B, T).
using LogitsFn = std::function<void(const std::int32_t* tokens, int B, int T, float* logits)>;

enum class PplProtocol {
  Windows,     // non-overlapping windows of ctx tokens, every predicted token scored (GPTQ-style)
  SecondHalf,  // llama.cpp: chunks of ctx, first token <- BOS, only the second half scored
};
const char* protocol_label(PplProtocol p, int ctx);

// One evaluation window's sums (a window of the Windows protocol, a chunk of SecondHalf): the
// unit that intervals resample. Tokens inside a window are correlated (one context), windows
// nearly independent, so resampling whole windows keeps that correlation in the interval.
struct WindowSums {
  double nll = 0;  // sum of the scored tokens' negative log-likelihoods
  std::int64_t scored = 0;
  double kl = 0;          // kl_divergence: sum over the window's positions
  std::int64_t top1 = 0;  // kl_divergence: positions whose argmaxes agree
  std::int64_t positions = 0;
};

struct Interval {
  double lo = 0, hi = 0;  // a 95% interval
};

// The 95% percentile-bootstrap interval of stat over n windows: `resamples` draws of n windows
// with replacement (counts[i] = times window i was drawn), from a fixed seed, so the same
// results always give the same interval. stat may read several models' windows with the same
// counts (a paired interval: both models scored on the same resampled text).
Interval bootstrap95(int n, const std::function<double(const std::vector<int>& counts)>& stat,
                     int resamples = 1000, std::uint64_t seed = 1);
// Perplexity exp(sum nll / sum scored) of windows, and its interval.
double perplexity_of(const std::vector<WindowSums>& w, const std::vector<int>* counts = nullptr);
Interval perplexity_interval(const std::vector<WindowSums>& w);
// The ratio perplexity(b) / perplexity(a) of two models scored on the same windows, and its
// paired interval.
Interval perplexity_ratio_interval(const std::vector<WindowSums>& a,
                                   const std::vector<WindowSums>& b);

struct PplResult {
  PplProtocol protocol = PplProtocol::Windows;
  int ctx = 0;
  double nll = 0;         // mean negative log-likelihood (nats per scored token)
  double perplexity = 0;  // exp(nll)
  double stderr_ppl = 0;  // ppl * sqrt(var(nll) / (count - 1)), as llama-perplexity reports
  std::int64_t scored = 0;
  int windows = 0;
  std::string label;
  std::vector<WindowSums> per_window;  // (windows)
  Interval ppl_ci95;                   // of perplexity, bootstrap over windows
};

// Refuses a protocol and context that would score no token (llama.cpp chunks of 2 tokens).
void check_scores_something(PplProtocol protocol, int ctx);

// tokens: the evaluation stream. max_windows = 0: as many as fit. batch: windows per call.
// bos: the token that replaces each chunk's first token for SecondHalf; -1 = V - 1 (GPT-2's
// <|endoftext|> = 50256, which GPT-2 uses as BOS).
PplResult perplexity(const LogitsFn& fn, const std::vector<std::int32_t>& tokens, int ctx, int V,
                     int Vp, PplProtocol protocol, int max_windows = 0, int batch = 4,
                     std::int32_t bos = -1);

struct KlResult {
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
  double top1_agreement = 0;  // fraction of positions where both argmaxes agree
  std::int64_t positions = 0;
  Interval mean_ci95, top1_ci95;  // bootstrap over windows
  // The model's perplexity on the same windows by the Windows protocol (ctx - 1 predictions per
  // window), computed from the same logits.
  PplResult model_ppl;
};
// KL(reference || model) per position over non-overlapping windows of ctx tokens.
KlResult kl_divergence(const LogitsFn& reference, const LogitsFn& model,
                       const std::vector<std::int32_t>& tokens, int ctx, int V, int Vp,
                       int max_windows = 0, int batch = 4);

}  // namespace tessera::eval
