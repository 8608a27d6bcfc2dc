// Tensor parallelism end to end: `mpirun -n N tessera train` on tensor grids, with data
// parallelism and ZeRO on top, with and without recomputation, against the single-process run of
// the same global batch: per-step losses within 1e-5 relative for 20 steps, and the final weights
// within the bounds of test_parallel.cpp (99.9th percentile |diff| <= 1e-5, max <= 2e-2).
// Tensor parallelism changes only the order of sums (GEMM inner products split over tx / ty and
// all-reduced, row sums split over tz, LayerNorm statistics split over tx), so the same argument
// as for data parallelism applies. Also: a checkpoint written on one grid resumes on others.
//
// The model is tiny.toml with 4 heads (ty must divide n_head).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run_util.hpp"

namespace fs = std::filesystem;
using namespace tessera::test;

namespace {

struct Grid {
  int ranks;
  std::string set, name;
};

std::string tp_args(const fs::path& data, const fs::path& out, int B, int steps) {
  return train_args(data, out, B, 1, steps) + " model.n_head=4";
}

const std::vector<Grid>& grids() {
  static const std::vector<Grid> g = {
      {2, "parallel.tx=2", "tx2"},
      {4, "parallel.tx=4", "tx4"},
      {4, "parallel.tx=2 parallel.ty=2", "tx2_ty2"},
      {8, "parallel.tx=2 parallel.ty=2 parallel.tz=2", "tx2_ty2_tz2"},
      {4, "parallel.tz=4", "tz4"},
      {8, "parallel.dp=2 parallel.tx=2 parallel.ty=2", "dp2_tx2_ty2"},
      {4, "parallel.dp=2 parallel.tx=2 parallel.zero=1", "dp2_tx2_zero1"},
      {4, "parallel.dp=2 parallel.ty=2 parallel.zero=2", "dp2_ty2_zero2"},
      {4, "parallel.dp=2 parallel.tz=2 parallel.zero=3", "dp2_tz2_zero3"},
      {2, "parallel.tx=2 parallel.sequence_parallel=true", "tx2_sp"},
      {4, "parallel.tx=4 parallel.sequence_parallel=true", "tx4_sp"},
  };
  return g;
}

int dp_of(const Grid& g) {
  return g.set.find("parallel.dp=2") != std::string::npos ? 2 : 1;
}

class TensorParallel : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
};

}  // namespace

TEST_P(TensorParallel, LossesAndWeightsEqualSingleProcess) {
  const bool recompute = GetParam();
  const auto data = data_dir();
  auto ref = scratch("tp_ref");
  auto r = sh(tp_args(data, ref, 8, 20));
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(losses(ref / "metrics.jsonl").size(), 20u);
  if (recompute) {  // one process recomputes too: the same kernels on the same inputs
    auto one = scratch("tp_single_rc");
    auto run = sh(tp_args(data, one, 8, 20) + " parallel.recompute=true");
    ASSERT_EQ(run.code, 0) << run.output;
    expect_same_run(ref, one, "one process (recompute)");
  }
  for (const auto& g : grids()) {
    auto out = scratch("tp_" + g.name + (recompute ? "_rc" : ""));
    auto run = sh(mpirun(g.ranks) + tp_args(data, out, 8 / dp_of(g), 20) + " " + g.set +
                  (recompute ? " parallel.recompute=true" : ""));
    ASSERT_EQ(run.code, 0) << g.set << "\n" << run.output;
    expect_same_run(ref, out, g.set + (recompute ? " (recompute)" : ""));
  }
}
INSTANTIATE_TEST_SUITE_P(Recompute, TensorParallel, ::testing::Values(false, true));

// A checkpoint from {tx=2, ty=2} (10 of 20 steps) resumes in one process and on {tz=4}, and the
// next 10 losses are those of the uninterrupted single-process run.
TEST(TensorResharding, Tx2Ty2CheckpointResumesInOneProcessAndOnTz4) {
  if (!have_tokenizer()) GTEST_SKIP();
  const auto data = data_dir();
  auto ref = scratch("tp_reshard_ref");
  ASSERT_EQ(sh(tp_args(data, ref, 8, 20)).code, 0);
  auto ref_losses = losses(ref / "metrics.jsonl");
  ASSERT_EQ(ref_losses.size(), 20u);
  for (const auto& [ranks, set, name] :
       std::vector<Grid>{{1, "", "single"}, {4, "parallel.tz=4", "tz4"}}) {
    auto out = scratch("tp_reshard_" + name);
    expect_resume_matches(ref_losses, out, 4,
                          tp_args(data, out, 8, 20) + " parallel.tx=2 parallel.ty=2", ranks,
                          tp_args(data, out, 8, 20) + " " + set, 10, name);
  }
}

namespace {
int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

// Samples of a sliced model are generated on the slices (each token a forward through the tensor
// groups, the stages or the ZeRO-3 shards, the lead's random state on every rank): each sample is
// printed once, by the lead, and the run ends cleanly. With ZeRO-3 at tz = 4 and sequence
// parallelism, the sampling batch is the grid's smallest (tz sequences, a multiple of tx).
TEST(ParallelSampling, SamplesRunOnTheSlices) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const std::string sample =
      " sample.tokens=6 sample.every=1 sample.temperature=0.8 'sample.prompt=\"The\"'";
  for (const Grid& g :
       {Grid{2, "parallel.tx=2", "tx2"}, Grid{4, "parallel.tx=2 parallel.tz=2", "tx2_tz2"},
        Grid{2, "parallel.tx=2 parallel.sequence_parallel=true", "tx2_sp"},
        Grid{2, "parallel.pp=2 train.grad_accum=2", "pp2"},
        Grid{2, "parallel.dp=2 parallel.zero=3", "dp2_zero3"}}) {
    auto out = scratch("sample_" + g.name);
    auto run = sh(mpirun(g.ranks) + tp_args(data, out, 4, 2) + sample + " " + g.set);
    ASSERT_EQ(run.code, 0) << g.set << "\n" << run.output;
    EXPECT_EQ(count_of(run.output, "---- sample at step 1 ----"), 1) << g.set << "\n" << run.output;
    EXPECT_EQ(count_of(run.output, "---- sample at step 2 ----"), 1) << g.set << "\n" << run.output;
  }
}
