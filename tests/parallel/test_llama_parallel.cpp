// The llama family (RMSNorm, RoPE, SwiGLU, 4 query heads sharing 2 kv heads, untied head) through
// tensor and pipeline parallelism end to end: `mpirun -n N tessera train` against the
// single-process run of the same global batch, with the bounds of the GPT-2 tests (per-step
// losses within 1e-5 relative, final weights: 99.9th percentile |diff| <= 1e-5, max <= 2e-2;
// test_parallel.cpp argues them). The argument carries over unchanged: the grids only reorder
// sums (GEMM inner products over tx / ty, RMSNorm's sum of squares over tx, rows over tz, the
// pipeline's micro-batches); the row permutations of the fused q|k|v and gate|up matrices move
// whole rows, and RoPE and SwiGLU are per element. Every tx x ty x tz factorization of 4 and 8
// that the heads allow is checked at the layer level (tests/mpi/test_tensor_model.cpp); here:
// 2D and 3D grids, pp {2, 4} x every schedule, dp x pp x tensor axes together, sequence
// parallelism, and a checkpoint resharded between two grids.
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "run_util.hpp"

using namespace tessera::test;

namespace {

// 4 layers (pp=4 holds one each; interleaved pp=2 v=2 too; interleaved pp=4 v=2 takes 8), 20
// steps of 4 sequences.
std::string llama_args(const fs::path& out, int B, int m, int steps, int layers = 4) {
  return train_args(data_dir(), out, B, m, steps) +
         " model.family=llama model.n_layer=" + std::to_string(layers) +
         " model.n_head=4 model.n_kv_head=2 model.intermediate_size=48 model.tie_embeddings=false";
}

class LlamaParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
};

// The single-process reference (micro-batches of 4 sequences, m of them), computed once per
// (m, layers).
fs::path llama_reference(int m, int layers = 4) {
  static std::map<std::pair<int, int>, fs::path> refs;
  auto it = refs.find({m, layers});
  if (it != refs.end()) return it->second;
  auto ref = scratch("llama_ref_m" + std::to_string(m) + "_l" + std::to_string(layers));
  auto r = sh(llama_args(ref, 4, m, 20, layers));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(losses(ref / "metrics.jsonl").size(), 20u);
  return refs[{m, layers}] = ref;
}

struct Case {
  int ranks, m, dp;
  std::string set, name;
  int layers = 4;
};

void run_case(const Case& c) {
  const auto ref = llama_reference(c.m, c.layers);
  auto out = scratch("llama_" + c.name);
  auto run = sh(mpirun(c.ranks) + llama_args(out, 4 / c.dp, c.m, 20, c.layers) + " " + c.set);
  ASSERT_EQ(run.code, 0) << c.set << "\n" << run.output;
  expect_same_run(ref, out, c.set);
}

}  // namespace

// Tensor grids: kv heads over ty (2 kv heads: ty <= 2), channels over tx, rows over tz;
// recomputation; sequence parallelism (1D over tx).
TEST_F(LlamaParallel, TensorGridsMatchOneProcess) {
  const std::vector<Case> cases = {
      {4, 1, 1, "parallel.tx=2 parallel.ty=2", "tx2_ty2"},
      {8, 1, 1, "parallel.tx=2 parallel.ty=2 parallel.tz=2 parallel.recompute=true",
       "tx2_ty2_tz2_rc"},
      {2, 1, 1, "parallel.tx=2 parallel.sequence_parallel=true", "tx2_sp"},
  };
  for (const auto& c : cases) run_case(c);
}

// pp in {2, 4} x schedule in {gpipe, 1f1b, interleaved v=2}, 4 micro-batches (interleaved on
// pp=4: 8 layers, one per chunk).
TEST_F(LlamaParallel, EveryScheduleMatchesOneProcess) {
  for (int pp : {2, 4})
    for (const std::string sched : {"gpipe", "1f1b", "interleaved"}) {
      const std::string set = "parallel.pp=" + std::to_string(pp) + " parallel.schedule=" + sched +
                              (sched == "interleaved" ? " parallel.virtual_stages=2" : "");
      const int layers = sched == "interleaved" && pp == 4 ? 8 : 4;
      run_case({pp, 4, 1, set, "pp" + std::to_string(pp) + "_" + sched, layers});
    }
}

// Data, pipeline and tensor axes together.
TEST_F(LlamaParallel, DpPpTensorGridMatchesOneProcess) {
  run_case({8, 4, 2, "parallel.dp=2 parallel.pp=2 parallel.ty=2 parallel.zero=1", "dp2_pp2_ty2"});
}

// A checkpoint from {pp=2, tx=2} (10 of 20 steps) resumes on {ty=2, tz=2}: the Hugging Face
// order of the fused matrices survives both grids' row permutations.
TEST_F(LlamaParallel, CheckpointReshardsBetweenGrids) {
  const auto ref_losses = losses(llama_reference(4) / "metrics.jsonl");
  ASSERT_EQ(ref_losses.size(), 20u);
  auto out = scratch("llama_reshard");
  expect_resume_matches(
      ref_losses, out, 4, llama_args(out, 4, 4, 20) + " parallel.pp=2 parallel.tx=2", 4,
      llama_args(out, 4, 4, 20) + " parallel.ty=2 parallel.tz=2", 10, "pp2_tx2 -> ty2_tz2");
}
