// Memorization metrics (src/tessera/eval/memorization.hpp): ROUGE-L F1 and position-wise token
// match on known cases, and score_documents against the greedy decoder on a tiny random model.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/eval/memorization.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/study/memorization.hpp"

using namespace tessera;
using Ids = std::vector<std::int32_t>;

namespace {
eval::SampleOptions greedy(int tokens) {
  eval::SampleOptions so;
  so.max_new_tokens = tokens;
  so.temperature = 0.0f;
  so.top_k = 0;
  return so;
}
}  // namespace

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
  const auto so = greedy(suffix);
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

// Words as rouge_score's default tokenizer finds them: lower-cased, split at every run of
// characters other than ASCII letters and digits (so non-ASCII letters split words too).
TEST(Memorization, RougeWords) {
  using Words = std::vector<std::string>;
  EXPECT_EQ(eval::rouge_words("Don't STOP!  now,\n42x"), (Words{"don", "t", "stop", "now", "42x"}));
  EXPECT_EQ(eval::rouge_words(" ...\n"), Words{});
  EXPECT_EQ(eval::rouge_words("caf\xC3\xA9 au lait"), (Words{"caf", "au", "lait"}));
}

// Hand-computed: the cat sat on the mat / the cat is on a mat: LCS the-cat-on-mat = 4 of 6 words
// each, P = R = 2/3, F1 = 2/3. Case and punctuation do not count; word order does.
TEST(Memorization, RougeLWordsHandComputed) {
  EXPECT_NEAR(eval::rouge_l_words("The cat sat on the mat.", "the cat is on a mat"), 2.0 / 3.0,
              1e-12);
  EXPECT_DOUBLE_EQ(eval::rouge_l_words("Hello, World!", "hello world"), 1.0);
  // 3 generated words, 5 true ones, LCS "a c" = 2: P = 2/3, R = 2/5, F1 = 2PR/(P+R) = 1/2.
  EXPECT_NEAR(eval::rouge_l_words("a b c", "a x c y z"), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(eval::rouge_l_words("one two", "three four"), 0.0);
  EXPECT_DOUBLE_EQ(eval::rouge_l_words("!!", "!!"), 0.0);  // no words on either side
  EXPECT_DOUBLE_EQ(eval::rouge_l_words("word", ""), 0.0);
}

// The 95% Wilson interval (z = 1.95996) of the study's exact-match rates, hand-computed:
// 0 of 16: [0, z^2 / (16 + z^2)] = [0, 0.19361]; 8 of 16: 0.5 +- z sqrt(1/64 + z^2/1024) /
// (1 + z^2/16) = 0.5 +- 0.22001; 16 of 16 mirrors 0 of 16.
TEST(Memorization, WilsonInterval) {
  const auto none = study::wilson_interval(0, 16);
  EXPECT_NEAR(none.low, 0.0, 1e-12);
  EXPECT_NEAR(none.high, 0.19361, 1e-5);
  const auto half = study::wilson_interval(8, 16);
  EXPECT_NEAR(half.low, 0.5 - 0.22001, 1e-5);
  EXPECT_NEAR(half.high, 0.5 + 0.22001, 1e-5);
  const auto all = study::wilson_interval(16, 16);
  EXPECT_NEAR(all.low, 1 - 0.19361, 1e-5);
  EXPECT_NEAR(all.high, 1.0, 1e-12);
}

// The same scoring on a Llama model with grouped-query attention (2 query heads per kv head):
// score_documents decodes through the KV-cache decoder of that family (whose agreement with the
// full forward is tests/unit/test_model.cpp's KvCacheDecoderMatchesFullForward), so a document
// ending in the model's own greedy continuation is an exact match.
TEST(Memorization, ScoreDocumentsOnLlama) {
  model::ModelConfig cfg{2, 4, 32, 32, 97};
  cfg.family = model::Family::Llama;
  cfg.n_kv_head = 2;
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 11);
  const int suffix = 5;
  Rng rng(1);
  Ids doc{9, 8, 7, 60, 61, 3, 2, 1};
  const Ids gen = eval::generate(layout, p.data(), doc, greedy(suffix), rng);
  doc.insert(doc.end(), gen.begin(), gen.end());
  const auto r = eval::score_documents(layout, p.data(), {doc}, suffix);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_TRUE(r.rows[0].exact);
  EXPECT_DOUBLE_EQ(r.mean_rouge_l, 1.0);
  EXPECT_DOUBLE_EQ(r.mean_rouge_l_words, 0.0);  // no tokenizer given: no word score
}
