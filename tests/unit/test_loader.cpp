// Data-parallel token loader: windows, data-parallel equivalence, wrap-around and resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"
#include "tessera/core/error.hpp"
#include "tessera/data/loader.hpp"
#include "tessera/data/shard.hpp"

using namespace tessera::data;
namespace fs = std::filesystem;

namespace {

// A shard whose token i is i (so positions can be read off the data).
fs::path iota_shard(const std::string& name, std::size_t n) {
  auto dir = tessera::test::scratch_path("loader_test");
  std::vector<std::uint32_t> toks(n);
  std::iota(toks.begin(), toks.end(), 0u);
  auto p = dir / name;
  write_shard(p, toks);
  return p;
}

struct Batch {
  std::vector<std::int32_t> x, y;  // (B, T) each
};

Batch next(TokenLoader& l) {
  Batch b{std::vector<std::int32_t>(l.batch() * l.seq_len()),
          std::vector<std::int32_t>(l.batch() * l.seq_len())};
  l.next(b.x.data(), b.y.data());
  return b;
}

}  // namespace

TEST(Loader, WindowsAndShiftedTargets) {
  auto p = iota_shard("w.bin", 100);
  TokenLoader l(p, 2, 4);  // B=2, T=4: 8 tokens per step
  auto b = next(l);
  EXPECT_EQ(b.x, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.y, (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(l.position(), 8u);
  b = next(l);
  EXPECT_EQ(b.x[0], 8);
  EXPECT_EQ(b.y[7], 16);
}

TEST(Loader, DataParallelRanksTileTheSingleProcessBatch) {
  // The union of the ranks' rows at step k equals the rows of one loader with batch dp*B at step
  // k: rank r holds rows r*B .. r*B+B-1. Checked over several epochs, so the wrap agrees too.
  const std::size_t B = 2, T = 5, dp = 3, n = 347;
  auto p = iota_shard("dp.bin", n);
  TokenLoader single(p, dp * B, T);
  std::vector<TokenLoader> ranks;
  for (std::size_t r = 0; r < dp; ++r) ranks.emplace_back(p, B, T, r, dp);
  for (int step = 0; step < 40; ++step) {
    auto s = next(single);
    for (std::size_t r = 0; r < dp; ++r) {
      auto b = next(ranks[r]);
      for (std::size_t i = 0; i < B * T; ++i) {
        ASSERT_EQ(b.x[i], s.x[r * B * T + i]) << "step " << step << " rank " << r;
        ASSERT_EQ(b.y[i], s.y[r * B * T + i]) << "step " << step << " rank " << r;
      }
      ASSERT_EQ(ranks[r].position(), single.position());
    }
  }
}

TEST(Loader, WrapsWhenTheLastRankWouldRunPastTheEnd) {
  // 2 ranks x B=1 x T=4: 8 tokens per step, a step needs 9. With 26 tokens, steps start at
  // 0, 8, 16 (16 + 9 = 25 <= 26), then 24 + 9 > 26, so the fourth step starts at 0 again.
  auto p = iota_shard("wrap.bin", 26);
  TokenLoader r0(p, 1, 4, 0, 2), r1(p, 1, 4, 1, 2);
  std::vector<std::int32_t> firsts;
  for (int step = 0; step < 4; ++step) {
    auto a = next(r0);
    auto b = next(r1);
    EXPECT_EQ(b.x[0], a.x[0] + 4);
    firsts.push_back(a.x[0]);
  }
  EXPECT_EQ(firsts, (std::vector<std::int32_t>{0, 8, 16, 0}));
  // The last window reaches the shard's final token.
  TokenLoader exact(p, 1, 5);  // 5 per step: 0, 5, 10, 15, 20 (20 + 6 = 26), then wrap
  Batch b;
  for (int step = 0; step < 5; ++step) b = next(exact);
  EXPECT_EQ(b.y.back(), 25);
  EXPECT_EQ(exact.position(), 0u);
}

TEST(Loader, ResumeFromPosition) {
  auto p = iota_shard("resume.bin", 200);
  TokenLoader a(p, 3, 7, 1, 2);
  for (int i = 0; i < 5; ++i) next(a);
  const auto pos = a.position();
  TokenLoader b(p, 3, 7, 1, 2);
  b.set_position(pos);
  for (int i = 0; i < 20; ++i) {
    auto x = next(a), y = next(b);
    ASSERT_EQ(x.x, y.x);
    ASSERT_EQ(x.y, y.y);
  }
  b.reset();
  EXPECT_EQ(b.position(), 0u);
  EXPECT_THROW(b.set_position(200 - 42), tessera::Error);  // 2*3*7 + 1 = 43 tokens needed
  b.set_position(200 - 43);
  EXPECT_THROW(b.set_position(1000), tessera::Error);
}

TEST(Loader, TooSmallShardIsAClearError) {
  auto p = iota_shard("small.bin", 64);
  EXPECT_NO_THROW(TokenLoader(p, 1, 63));
  try {
    TokenLoader l(p, 2, 32);  // needs 65
    ADD_FAILURE() << "no error";
  } catch (const tessera::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("holds 64 tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("needs 65"), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_THROW(TokenLoader(p, 1, 8, 2, 2), tessera::Error);  // rank out of range
  EXPECT_THROW(TokenLoader(p, 0, 8), tessera::Error);
}
