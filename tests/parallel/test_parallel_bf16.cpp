// bf16 mixed precision on the CPU under data parallelism and ZeRO 0-3 (mpirun, end to end),
// against the single-process bf16 run of the same global batch.
//
// Bounds. As in fp32 (test_parallel.cpp), data parallelism only reorders fp32 sums, which moves
// values by ~1e-7 relative. The bf16 roundings of the GEMM operands are then the same on both
// sides except for the values within ~1e-7 relative of a rounding boundary: a fraction
// p ~ 1e-7 / 2^-8 ~ 3e-5 of them, each moved by one bf16 ulp (2u = 2^-7 relative). Normwise, a
// GEMM operand moves by ~2u sqrt(p) ~ 4e-5 relative, its output by as much at most, and the loss
// by less (a mean over positions). The losses are held to 1e-3 relative (25x that), the final
// parameters to the fp32 test's argument scaled the same way: 99.9% of them within 1e-4 (10x the
// fp32 bound), and every one within 20 steps x lr = 2e-2 (AdamW's update is at most ~lr per
// element, whatever the gradient). Both bounds are far under the bf16-vs-fp32 differences
// (tests/unit/test_bf16_cpu.cpp: 8u = 3.1e-2) and a wrong gradient's O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "run_util.hpp"
#include "tessera/io/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace tessera::test;

TEST(DataParallelBf16, LossesAndWeightsEqualSingleProcess) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const std::string bf16 = " 'train.precision=\"bf16\"'";
  const auto data = data_dir();
  auto ref = scratch("bf16_ref");
  auto r = sh(train_args(data, ref, 8, 1, 20) + bf16);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto want = losses(ref / "metrics.jsonl");
  ASSERT_EQ(want.size(), 20u);
  const auto ma = tessera::io::load_model(*tessera::io::latest_checkpoint(ref / "checkpoints"));
  const tessera::model::ParamLayout layout(ma.config);
  for (int zero : {0, 1, 2, 3}) {
    const std::string what = "bf16 dp=2 zero=" + std::to_string(zero);
    auto out = scratch("bf16_dp2_z" + std::to_string(zero));
    auto run = sh(mpirun(2) + train_args(data, out, 4, 1, 20) + bf16 +
                  " parallel.dp=2 parallel.zero=" + std::to_string(zero));
    ASSERT_EQ(run.code, 0) << what << "\n" << run.output;
    const auto got = losses(out / "metrics.jsonl");
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(got[i] - want[i]) / want[i]);
      EXPECT_LE(std::fabs(got[i] - want[i]), 1e-3 * want[i]) << what << " step " << i + 1;
    }
    const auto mb = tessera::io::load_model(*tessera::io::latest_checkpoint(out / "checkpoints"));
    std::vector<double> diff(layout.total());
    for (std::size_t i = 0; i < layout.total(); ++i)
      diff[i] = std::fabs(double(ma.params[i]) - mb.params[i]);
    std::sort(diff.begin(), diff.end());
    EXPECT_LE(diff[diff.size() * 999 / 1000], 1e-4) << what << " (99.9th percentile)";
    EXPECT_LE(diff.back(), 2e-2) << what << " (max |param diff|)";
    std::printf("[ %s ] worst loss rel diff %.3g, |param diff| 99.9th percentile %.3g, max %.3g\n",
                what.c_str(), worst, diff[diff.size() * 999 / 1000], diff.back());
  }
}
