// Data parallelism and ZeRO under mpirun, end to end: the tessera binary is launched as a user
// would launch it, and its per-step losses and final weights are compared with the
// single-process run of the same global batch.
//
// Bounds. Data parallelism changes only the order of the gradient sums (per-rank partial sums,
// then the all-reduce / reduce-scatter), so the loss of every step agrees to ~1e-7 relative;
// the acceptance bound is 1e-5 relative. Final parameters after 20 AdamW steps: a reordered sum
// changes a gradient by ~1e-7 relative; AdamW's update m/sqrt(v) is scale-free, so for elements
// whose gradient is pure round-off (e.g. the key bias, whose true gradient is 0) the update
// direction itself is noise of size lr per step. Hence an absolute bound of 20 steps x lr (1e-3)
// = 2e-2 for such elements would be the worst case; we assert the much tighter 99.9th percentile
// |diff| <= 1e-5 and max |diff| <= 2e-2 (the latter bounded by the argument above).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_util.hpp"
#include "tessera/io/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace tessera::test;

class DataParallel : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
};

// 20 steps, global batch 8 x accum: single process with B=8 against dp x (8/dp) for every
// dp in {1, 2, 4} and ZeRO stage in {0, 1, 2, 3}.
TEST_P(DataParallel, LossesAndWeightsEqualSingleProcess) {
  const int accum = GetParam();
  const auto data = data_dir();
  auto ref = scratch("ref_a" + std::to_string(accum));
  auto r = sh(train_args(data, ref, 8, accum, 20));
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(losses(ref / "metrics.jsonl").size(), 20u);
  for (int dp : {1, 2, 4})
    for (int zero : {0, 1, 2, 3}) {
      auto out = scratch("dp" + std::to_string(dp) + "_z" + std::to_string(zero) + "_a" +
                         std::to_string(accum));
      auto run = sh(mpirun(dp) + train_args(data, out, 8 / dp, accum, 20) + " parallel.dp=" +
                    std::to_string(dp) + " parallel.zero=" + std::to_string(zero));
      ASSERT_EQ(run.code, 0) << "dp=" << dp << " zero=" << zero << "\n" << run.output;
      expect_same_run(ref, out,
                      "dp=" + std::to_string(dp) + " zero=" + std::to_string(zero) +
                          " accum=" + std::to_string(accum));
    }
}
INSTANTIATE_TEST_SUITE_P(Accumulation, DataParallel, ::testing::Values(1, 4));

// The same for a llama model (4 heads over 2 key-value heads, SwiGLU, untied head): data
// parallelism and ZeRO work on the flat buffer whatever the family, under the same bounds.
TEST(DataParallelLlama, LossesAndWeightsEqualSingleProcess) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const std::string llama =
      " model.family=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=48"
      " model.tie_embeddings=false";
  const auto data = data_dir();
  auto ref = scratch("llama_ref");
  auto r = sh(train_args(data, ref, 8, 1, 20) + llama);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(losses(ref / "metrics.jsonl").size(), 20u);
  for (int dp : {2, 4})
    for (int zero : {0, 1, 2, 3}) {
      auto out = scratch("llama_dp" + std::to_string(dp) + "_z" + std::to_string(zero));
      auto run = sh(mpirun(dp) + train_args(data, out, 8 / dp, 1, 20) + llama + " parallel.dp=" +
                    std::to_string(dp) + " parallel.zero=" + std::to_string(zero));
      ASSERT_EQ(run.code, 0) << "dp=" << dp << " zero=" << zero << "\n" << run.output;
      expect_same_run(ref, out, "llama dp=" + std::to_string(dp) + " zero=" + std::to_string(zero));
    }
}

TEST(Resharding, SaveAtDp4Zero3ResumeAtDp2Zero1AndDp1) {
  if (!have_tokenizer()) GTEST_SKIP();
  const auto data = data_dir();
  auto ref = scratch("reshard_ref");
  ASSERT_EQ(sh(train_args(data, ref, 8, 1, 20)).code, 0);
  auto ref_losses = losses(ref / "metrics.jsonl");
  for (auto [dp, zero] : {std::pair{2, 1}, {1, 0}, {4, 2}}) {
    auto out = scratch("reshard_" + std::to_string(dp) + "_" + std::to_string(zero));
    auto first = sh(mpirun(4) + train_args(data, out, 2, 1, 20) +
                    " parallel.dp=4 parallel.zero=3 --stop-at 10");
    ASSERT_EQ(first.code, 0) << first.output;
    auto second = sh(mpirun(dp) + train_args(data, out, 8 / dp, 1, 20) + " parallel.dp=" +
                     std::to_string(dp) + " parallel.zero=" + std::to_string(zero) + " --resume");
    ASSERT_EQ(second.code, 0) << second.output;
    auto got = losses(out / "metrics.jsonl");
    ASSERT_EQ(got.size(), 20u);
    for (int i = 10; i < 20; ++i)
      EXPECT_LE(std::fabs(got[i] - ref_losses[i]), 1e-5 * ref_losses[i])
          << "dp=" << dp << " step " << i + 1;
  }
}

// The bytes each rank holds match the ZeRO accounting for fp32 training (Psi = parameters in the
// flat buffer, N = dp, S = ceil(Psi/N), rank 0's shard): stage 0 holds 4Psi + 4Psi + 8Psi =
// 16Psi; stage 1: 4Psi + 4Psi + 8S = 8Psi + 8Psi/N; stage 2: 4Psi + 4S + 8S = 4Psi + 12Psi/N;
// stage 3: 4S + 4S + 8S = 16Psi/N. Stages 2 and 3 also hold transient staging buffers (the
// gradients of blocks in flight, the gathered block in use and the prefetched one), reported
// separately as transient_bytes. Read from the buffers the trainer allocated (metrics.jsonl).
TEST(ZeroMemory, PerRankBytesMatchTheAccounting) {
  if (!have_tokenizer()) GTEST_SKIP();
  const auto data = data_dir();
  for (int zero : {0, 1, 2, 3}) {
    auto out = scratch("memory" + std::to_string(zero));
    auto r = sh(mpirun(4) + train_args(data, out, 2, 1, 1) +
                " parallel.dp=4 parallel.zero=" + std::to_string(zero));
    ASSERT_EQ(r.code, 0) << r.output;
    std::istringstream in(slurp(out / "metrics.jsonl"));
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    ASSERT_NE(line.find("\"event\":\"memory\""), std::string::npos) << line;
    auto num = [&](const std::string& key) {
      auto a = line.find("\"" + key + "\":");
      EXPECT_NE(a, std::string::npos) << key;
      return std::stoull(line.substr(a + key.size() + 3));
    };
    const unsigned long long psi = num("param_count"), n = 4;
    const unsigned long long S = (psi + n - 1) / n;
    // Buffers are allocated in 64-byte multiples: compare with the accounting rounded the same way.
    auto r64 = [](unsigned long long b) { return (b + 63) / 64 * 64; };
    EXPECT_EQ(num("params_bytes"), r64(4 * (zero < 3 ? psi : S))) << "zero=" << zero;
    EXPECT_EQ(num("grads_bytes"), r64(4 * (zero < 2 ? psi : S))) << "zero=" << zero;
    EXPECT_EQ(num("optimizer_bytes"), 2 * r64(4 * (zero == 0 ? psi : S))) << "zero=" << zero;
    const double total =
        static_cast<double>(num("params_bytes") + num("grads_bytes") + num("optimizer_bytes"));
    const double model = zero == 0   ? 16.0 * psi
                         : zero == 1 ? 8.0 * psi + 8.0 * psi / n
                         : zero == 2 ? 4.0 * psi + 12.0 * psi / n
                                     : 16.0 * psi / n;
    EXPECT_NEAR(total / model, 1.0, 1e-4) << "zero=" << zero;
    if (zero < 2) {
      EXPECT_EQ(num("transient_bytes"), 0u) << "zero=" << zero;
    }
  }
}

TEST(ParallelGrid, BadGridsAreRejectedBeforeAnyWork) {
  if (!have_tokenizer()) GTEST_SKIP();
  const auto data = data_dir();
  struct Case {
    int n;
    std::string set, needle;
  };
  for (const auto& c : std::vector<Case>{
           {2, "parallel.dp=4", "has 4 ranks but the job has 2"},
           {4, "parallel.ty=4", "n_head=2 is not divisible by ty=4"},
           {2, "parallel.zero=7", "parallel.zero"},
           {4, "parallel.dp=2 parallel.ty=2 parallel.sequence_parallel=true",
            "sequence_parallel needs 1D tensor parallelism over tx"},
           {2, "parallel.tz=2 train.batch_size=3", "not divisible by parallel.tz=2"},
           {4, "parallel.dp=4 train.global_batch=10",
            "train.global_batch=10 is not divisible by grad_accum x parallel.dp"},
       }) {
    auto out = scratch("badgrid");
    auto r = sh(mpirun(c.n) + train_args(data, out, 2, 1, 5) + " " + c.set);
    EXPECT_NE(r.code, 0) << c.set;
    // our one error line, printed once (rank 0), naming the problem
    std::size_t count = 0, pos = 0;
    while ((pos = r.output.find("error: ", pos)) != std::string::npos) ++count, ++pos;
    EXPECT_EQ(count, 1u) << c.set << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.set << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "no work may start: " << c.set;
  }
}

TEST(FailFast, KilledRankEndsTheJobWithItsName) {
  if (!have_tokenizer()) GTEST_SKIP();
  const auto data = data_dir();
  auto out = scratch("fault");
  auto log = out / "mpirun.log";
  std::string cmd = "cd '" TESSERA_SOURCE_DIR "' && exec env " + mpirun(4) +
                    train_args(data, out, 2, 1, 100000) + " parallel.dp=4 >'" + log.string() +
                    "' 2>&1";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until training runs, then SIGKILL one rank (a child of mpirun).
  for (int i = 0; i < 100 && !fs::exists(out / "metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto kids = sh("pgrep -P " + std::to_string(pid) + " -f 'tessera train'");
  std::istringstream ks(kids.output);
  std::vector<int> pids;
  for (int p; ks >> p;) pids.push_back(p);
  ASSERT_GE(pids.size(), 2u) << kids.output;
  // Which rank is it? Open MPI puts it in the process's environment.
  std::string env = slurp("/proc/" + std::to_string(pids[1]) + "/environ");
  std::string killed_rank;
  for (std::size_t a = 0; a < env.size();) {
    std::size_t e = env.find('\0', a);
    if (e == std::string::npos) e = env.size();
    std::string var = env.substr(a, e - a);
    if (var.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) killed_rank = var.substr(21);
    a = e + 1;
  }
  ASSERT_FALSE(killed_rank.empty());
  ::kill(pids[1], SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      ::kill(pid, SIGKILL);
      FAIL() << "the job did not end within 60 s of a rank's death";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(!WIFEXITED(st) || WEXITSTATUS(st) != 0) << "mpirun must exit non-zero";
  std::string text = slurp(log);
  EXPECT_NE(text.find("rank " + killed_rank + " "), std::string::npos)
      << "the message must name the dead rank " << killed_rank << "\n"
      << text;
  EXPECT_LT(secs, 60.0);
  // No rank outlives the job (a rank being torn down may take a moment; zombies count as gone).
  auto alive = [](int p) {
    std::string stat = slurp("/proc/" + std::to_string(p) + "/stat");
    auto rp = stat.rfind(')');
    return !stat.empty() && rp != std::string::npos && rp + 2 < stat.size() && stat[rp + 2] != 'Z';
  };
  for (int p : pids) {
    for (int i = 0; i < 100 && alive(p); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(alive(p)) << "rank process " << p << " still running 10 s after the job ended";
  }
}
