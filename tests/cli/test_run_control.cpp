// Operating a run, as a user (or a batch scheduler) does it to the `tessera` binary: SIGTERM and
// SIGUSR1 stop a run after its current step with a checkpoint, --time-limit stops it before a
// wall-clock limit the same way, and a loss spike rolls the run back to its newest checkpoint and
// skips the data window that caused it. (Resume guards: test_bad_input.cpp; 4 ranks:
// tests/parallel/test_run_control_parallel.cpp.)
//
// The data is a made-up language of 64 token ids: a fixed random successor for each id, so a tiny
// model learns it within a few dozen steps and its loss then stays low and steady. A garbage
// window (the same ids in another order) makes a spike at a step the test chooses.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/checkpoint.hpp"

namespace fs = std::filesystem;

namespace {

constexpr int k_vocab = 64, k_B = 4, k_T = 16;  // a step reads B*T = 64 tokens

// `n` tokens of the language; the targets of the steps in `garbage` (1-based) follow another
// successor table instead. Step s reads tokens (s-1)*64 .. s*64: its targets are the last 64.
std::vector<std::uint32_t> language(std::size_t n, const std::set<int>& garbage) {
  // The successors form one cycle through 61 of the ids (the other three lead into it), so the
  // text visits them all, also after a garbage window, and a cycle prime to the 16 positions of
  // a row puts every id at every position (the model must learn the successors, not the
  // positions); the garbage successors are a random permutation of all 64.
  constexpr int k_cycle = 61;
  std::mt19937 rng(7);
  std::vector<std::uint32_t> order(k_vocab), next(k_vocab), bad(k_vocab);
  std::iota(order.begin(), order.end(), 0);
  std::iota(bad.begin(), bad.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::shuffle(bad.begin(), bad.end(), rng);
  for (int k = 0; k < k_vocab; ++k) next[order[k]] = order[k + 1 < k_cycle ? k + 1 : 0];
  std::vector<std::uint32_t> t(n);
  t[0] = order[0];
  for (std::size_t i = 1; i < n; ++i) {
    const int step = static_cast<int>((i - 1) / (k_B * k_T)) + 1;
    t[i] = (garbage.contains(step) ? bad : next)[t[i - 1]];
  }
  return t;
}

// `key` of every step row (rows with a step and a loss) of metrics.jsonl, in file order.
std::vector<double> step_values(const fs::path& metrics, const char* key) {
  std::vector<double> values;
  std::ifstream in(metrics);
  for (std::string l; std::getline(in, l);) {
    const auto row = nlohmann::json::parse(l, nullptr, false);
    if (!row.is_discarded() && row.contains("step") && row.contains("loss"))
      values.push_back(row[key].get<double>());
  }
  return values;
}

std::vector<int> metric_steps(const fs::path& metrics) {
  const auto v = step_values(metrics, "step");
  return std::vector<int>(v.begin(), v.end());
}

std::vector<int> one_to(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 1);
  return v;
}

class RunControl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = cli::scratch("run_control_data");
    tessera::data::write_shard(data_ / "train.bin", language(64 * 200 + 1, {}));
    tessera::data::write_shard(data_ / "val.bin", language(64 * 8 + 1, {}));
  }
  // A run trained with a model's own tokenizer (a small GGUF vocabulary of the fuzz seeds, with
  // `vocab` tokens) saves it beside each checkpoint as `file`, so the checkpoint samples without
  // --tokenizer (GPT-2's default would not fit its vocabulary).
  static void expect_checkpoints_carry(const std::string& name, const std::string& seed, int vocab,
                                       const std::string& file) {
    const auto out = cli::scratch(name);
    const std::string tok = TESSERA_SOURCE_DIR "/tests/fuzz/corpus/gguf/" + seed;
    auto r = cli::run(
        train(out, 1, fmt::format("model.vocab_size={} 'data.tokenizer=\"{}\"'", vocab, tok)));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto latest = tessera::io::latest_checkpoint(out / "checkpoints");
    ASSERT_TRUE(latest.has_value());
    for (const char* f : {"tokenizer.json", "tokenizer.gguf"})
      EXPECT_EQ(fs::exists(*latest / f), file == f) << f;
    auto s = cli::run("sample --model " + out.string() + " --prompt ab --tokens 3 --temperature 0");
    EXPECT_EQ(s.code, 0) << s.err;
  }
  static std::string train(const fs::path& out, int steps, const std::string& extra = "",
                           const fs::path& shard = {}) {
    return fmt::format(
        "train --config configs/runs/tiny.toml --quiet --set model.n_layer=1 model.vocab_size={} "
        "model.block_size={} train.seq_len={} train.batch_size={} train.val_every=0 "
        "sample.tokens=0 hardware.peak_tflops=1 train.lr=1e-2 train.warmup_steps=2 "
        "train.steps={} 'data.train=\"{}\"' 'data.val=\"{}\"' 'train.out_dir=\"{}\"' {}",
        k_vocab, k_T, k_T, k_B, steps, (shard.empty() ? data_ / "train.bin" : shard).string(),
        (data_ / "val.bin").string(), out.string(), extra);
  }
  // Waits (up to two minutes: a loaded machine is slow) until `metrics` has `n` step rows.
  static bool wait_for_steps(const fs::path& metrics, std::size_t n) {
    for (int i = 0; i < 2400; ++i) {
      if (fs::exists(metrics) && metric_steps(metrics).size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  static int exit_code(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  static inline fs::path data_;
};

fs::path checkpoint_of(const fs::path& out, int step) {
  return out / "checkpoints" / fmt::format("step_{:08d}", step);
}

}  // namespace

// SIGTERM (a scheduler's "you are about to be killed") and SIGUSR1 (Slurm's --signal warning)
// end the step in progress, save a checkpoint of it and exit with code 0; --resume continues.
TEST_F(RunControl, StopSignalSavesACheckpointAndResumeContinues) {
  for (int sig : {SIGTERM, SIGUSR1}) {
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGUSR1";
    SCOPED_TRACE(name);
    const auto out = cli::scratch("signal_" + name);
    const fs::path err_file = out.parent_path() / (name + ".err");
    const pid_t pid = cli::spawn(train(out, 100000), ">/dev/null 2>'" + err_file.string() + "'");
    ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 3));
    kill(pid, sig);
    EXPECT_EQ(exit_code(pid), 0);
    const std::string err = cli::slurp(out.parent_path() / (name + ".err"));
    EXPECT_NE(err.find("stopped by " + name + " after step"), std::string::npos) << err;
    const auto latest = tessera::io::latest_checkpoint(out / "checkpoints");
    ASSERT_TRUE(latest.has_value()) << err;
    const auto steps = metric_steps(out / "metrics.jsonl");
    ASSERT_FALSE(steps.empty());
    const int last = steps.back();
    EXPECT_EQ(steps, one_to(last));
    EXPECT_EQ(*latest, checkpoint_of(out, last)) << "the checkpoint is of the last step run";
    auto r = cli::run(train(out, 100000, fmt::format("--resume --stop-at {}", last + 2)));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(last + 2));
  }
}

// --time-limit stops the run with a checkpoint before the limit (the next step and the save
// must fit); a limit that is not a duration is refused before any work.
TEST_F(RunControl, TimeLimitStopsWithACheckpoint) {
  const auto out = cli::scratch("time_limit");
  auto r = cli::run(train(out, 100000, "--time-limit 0:03"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("stopped by --time-limit after step"), std::string::npos) << r.err;
  const auto steps = metric_steps(out / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(tessera::io::latest_checkpoint(out / "checkpoints"), checkpoint_of(out, steps.back()));
  for (const char* bad : {"abc", "0", "1:2:3:4", "-5", "1::2"})
    cli::expect_clean_error(
        cli::run(train(cli::scratch("time_limit_bad"), 2, std::string("--time-limit ") + bad)),
        "--time-limit");
}

// A garbage window at step 45 makes the loss jump: the run reloads its checkpoint of step 40,
// replays steps 41-44 exactly as they ran, skips step 45's window (step 45 trains on the next
// one) and finishes. The metrics hold each step once and a "rollback" row.
TEST_F(RunControl, LossSpikeRollsBackToTheCheckpointAndSkipsTheWindow) {
  const auto out = cli::scratch("spike");
  const fs::path shard = out.parent_path() / "spike_train.bin";
  tessera::data::write_shard(shard, language(64 * 80 + 1, {45}));
  const std::string spike = "train.spike_factor=3 train.spike_window=5 train.ckpt_every=10 ";
  auto r = cli::run(train(out, 60, spike, shard));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("loss spike at step 45"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rolled back to step 40, skipping the data window of step 45"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(60));
  const std::string m = cli::slurp(out / "metrics.jsonl");
  EXPECT_NE(m.find("\"event\":\"rollback\""), std::string::npos) << m;
  // Replayed steps are the steps that ran: the same losses as a run without the garbage up to
  // step 44 (the windows before the garbage are the same).
  const auto clean = cli::scratch("spike_clean");
  ASSERT_EQ(cli::run(train(clean, 60, spike + "--stop-at 44")).code, 0);
  const auto a = step_values(out / "metrics.jsonl", "loss"),
             b = step_values(clean / "metrics.jsonl", "loss");
  ASSERT_EQ(b.size(), 44u);
  for (int i = 0; i < 44; ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

// Garbage that does not end (each rollback at the same step skips one more window): after
// train.spike_retries rollbacks the run gives up with one error
// line (exit code 2); without a checkpoint to go back to it says so.
TEST_F(RunControl, RepeatedSpikesGiveUpAfterTheRetries) {
  const auto out = cli::scratch("spike_forever");
  const fs::path shard = out.parent_path() / "spike_forever_train.bin";
  std::set<int> garbage;
  for (int s = 45; s <= 80; ++s) garbage.insert(s);
  tessera::data::write_shard(shard, language(64 * 80 + 1, garbage));
  auto r = cli::run(
      train(out, 60,
            "train.spike_factor=3 train.spike_window=5 train.ckpt_every=10 train.spike_retries=2",
            shard));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: loss spike at step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("giving up after 2 rollbacks"), std::string::npos) << r.err;
  auto none = cli::run(
      train(cli::scratch("spike_no_ckpt"), 60, "train.spike_factor=3 train.spike_window=5", shard));
  EXPECT_EQ(none.code, 2) << none.err;
  EXPECT_NE(none.err.find("no checkpoint to roll back to"), std::string::npos) << none.err;
}

// Byte-level BPE (SmolLM-style) as tokenizer.json; SentencePiece read from GGUF (Llama 2's kind)
// as tokenizer.gguf, the form that keeps its merges by score.
TEST_F(RunControl, CheckpointsCarryTheRunsOwnTokenizer) {
  expect_checkpoints_carry("own_tokenizer", "tokenizer_smollm.gguf", 259, "tokenizer.json");
  expect_checkpoints_carry("spm_tokenizer", "tokenizer_spm.gguf", 142, "tokenizer.gguf");
  // GPT-2's own tokenizer is not copied into every checkpoint.
  const auto gpt2 = cli::scratch("gpt2_tokenizer");
  ASSERT_EQ(cli::run(train(gpt2, 1, "model.vocab_size=50257")).code, 0);
  EXPECT_FALSE(fs::exists(checkpoint_of(gpt2, 1) / "tokenizer.json"));
}
