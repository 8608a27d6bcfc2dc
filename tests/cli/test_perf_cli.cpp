// End-to-end tests of tessera plan, simulate and probe: outputs, JSON, traces, clean errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "tessera/perf/cluster.hpp"

namespace {

namespace fs = std::filesystem;
using cli::expect_clean_error;

}  // namespace

TEST(PerfCli, PlanTableAndJson) {
  auto r = cli::run("plan --model gpt-22b --cluster frontier --gpus 64 --global-batch 128 --top 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("configurations"), std::string::npos);
  EXPECT_NE(r.out.find("out of memory"), std::string::npos);
  EXPECT_NE(r.out.find("TFLOP/s"), std::string::npos);
  auto j = cli::run(
      "plan -m configs/models/gpt-22b.toml -c configs/clusters/frontier.toml -n 64 "
      "-b 128 --top 3 --json");
  ASSERT_EQ(j.code, 0) << j.err;
  auto js = nlohmann::json::parse(j.out);
  ASSERT_EQ(js["plans"].size(), 3u);
  EXPECT_LE(js["plans"][0]["step_s"].get<double>(), js["plans"][1]["step_s"].get<double>());
  EXPECT_LE(js["plans"][0]["memory_bytes"]["total"].get<double>(),
            js["plans"][0]["capacity_bytes"].get<double>());
}

TEST(PerfCli, PlanErrors) {
  expect_clean_error(cli::run("plan -m nope -c frontier -n 8 -b 8"), "model file not found");
  expect_clean_error(cli::run("plan -m gpt-22b -c frontier -n 8 -b 8 --grid 1,2,3"), "--grid");
  expect_clean_error(cli::run("plan -m gpt-1t -c frontier -n 8 -b 8"), "no configuration");
  expect_clean_error(cli::run("plan -m gpt-22b -c frontier -n 8 -b 8 --dtype fp8"), "dtype");
  // device counts the planner cannot enumerate (an int's last values overflowed or hung it)
  const std::string small = "plan -m gpt2-124m -c dgx-h100 -b 64";
  for (const char* n : {"2147483647", "2147483646", "999999999", "1048577"})
    expect_clean_error(cli::run(small + " -n " + n), "more than the 1048576 devices (2^20)");
  expect_clean_error(cli::run(small + " -n 0"), "--gpus must be >= 1");
  // option values the search cannot use: refused, not searched to "no configuration fits"
  const std::string plan = small + " -n 16";
  expect_clean_error(cli::run(plan + " --seq -1"), "--seq must be >= 1 (got -1)");
  expect_clean_error(cli::run(plan + " --seq 0"), "--seq must be >= 1 (got 0)");
  for (const char* v : {"0", "-1"}) {
    expect_clean_error(cli::run(plan + " --max-chunks " + v), "--max-chunks must be >= 1");
    expect_clean_error(cli::run(plan + " --max-micro-batch " + v),
                       "--max-micro-batch must be >= 1");
  }
  expect_clean_error(cli::run(plan + " --grid 2,2,2,1,1,1"), "needs 5 sizes (got 6)");
  expect_clean_error(cli::run(plan + " --grid 2,2,2,2"), "needs 5 sizes (got 4)");
  expect_clean_error(cli::run(plan + " --grid 65536,65536,1,1,1"), "more than the 1048576");
  expect_clean_error(cli::run(plan + " --top 0"), "--top must be >= 1");
  // a cluster file's numbers are finite, in every section
  const auto dir = cli::scratch("plan_inf_cluster");
  const std::string h100 = cli::slurp(TESSERA_SOURCE_DIR "/configs/clusters/dgx-h100.toml");
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"memory_gib = 80.0", "memory_gib = inf"},
                                                        {"half_dim = 64", "half_dim = inf"},
                                                        {"latency_us = 4.0", "latency_us = inf"},
                                                        {"latency_us = 6.0", "latency_us = nan"}}) {
    std::string text = h100;
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    const auto file = (dir / "c.toml").string();
    std::ofstream(file) << text;
    expect_clean_error(cli::run("plan -m gpt2-124m -c " + file + " -n 16 -b 64"),
                       "must be a finite number");
  }
}

// --emit-set: one line of run-config keys on stdout (the plan it is on stderr), the Nth plan's
// (as the JSON's Nth with the same search), and clean errors.
TEST(PerfCli, PlanEmitSet) {
  const std::string plan = "plan -m gpt2-124m -c dgx-h100 -n 8 -b 64 --seq 1024 --recompute none";
  auto r = cli::run(plan + " --emit-set");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("--set parallel.dp=", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find(" train.global_batch=64 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" train.seq_len=1024"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("plan 1 of the"), std::string::npos) << r.err;
  auto third = cli::run(plan + " --emit-set 3");
  ASSERT_EQ(third.code, 0) << third.err;
  auto j = cli::run(plan + " --top 3 --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const auto p3 = nlohmann::json::parse(j.out)["plans"][2];
  for (const char* axis : {"dp", "pp", "tx", "ty", "tz"})
    EXPECT_NE(third.out.find(fmt::format("parallel.{}={} ", axis, p3["grid"][axis].get<int>())),
              std::string::npos)
        << axis << ": " << third.out;
  EXPECT_NE(third.out.find(fmt::format("parallel.zero={} ", p3["zero"].get<int>())),
            std::string::npos)
      << third.out;

  expect_clean_error(cli::run(plan + " --emit-set 0"), "--emit-set 0 is not a plan number");
  expect_clean_error(cli::run(plan + " --emit-set x"), "--emit-set x is not a plan number");
  expect_clean_error(cli::run(plan + " --emit-set --json"), "not JSON");
  expect_clean_error(cli::run("plan -m gpt2-124m -c dgx-h100 -n 8 -b 64 --recompute selective "
                              "--emit-set"),
                     "no selective recomputation");
  expect_clean_error(cli::run(plan + " --emit-set 100000"), "configurations fit");
}

// Bad input to tune, the scaling study and train's --set-file: one clean line, exit code 2,
// before any work.
TEST(PerfCli, TuneScalingAndFragmentErrors) {
  expect_clean_error(cli::run("tune configs/runs/tiny.toml --steps 1"), "--steps must be >= 2");
  expect_clean_error(cli::run("tune configs/runs/tiny.toml --top 0"), "--top must be >= 1");
  expect_clean_error(cli::run("train configs/runs/tiny.toml --set-file nope.toml"),
                     "config fragment not found");
  const auto dir = cli::scratch("fragment");
  std::ofstream(dir / "loose.toml") << "dp = 2\n";
  expect_clean_error(
      cli::run("train configs/runs/tiny.toml --set-file " + (dir / "loose.toml").string()),
      "'dp' is not in a section");
  std::ofstream(dir / "typo.toml") << "[parallel]\ndq = 2\n";
  expect_clean_error(
      cli::run("train configs/runs/tiny.toml --set-file " + (dir / "typo.toml").string()),
      "parallel.dq");
  expect_clean_error(cli::run("study scaling --grids foo"), "unknown grid 'foo'");
  expect_clean_error(cli::run("study scaling --ranks 2,4"), "must start at 1");
  // A grid the study's small model cannot take, said before the first run (nothing is written).
  const auto early = cli::scratch("scaling_early") / "study";
  expect_clean_error(
      cli::run("study scaling --grids dp,pipeline --ranks 1,2,16 --strong-batch 16 -o " +
               early.string()),
      "the pipeline grid on 16 ranks (weak scaling) cannot run: model.n_layer=8");
  expect_clean_error(cli::run("study scaling --grids tensor --ranks 1,3 -o " + early.string()),
                     "not divisible by tx=3");
  EXPECT_FALSE(fs::exists(early));
  // the published part's inputs are checked before any run is measured (or its folder made)
  const auto out = cli::scratch("scaling_refused") / "study";
  const std::string study =
      "study scaling --launcher '' --ranks 1 --grids dp -o " + out.string() + " ";
  expect_clean_error(cli::run(study + "--max-devices 16777216"),
                     "--max-devices 16777216 is more than the 1048576 devices");
  expect_clean_error(cli::run(study + "--clusters bogus"), "cluster file not found: bogus");
  expect_clean_error(cli::run(study + "--model nonexist"), "nonexist");
  expect_clean_error(cli::run(study + "--published-batch 0"), "--published-batch must be in [1,");
  expect_clean_error(cli::run(study + "--strong-batch 0"), "--strong-batch must be >= 1");
  expect_clean_error(cli::run(study + "--ranks 1,2,4 --strong-batch 6"),
                     "--strong-batch 6 does not split into micro-batches of 1 on 4");
  EXPECT_FALSE(fs::exists(out)) << "a refused study wrote " << out;
}

TEST(PerfCli, SimulateWithTrace) {
  auto dir = cli::scratch("simulate");
  auto trace = (dir / "trace.json").string();
  auto r = cli::run(
      "simulate -m gpt-22b -c selene -n 64 -b 64 --grid 2,4,1,8,1 --micro-batch 2 "
      "--schedule interleaved --chunks 2 --trace " +
      trace);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("busy"), std::string::npos);
  EXPECT_NE(r.out.find("simulated"), std::string::npos);
  auto j = nlohmann::json::parse(cli::slurp(trace));
  EXPECT_GT(j["traceEvents"].size(), 100u);
  expect_clean_error(cli::run("simulate -m gpt-22b -c selene -n 64 -b 64 --grid 2,4,1,8,1 "
                              "--schedule interleaved --chunks 2 --micro-batch 3"),
                     "cannot run");
  // option values it cannot use: one line, no trace written
  const std::string sim = "simulate -m gpt2-124m -c dgx-h100 -b 64 ";
  const auto refused_trace = (dir / "refused.json").string();
  expect_clean_error(cli::run(sim + "-n 16 --trace-ranks -1 --trace " + refused_trace),
                     "--trace-ranks: must be a whole number of at least 1, got -1");
  expect_clean_error(cli::run(sim + "-n 16 --trace-ranks 0"),
                     "--trace-ranks: must be a whole number of at least 1");
  EXPECT_FALSE(fs::exists(refused_trace));
  expect_clean_error(cli::run(sim + "-n 2147483647"), "more than the 1048576 devices");
  expect_clean_error(cli::run(sim + "-n 16 --seq -1"), "--seq must be >= 1");
  expect_clean_error(cli::run(sim + "-n 16 --micro-batch -1"),
                     "--micro-batch: must be a whole number of at least 1");
  expect_clean_error(cli::run(sim + "-n 16 --chunks 0"),
                     "--chunks: must be a whole number of at least 1");
  expect_clean_error(cli::run(sim + "-n 16 --zero 4"), "--zero: 4 not in {0,1,2,3}");
  // pp x chunks beyond an int was an internal error (the product wrapped around)
  expect_clean_error(cli::run(sim + "-n 8 --grid 2,2,2,1,1 --schedule interleaved "
                                    "--chunks 2147483647"),
                     "cannot run: layers fewer than pp x chunks");
  expect_clean_error(cli::run(sim + "-n 8 --grid 2,2,2,1,1,1"), "needs 5 sizes (got 6)");
  // a step too long to replay, or a batch whose micro-batches overflow the count (a 2^32 + 64
  // batch was planned as 64 micro-batches at 2e9 % of peak)
  expect_clean_error(
      cli::run("simulate -m gpt2-124m -c dgx-h100 -n 16 --grid 4,4,1,1,1 -b 100000000"),
      "beyond the replay's limits");
  expect_clean_error(cli::run("plan -m gpt2-124m -c dgx-h100 -n 1 -b 4294967360"),
                     "--global-batch must be in [1, 2147483647] sequences (got 4294967360)");
}

TEST(PerfCli, ProbeWritesALoadableClusterFile) {
  auto dir = cli::scratch("probe");
  auto out = (dir / "here.toml").string();
  auto r = cli::run("probe --quick --reps 1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  auto c = tessera::perf::load_cluster(out);
  EXPECT_GT(c.peak_tflops_fp32, 0);
  EXPECT_GT(c.memory_bw_gbps, 0);
  // and the planner runs on it (fp32: the CPU path)
  auto p = cli::run("plan -m gpt2-124m -c " + out + " -n 1 -b 4 --seq 256 --dtype fp32 --top 1");
  EXPECT_EQ(p.code, 0) << p.err;
}

TEST(PerfCli, ShowSchedule) {
  auto r = cli::run("plan --show-schedule 1f1b --pp 4 --micro-batches 8");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int st = 0; st < 4; ++st)
    EXPECT_NE(r.out.find("stage " + std::to_string(st) + " |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("stage 4 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ideal 0.375 = (pp-1)/m = 3/8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0.375 measured"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("schedule check: ok"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;

  // Interleaved: v defaults to 2, a chunk row under each stage; JSON has the lists.
  auto i = cli::run("plan --show-schedule interleaved --pp 2 --micro-batches 4");
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("v=2"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("chunk |"), std::string::npos) << i.out;
  auto j = cli::run("plan --show-schedule interleaved --pp 2 --micro-batches 4 --chunks 3 --json");
  ASSERT_EQ(j.code, 0) << j.err;
  auto js = nlohmann::json::parse(j.out);
  EXPECT_EQ(js["chunks"], 3);
  EXPECT_TRUE(js["check"]["ok"].get<bool>());
  ASSERT_EQ(js["stages"].size(), 2u);
  EXPECT_EQ(js["stages"][0]["instructions"][0]["op"], "F");
  EXPECT_EQ(js["stages"][1]["instructions"].back()["op"], "OPT");
  EXPECT_NEAR(js["stages"][0]["bubble"].get<double>(), js["ideal_bubble"].get<double>(), 1e-12);
}

TEST(PerfCli, ShowScheduleErrors) {
  expect_clean_error(cli::run("plan --show-schedule interleaved --pp 4 --micro-batches 6"),
                     "micro-batches divisible by pp");
  expect_clean_error(cli::run("plan --show-schedule 1f1b --micro-batches 8"), "needs --pp");
  expect_clean_error(cli::run("plan --show-schedule 1f1b"), "--pp and --micro-batches");
  expect_clean_error(cli::run("plan --show-schedule zigzag --pp 2 --micro-batches 2"),
                     "unknown pipeline schedule");
  expect_clean_error(cli::run("plan --show-schedule 1f1b --pp 2 --micro-batches 2 --chunks 2"),
                     "one chunk per stage");
  expect_clean_error(cli::run("plan --show-schedule 1f1b --pp 2 --micro-batches 2 -m gpt-22b"),
                     "--model is not used");
  // Without --show-schedule the planner's flags stay required, and the drawing flags are refused.
  expect_clean_error(cli::run("plan -m gpt-22b -c frontier"),
                     "--gpus and --global-batch are required");
  expect_clean_error(cli::run("plan"), "--model, --cluster, --gpus and --global-batch");
  expect_clean_error(cli::run("plan -m gpt-22b -c frontier -n 8 -b 8 --pp 2"),
                     "only used with --show-schedule");
}
