#include "tessera/quant/study_eval.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::quant::study_eval {

Windows make_windows(const std::vector<std::vector<std::int32_t>>& texts,
                     const std::vector<EvalText>& names, int ctx, int short_n, int long_n,
                     std::int32_t bos) {
  if (ctx < 4) throw Error(fmt::format("evaluation context {} is too short (at least 4)", ctx));
  Windows w;
  w.ctx = ctx;
  const std::size_t stride = static_cast<std::size_t>(ctx) - 1;  // text tokens per window
  for (std::size_t t = 0; t < texts.size(); ++t) {
    const int fit = static_cast<int>(texts[t].size() / stride);
    if (fit < short_n)
      throw Error(fmt::format("evaluation text '{}' has {} tokens: fewer than --windows {} of {}",
                              names[t].name, texts[t].size(), short_n, ctx),
                  "lower --windows or --ctx, or give a longer text");
    const int n = std::min(fit, std::max(short_n, long_n));
    for (int i = 0; i < n; ++i) {
      w.tokens.push_back(bos);
      const auto* from = texts[t].data() + static_cast<std::size_t>(i) * stride;
      w.tokens.insert(w.tokens.end(), from, from + stride);
      w.info.push_back({static_cast<int>(t), i < short_n});
    }
  }
  return w;
}

namespace {
// log sum exp and argmax of z[0..V)
struct RowStats {
  double lse = 0;
  int argmax = 0;
};
RowStats row_stats(const float* z, int V) {
  RowStats r;
  float m = z[0];
  for (int i = 1; i < V; ++i)
    if (z[i] > m) {
      m = z[i];
      r.argmax = i;
    }
  double s = 0;
  for (int i = 0; i < V; ++i) s += std::exp(z[i] - m);
  r.lse = m + std::log(s);
  return r;
}

// Adds one scored prediction at position t of a ctx-token window to both protocols' sums.
void add(WindowScore& ws, int t, int ctx, double nll, double kl, bool agree) {
  if (!std::isfinite(nll) || !std::isfinite(kl))
    throw Error(fmt::format("the model's predictions are not finite numbers (position {})", t),
                "the weights or the quantization scales hold NaN or infinity");
  ws.a.nll += nll;
  ++ws.a.scored;
  ws.a.kl += std::max(0.0, kl);
  ws.a.top1 += agree;
  ++ws.a.positions;
  if (t >= ctx / 2) {
    ws.b.nll += nll;
    ++ws.b.scored;
  }
}
}  // namespace

std::vector<WindowScore> Reference::set(std::vector<float>&& logits, int B,
                                        const std::int32_t* tokens) {
  p = std::move(logits);
  const std::int64_t N = static_cast<std::int64_t>(B) * ctx;
  neg_entropy.assign(N, 0.0);
  argmax.assign(N, 0);
  std::vector<double> nll(N);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    float* z = p.data() + i * Vp;
    const RowStats st = row_stats(z, V);
    const std::int64_t next = i % ctx == ctx - 1 ? i : i + 1;
    nll[i] = st.lse - z[tokens[next]];
    double h = 0;
    for (int v = 0; v < V; ++v) {
      const double lp = z[v] - st.lse;
      z[v] = static_cast<float>(std::exp(lp));
      h += z[v] * lp;
    }
    neg_entropy[i] = h;
    argmax[i] = st.argmax;
  }
  std::vector<WindowScore> out(B);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < ctx - 1; ++t)
      add(out[b], t, ctx, nll[static_cast<std::size_t>(b) * ctx + t], 0.0, true);
  return out;
}

WindowScore score_window(const Reference& ref, int b, const float* logits,
                         const std::int32_t* tokens) {
  const int ctx = ref.ctx, V = ref.V, Vp = ref.Vp;
  std::vector<double> nll(ctx - 1), kl(ctx - 1);
  std::vector<char> agree(ctx - 1);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < ctx - 1; ++t) {
    const float* z = logits + static_cast<std::size_t>(t) * Vp;
    const float* p = ref.at(b, t);
    const RowStats st = row_stats(z, V);
    double pz = 0;
    for (int v = 0; v < V; ++v) pz += static_cast<double>(p[v]) * z[v];
    // KL(p || q) = sum p log p - sum p log q, log q = z - lse
    const std::size_t i = static_cast<std::size_t>(b) * ctx + t;
    kl[t] = ref.neg_entropy[i] - pz + st.lse;
    nll[t] = st.lse - z[tokens[t + 1]];
    agree[t] = st.argmax == ref.argmax[i];
  }
  WindowScore ws;
  for (int t = 0; t < ctx - 1; ++t) add(ws, t, ctx, nll[t], kl[t], agree[t] != 0);
  return ws;
}

}  // namespace tessera::quant::study_eval
