#include "tessera/eval/perplexity.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/rng.hpp"

namespace tessera::eval {

const char* protocol_label(PplProtocol p, int ctx) {
  static thread_local std::string s;
  if (p == PplProtocol::Windows)
    s = fmt::format("non-overlapping windows of {} tokens, every token scored", ctx);
  else
    s = fmt::format("llama.cpp chunks of {} tokens, first token BOS, second half scored", ctx);
  return s.c_str();
}

namespace {
// log-softmax over the first V of Vp logits of one row into lp (V), probabilities into p (V).
void log_softmax(const float* z, int V, std::vector<double>& lp, std::vector<double>& p) {
  double m = z[0];
  for (int i = 1; i < V; ++i) m = std::max<double>(m, z[i]);
  lp.resize(V);
  p.resize(V);
  double s = 0;
  for (int i = 0; i < V; ++i) s += p[i] = std::exp(z[i] - m);
  const double lse = std::log(s), inv = 1.0 / s;
  for (int i = 0; i < V; ++i) {
    lp[i] = z[i] - m - lse;
    p[i] *= inv;
  }
}

// A model whose predictions are not numbers: its score would be meaningless.
Error non_finite(int window, std::int64_t position) {
  return Error(fmt::format("the model's predictions are not finite numbers (window {}, position "
                           "{})",
                           window, position),
               "the weights or the quantization scales hold NaN or infinity");
}
}  // namespace

Interval bootstrap95(int n, const std::function<double(const std::vector<int>& counts)>& stat,
                     int resamples, std::uint64_t seed) {
  if (n < 1 || resamples < 1) return {};
  Rng rng(seed);
  std::vector<double> values(resamples);
  std::vector<int> counts(n);
  for (int r = 0; r < resamples; ++r) {
    std::fill(counts.begin(), counts.end(), 0);
    for (int i = 0; i < n; ++i) ++counts[rng.next_u64() % n];
    values[r] = stat(counts);
  }
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    return values[std::min<std::size_t>(resamples - 1, static_cast<std::size_t>(q * resamples))];
  };
  return {at(0.025), at(0.975)};
}

double perplexity_of(const std::vector<WindowSums>& w, const std::vector<int>* counts) {
  double nll = 0, scored = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double c = counts ? (*counts)[i] : 1;
    nll += c * w[i].nll;
    scored += c * static_cast<double>(w[i].scored);
  }
  return scored > 0 ? std::exp(nll / scored) : 0.0;
}

Interval perplexity_interval(const std::vector<WindowSums>& w) {
  return bootstrap95(static_cast<int>(w.size()),
                     [&](const std::vector<int>& c) { return perplexity_of(w, &c); });
}

namespace {
// The negative log-likelihoods of the scored tokens: their sum, sum of squares and count.
struct NllTotals {
  double sum = 0, sumsq = 0;
  std::int64_t count = 0;
  void add(double nll, WindowSums& window) {
    sum += nll;
    sumsq += nll * nll;
    ++count;
    window.nll += nll;
    ++window.scored;
  }
};

// A result's totals: the mean, the perplexity, its standard error (as llama-perplexity reports
// it) and its bootstrap interval over r.per_window.
void finish_perplexity(PplResult& r, const NllTotals& t) {
  r.scored = t.count;
  r.nll = t.count ? t.sum / t.count : 0;
  r.perplexity = std::exp(r.nll);
  if (t.count > 1) {
    double var = std::max(0.0, t.sumsq / t.count - r.nll * r.nll);
    r.stderr_ppl = r.perplexity * std::sqrt(var / (t.count - 1));
  }
  r.ppl_ci95 = perplexity_interval(r.per_window);
}

// How many windows (or chunks) of ctx tokens the text holds, at most max_windows when that is
// positive; an error when it holds none.
int window_count(std::size_t tokens, int ctx, int max_windows, const char* unit) {
  const auto fit = static_cast<int>(std::min<std::size_t>(tokens / ctx, 1 << 30));
  if (fit < 1)
    throw Error(fmt::format("the evaluation text has {} tokens, fewer than one {} of {}", tokens,
                            unit, ctx));
  return max_windows > 0 ? std::min(max_windows, fit) : fit;
}

// Scores window w: from its logits (ctx positions Vp apart, the first V of each real), the
// negative log-likelihood of each next token of `window` (its ctx tokens) from position `first`.
void score_window(const float* logits, const std::int32_t* window, int first, int ctx, int V,
                  int Vp, int w, NllTotals& totals, WindowSums& ws) {
  for (int t = first; t < ctx - 1; ++t) {
    const float* z = logits + static_cast<std::size_t>(t) * Vp;
    double m = z[0];
    for (int i = 1; i < V; ++i) m = std::max<double>(m, z[i]);
    double s = 0;
    for (int i = 0; i < V; ++i) s += std::exp(z[i] - m);
    const double nll = m + std::log(s) - z[window[t + 1]];
    if (!std::isfinite(nll)) throw non_finite(w, t);
    totals.add(nll, ws);
  }
}
}  // namespace

Interval perplexity_ratio_interval(const std::vector<WindowSums>& a,
                                   const std::vector<WindowSums>& b) {
  TESSERA_CHECK(a.size() == b.size(), "a paired interval needs the same windows");
  return bootstrap95(static_cast<int>(a.size()), [&](const std::vector<int>& c) {
    return perplexity_of(b, &c) / perplexity_of(a, &c);
  });
}

void check_scores_something(PplProtocol protocol, int ctx) {
  const int first = protocol == PplProtocol::SecondHalf ? ctx / 2 : 0;
  if (ctx >= 2 && first >= ctx - 1)
    throw Error(fmt::format("{} scores no token: each chunk's second half holds no prediction",
                            protocol_label(protocol, ctx)),
                "use a context (--seq) of 3 tokens or more");
}

PplResult perplexity(const LogitsFn& fn, const std::vector<std::int32_t>& tokens, int ctx, int V,
                     int Vp, PplProtocol protocol, int max_windows, int batch, std::int32_t bos) {
  if (bos < 0 || bos >= V) bos = V - 1;
  if (ctx < 2) throw Error(fmt::format("context {} is too short for perplexity", ctx));
  // Windows: ctx+1 tokens per window would overlap by one; windows of ctx tokens score ctx-1
  // predictions inside the window plus none across windows (GPTQ's eval: ctx-1 per segment).
  const bool second_half = protocol == PplProtocol::SecondHalf;
  const int nw = window_count(tokens.size(), ctx, max_windows, second_half ? "chunk" : "window");
  check_scores_something(protocol, ctx);
  const int first = second_half ? ctx / 2 : 0;
  PplResult r;
  r.protocol = protocol;
  r.ctx = ctx;
  r.windows = nw;
  r.label = protocol_label(protocol, ctx);
  std::vector<float> logits(static_cast<std::size_t>(batch) * ctx * Vp);
  std::vector<std::int32_t> in(static_cast<std::size_t>(batch) * ctx);
  NllTotals totals;
  Progress progress("perplexity", nw, 2.0);
  for (int w0 = 0; w0 < nw; w0 += batch) {
    progress.update(w0, "windows");
    const int B = std::min(batch, nw - w0);
    const std::int32_t* window0 = tokens.data() + static_cast<std::size_t>(w0) * ctx;
    std::copy(window0, window0 + static_cast<std::size_t>(B) * ctx, in.begin());
    if (second_half)
      for (int b = 0; b < B; ++b) in[static_cast<std::size_t>(b) * ctx] = bos;
    fn(in.data(), B, ctx, logits.data());
    for (int b = 0; b < B; ++b)
      score_window(logits.data() + static_cast<std::size_t>(b) * ctx * Vp,
                   window0 + static_cast<std::size_t>(b) * ctx, first, ctx, V, Vp, w0 + b, totals,
                   r.per_window.emplace_back());
  }
  progress.finish();
  finish_perplexity(r, totals);
  return r;
}

namespace {
// The comparison of one position's logits: KL(reference || model) and whether their argmaxes
// agree. pa, ea, pb, eb: the two rows' log-probabilities and probabilities (over V).
struct PositionKl {
  double kl;
  bool agree;
};
PositionKl compare_position(const std::vector<double>& pa, const std::vector<double>& ea,
                            const std::vector<double>& pb, int V) {
  double kl = 0;
  int aa = 0, ab = 0;
  for (int v = 0; v < V; ++v) {
    kl += ea[v] * (pa[v] - pb[v]);
    if (pa[v] > pa[aa]) aa = v;
    if (pb[v] > pb[ab]) ab = v;
  }
  return {kl, aa == ab};
}

// r's summary of the positions' divergences (kls, sorted here) and argmax agreements: mean,
// percentiles, top-1 agreement, and bootstrap intervals over the windows.
void summarize_kl(KlResult& r, std::vector<double>& kls, const std::vector<WindowSums>& windows,
                  std::int64_t agree) {
  const int nw = static_cast<int>(windows.size());
  auto mean_of = [&](const std::vector<int>& c, bool top1) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < windows.size(); ++i) {
      num += c[i] * (top1 ? static_cast<double>(windows[i].top1) : windows[i].kl);
      den += c[i] * static_cast<double>(windows[i].positions);
    }
    return den > 0 ? num / den : 0.0;
  };
  r.mean_ci95 = bootstrap95(nw, [&](const std::vector<int>& c) { return mean_of(c, false); });
  r.top1_ci95 = bootstrap95(nw, [&](const std::vector<int>& c) { return mean_of(c, true); });
  double s = 0;
  for (double k : kls) s += k;
  r.mean = s / kls.size();
  std::sort(kls.begin(), kls.end());
  auto pct = [&](double p) {
    return kls[std::min(kls.size() - 1, static_cast<std::size_t>(p * (kls.size() - 1) + 0.5))];
  };
  r.median = pct(0.5);
  r.p90 = pct(0.9);
  r.p99 = pct(0.99);
  r.max = kls.back();
  r.top1_agreement = static_cast<double>(agree) / kls.size();
}
}  // namespace

KlResult kl_divergence(const LogitsFn& reference, const LogitsFn& model,
                       const std::vector<std::int32_t>& tokens, int ctx, int V, int Vp,
                       int max_windows, int batch) {
  if (ctx < 2) throw Error(fmt::format("context {} is too short for a KL divergence", ctx));
  const int nw = window_count(tokens.size(), ctx, max_windows, "window");
  std::vector<float> la(static_cast<std::size_t>(batch) * ctx * Vp), lb(la.size());
  std::vector<double> kls;
  std::vector<WindowSums> windows;  // (nw)
  std::int64_t agree = 0;
  NllTotals totals;
  std::vector<double> pa, pb, ea, eb;
  Progress progress("KL divergence", nw, 2.0);
  for (int w0 = 0; w0 < nw; w0 += batch) {
    progress.update(w0, "windows");
    int B = std::min(batch, nw - w0);
    const std::int32_t* in = tokens.data() + static_cast<std::size_t>(w0) * ctx;
    reference(in, B, ctx, la.data());
    model(in, B, ctx, lb.data());
    for (int b = 0; b < B; ++b) windows.emplace_back();
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(B) * ctx; ++i) {
      WindowSums& ws = windows[static_cast<std::size_t>(w0) + i / ctx];
      log_softmax(la.data() + i * Vp, V, pa, ea);
      log_softmax(lb.data() + i * Vp, V, pb, eb);
      const PositionKl c = compare_position(pa, ea, pb, V);
      if (i % ctx != ctx - 1) totals.add(-pb[in[i + 1]], ws);  // the next token's NLL
      if (!std::isfinite(c.kl)) throw non_finite(w0 + static_cast<int>(i / ctx), i % ctx);
      kls.push_back(std::max(0.0, c.kl));
      agree += c.agree;
      ws.kl += kls.back();
      ws.top1 += c.agree;
      ++ws.positions;
    }
  }
  progress.finish();
  KlResult r;
  r.positions = static_cast<std::int64_t>(kls.size());
  r.model_ppl.protocol = PplProtocol::Windows;
  r.model_ppl.ctx = ctx;
  r.model_ppl.windows = nw;
  r.model_ppl.label = protocol_label(PplProtocol::Windows, ctx);
  r.model_ppl.per_window = windows;
  finish_perplexity(r.model_ppl, totals);
  if (!kls.empty()) summarize_kl(r, kls, windows, agree);
  return r;
}

}  // namespace tessera::eval
