// The layer split of pipeline parallelism (parallel/pipeline.hpp): balanced by default, explicit
// counts checked, and each stage's local chunks following the interleaved numbering.
#include <gtest/gtest.h>

#include <numeric>

#include "tessera/core/error.hpp"
#include "tessera/parallel/pipeline.hpp"

using namespace tessera::parallel;

TEST(PipelineSplit, BalancedSplitCoversEveryLayerWithin1) {
  for (int L = 1; L <= 40; ++L)
    for (int chunks = 1; chunks <= L; ++chunks) {
      auto s = balanced_layer_split(L, chunks);
      ASSERT_EQ(static_cast<int>(s.size()), chunks);
      EXPECT_EQ(std::accumulate(s.begin(), s.end(), 0), L);
      const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
      EXPECT_GE(*lo, 1);
      EXPECT_LE(*hi - *lo, 1) << L << " layers in " << chunks;
    }
  // The remainder goes to the middle chunks first (the ends also run the embedding / LM head).
  EXPECT_EQ(balanced_layer_split(10, 4), (std::vector<int>{2, 3, 3, 2}));
  EXPECT_EQ(balanced_layer_split(11, 4), (std::vector<int>{2, 3, 3, 3}));
  EXPECT_EQ(balanced_layer_split(5, 2), (std::vector<int>{2, 3}));
  EXPECT_THROW(balanced_layer_split(3, 4), tessera::Error);
}

TEST(PipelineSplit, ExplicitCountsAreChecked) {
  EXPECT_EQ(parse_layer_split("", 8, 4), balanced_layer_split(8, 4));
  EXPECT_EQ(parse_layer_split("0, 4,4 ,0", 8, 4), (std::vector<int>{0, 4, 4, 0}));
  for (const char* bad : {"1,2,3", "4,4,4,4", "a,b,c,d", "1,-1,4,4", "2,2,2,", "2.5,2,2,1.5"})
    EXPECT_THROW(parse_layer_split(bad, 8, 4), tessera::Error) << bad;
}

TEST(PipelineSplit, StageChunksFollowTheInterleavedNumbering) {
  // 8 layers, pp = 2, v = 2: model chunks of 2 layers; stage 0 holds chunks 0 and 2.
  const auto split = balanced_layer_split(8, 4);
  auto s0 = stage_chunks(split, 2, 2, 0), s1 = stage_chunks(split, 2, 2, 1);
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_EQ(s0[0], (ModelChunk{0, 2, true, false}));
  EXPECT_EQ(s0[1], (ModelChunk{4, 6, false, false}));
  EXPECT_EQ(s1[0], (ModelChunk{2, 4, false, false}));
  EXPECT_EQ(s1[1], (ModelChunk{6, 8, false, true}));
  // One stage holds everything.
  auto one = stage_chunks({5}, 1, 1, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], (ModelChunk{0, 5, true, true}));
  // Empty chunks: the embedding and the head alone on their stages.
  auto e = stage_chunks({0, 3, 3, 0}, 4, 1, 0);
  EXPECT_EQ(e[0], (ModelChunk{0, 0, true, false}));
  EXPECT_EQ(stage_chunks({0, 3, 3, 0}, 4, 1, 3)[0], (ModelChunk{6, 6, false, true}));
}
