// The one parallel plan and its one feasibility function (parallel/plan.hpp): its rules, and that
// the trainer (train::plan_run) and the performance model and planner (perf::infeasible_reason,
// perf::predict, perf::plan) give the same answer for every plan of a small enumeration.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "tessera/core/error.hpp"
#include "tessera/parallel/plan.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/train/run_setup.hpp"

using namespace tessera;
using parallel::ParallelPlan;
using parallel::Recompute;
using parallel::ScheduleKind;

namespace {

comm::GridShape grid(int dp, int pp, int tx, int ty, int tz) {
  return comm::GridShape{dp, pp, tx, ty, tz};
}

model::ModelConfig gpt2_124m() {
  model::ModelConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  m.vocab_size = 50257;
  return m;
}

// Small shapes whose rules bite on small grids. gpt2: 5 layers (uneven on 2 or 3 stages), 6
// heads (not over ty = 4), padded vocabulary 1024 (not over tx*ty = 3).
model::ModelConfig small_gpt2() {
  model::ModelConfig m;
  m.n_layer = 5;
  m.n_head = 6;
  m.n_embd = 48;
  m.vocab_size = 1000;
  return m;
}
// llama: 8 query heads, 2 key-value heads (not over ty = 4), an MLP of 176 (not over ty = 3),
// padded vocabulary 384.
model::ModelConfig small_llama() {
  model::ModelConfig m;
  m.family = model::Family::Llama;
  m.n_layer = 4;
  m.n_head = 8;
  m.n_kv_head = 2;
  m.n_embd = 64;
  m.intermediate_size = 176;
  m.vocab_size = 384;
  m.tie_embeddings = false;
  return m;
}

std::string first_reason(const model::ModelConfig& m, const ParallelPlan& p) {
  auto why = parallel::plan_infeasible_reason(m, p);
  return why ? why->reason : std::string();
}

const char* k_cluster = R"(
name = "small"
[device]
name = "dev"
peak_tflops_bf16 = 100.0
peak_tflops_fp32 = 50.0
memory_gib = 1024.0
memory_bw_gbps = 1000.0
[node]
devices = 8
[[node.links]]
name = "link"
group = 8
bw_gbps = 100.0
[network]
injection_gbps = 50.0
)";

// One point of the enumeration, as settings of a run config.
struct Settings {
  comm::GridShape g;
  int zero = 0, B = 1, accum = 1, v = 1;
  std::string schedule = "1f1b", split;
  bool sp = false, recompute = false;
};

train::RunConfig run_config(const Settings& s) {
  train::RunConfig cfg;
  cfg.train.seq_len = 16;
  cfg.train.batch_size = s.B;
  cfg.train.grad_accum = s.accum;
  auto& pc = cfg.parallel;
  pc.dp = s.g.dp;
  pc.pp = s.g.pp;
  pc.tx = s.g.tx;
  pc.ty = s.g.ty;
  pc.tz = s.g.tz;
  pc.zero = s.zero;
  pc.schedule = s.schedule;
  pc.virtual_stages = s.v;
  pc.pp_layers = s.split;
  pc.sequence_parallel = s.sp;
  pc.recompute = s.recompute;
  return cfg;
}

// The same settings as the planner builds a point (perf/planner.cpp), independently of
// train::parallel_plan.
perf::PlanPoint planner_point(const Settings& s) {
  perf::PlanPoint p;
  p.grid = s.g;
  p.zero = s.zero;
  p.micro_batch = s.B;
  p.schedule = parallel::parse_schedule(s.schedule);
  p.virtual_stages = s.v;
  p.layer_split = parallel::parse_layer_counts(s.split);
  p.recompute = s.recompute ? Recompute::Full : Recompute::None;
  p.sequence_parallel = s.sp;
  return p;
}

}  // namespace

TEST(ParallelPlan, AcceptsValidPlans) {
  const auto m = gpt2_124m();
  ParallelPlan p;
  EXPECT_EQ(first_reason(m, p), "");
  p.grid = grid(2, 4, 2, 2, 2);
  p.micro_batch = 2;
  EXPECT_EQ(first_reason(m, p), "");
  p.grid = grid(1, 1, 3, 1, 1);  // 50304 = 2^7 * 3 * 131
  p.micro_batch = 1;
  EXPECT_EQ(first_reason(m, p), "");
  // Uneven pipeline stages: 12 layers on 5 stages (balanced), or as given.
  p.grid = grid(1, 5, 1, 1, 1);
  EXPECT_EQ(first_reason(m, p), "");
  EXPECT_EQ(parallel::plan_layer_split(m, p), (std::vector<int>{2, 3, 3, 2, 2}));
  p.layer_split = {0, 4, 4, 4, 0};
  EXPECT_EQ(first_reason(m, p), "");
  EXPECT_EQ(parallel::stage_layers({1, 2, 3, 4}, 2, 1), 6);
}

TEST(ParallelPlan, AxesOfSizeOneNeverConstrain) {
  // A model that no tensor or pipeline axis could split: odd heads, width, vocabulary; 1 layer.
  model::ModelConfig m;
  m.n_layer = 1;
  m.n_head = 7;
  m.n_embd = 7 * 13;
  m.vocab_size = 1001;
  ParallelPlan p;
  p.micro_batch = 3;
  p.micro_batches = 5;
  for (int dp : {1, 2, 3, 7}) {
    p.grid = grid(dp, 1, 1, 1, 1);
    EXPECT_EQ(first_reason(m, p), "") << dp;
  }
}

TEST(ParallelPlan, HeadsOverTy) {
  const auto m = gpt2_124m();
  ParallelPlan p;
  p.grid = grid(1, 1, 1, 8, 1);
  auto why = parallel::plan_infeasible_reason(m, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->reason, "heads not divisible by ty");
  EXPECT_EQ(why->message,
            "model.n_head=12 is not divisible by ty=8 (tensor-parallel attention splits heads "
            "over ty)");
  EXPECT_EQ(why->hint, "choose ty among the divisors of 12: 1, 2, 3, 4, 6, 12");
  // tx replicates the attention and tz splits the batch: neither splits heads.
  p.grid = grid(1, 1, 8, 1, 1);
  EXPECT_EQ(first_reason(m, p), "");
  p.grid = grid(1, 1, 2, 2, 2);
  p.micro_batch = 2;
  EXPECT_EQ(first_reason(m, p), "");
  // llama: the key-value heads too
  auto l = small_llama();
  p = ParallelPlan{};
  p.grid = grid(1, 1, 1, 4, 1);
  EXPECT_EQ(first_reason(l, p), "key-value heads not divisible by ty");
  p.grid = grid(1, 1, 1, 2, 1);
  EXPECT_EQ(first_reason(l, p), "");
}

TEST(ParallelPlan, WidthAndVocabularyOverTheirAxes) {
  auto m = gpt2_124m();
  m.n_head = 8;
  m.n_embd = 8 * 33;  // 264: not divisible by 16
  ParallelPlan p;
  p.grid = grid(1, 1, 16, 1, 1);
  EXPECT_EQ(first_reason(m, p), "hidden not divisible by tx");
  // tz shards the weight blocks unevenly if need be: no rule on the width
  p.grid = grid(1, 1, 1, 1, 16);
  p.micro_batch = 16;
  EXPECT_EQ(first_reason(m, p), "");
  // the vocabulary is split over tx*ty, on its padded size
  model::ModelConfig v;
  v.n_layer = 1;
  v.n_head = 5;
  v.n_embd = 640;
  v.vocab_size = 100;  // padded to 128, not divisible by 5
  p = ParallelPlan{};
  p.grid = grid(1, 1, 5, 1, 1);
  auto why = parallel::plan_infeasible_reason(v, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->message,
            "padded vocabulary 128 (model.vocab_size=100 rounded up to a multiple of 128) is not "
            "divisible by tx*ty=5 (the embedding is split over the vocabulary)");
  p.grid = grid(1, 1, 1, 1, 5);
  p.micro_batch = 5;
  EXPECT_EQ(first_reason(v, p), "");
}

TEST(ParallelPlan, SequenceParallelismIsTxAlone) {
  const auto m = gpt2_124m();
  ParallelPlan p;
  p.sequence_parallel = true;
  p.micro_batch = 4;
  p.grid = grid(1, 1, 4, 1, 1);
  EXPECT_EQ(first_reason(m, p), "");
  p.grid = grid(1, 2, 2, 1, 1);  // with a pipeline too
  EXPECT_EQ(first_reason(m, p), "");
  for (auto g :
       {grid(1, 1, 1, 4, 1), grid(1, 1, 2, 2, 1), grid(1, 1, 2, 1, 2), grid(4, 1, 1, 1, 1)}) {
    p.grid = g;
    EXPECT_EQ(first_reason(m, p), "sequence parallelism needs tx > 1 alone") << g.describe();
  }
  p.grid = grid(1, 1, 4, 1, 1);
  p.micro_batch = 6;
  EXPECT_EQ(first_reason(m, p), "micro-batch not divisible by tx (sequence parallelism)");
}

TEST(ParallelPlan, PipelineRules) {
  auto m = gpt2_124m();
  m.n_layer = 2;
  ParallelPlan p;
  p.grid = grid(1, 4, 1, 1, 1);
  auto why = parallel::plan_infeasible_reason(m, p);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->message, "model.n_layer=2 is smaller than pp=4: every stage needs a layer");
  EXPECT_EQ(why->hint, "use parallel.pp <= 2 or a deeper model");
  m.n_layer = 6;
  p.grid = grid(1, 2, 1, 1, 1);
  p.schedule = ScheduleKind::Interleaved;
  p.virtual_stages = 4;  // 8 chunks, 6 layers
  p.micro_batches = 4;
  EXPECT_EQ(first_reason(m, p), "layers fewer than pp x chunks");
  p.virtual_stages = 2147483647;  // pp x chunks beyond an int: refused, not wrapped around
  EXPECT_EQ(first_reason(m, p), "layers fewer than pp x chunks");
  p.virtual_stages = 4;
  p.layer_split = {0, 1, 1, 1, 1, 1, 1, 0};  // given, chunks may be empty
  EXPECT_EQ(first_reason(m, p), "");
  p.micro_batches = 3;
  EXPECT_EQ(first_reason(m, p), "schedule: micro-batches not divisible by pp (interleaved)");
  p.micro_batches = 4;
  p.layer_split = {3, 3};
  EXPECT_EQ(first_reason(m, p), "layer split does not match the chunks");
  p.layer_split = {1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(first_reason(m, p), "layer split does not add up to the layers");
  p = ParallelPlan{};
  p.grid = grid(2, 2, 1, 1, 1);
  p.zero = 2;
  EXPECT_EQ(first_reason(m, p), "ZeRO-2/3 with pipeline (gradients re-reduced per micro-batch)");
  p.grid = grid(2, 1, 1, 1, 1);
  EXPECT_EQ(first_reason(m, p), "");
  p.schedule = ScheduleKind::GPipe;
  EXPECT_EQ(first_reason(m, p), "schedule needs pp > 1");
  // every broken rule is listed, in order
  p.grid = grid(1, 1, 1, 5, 3);
  p.micro_batch = 2;
  const auto all = parallel::plan_problems(m, p);
  std::vector<std::string> reasons;
  for (const auto& a : all) reasons.push_back(a.reason);
  EXPECT_EQ(reasons, (std::vector<std::string>{
                         "micro-batch not divisible by tz", "heads not divisible by ty",
                         "key-value heads not divisible by ty", "MLP width not divisible by ty",
                         "vocabulary not divisible by tx*ty", "schedule needs pp > 1"}));
}

TEST(ParallelPlan, TheTrainerBuildsThePlanOnceAndRefusesWithTheFunctionsReason) {
  const auto m = gpt2_124m();
  Settings s;
  s.g = grid(1, 1, 1, 8, 1);
  test::expect_error([&] { train::plan_run(run_config(s), m, 8); },
                     "model.n_head=12 is not divisible by ty=8");
  s.g = grid(2, 1, 1, 1, 1);
  test::expect_error([&] { train::plan_run(run_config(s), m, 4); },
                     "has 2 ranks but the job has 4");
  // pp = 1 ignores the schedule, chunks and split; recomputation holds on any grid
  s.schedule = "interleaved";
  s.v = 2;
  s.split = "6,6";
  s.recompute = true;
  const auto plan = train::plan_run(run_config(s), m, 2);
  EXPECT_EQ(plan.par.schedule, ScheduleKind::OneF1B);
  EXPECT_EQ(plan.par.chunks(), 1);
  EXPECT_TRUE(plan.par.layer_split.empty());
  EXPECT_EQ(plan.par.recompute, Recompute::Full);
  // a pipeline gets its split resolved
  s = Settings{};
  s.g = grid(1, 5, 1, 1, 1);
  s.recompute = true;
  const auto pipe = train::plan_run(run_config(s), m, 5);
  EXPECT_EQ(pipe.par.layer_split, (std::vector<int>{2, 3, 3, 2, 2}));
  EXPECT_EQ(pipe.par.recompute, Recompute::Full);
}

// The trainer's acceptance is the planner's: for every plan of the enumeration (both families,
// every small grid, ZeRO stage, schedule, sequence parallelism, even and uneven splits), plan_run
// accepts it exactly when perf::infeasible_reason does, refuses it with the function's first
// message, and the model predicts every accepted plan (its split included).
TEST(ParallelPlan, TrainerAcceptsExactlyWhatThePlannerAccepts) {
  const auto cluster = perf::parse_cluster(k_cluster, "small");
  long accepted = 0, refused = 0, sp_accepted = 0, uneven_accepted = 0;
  for (const auto& m : {small_gpt2(), small_llama()})
    for (int dp : {1, 2})
      for (int pp : {1, 2, 3})
        for (int tx : {1, 2, 3})
          for (int ty : {1, 2, 4})
            for (int tz : {1, 2})
              for (int zero : {0, 1, 2, 3})
                for (const char* sched : {"1f1b", "gpipe", "interleaved"})
                  for (int sp : {0, 1})
                    for (int uneven : {0, 1})
                      for (int B : {2, 3})
                        for (int accum : {2, 3}) {
                          if (pp == 1 && (std::string(sched) != "1f1b" || uneven)) continue;
                          Settings s;
                          s.g = grid(dp, pp, tx, ty, tz);
                          s.zero = zero;
                          s.schedule = sched;
                          s.v = s.schedule == "interleaved" ? 2 : 1;
                          s.sp = sp == 1;
                          s.B = B;
                          s.accum = accum;
                          s.recompute = (B + zero) % 2 == 0;
                          const int chunks = pp * s.v;
                          if (uneven) {  // the embedding alone, the layers on the others
                            s.split = "0";
                            const int rest = chunks - 1;
                            for (int c = 1; c < chunks; ++c) {
                              s.split += ',';
                              s.split += std::to_string(m.n_layer / rest +
                                                        (c <= m.n_layer % rest ? 1 : 0));
                            }
                          }
                          const int world = dp * pp * tx * ty * tz;
                          std::string trainer_error;
                          try {
                            train::plan_run(run_config(s), m, world);
                          } catch (const Error& e) {
                            trainer_error = e.what();
                          }
                          const auto point = planner_point(s);
                          const perf::Workload w{m, 16, static_cast<long>(B) * accum * dp};
                          const std::string why = perf::infeasible_reason(w, point, cluster);
                          const std::string what = point.describe() + " " + model::describe(m);
                          ASSERT_EQ(trainer_error.empty(), why.empty())
                              << what << "\n trainer: " << trainer_error << "\n perf: " << why;
                          if (!why.empty()) {
                            ++refused;
                            auto p = point;
                            p.micro_batches = accum;
                            const auto first = parallel::plan_infeasible_reason(m, p);
                            ASSERT_TRUE(first) << what;
                            EXPECT_EQ(first->reason, why) << what;
                            EXPECT_EQ(first->message, trainer_error) << what;
                            continue;
                          }
                          ++accepted;
                          sp_accepted += s.sp;
                          uneven_accepted += uneven;
                          const auto r = perf::predict(w, point, cluster);
                          ASSERT_TRUE(std::isfinite(r.step_s) && r.step_s > 0) << what;
                          EXPECT_EQ(r.micro_batches, accum) << what;
                          ASSERT_EQ(r.chunk_cost.size(), static_cast<std::size_t>(pp)) << what;
                        }
  // the enumeration reaches both answers, sequence parallelism and uneven splits
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(sp_accepted, 50);
  EXPECT_GT(uneven_accepted, 50);
}

// What the planner returns, the trainer runs: each of the planner's best plans (its balanced
// splits included) passes plan_run as a run config.
TEST(ParallelPlan, ThePlannersPlansPassTheTrainer) {
  const auto cluster = perf::parse_cluster(k_cluster, "small");
  for (const auto& m : {small_gpt2(), small_llama()}) {
    perf::Workload w{m, 16, 24};
    perf::PlanSearch search;
    search.devices = 12;
    search.recompute = {Recompute::None, Recompute::Full};
    search.top = 1000;
    const auto res = perf::plan(w, cluster, search);
    ASSERT_FALSE(res.best.empty());
    bool sp = false, uneven = false;
    for (const auto& pr : res.best) {
      const auto& p = pr.point;
      Settings s;
      s.g = p.grid;
      s.zero = p.zero;
      s.B = p.micro_batch;
      s.accum = pr.micro_batches;
      s.schedule = parallel::schedule_name(p.schedule);
      s.v = p.chunks();
      s.sp = p.sequence_parallel;
      s.recompute = p.recompute == Recompute::Full;
      EXPECT_NO_THROW(train::plan_run(run_config(s), m, 12)) << p.describe();
      sp = sp || p.sequence_parallel;
      uneven = uneven || (p.grid.pp > 1 && m.n_layer % (p.grid.pp * p.chunks()) != 0);
    }
    EXPECT_TRUE(sp) << model::describe(m);
    EXPECT_TRUE(uneven) << model::describe(m);
  }
}
