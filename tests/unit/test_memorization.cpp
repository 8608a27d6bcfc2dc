// Memorization metrics (src/tessera/eval/memorization.hpp): ROUGE-L F1 and position-wise token
// match on known cases, and score_documents against the greedy decoder on a tiny random model.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/eval/memorization.hpp"
#include "tessera/model/gpt.hpp"

using namespace tessera;
using Ids = std::vector<std::int32_t>;

TEST(Memorization, RougeLKnownCases) {
  EXPECT_DOUBLE_EQ(eval::rouge_l_f1({1, 2, 3, 4}, {1, 2, 3, 4}), 1.0);
  EXPECT_DOUBLE_EQ(eval::rouge_l_f1({1, 2, 3}, {4, 5, 6}), 0.0);
  EXPECT_DOUBLE_EQ(eval::rouge_l_f1({}, {}), 1.0);
  EXPECT_DOUBLE_EQ(eval::rouge_l_f1({1}, {}), 0.0);
  // Textbook LCS (CLRS): X = ABCBDAB, Y = BDCABA, LCS length 4 (e.g. BCBA).
  // P = 4/7, R = 4/6, F1 = 2PR/(P+R) = 8/13.
  const int A = 1, B = 2, C = 3, D = 4;
  Ids x{A, B, C, B, D, A, B}, y{B, D, C, A, B, A};
  EXPECT_NEAR(eval::rouge_l_f1(x, y), 8.0 / 13.0, 1e-12);
  EXPECT_NEAR(eval::rouge_l_f1(y, x), 8.0 / 13.0, 1e-12);  // F1 is symmetric
  // Reordering: LCS of (1 2 3 4) and (4 3 2 1) is 1 -> F1 = 1/4.
  EXPECT_NEAR(eval::rouge_l_f1({1, 2, 3, 4}, {4, 3, 2, 1}), 0.25, 1e-12);
}

TEST(Memorization, TokenMatch) {
  EXPECT_DOUBLE_EQ(eval::token_match({1, 2, 3, 4}, {1, 2, 3, 4}), 1.0);
  EXPECT_DOUBLE_EQ(eval::token_match({1, 2, 3, 4}, {1, 9, 3, 9}), 0.5);
  // Position-wise, not order-free: a shifted copy matches nowhere.
  EXPECT_DOUBLE_EQ(eval::token_match({1, 2, 3, 4}, {0, 1, 2, 3}), 0.0);
  // Missing positions count as mismatches.
  EXPECT_DOUBLE_EQ(eval::token_match({1, 2}, {1, 2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(eval::token_match({}, {}), 1.0);
}

TEST(Memorization, ScoreDocumentsMatchesGreedyDecoding) {
  model::ModelConfig cfg{2, 2, 32, 32, 97};
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 7);
  const int suffix = 6;

  eval::SampleOptions so;
  so.max_new_tokens = suffix;
  so.temperature = 0.0f;
  so.top_k = 0;
  Rng rng(1);

  // Document 0: a prompt followed by the model's own greedy continuation -> exact match 1.
  Ids prompt0{5, 17, 42, 3, 88, 11, 60};
  Ids gen0 = eval::generate(layout, p.data(), prompt0, so, rng);
  ASSERT_EQ(gen0.size(), static_cast<std::size_t>(suffix));
  Ids doc0 = prompt0;
  doc0.insert(doc0.end(), gen0.begin(), gen0.end());

  // Document 1: a long prompt (longer than block_size - suffix) is cut to its last tokens.
  Ids long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt.push_back((i * 31 + 7) % cfg.vocab_size);
  Ids capped(long_prompt.end() - (cfg.block_size - suffix), long_prompt.end());
  Ids gen1 = eval::generate(layout, p.data(), capped, so, rng);
  Ids doc1 = long_prompt;
  doc1.insert(doc1.end(), gen1.begin(), gen1.end());

  // Document 2: too short (suffix tokens, no prompt) -> skipped.
  Ids doc2(suffix, 4);

  // Document 3: a true suffix that differs from the greedy output in its last token.
  Ids doc3 = doc0;
  doc3.back() = (doc3.back() + 1) % cfg.vocab_size;

  auto r = eval::score_documents(layout, p.data(), {doc0, doc1, doc2, doc3}, suffix);
  EXPECT_EQ(r.skipped, 1u);
  EXPECT_EQ(r.truncated, 1u);
  EXPECT_EQ(r.max_prompt, cfg.block_size - suffix);
  ASSERT_EQ(r.rows.size(), 3u);

  EXPECT_EQ(r.rows[0].index, 0u);
  EXPECT_EQ(r.rows[0].generated, gen0);
  EXPECT_TRUE(r.rows[0].exact);
  EXPECT_DOUBLE_EQ(r.rows[0].token_match, 1.0);
  EXPECT_DOUBLE_EQ(r.rows[0].rouge_l, 1.0);
  EXPECT_EQ(r.rows[0].prompt_tokens, static_cast<int>(prompt0.size()));

  EXPECT_EQ(r.rows[1].index, 1u);
  EXPECT_EQ(r.rows[1].generated, gen1);
  EXPECT_TRUE(r.rows[1].exact);
  EXPECT_EQ(r.rows[1].prompt_tokens, cfg.block_size - suffix);
  EXPECT_EQ(r.rows[1].prompt_tokens_dropped, 40 - (cfg.block_size - suffix));

  EXPECT_EQ(r.rows[2].index, 3u);
  EXPECT_EQ(r.rows[2].generated, gen0);
  EXPECT_FALSE(r.rows[2].exact);
  EXPECT_NEAR(r.rows[2].token_match, (suffix - 1.0) / suffix, 1e-12);
  EXPECT_NEAR(r.rows[2].rouge_l, (suffix - 1.0) / suffix, 1e-12);

  EXPECT_NEAR(r.exact_rate, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.mean_token_match, (2.0 + (suffix - 1.0) / suffix) / 3.0, 1e-12);
}

TEST(Memorization, ScoreDocumentsRejectsBadSuffix) {
  model::ModelConfig cfg{1, 2, 16, 16, 50};
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 3);
  EXPECT_THROW(eval::score_documents(layout, p.data(), {{1, 2, 3}}, 0), Error);
  EXPECT_THROW(eval::score_documents(layout, p.data(), {{1, 2, 3}}, 16), Error);
}
