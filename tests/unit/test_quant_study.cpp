// The calibration study's evaluation pieces: its windows, the scores of a model against a kept
// reference distribution (checked against a direct computation in double), and its measures.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/quant/study.hpp"
#include "tessera/quant/study_eval.hpp"

using namespace tessera;
using namespace tessera::quant;

TEST(QuantStudyEval, WindowsStartWithBosAndCoverTheTextInOrder) {
  std::vector<std::int32_t> a(40), b(25);
  for (int i = 0; i < 40; ++i) a[i] = i;
  for (int i = 0; i < 25; ++i) b[i] = 100 + i;
  const std::vector<EvalText> names{{"a", "a.bin"}, {"b", "b.txt"}};
  auto w = study_eval::make_windows({a, b}, names, 8, 1, 3, 7);  // 7 text tokens per window
  ASSERT_EQ(w.n(), 3 + 3);  // a: 40 / 7 = 5 fit, 3 wanted; b: 25 / 7 = 3
  EXPECT_EQ(w.window(0)[0], 7);
  EXPECT_EQ(w.window(0)[1], 0);
  EXPECT_EQ(w.window(1)[1], 7);  // the next window goes on where the last stopped
  EXPECT_EQ(w.window(3)[1], 100);
  EXPECT_TRUE(w.info[0].short_);
  EXPECT_FALSE(w.info[1].short_);
  EXPECT_EQ(w.info[3].text, 1);
  EXPECT_TRUE(w.info[3].short_);
  EXPECT_THROW(study_eval::make_windows({a, b}, names, 8, 4, 0, 7), Error);  // b holds 3
  EXPECT_THROW(study_eval::make_windows({a}, names, 3, 1, 0, 7), Error);     // ctx too short
}

// The scores from a kept reference equal the definitions computed directly in double: NLL of the
// next token (A: every position but the last, B: positions ctx/2 .. ctx-2), KL(ref || model) and
// argmax agreement. Both sides sum the same few hundred float terms in another order: relative
// 1e-5.
TEST(QuantStudyEval, ScoresAgainstAKeptReferenceMatchTheDefinitions) {
  const int V = 50, Vp = 64, ctx = 8;
  Rng rng(5);
  std::vector<float> ref(static_cast<std::size_t>(ctx) * Vp, 0.0f), mod(ref.size(), 0.0f);
  std::vector<std::int32_t> tok(ctx);
  for (int t = 0; t < ctx; ++t) {
    tok[t] = static_cast<std::int32_t>(rng.next_u64() % V);
    for (int v = 0; v < V; ++v) {
      ref[t * Vp + v] = 3.0f * rng.normal();
      mod[t * Vp + v] = ref[t * Vp + v] + (t % 3 == 0 ? 2.0f : 0.3f) * rng.normal();
    }
  }
  auto logp = [&](const std::vector<float>& z, int t, int v) {
    double m = -1e30, s = 0;
    for (int i = 0; i < V; ++i) m = std::max<double>(m, z[t * Vp + i]);
    for (int i = 0; i < V; ++i) s += std::exp(z[t * Vp + i] - m);
    return z[t * Vp + v] - m - std::log(s);
  };
  double nll_a = 0, nll_b = 0, kl = 0;
  int agree = 0;
  for (int t = 0; t < ctx - 1; ++t) {
    const double nll = -logp(mod, t, tok[t + 1]);
    nll_a += nll;
    if (t >= ctx / 2) nll_b += nll;
    int ar = 0, am = 0;
    for (int v = 0; v < V; ++v) {
      kl += std::exp(logp(ref, t, v)) * (logp(ref, t, v) - logp(mod, t, v));
      if (ref[t * Vp + v] > ref[t * Vp + ar]) ar = v;
      if (mod[t * Vp + v] > mod[t * Vp + am]) am = v;
    }
    agree += ar == am;
  }
  study_eval::Reference r{V, Vp, ctx, {}, {}, {}};
  auto own = r.set(std::vector<float>(ref), 1, tok.data());
  const auto s = study_eval::score_window(r, 0, mod.data(), tok.data());
  EXPECT_NEAR(s.a.nll, nll_a, 1e-5 * nll_a);
  EXPECT_NEAR(s.b.nll, nll_b, 1e-5 * nll_b);
  EXPECT_EQ(s.a.scored, ctx - 1);
  EXPECT_EQ(s.b.scored, ctx - 1 - ctx / 2);
  EXPECT_NEAR(s.a.kl, kl, 1e-5 * kl);
  EXPECT_EQ(s.a.top1, agree);
  // the reference against itself: KL 0 (to rounding), every argmax agreeing, its own NLL
  const auto self = study_eval::score_window(r, 0, ref.data(), tok.data());
  EXPECT_LT(self.a.kl, 1e-5);
  EXPECT_EQ(self.a.top1, ctx - 1);
  EXPECT_NEAR(own[0].a.nll, self.a.nll, 1e-5 * self.a.nll);
}

TEST(QuantStudyEval, MeasuresOfTheReferenceItselfAreNeutral) {
  StudyResult res;
  res.texts = {{"a", "a.bin"}, {"b", "b.bin"}};
  for (int w = 0; w < 6; ++w) {
    res.windows.push_back({w % 2, w < 4});
    WindowScore s;
    s.a = {1.5 * (1 + w), 10, 0, 10, 10};
    s.b = {0.7 * (1 + w), 4, 0, 0, 0};
    res.fp.push_back(s);
  }
  const auto all = res.measures(res.fp, true), sh = res.measures(res.fp, false);
  EXPECT_EQ(all.windows, 6);
  EXPECT_EQ(sh.windows, 4);
  EXPECT_EQ(res.measures(res.fp, true, 1).windows, 3);
  EXPECT_EQ(all.scored_a, 60);
  EXPECT_NEAR(all.ppl_a, std::exp(1.5 * 21 / 60), 1e-9);
  EXPECT_NEAR(all.ratio_a_ci.lo, 1.0, 1e-12);
  EXPECT_NEAR(all.ratio_a_ci.hi, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(all.kl, 0.0);
  EXPECT_DOUBLE_EQ(all.top1, 1.0);
  EXPECT_LE(all.ppl_a_ci.lo, all.ppl_a);
  EXPECT_GE(all.ppl_a_ci.hi, all.ppl_a);
}

TEST(QuantStudyEval, EvalTextsAreNamedByTheirFileOrFolder) {
  EXPECT_EQ(parse_eval_text("data/brown-smollm2/val.bin").name, "brown-smollm2");
  EXPECT_EQ(parse_eval_text("data/eval/manpages-en.txt").name, "manpages-en");
  const auto t = parse_eval_text("man=data/eval/manpages-en.txt");
  EXPECT_EQ(t.name, "man");
  EXPECT_EQ(t.path, "data/eval/manpages-en.txt");
  EXPECT_THROW(parse_eval_text("=x.bin"), Error);
  EXPECT_THROW(parse_eval_text("x="), Error);
}
