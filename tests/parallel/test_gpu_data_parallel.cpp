// Data parallelism on GPUs, end to end under mpirun: two ranks of hardware.device = "cuda", each
// with half the batch, against one rank with the whole batch on the same GPU model. Skipped
// without a CUDA device; the NCCL cases need as many GPUs as ranks (NCCL refuses two ranks on
// one device), so on a one-GPU machine the two ranks share it and sum through the host, and
// forcing NCCL there must be refused with one clear line.
//
// Bounds. fp32: as on the CPU (test_parallel.cpp), the ranks change only the order of the
// gradient sums (each rank's half, then their sum), so the losses agree to ~1e-7 and the
// 1e-5-relative, 99.9th-percentile and max bounds of expect_same_run apply. bf16: each rank's
// GEMMs see half the rows, and cuBLASLt may pick another algorithm for another shape, so the
// bf16-rounded activations can differ by one rounding (u = 2^-8) wherever an fp32 sum lands
// differently; the losses are held to 8u relative per step, the bf16 forward's bound of the GPU
// model tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "run_util.hpp"
#include "tessera/kernels/cuda/device.hpp"

namespace fs = std::filesystem;
using namespace tessera::test;

namespace {

namespace gpu = tessera::kernels::cuda;

// GPT-2 of head size 32, which tessera's bf16 flash kernels run (cuDNN not needed).
const std::string k_gpu = " hardware.device=cuda model.n_embd=64 model.n_head=2";

std::string skip_reason() {
  if (!have_tokenizer()) return "data/gpt2 missing (run scripts/setup)";
  if (gpu::device_count() == 0) return "no CUDA device: " + gpu::describe_devices();
  return {};
}

#define REQUIRE_GPU_AND_DATA()                                                    \
  do {                                                                            \
    if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// One rank with B = 8 and two ranks with B = 4 each (dp = 2), 20 steps; returns both out dirs.
std::pair<fs::path, fs::path> one_and_two_ranks(const std::string& name, const std::string& set) {
  const auto data = data_dir();
  auto one = scratch(name + "_1"), two = scratch(name + "_2");
  auto a = sh(train_args(data, one, 8, 1, 20) + k_gpu + set);
  EXPECT_EQ(a.code, 0) << a.output;
  auto b = sh(mpirun(2) + train_args(data, two, 4, 1, 20) + k_gpu + set + " parallel.dp=2");
  EXPECT_EQ(b.code, 0) << b.output;
  return {one, two};
}

// Prints what the bounds are held against: the worst relative loss difference over the steps and
// the 99.9th percentile and max |parameter difference| after them.
void report(const fs::path& one, const fs::path& two, const std::string& what) {
  const auto a = losses(one / "metrics.jsonl"), b = losses(two / "metrics.jsonl");
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / a[i]);
  const auto diff = sorted_param_diffs(one, two);
  std::printf(
      "[ %s ] losses %.5f -> %.5f, worst rel diff %.3g; |param diff| p99.9 %.3g, max %.3g\n",
      what.c_str(), a.front(), a.back(), worst, diff[diff.size() * 999 / 1000], diff.back());
}

// fp32: the two-rank run is the one-rank run within the CPU data-parallel bounds.
void expect_two_ranks_equal_one(const std::string& name, const std::string& set,
                                const std::string& what) {
  auto [one, two] = one_and_two_ranks(name, set);
  if (::testing::Test::HasFailure()) return;
  report(one, two, what);
  expect_same_run(one, two, "GPU " + what);
}

}  // namespace

TEST(GpuDataParallel, TwoRanksEqualOneRankFp32) {
  REQUIRE_GPU_AND_DATA();
  expect_two_ranks_equal_one("fp32", "", "dp=2 fp32");
}

TEST(GpuDataParallel, TwoRanksEqualOneRankBf16) {
  REQUIRE_GPU_AND_DATA();
  auto [one, two] = one_and_two_ranks("bf16", " train.precision=bf16");
  if (HasFailure()) return;
  report(one, two, "dp=2 bf16");
  const auto a = losses(one / "metrics.jsonl"), b = losses(two / "metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::fabs(a[i] - b[i]), 8 * 0x1p-8 * a[i]) << "step " << i + 1;
}

// The host-staged sum chosen explicitly (what auto picks when the ranks share a GPU, the
// fallback where NCCL is missing) equals one rank too.
TEST(GpuDataParallel, HostStagedSumEqualsTheDefault) {
  REQUIRE_GPU_AND_DATA();
  expect_two_ranks_equal_one("host", " hardware.gpu_reduce=host", "dp=2 fp32, host-staged");
}

// NCCL with a GPU per rank: the real thing, on a machine with two GPUs or more.
TEST(GpuDataParallel, NcclTwoRanksEqualOneRank) {
  REQUIRE_GPU_AND_DATA();
  if (gpu::device_count() < 2)
    GTEST_SKIP() << "one GPU: NCCL refuses two ranks on one device (needs 2 GPUs)";
  expect_two_ranks_equal_one("nccl", " hardware.gpu_reduce=nccl", "dp=2 fp32, NCCL");
}

// NCCL forced where the ranks share the one GPU: one error line naming why, exit 2.
TEST(GpuDataParallel, NcclOnASharedGpuIsRefusedClearly) {
  REQUIRE_GPU_AND_DATA();
  if (gpu::device_count() != 1) GTEST_SKIP() << "needs exactly one GPU for two ranks to share";
  auto out = scratch("nccl_shared");
  auto r = sh(mpirun(2) + train_args(data_dir(), out, 4, 1, 2) + k_gpu +
              " parallel.dp=2 hardware.gpu_reduce=nccl");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("share a GPU, which NCCL refuses"), std::string::npos) << r.output;
}

// Axes other than dp are refused on GPUs before any work (before looking for a GPU, too).
TEST(GpuDataParallel, OtherAxesAreRefusedBeforeAnyWork) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  auto out = scratch("gpu_tx");
  auto r = sh(mpirun(2) + train_args(data_dir(), out, 4, 1, 2) + k_gpu + " parallel.tx=2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("runs data parallelism with replicated optimizer state so far"),
            std::string::npos)
      << r.output;
}
