// Goldfish loss masking (src/tessera/train/goldfish.hpp): dropped fractions, context
// determinism, the kept prefix, position-keyed randomness, the [goldfish] config section, and
// the masked loss gradient against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "grad_check.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/train/goldfish.hpp"
#include "tessera/train/run_config.hpp"

using namespace tessera;
using train::GoldfishConfig;

namespace {

std::vector<std::int32_t> random_ids(std::size_t n, int lo, int hi, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t)
    x = lo + static_cast<std::int32_t>(r.next_u32() % static_cast<unsigned>(hi - lo));
  return t;
}

GoldfishConfig gf(int k, std::string strategy, int h = 13, std::uint64_t seed = 0) {
  GoldfishConfig c;
  c.k = k;
  c.h = h;
  c.strategy = std::move(strategy);
  c.seed = seed;
  return c;
}

// |p_hat - p| <= 5 * sqrt(p (1 - p) / n): five binomial standard deviations (a false failure
// has probability < 1e-6 for independent draws).
void expect_binomial(std::int64_t dropped, std::int64_t n, int k, const char* what) {
  const double p = 1.0 / k, p_hat = static_cast<double>(dropped) / static_cast<double>(n);
  const double bound = 5.0 * std::sqrt(p * (1 - p) / static_cast<double>(n));
  EXPECT_LE(std::abs(p_hat - p), bound)
      << what << ": k " << k << ", dropped " << dropped << " of " << n << " (" << p_hat << ")";
}

}  // namespace

TEST(Goldfish, DroppedFractionIsOneOverK) {
  // 1,048,576 targets of random ids (1..50256: id 0 would zero the hash product).
  const int B = 512, T = 2048;
  const auto ids = random_ids(static_cast<std::size_t>(B) * T, 1, 50257, 11);
  for (int k : {2, 4, 50}) {
    {  // hash: the first h-1 positions of a row are never candidates; count over the rest
      auto y = ids;
      const int h = 13;
      const std::int64_t kept = train::apply_goldfish(gf(k, "hash", h), y.data(), B, T, 0, 0);
      const std::int64_t candidates = static_cast<std::int64_t>(B) * (T - h + 1);
      expect_binomial(static_cast<std::int64_t>(B) * T - kept, candidates, k, "hash");
    }
    {  // random
      auto y = ids;
      const std::int64_t kept =
          train::apply_goldfish(gf(k, "random", 13, 42), y.data(), B, T, 12345, 7);
      expect_binomial(static_cast<std::int64_t>(B) * T - kept, static_cast<std::int64_t>(B) * T, k,
                      "random");
    }
    {  // static: exactly floor(T/k) per row (T = 2048 is a multiple of 2 and 4, not of 50)
      auto y = ids;
      const std::int64_t kept = train::apply_goldfish(gf(k, "static"), y.data(), B, T, 0, 0);
      EXPECT_EQ(static_cast<std::int64_t>(B) * T - kept, static_cast<std::int64_t>(B) * (T / k));
      for (int t = 0; t < T; ++t) EXPECT_EQ(y[t] < 0, (t + 1) % k == 0) << t;
    }
  }
}

TEST(Goldfish, OffDropsNothing) {
  auto y = random_ids(4 * 64, 0, 1000, 3);
  const auto y0 = y;
  for (const char* s : {"hash", "static", "random"})
    EXPECT_EQ(train::apply_goldfish(gf(0, s), y.data(), 4, 64, 0, 0), 4 * 64);
  EXPECT_EQ(y, y0);
  y[5] = -1;  // already-ignored targets stay ignored and are not counted
  EXPECT_EQ(train::apply_goldfish(gf(0, "hash"), y.data(), 4, 64, 0, 0), 4 * 64 - 1);
}

TEST(Goldfish, IdenticalContextsGiveIdenticalMasks) {
  // A 300-token document appears in several rows at different offsets after different random
  // text: from its h-th token on (where the window lies inside the document) the decisions are
  // the same wherever it occurs; and any h-token window decides the same as goldfish_hash_drops.
  const int h = 13, k = 4, T = 400, L = 300;
  const auto doc = random_ids(L, 1, 50257, 5);
  const int offsets[] = {0, 1, 37, 100};
  const int B = 4;
  auto y = random_ids(static_cast<std::size_t>(B) * T, 1, 50257, 6);
  for (int b = 0; b < B; ++b) std::copy(doc.begin(), doc.end(), y.begin() + b * T + offsets[b]);
  const auto orig = y;
  train::apply_goldfish(gf(k, "hash", h), y.data(), B, T, 0, 0);
  int dropped_in_doc = 0;
  for (int i = h - 1; i < L; ++i) {
    const bool d0 = y[offsets[0] + i] < 0;
    dropped_in_doc += d0;
    for (int b = 1; b < B; ++b) EXPECT_EQ(y[b * T + offsets[b] + i] < 0, d0) << b << " " << i;
    EXPECT_EQ(d0, train::goldfish_hash_drops(doc.data() + i - h + 1, h, k)) << i;
  }
  EXPECT_GT(dropped_in_doc, 30);  // about (L-h+1)/k = 72 decisions were actually exercised
  for (int b = 0; b < B; ++b)
    for (int t = h - 1; t < T; ++t)
      EXPECT_EQ(y[b * T + t] < 0,
                train::goldfish_hash_drops(orig.data() + b * T + t - h + 1, h, k));
}

TEST(Goldfish, FirstHMinusOnePositionsAreKept) {
  // A row of one repeated id whose window drops: every position from h-1 on is dropped, none
  // before it.
  for (int h : {1, 4, 13}) {
    const int k = 4, T = 64, B = 3;
    std::int32_t c = 1;
    std::vector<std::int32_t> w(h);
    for (;; ++c) {
      std::fill(w.begin(), w.end(), c);
      if (train::goldfish_hash_drops(w.data(), h, k)) break;
    }
    std::vector<std::int32_t> y(static_cast<std::size_t>(B) * T, c);
    const auto kept = train::apply_goldfish(gf(k, "hash", h), y.data(), B, T, 0, 0);
    EXPECT_EQ(kept, B * (h - 1));
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) EXPECT_EQ(y[b * T + t] < 0, t >= h - 1) << h << " " << t;
  }
  // And over random text: no row ever loses one of its first h-1 targets.
  const int B = 256, T = 128, h = 13;
  auto y = random_ids(static_cast<std::size_t>(B) * T, 1, 50257, 8);
  train::apply_goldfish(gf(2, "hash", h), y.data(), B, T, 0, 0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < h - 1; ++t) EXPECT_GE(y[b * T + t], 0);
}

TEST(Goldfish, DeterministicAndKeyedByGlobalPosition) {
  const int B = 4, T = 64;
  const auto ids = random_ids(static_cast<std::size_t>(B) * T, 0, 50257, 9);
  for (const char* s : {"hash", "static", "random"}) {
    auto a = ids, b = ids;
    train::apply_goldfish(gf(4, s, 13, 77), a.data(), B, T, 1000, 3);
    train::apply_goldfish(gf(4, s, 13, 77), b.data(), B, T, 1000, 3);
    EXPECT_EQ(a, b) << s;
  }
  // random: the same global positions give the same mask however the rows are split (two dp
  // ranks of B/2 rows, rank r starting at first_pos + r*(B/2)*T); another step, seed or position
  // gives another mask.
  auto whole = ids, r0 = ids, r1 = ids;
  const auto cfg = gf(4, "random", 13, 77);
  train::apply_goldfish(cfg, whole.data(), B, T, 1000, 3);
  train::apply_goldfish(cfg, r0.data(), B / 2, T, 1000, 3);
  train::apply_goldfish(cfg, r1.data() + B / 2 * T, B / 2, T, 1000 + B / 2 * T, 3);
  std::copy(r1.begin() + B / 2 * T, r1.end(), r0.begin() + B / 2 * T);
  EXPECT_EQ(whole, r0);
  auto other_step = ids, other_seed = ids, other_pos = ids;
  train::apply_goldfish(cfg, other_step.data(), B, T, 1000, 4);
  train::apply_goldfish(gf(4, "random", 13, 78), other_seed.data(), B, T, 1000, 3);
  train::apply_goldfish(cfg, other_pos.data(), B, T, 1001, 3);
  EXPECT_NE(whole, other_step);
  EXPECT_NE(whole, other_seed);
  EXPECT_NE(whole, other_pos);
}

TEST(Goldfish, ConfigSection) {
  auto c = train::parse_run_config("[goldfish]\nk = 4\nh = 7\nstrategy = \"random\"\nseed = 5\n",
                                   "t.toml");
  EXPECT_EQ(c.goldfish, gf(4, "random", 7, 5));
  EXPECT_EQ(train::parse_run_config(train::to_toml(c), "t.toml").goldfish, c.goldfish);
  EXPECT_EQ(train::parse_run_config("", "t.toml").goldfish, GoldfishConfig{});
  EXPECT_EQ(train::parse_run_config("", "t.toml", {"goldfish.k=3"}).goldfish.k, 3);
  auto throws = [](const std::string& text, const std::string& what) {
    try {
      train::parse_run_config(text, "t.toml");
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  throws("[goldfish]\nk = 1\n", "invalid goldfish.k = 1");
  throws("[goldfish]\nk = -2\n", "invalid goldfish.k = -2");
  throws("[goldfish]\nh = 0\n", "invalid goldfish.h = 0");
  throws("[goldfish]\nstrategy = \"hash-table\"\n", "invalid goldfish.strategy");
  throws("[goldfish]\nkk = 4\n", "unknown key 'goldfish.kk'");
}

namespace {

// For both families: the masked loss only changes which targets count.
void check_goldfish_gradient(const model::ModelConfig& cfg) {
  // forward/backward with the dropped targets at -1 and dloss = 1/kept gives the gradient of
  // L = mean over the kept positions of -log softmax(logits)[target], checked against central
  // differences of L computed in double from the fp32 logits (eps = 1e-3, about 5% of a typical
  // weight, so the truncation error O(eps^2 L''') stays below 1e-6). Bound: the fp32 forward
  // perturbs L by a few 1e-8 (rounding of O(1) logits, averaged over the kept positions), i.e.
  // <~1e-5 in (L(x+e) - L(x-e)) / 2e: atol 2e-5 + rtol 1e-3 (observed worst |a - fd| 4.4e-6 with
  // TESSERA_GRAD_VERBOSE=1).
  const model::ParamLayout layout(cfg);
  const int B = 2, T = 16, V = cfg.vocab_size, Vp = cfg.padded_vocab();
  Buffer<float> p(layout.total()), g(layout.total()), gu(layout.total());
  model::init_params(layout, p.data(), 21);
  const auto x = random_ids(B * T, 1, V, 22);
  auto y = random_ids(B * T, 1, V, 23);
  const auto y_all = y;
  const auto kept = train::apply_goldfish(gf(2, "hash", 2), y.data(), B, T, 0, 0);
  ASSERT_GT(kept, 0);
  ASSERT_LT(kept, B * T);

  model::Activations acts;
  model::ForwardOptions o;
  o.training = true;
  o.dloss = 1.0f / static_cast<float>(kept);
  std::fill(g.data(), g.data() + layout.total(), 0.0f);
  model::forward(layout, p.data(), acts, x.data(), y.data(), B, T, o);
  model::backward(layout, p.data(), g.data(), acts, x.data(), B, T, o.gemm);
  o.dloss = 1.0f / static_cast<float>(B * T);  // the standard loss, for contrast
  std::fill(gu.data(), gu.data() + layout.total(), 0.0f);
  model::forward(layout, p.data(), acts, x.data(), y_all.data(), B, T, o);
  model::backward(layout, p.data(), gu.data(), acts, x.data(), B, T, o.gemm);

  model::ForwardOptions eval;
  auto kept_loss = [&]() {
    model::forward(layout, p.data(), acts, x.data(), y.data(), B, T, eval);
    const float* logits = acts.at(acts.logits);
    double sum = 0;
    int n = 0;
    for (int i = 0; i < B * T; ++i) {
      if (y[i] < 0) continue;
      const float* row = logits + static_cast<std::size_t>(i) * Vp;
      double mx = row[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double se = 0;
      for (int v = 0; v < V; ++v) se += std::exp(static_cast<double>(row[v]) - mx);
      sum += mx + std::log(se) - row[y[i]];
      ++n;
    }
    return sum / n;
  };
  Rng rng(24);
  auto st = test::check_gradient("goldfish params", p.data(), layout.total(), g.data(), kept_loss,
                                 1e-3, {2e-5, 1e-3}, rng, 48);
  EXPECT_EQ(st.failed, 0u);
  double maxdiff = 0, maxabs = 0;
  for (std::size_t i = 0; i < layout.total(); ++i) {
    maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(g[i] - gu[i])));
    maxabs = std::max(maxabs, static_cast<double>(std::fabs(g[i])));
  }
  EXPECT_GT(maxabs, 1e-3);
  EXPECT_GT(maxdiff, 0.1 * maxabs);  // masking changes the gradient materially
}

}  // namespace

TEST(Goldfish, GradientIsTheGradientOfTheLossOverKeptTokens) {
  check_goldfish_gradient(model::ModelConfig{2, 2, 16, 16, 64});
}

TEST(Goldfish, LlamaGradientIsTheGradientOfTheLossOverKeptTokens) {
  // A llama of the same size: RMSNorm, rotary positions, SwiGLU, 1 key-value head for 2 query
  // heads, an untied head; the same bound (same sizes, O(1) logits).
  model::ModelConfig cfg{2, 2, 16, 16, 64};
  cfg.family = model::Family::Llama;
  cfg.n_kv_head = 1;
  cfg.intermediate_size = 24;
  cfg.tie_embeddings = false;
  check_goldfish_gradient(cfg);
}
