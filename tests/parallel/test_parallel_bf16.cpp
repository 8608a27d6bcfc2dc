// bf16 mixed precision on the CPU under data parallelism and ZeRO 0-3, and under tensor, sequence
// and pipeline parallelism (mpirun, end to end), against the single-process bf16 run of the same
// global batch.
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
// (tests/unit/test_bf16_cpu.cpp: 8u = 3.1e-2) and a wrong gradient's O(1). Tensor and pipeline
// parallelism are the same case: a rank's GEMM operands are slices of the single process's
// (the same elements, rounded alike), and what changes is the order of fp32 sums (partial
// products all-reduced over tx or ty, gradients summed over tz, micro-batches over stages).
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

namespace {

const std::string k_bf16 = " 'train.precision=\"bf16\"'";

// The single-process bf16 run of 20 steps of B = 8.
fs::path reference_run(const fs::path& data) {
  auto ref = scratch("bf16_ref");
  auto r = sh(train_args(data, ref, 8, 1, 20) + k_bf16);
  EXPECT_EQ(r.code, 0) << r.output;
  return ref;
}

// `out`'s losses and final weights against the reference run's, within the bounds above.
void expect_bf16_run_matches(const fs::path& ref, const fs::path& out, const std::string& what) {
  const auto want = losses(ref / "metrics.jsonl");
  ASSERT_EQ(want.size(), 20u);
  const auto got = losses(out / "metrics.jsonl");
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]) / want[i]);
    EXPECT_LE(std::fabs(got[i] - want[i]), 1e-3 * want[i]) << what << " step " << i + 1;
  }
  const auto diff = sorted_param_diffs(ref, out);
  EXPECT_LE(diff[diff.size() * 999 / 1000], 1e-4) << what << " (99.9th percentile)";
  EXPECT_LE(diff.back(), 2e-2) << what << " (max |param diff|)";
  std::printf("[ %s ] worst loss rel diff %.3g, |param diff| 99.9th percentile %.3g, max %.3g\n",
              what.c_str(), worst, diff[diff.size() * 999 / 1000], diff.back());
}

// `out` against the reference run within the bounds of one bf16 rounding of the messages (the
// tests below argue them): losses within 1e-2 relative, the parameters' 99th percentile within
// 1e-3 and every one within 20 steps x 2 lr = 4e-2.
void expect_bf16_wire_run_matches(const fs::path& ref, const fs::path& out,
                                  const std::string& what) {
  const auto want = losses(ref / "metrics.jsonl");
  const auto got = losses(out / "metrics.jsonl");
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]) / want[i]);
    EXPECT_LE(std::fabs(got[i] - want[i]), 1e-2 * want[i]) << what << " step " << i + 1;
  }
  const auto diff = sorted_param_diffs(ref, out);
  EXPECT_LE(diff[diff.size() * 99 / 100], 1e-3) << what << " (99th percentile)";
  EXPECT_LE(diff.back(), 4e-2) << what << " (max |param diff|)";
  std::printf("[ %s ] worst loss rel diff %.3g, |param diff| 99th percentile %.3g, max %.3g\n",
              what.c_str(), worst, diff[diff.size() * 99 / 100], diff.back());
}

}  // namespace

TEST(DataParallelBf16, LossesAndWeightsEqualSingleProcess) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const fs::path ref = reference_run(data);
  for (int zero : {0, 1, 2, 3}) {
    const std::string what = "bf16 dp=2 zero=" + std::to_string(zero);
    auto out = scratch("bf16_dp2_z" + std::to_string(zero));
    auto run = sh(mpirun(2) + train_args(data, out, 4, 1, 20) + k_bf16 +
                  " parallel.dp=2 parallel.zero=" + std::to_string(zero));
    ASSERT_EQ(run.code, 0) << what << "\n" << run.output;
    expect_bf16_run_matches(ref, out, what);
  }
}

// Gradients reduced in bf16 (parallel.grad_reduce = "bf16"): each rank's block rounded to bf16
// (relative error <= u = 2^-9), the sum of the two rounded once more: every element of the
// reduced gradient within 3u of its size-weighted parts, about 6e-3 relative where the parts do
// not cancel. AdamW normalizes the update, so a parameter moves by at most ~lr = 1e-3 per step
// whatever its gradient: after 20 steps every parameter is within 20 x 2 lr = 4e-2 of the
// reference, whatever the rounding did (the hard bound); typically the update changes by the
// gradient's relative error, 20 x lr x 6e-3 ~ 1e-4 (99th percentile held to 1e-3, 10x). The
// losses: held to 1e-2 relative (the gradient error is small; a wrong reduction -- a block
// skipped, summed twice -- changes them by O(1)).
TEST(DataParallelBf16, GradientsReducedInBf16StayWithinTheirRounding) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const fs::path ref = reference_run(data);
  for (int zero : {0, 2}) {
    const std::string what = "bf16 reduction, dp=2 zero=" + std::to_string(zero);
    auto out = scratch("bf16_reduce_z" + std::to_string(zero));
    auto run =
        sh(mpirun(2) + train_args(data, out, 4, 1, 20) + k_bf16 +
           " parallel.dp=2 'parallel.grad_reduce=\"bf16\"' parallel.zero=" + std::to_string(zero));
    ASSERT_EQ(run.code, 0) << what << "\n" << run.output;
    expect_bf16_wire_run_matches(ref, out, what);
  }
}

// The tensor grid's axes (tz: the weight blocks gathered, then rounded), sequence parallelism and
// a pipeline, each in bf16, against the single-process bf16 run.
TEST(TensorPipelineBf16, LossesAndWeightsEqualSingleProcess) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const fs::path ref = reference_run(data);
  struct Case {
    int ranks, B, accum;  // B x accum = the reference's 8 sequences
    const char* set;
    const char* name;
  };
  for (const Case& c : {Case{2, 8, 1, "parallel.tx=2", "tx2"},
                        Case{4, 8, 1, "parallel.ty=2 parallel.tz=2", "ty2_tz2"},
                        Case{2, 8, 1, "parallel.tx=2 parallel.sequence_parallel=true", "tx2_sp"},
                        Case{2, 4, 2, "parallel.pp=2 parallel.schedule=1f1b", "pp2_1f1b"}}) {
    const std::string what = std::string("bf16 ") + c.name;
    auto out = scratch(std::string("bf16_") + c.name);
    auto run = sh(mpirun(c.ranks) + train_args(data, out, c.B, c.accum, 20) + k_bf16 + " " + c.set);
    ASSERT_EQ(run.code, 0) << what << "\n" << run.output;
    expect_bf16_run_matches(ref, out, what);
  }
}

// The pipeline's wire in bf16 (parallel.pipeline_dtype = "bf16"): the residual stream is rounded
// to bf16 once where it crosses the stage boundary (relative error <= u = 2^-9 per element) and
// its gradient once on the way back. Forward, the second stage starts from an input within u of
// the reference's; its blocks normalize their inputs (pre-norm), so the logits move by a few u
// relative and the loss, a mean over positions, by less: held to 1e-2 relative (5u), where a
// wrong boundary (a stale or missing micro-batch) changes it by O(1). Backward, the first stage's
// gradients are within ~u of the reference's, the case of the bf16 gradient reduction above: the
// same parameter bounds (every one within 20 x 2 lr = 4e-2, the 99th percentile within 1e-3).
TEST(TensorPipelineBf16, ActivationsSentInBf16StayWithinTheirRounding) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const fs::path ref = reference_run(data);
  const std::string what = "bf16 pp2 1f1b, bf16 wire";
  auto out = scratch("bf16_pp2_wire");
  auto run = sh(mpirun(2) + train_args(data, out, 4, 2, 20) + k_bf16 +
                " parallel.pp=2 parallel.schedule=1f1b 'parallel.pipeline_dtype=\"bf16\"'");
  ASSERT_EQ(run.code, 0) << what << "\n" << run.output;
  expect_bf16_wire_run_matches(ref, out, what);
}

// Tensor parallelism's messages in bf16 (parallel.tensor_dtype = "bf16"): a linear's partial sums
// over its input axis (forward) and its input gradient's over the output axis (backward), and with
// sequence parallelism the reduce-scatters and all-gathers, each part rounded to bf16 and the sum
// of the two rounded once more: every element within 3u (u = 2^-9) of its exact sum where the
// parts do not cancel, the case of the bf16 gradient reduction (data parallelism above) but for
// activations: the residual stream moves by a few u relative at each transposed linear, which the
// pre-norm blocks normalize, and the gradients by a few u. The same bounds as the pipeline's wire.
TEST(TensorPipelineBf16, TensorMessagesInBf16StayWithinTheirRounding) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const fs::path ref = reference_run(data);
  struct Case {
    int ranks;
    const char* set;
    const char* name;
  };
  for (const Case& c :
       {Case{2, "parallel.tx=2", "tx2"}, Case{4, "parallel.ty=2 parallel.tz=2", "ty2_tz2"},
        Case{2, "parallel.tx=2 parallel.sequence_parallel=true", "tx2_sp"}}) {
    const std::string what = std::string("bf16 ") + c.name + ", bf16 tensor messages";
    auto out = scratch(std::string("bf16_wire_") + c.name);
    auto run = sh(mpirun(c.ranks) + train_args(data, out, 8, 1, 20) + k_bf16 + " " + c.set +
                  " 'parallel.tensor_dtype=\"bf16\"'");
    ASSERT_EQ(run.code, 0) << what << "\n" << run.output;
    expect_bf16_wire_run_matches(ref, out, what);
  }
}
