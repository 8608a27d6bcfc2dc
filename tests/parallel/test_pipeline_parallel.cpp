// Pipeline parallelism end to end: `mpirun -n N tessera train` with pp stages, every
// schedule (GPipe, 1F1B, interleaved with v = 2), composed with data and tensor parallelism,
// against the single-process run of the same global batch: per-step losses within 1e-5 relative
// for 20 steps, final weights as in the tensor-parallel tests. The pipeline only reorders the
// micro-batches' work and sums the tied embedding's two gradients, so the difference is
// reduction order alone. Also: activation memory in flight per stage (measured by the trainer,
// written as the "pipeline" metrics event) is what the schedule allows; checkpoints reshard;
// and what pipelines cannot do is refused up front.
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "run_util.hpp"

using namespace tessera::test;

namespace {

// 8 layers: pp=4 with v=2 gives every chunk one layer.
std::string pp_args(const fs::path& data, const fs::path& out, int B, int m, int steps) {
  return train_args(data, out, B, m, steps) + " model.n_layer=8 model.n_head=4";
}

nlohmann::json pipeline_event(const fs::path& out) {
  std::istringstream in(slurp(out / "metrics.jsonl"));
  for (std::string l; std::getline(in, l);)
    if (l.find("\"event\":\"pipeline\"") != std::string::npos) return nlohmann::json::parse(l);
  return {};
}

class PipelineParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
};

struct Case {
  int ranks, m, dp;
  std::string set, name;
};

// The single-process reference of m micro-batches of 4 sequences (computed once per m).
fs::path reference(int m) {
  static std::map<int, fs::path> refs;
  auto it = refs.find(m);
  if (it != refs.end()) return it->second;
  auto ref = scratch("pp_ref_m" + std::to_string(m));
  auto r = sh(pp_args(data_dir(), ref, 4, m, 20));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(losses(ref / "metrics.jsonl").size(), 20u);
  return refs[m] = ref;
}

void run_case(const Case& c) {
  const auto ref = reference(c.m);
  auto out = scratch("pp_" + c.name);
  auto run = sh(mpirun(c.ranks) + pp_args(data_dir(), out, 4 / c.dp, c.m, 20) + " " + c.set);
  ASSERT_EQ(run.code, 0) << c.set << "\n" << run.output;
  expect_same_run(ref, out, c.set + " m=" + std::to_string(c.m));

  // Activations in flight, measured per stage: what the schedule's lists allow (1F1B: at most
  // pp - stage <= pp micro-batches; GPipe: all m), and the bytes follow from the slots.
  auto ev = pipeline_event(out);
  ASSERT_FALSE(ev.is_null()) << c.set;
  const int pp = ev["pp"], m = ev["m"];
  const std::string sched = ev["schedule"];
  ASSERT_EQ(static_cast<int>(ev["stages"].size()), pp);
  for (const auto& st : ev["stages"]) {
    const int stage = st["stage"];
    const double live = st["peak_in_flight"], bytes = st["peak_activation_bytes"],
                 slot = st["slot_bytes"];
    EXPECT_EQ(live, static_cast<double>(st["in_flight_formula"])) << c.set << " stage " << stage;
    EXPECT_LE(bytes, live * slot) << c.set << " stage " << stage;
    EXPECT_GT(bytes, 0) << c.set;
    if (sched == "1f1b") {
      EXPECT_EQ(live, std::min(pp - stage, m)) << c.set << " stage " << stage;
      EXPECT_LE(bytes, pp * slot) << c.set << " stage " << stage;
    } else if (sched == "gpipe") {
      EXPECT_EQ(live, m) << c.set << " stage " << stage;
      EXPECT_EQ(bytes, m * slot) << c.set << " stage " << stage;  // every slot the same size
    }
  }
}

}  // namespace

// pp in {2, 4} x schedule in {gpipe, 1f1b, interleaved v=2} x m in {4, 8}.
TEST_F(PipelineParallel, EverySchedulePpAndMicroBatchCountMatchesOneProcess) {
  for (int pp : {2, 4})
    for (int m : {4, 8})
      for (const std::string sched : {"gpipe", "1f1b", "interleaved"}) {
        const std::string set = "parallel.pp=" + std::to_string(pp) +
                                " parallel.schedule=" + sched +
                                (sched == "interleaved" ? " parallel.virtual_stages=2" : "");
        run_case(
            {pp, m, 1, set, "pp" + std::to_string(pp) + "_" + sched + "_m" + std::to_string(m)});
      }
}

// The combined grids of 8 ranks, plus ZeRO-1, recomputation and an explicit layer split with
// the embedding and the head on stages of their own.
TEST_F(PipelineParallel, CombinedGridsMatchOneProcess) {
  const std::vector<Case> cases = {
      {8, 4, 2, "parallel.dp=2 parallel.pp=2 parallel.tx=2", "dp2_pp2_tx2"},
      {8, 4, 1, "parallel.pp=2 parallel.tx=2 parallel.ty=2", "pp2_tx2_ty2"},
      {8, 4, 2,
       "parallel.dp=2 parallel.pp=2 parallel.tz=2 parallel.zero=1 parallel.recompute=true "
       "parallel.schedule=interleaved parallel.virtual_stages=2",
       "dp2_pp2_tz2_zero1_rc_int"},
      {4, 4, 1, "parallel.pp=4 parallel.pp_layers=0,4,4,0", "pp4_split_0440"},
  };
  for (const auto& c : cases) run_case(c);
}

// A checkpoint from {pp=2, tx=2} (10 of 20 steps) resumes in one process and on {pp=4}, and the
// next 10 losses are those of the uninterrupted single-process run.
TEST_F(PipelineParallel, Pp2Tx2CheckpointResumesInOneProcessAndOnPp4) {
  const auto ref_losses = losses(reference(4) / "metrics.jsonl");
  ASSERT_EQ(ref_losses.size(), 20u);
  for (const auto& [ranks, set, name] : std::vector<std::tuple<int, std::string, std::string>>{
           {1, "", "single"}, {4, "parallel.pp=4", "pp4"}}) {
    auto out = scratch("pp_reshard_" + name);
    expect_resume_matches(ref_losses, out, 4,
                          pp_args(data_dir(), out, 4, 4, 20) + " parallel.pp=2 parallel.tx=2",
                          ranks, pp_args(data_dir(), out, 4, 4, 20) + " " + set, 10, name);
  }
}

// What a pipeline cannot run is refused before any work, with the reason.
TEST_F(PipelineParallel, UnsupportedCombinationsAreRefusedUpFront) {
  struct Bad {
    std::string set, expect;
  };
  const std::vector<Bad> bad = {
      {"parallel.pp=2 parallel.dp=1 parallel.zero=2", "ZeRO-2 and -3"},
      {"parallel.pp=2 parallel.schedule=interleaved parallel.virtual_stages=2 train.grad_accum=3",
       "divisible by parallel.pp"},
      {"parallel.pp=2 parallel.pp_layers=3,3", "adds up to 6 layers"},
      {"parallel.pp=2 parallel.pp_layers=8", "has 1 entries"},
      {"parallel.pp=2 parallel.schedule=interleaved", "virtual_stages"},
  };
  for (const auto& b : bad) {
    auto out = scratch("pp_bad");
    auto r = sh(mpirun(2) + pp_args(data_dir(), out, 4, 4, 2) + " " + b.set);
    EXPECT_EQ(r.code, 2) << b.set << "\n" << r.output;
    EXPECT_NE(r.output.find(b.expect), std::string::npos) << b.set << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << b.set;
  }
}

namespace {

// The "val_loss" rows of a run's metrics, in order.
std::vector<double> val_losses(const fs::path& out) {
  std::vector<double> v;
  std::istringstream in(slurp(out / "metrics.jsonl"));
  for (std::string l; std::getline(in, l);)
    if (l.find("\"val_loss\"") != std::string::npos)
      v.push_back(nlohmann::json::parse(l)["val_loss"].get<double>());
  return v;
}

}  // namespace

// Validation on a pipeline runs on the stages' own chunks (a forward through every stage in model
// order), with the tensor grid inside a stage and interleaved chunks: the validation losses are
// the single-process ones (the same sums in another order: 1e-5 relative, as the step losses).
TEST_F(PipelineParallel, ValidationOnTheStagesEqualsOneProcess) {
  const std::string val = " train.val_every=2 train.val_batches=2 train.seq_len=32";
  auto ref = scratch("pp_val_ref");
  auto r = sh(pp_args(data_dir(), ref, 4, 2, 4) + val);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto want = val_losses(ref);
  ASSERT_EQ(want.size(), 3u);  // steps 0, 2, 4
  for (const std::string set : {"parallel.pp=2 parallel.tx=2",
                                "parallel.pp=2 parallel.schedule=interleaved "
                                "parallel.virtual_stages=2"}) {
    auto out = scratch("pp_val");
    auto run = sh(mpirun(set.find("tx=2") != std::string::npos ? 4 : 2) +
                  pp_args(data_dir(), out, 4, 2, 4) + val + " " + set);
    ASSERT_EQ(run.code, 0) << set << "\n" << run.output;
    const auto got = val_losses(out);
    ASSERT_EQ(got.size(), want.size()) << set;
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << set << " validation " << i;
  }
}
