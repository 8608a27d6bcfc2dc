// The planner driving the trainer: tessera plan --emit-set's line accepted by train and run on the
// grid it names, train with parallel.auto = true choosing and logging its plan, the prediction
// check of every run, and tessera tune ranking measured candidates and resuming.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_util.hpp"
#include "tessera/train/run_config.hpp"

using namespace tessera::test;

namespace {

// tiny.toml's model as a model file of the catalogue's format, for tessera plan.
fs::path tiny_model_file(const fs::path& dir) {
  const auto file = dir / "tiny-model.toml";
  std::ofstream(file) << "name = \"tiny\"\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
                         "vocab_size = 50257\nseq_len = 32\n";
  return file;
}

// The rows of metrics.jsonl whose event is `event`.
std::vector<nlohmann::json> rows(const fs::path& metrics, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::istringstream in(slurp(metrics));
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

// "--set a=1 b=2" -> the value of key `key` ("" if absent).
std::string key_of(const std::string& line, const std::string& key) {
  const auto at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const auto from = at + key.size() + 2;
  return line.substr(from, line.find_first_of(" \n", from) - from);
}

// The line of `text` that starts with `prefix` ("" if none).
std::string line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) return l;
  return "";
}

}  // namespace

// The line of each of two plans (the fastest, and a pipeline fixed with --grid), pasted after
// train: accepted, and the run's resolved config and memory row have the grid the plan named.
TEST(PlanTrain, EmitSetLineRunsThePlansGrid) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const auto dir = scratch("emit_set");
  const auto model = tiny_model_file(dir);
  for (const std::string grid : {"", " --grid 1,2,1,1,1"}) {
    auto plan = sh("'" TESSERA_BIN "' plan --model " + model.string() +
                   " --cluster dgx-h100 --gpus 2 --global-batch 8 --seq 16 --dtype fp32"
                   " --emit-set" +
                   grid);
    ASSERT_EQ(plan.code, 0) << plan.output;
    // stdout's one line (the output holds stderr's description of the plan too)
    const std::string line = line_starting(plan.output, "--set ");
    ASSERT_EQ(line.rfind("--set parallel.dp=", 0), 0u) << plan.output;
    EXPECT_EQ(key_of(line, "train.global_batch"), "8") << line;
    EXPECT_EQ(key_of(line, "train.seq_len"), "16") << line;
    const auto out = dir / ("run" + std::to_string(grid.size()));
    auto run = sh(mpirun(2) + train_args(data, out, 4, 1, 2) + " " + line.substr(6));
    ASSERT_EQ(run.code, 0) << line << "\n" << run.output;
    const auto cfg = tessera::train::load_run_config(out / "config.toml");
    for (const auto& [key, value] : {std::pair{"parallel.dp", cfg.parallel.dp},
                                     {"parallel.pp", cfg.parallel.pp},
                                     {"parallel.tx", cfg.parallel.tx},
                                     {"parallel.ty", cfg.parallel.ty},
                                     {"parallel.tz", cfg.parallel.tz},
                                     {"parallel.zero", cfg.parallel.zero},
                                     {"train.grad_accum", cfg.train.grad_accum}})
      EXPECT_EQ(key_of(line, key), std::to_string(value)) << key << " in " << line;
    const auto memory = rows(out / "metrics.jsonl", "memory");
    ASSERT_FALSE(memory.empty());
    EXPECT_EQ(memory[0]["dp"].get<int>(), cfg.parallel.dp);
    if (!grid.empty()) {
      EXPECT_EQ(cfg.parallel.pp, 2);
    }
  }
}

// parallel.auto = true on 4 ranks: a grid of 4 ranks is chosen and logged with its prediction,
// the run trains, and the prediction is checked against steps 2-4.
TEST(PlanTrain, AutoPlansForTheLaunchedRanks) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const auto out = scratch("auto4");
  auto run = sh(mpirun(4) + train_args(data, out, 4, 1, 5) + " parallel.auto=true");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("parallel.auto: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("; chose dp="), std::string::npos) << run.output;
  const auto cfg = tessera::train::load_run_config(out / "config.toml");
  EXPECT_FALSE(cfg.parallel.automatic);  // the resolved config is the run that ran
  EXPECT_EQ(cfg.parallel.dp * cfg.parallel.pp * cfg.parallel.tx * cfg.parallel.ty * cfg.parallel.tz,
            4);
  EXPECT_EQ(tessera::test::losses(out / "metrics.jsonl").size(), 5u);
  const auto predicted = rows(out / "metrics.jsonl", "prediction");
  ASSERT_EQ(predicted.size(), 1u);
  EXPECT_GT(predicted[0]["step_ms"].get<double>(), 0);
  const auto check = rows(out / "metrics.jsonl", "prediction_check");
  ASSERT_EQ(check.size(), 1u);
  EXPECT_EQ(check[0]["steps"].get<int>(), 3);  // steps 2-4
  // the warning line is there exactly when the row says the prediction is off
  EXPECT_EQ(run.output.find("warning: the performance model is off") != std::string::npos,
            !check[0]["within_tolerance"].get<bool>())
      << run.output;
}

// A run whose cluster file predicts a device far faster than this CPU gets the one warning line.
TEST(PlanTrain, PredictionFarOffWarnsOnce) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const auto out = scratch("warn");
  auto run = sh(mpirun(2) + train_args(data, out, 4, 1, 4) +
                " parallel.dp=2 hardware.cluster=configs/clusters/dgx-h100.toml");
  ASSERT_EQ(run.code, 0) << run.output;
  const auto check = rows(out / "metrics.jsonl", "prediction_check");
  ASSERT_EQ(check.size(), 1u);
  EXPECT_FALSE(check[0]["within_tolerance"].get<bool>());
  const std::string warning = "warning: the performance model is off by more than 25%";
  const auto at = run.output.find(warning);
  ASSERT_NE(at, std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(warning, at + 1), std::string::npos) << "once, from rank 0";
}

// tessera tune on 4 ranks: 4 candidates measured and ranked, the winner no slower than the
// planner's first choice beyond the noise it reports, a fragment train accepts, and a second
// tuning in the same directory reuses every measurement.
TEST(PlanTrain, TuneRanksMeasuredCandidatesAndResumes) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const auto dir = scratch("tune");
  const std::string tune = mpirun(4) +
                           "'" TESSERA_BIN
                           "' tune configs/runs/tiny.toml --top 4 "
                           "--steps 3 --dir " +
                           (dir / "t").string() + " --set 'data.train=\"" +
                           (data / "train.bin").string() + "\"' 'data.val=\"" +
                           (data / "val.bin").string() + "\"'";
  auto first = sh(tune);
  ASSERT_EQ(first.code, 0) << first.output;
  const auto results = nlohmann::json::parse(slurp(dir / "t" / "results.json"))["results"];
  ASSERT_EQ(results.size(), 4u);
  double fastest = 1e30, first_choice = 0, first_noise = 0;
  for (const auto& r : results) {
    EXPECT_GT(r["step_s"].get<double>(), 0);
    EXPECT_GT(r["peak_bytes"].get<double>(), 0);
    fastest = std::min(fastest, r["step_s"].get<double>());
    if (r["predicted_rank"] == 1)
      first_choice = r["step_s"].get<double>(), first_noise = r["noise_s"].get<double>();
  }
  EXPECT_LE(fastest, first_choice + first_noise);
  EXPECT_NE(first.output.find("measured predicted"), std::string::npos) << first.output;
  ASSERT_TRUE(fs::exists(dir / "t" / "best.toml"));
  auto train = sh(mpirun(4) + train_args(data, dir / "winner", 4, 1, 2) + " --set-file " +
                  (dir / "t" / "best.toml").string());
  EXPECT_EQ(train.code, 0) << train.output;

  auto again = sh(tune);
  ASSERT_EQ(again.code, 0) << again.output;
  std::size_t reused = 0;
  for (auto at = again.output.find("not run again"); at != std::string::npos;
       at = again.output.find("not run again", at + 1))
    ++reused;
  EXPECT_EQ(reused, 4u) << again.output;
}
