// `tessera study memorization` end to end.
// From scratch, on a tiny corpus and model: both arms run, and the summary (Markdown, CSV) and
// the per-document CSVs are written with one row per document; a Llama model runs too.
// With --model, on the tiny Llama fixture (grouped-query attention, 100 tokens, 16 positions): the
// pretrained row and the three arms run and are written; the control trains on documents that
// share no window with the targets.
// SIGTERM ends the whole study, not just the arm it arrived in.
// Bad options and input (a shard of another vocabulary, documents not divisible by the batch or
// longer than the model's context) give one error line and exit 2 before any training.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.hpp"
#include "tessera/data/shard.hpp"

namespace fs = std::filesystem;

namespace {

std::size_t count_lines(const std::string& s) {
  std::size_t n = 0;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) ++n;
  return n;
}

// A run refused before any training: exit 2, one line "error: ..." holding `needle`.
void expect_one_error_line(const cli::Result& r, const fs::path& out, const std::string& extra,
                           const std::string& needle) {
  EXPECT_EQ(r.code, 2) << extra << "\n" << r.err;
  auto lines = r.err_lines();
  ASSERT_EQ(lines.size(), 1u) << extra << "\n" << r.err;
  EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
  EXPECT_FALSE(fs::exists(out / "standard")) << "no training may start: " << extra;
}

class StudyMemorization : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!cli::have_tokenizer()) return;
    data_ = cli::scratch("memo_data");
    cli::make_corpus(data_);
    auto r = cli::run("prepare --corpus text --input " + (data_ / "corpus.txt").string() + " " +
                      (data_ / "corpus2.txt").string() + " --val-every 2 --out " + data_.string());
    ASSERT_EQ(r.code, 0) << r.err;
  }
  void SetUp() override {
    if (!cli::have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
  static std::string args(const fs::path& out) {
    return "study memorization --quiet --corpus " + (data_ / "train.bin").string() + " --val " +
           (data_ / "val.bin").string() + " --out " + out.string() +
           " --docs 8 --batch 4 --epochs 2 --n-layer 1 --n-head 2 --n-embd 32 --doc-tokens 32 "
           "--suffix 8 --val-batches 1 --threads 2";
  }
  static inline fs::path data_;
};

}  // namespace

// SIGTERM (a scheduler's warning) during an arm's training ends the whole study: its training
// stops after the step in progress, and the study exits with one error line instead of going on
// to the next arm (it does not resume; the error says it starts afresh).
TEST_F(StudyMemorization, StopSignalEndsTheStudy) {
  auto out = cli::scratch("memo_signal");
  const fs::path err = out.parent_path() / "memo_signal.err";
  std::string a = args(out);
  a.replace(a.find("--epochs 2"), 10, "--epochs 100000");
  const pid_t pid = cli::spawn(a, ">/dev/null 2>'" + err.string() + "'");
  bool training = false;  // the first arm has written a step row (up to two minutes)
  for (int i = 0; i < 2400 && !training; ++i) {
    training = cli::slurp(out / "standard" / "metrics.jsonl").find("\"loss\"") != std::string::npos;
    if (!training) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGTERM);
  int st = 0, waited = 0;
  while (waitpid(pid, &st, WNOHANG) == 0 && waited++ < 1200)  // up to two minutes
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (waited > 1200) kill(pid, SIGKILL), waitpid(pid, &st, 0);
  ASSERT_TRUE(training) << cli::slurp(err);
  ASSERT_TRUE(WIFEXITED(st)) << (waited > 1200 ? "the study did not stop within two minutes"
                                               : "killed by the signal")
                             << "\n"
                             << cli::slurp(err);
  EXPECT_EQ(WEXITSTATUS(st), 2) << cli::slurp(err);
  EXPECT_NE(cli::slurp(err).find("error: the study stopped by SIGTERM while training standard"),
            std::string::npos)
      << cli::slurp(err);
  EXPECT_FALSE(fs::exists(out / "goldfish")) << "the next arm must not start";
}

TEST_F(StudyMemorization, BothArmsRunAndWriteTheirTables) {
  auto out = cli::scratch("memo_out");
  auto r = cli::run(args(out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| standard |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| Goldfish k=4 h=13 |"), std::string::npos) << r.out;
  const auto csv = cli::slurp(out / "summary.csv");
  EXPECT_EQ(count_lines(csv), 3u) << csv;  // header + two arms
  EXPECT_EQ(csv.rfind("arm,goldfish_k,documents,", 0), 0u) << csv;
  for (const char* arm : {"standard", "goldfish"}) {
    EXPECT_EQ(count_lines(cli::slurp(out / arm / "memorization.csv")), 9u) << arm;
    EXPECT_TRUE(fs::exists(out / arm / "metrics.jsonl")) << arm;
  }
  // The Goldfish arm trained on fewer targets than the standard one.
  const auto gm = cli::slurp(out / "goldfish" / "metrics.jsonl");
  EXPECT_NE(gm.find("\"goldfish_kept\""), std::string::npos);
  EXPECT_TRUE(fs::exists(out / "summary.md"));
}

TEST_F(StudyMemorization, BadOptionsAreOneErrorLine) {
  struct Case {
    std::string extra, needle;
  };
  for (const auto& c : {Case{"--suffix 40", "--suffix 40 must be smaller than --doc-tokens 32"},
                        Case{"--docs 7", "--docs 7 is not divisible by --batch 4"},
                        Case{"--goldfish-k 1", "--goldfish-k must be >= 2"},
                        Case{"--corpus /nonexistent.bin", "/nonexistent.bin does not exist"}}) {
    auto out = cli::scratch("memo_bad");
    expect_one_error_line(cli::run(args(out) + " " + c.extra), out, c.extra, c.needle);
  }
}

namespace {

std::vector<std::uint32_t> read_shard(const fs::path& p) {
  tessera::data::ShardReader r(p);
  std::vector<std::uint32_t> v(r.size());
  if (!v.empty()) r.read(0, v.size(), v.data());
  return v;
}

constexpr int k_doc_tokens = 16;  // the fixture's context

class StudyMemorizationModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = cli::scratch("memo_model_data");
    // Shards of the fixture's vocabulary (ids < 100): a seeded pseudo-random stream, so that no
    // two windows of 16 tokens are equal.
    std::vector<std::uint32_t> train(4000), val(400);
    std::uint64_t x = 88172645463325252ull;
    auto next = [&] {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      return static_cast<std::uint32_t>(x % 100);
    };
    for (auto& t : train) t = next();
    for (auto& t : val) t = next();
    tessera::data::write_shard(data_ / "train.bin", train);
    tessera::data::write_shard(data_ / "val.bin", val);
    if (!cli::have_tokenizer()) return;
    cli::make_corpus(data_);  // GPT-2 shards: the vocabulary mismatch, and llama from scratch
    auto r = cli::run("prepare --corpus text --input " + (data_ / "corpus.txt").string() + " " +
                      (data_ / "corpus2.txt").string() + " --val-every 2 --out " +
                      (data_ / "gpt2").string());
    ASSERT_EQ(r.code, 0) << r.err;
  }
  void SetUp() override {
    // The word ROUGE-L decodes with GPT-2's tokenizer (the fixture has none of its own).
    if (!cli::have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
  static std::string args(const fs::path& out) {
    return "study memorization --quiet --model " TESSERA_FIXTURES "/llama_tiny --corpus " +
           (data_ / "train.bin").string() + " --val " + (data_ / "val.bin").string() + " --out " +
           out.string() +
           " --docs 4 --batch 2 --epochs 2 --doc-tokens 16 --suffix 4 --lr 1e-3 "
           "--val-batches 1 --threads 2";
  }
  static inline fs::path data_;
};

}  // namespace

TEST_F(StudyMemorizationModel, PretrainedRowAndThreeArms) {
  auto out = cli::scratch("memo_model_out");
  auto r = cli::run(args(out));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* row :
       {"| before (pretrained) | - |", "| standard | targets |", "| Goldfish k=4 h=13 | targets |",
        "| control (standard loss, other documents) | other documents |"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  const auto csv = cli::slurp(out / "summary.csv");
  EXPECT_EQ(count_lines(csv), 5u) << csv;  // header, before and three arms
  EXPECT_NE(cli::slurp(out / "summary.svg").find("<svg"), std::string::npos);
  for (const char* arm : {"before", "standard", "goldfish", "control"})
    EXPECT_EQ(count_lines(cli::slurp(out / arm / "memorization.csv")), 5u) << arm;
  for (const char* arm : {"standard", "goldfish", "control"})
    EXPECT_TRUE(fs::exists(out / arm / "metrics.jsonl")) << arm;

  // The control trained on its own shard, which holds no target document anywhere.
  EXPECT_NE(cli::slurp(out / "control" / "config.toml").find("control_docs.bin"),
            std::string::npos);
  EXPECT_EQ(cli::slurp(out / "standard" / "config.toml").find("control_docs.bin"),
            std::string::npos);
  const auto targets = read_shard(out / "docs.bin");
  const auto control = read_shard(out / "control_docs.bin");
  ASSERT_EQ(targets.size(), 4u * k_doc_tokens + 1);
  ASSERT_EQ(control.size(), 4u * k_doc_tokens + 1);
  for (int d = 0; d < 4; ++d) {
    const auto doc = targets.begin() + d * k_doc_tokens;
    EXPECT_EQ(std::search(control.begin(), control.end(), doc, doc + k_doc_tokens), control.end())
        << "target document " << d << " is in the control's training shard";
  }
}

TEST_F(StudyMemorizationModel, AllMasksAddTheStaticAndRandomArms) {
  auto out = cli::scratch("memo_model_masks");
  auto r = cli::run(args(out) + " --all-masks --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| Goldfish static k=4 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| Goldfish random k=4 |"), std::string::npos) << r.out;
  EXPECT_EQ(count_lines(cli::slurp(out / "summary.csv")), 7u);
}

TEST_F(StudyMemorizationModel, LlamaFromScratch) {
  auto out = cli::scratch("memo_llama_scratch");
  auto r = cli::run(
      "study memorization --quiet --family llama --n-layer 1 --n-head 2 "
      "--n-kv-head 1 --n-embd 32 --corpus " +
      (data_ / "gpt2" / "train.bin").string() + " --val " + (data_ / "gpt2" / "val.bin").string() +
      " --out " + out.string() +
      " --docs 4 --batch 2 --epochs 2 --doc-tokens 16 --suffix 4 --val-batches 1 "
      "--threads 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model llama L=1 H=2 KV=1 C=32 F=128 T=16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| standard |"), std::string::npos) << r.out;
  EXPECT_EQ(count_lines(cli::slurp(out / "summary.csv")), 3u);  // no control without --control
}

TEST_F(StudyMemorizationModel, BadInputIsOneErrorLine) {
  struct Case {
    std::string extra, needle;
  };
  const std::string gpt2_train = (data_ / "gpt2" / "train.bin").string();
  for (const auto& c :
       {Case{"--corpus " + gpt2_train, "outside the vocabulary of --model"},
        Case{"--docs 5", "--docs 5 is not divisible by --batch 2"},
        Case{"--doc-tokens 32 --suffix 4", "--doc-tokens 32 is longer than the context"},
        Case{"--model /nonexistent/model", "/nonexistent/model"}}) {
    auto out = cli::scratch("memo_model_bad");
    expect_one_error_line(cli::run(args(out) + " " + c.extra), out, c.extra, c.needle);
  }
  // The vocabulary mismatch names the way out.
  auto r = cli::run(args(cli::scratch("memo_model_vocab")) + " --corpus " + gpt2_train);
  EXPECT_NE(r.err.find("(hint: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tessera prepare --tokenizer"), std::string::npos) << r.err;
}
