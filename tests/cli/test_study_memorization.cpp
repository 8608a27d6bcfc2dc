// `tessera study memorization` end to end on a tiny corpus and model: both arms run, and the
// summary (Markdown, CSV) and the per-document CSVs are written with one row per document; bad
// options give one error line and exit 2 before any training.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "cli_util.hpp"

namespace fs = std::filesystem;

namespace {

std::size_t count_lines(const std::string& s) {
  std::size_t n = 0;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) ++n;
  return n;
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
    auto r = cli::run(args(out) + " " + c.extra);
    EXPECT_EQ(r.code, 2) << c.extra << "\n" << r.err;
    auto lines = r.err_lines();
    ASSERT_EQ(lines.size(), 1u) << c.extra << "\n" << r.err;
    EXPECT_NE(lines[0].find(c.needle), std::string::npos) << lines[0];
    EXPECT_FALSE(fs::exists(out / "standard")) << "no training may start: " << c.extra;
  }
}
