// A scheduler stopping a 4-rank job: SIGTERM reaches every rank (as Slurm sends it to each task of
// a job step); the ranks agree to stop after the same step, save one checkpoint together and exit
// with code 0, and --resume continues the run from it. (One process: tests/cli.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_util.hpp"
#include "tessera/io/checkpoint.hpp"

using namespace tessera::test;

namespace {

std::vector<int> metric_steps(const fs::path& metrics) {
  std::vector<int> steps;
  std::istringstream in(slurp(metrics));
  for (std::string l; std::getline(in, l);) {
    const auto s = l.find("\"step\":"), loss = l.find("\"loss\":");
    if (s != std::string::npos && loss != std::string::npos)
      steps.push_back(std::stoi(l.substr(s + 7)));
  }
  return steps;
}

}  // namespace

TEST(RunControlParallel, SigtermOnEveryRankSavesOneCheckpointAndResumes) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const auto out = scratch("sigterm4");
  const auto log = out.parent_path() / "sigterm4.log";
  const std::string args = train_args(data, out, 2, 1, 100000) + " parallel.dp=2 parallel.pp=2";
  const std::string cmd = "cd '" TESSERA_SOURCE_DIR "' && exec env " + mpirun(4) + args + " >'" +
                          log.string() + "' 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Until three steps are in the metrics (up to two minutes on a loaded machine).
  for (int i = 0; i < 1200 && metric_steps(out / "metrics.jsonl").size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(metric_steps(out / "metrics.jsonl").size(), 3u) << slurp(log);
  const auto kids = sh("pgrep -P " + std::to_string(pid) + " -f 'tessera train'");
  std::istringstream ks(kids.output);
  std::vector<int> ranks;
  for (int p; ks >> p;) ranks.push_back(p);
  ASSERT_EQ(ranks.size(), 4u) << kids.output;
  for (int p : ranks) ::kill(p, SIGTERM);
  int st = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
      ::kill(pid, SIGKILL);
      FAIL() << "the job did not stop within 120 s of SIGTERM\n" << slurp(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << slurp(log);
  const std::string text = slurp(log);
  EXPECT_NE(text.find("stopped by SIGTERM after step"), std::string::npos) << text;
  const auto steps = metric_steps(out / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  const int last = steps.back();
  for (std::size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<int>(i) + 1);
  const auto latest = tessera::io::latest_checkpoint(out / "checkpoints");
  ASSERT_TRUE(latest.has_value()) << text;
  EXPECT_EQ(latest->filename().string(),
            "step_" + std::string(8 - std::to_string(last).size(), '0') + std::to_string(last));
  // The checkpoint was written by all four ranks together: the run resumes on four ranks.
  auto r = sh(mpirun(4) + args + " --resume --stop-at " + std::to_string(last + 2));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto after = metric_steps(out / "metrics.jsonl");
  ASSERT_EQ(after.size(), static_cast<std::size_t>(last + 2)) << r.output;
  EXPECT_EQ(after.back(), last + 2);
}
