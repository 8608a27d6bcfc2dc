// `cmake --install` to a prefix, then the installed binary from a directory outside the
// repository: its default paths (data/gpt2, configs/...) resolve under PREFIX/share/tessera, so
// tokenize, train, sample and eval work as they do in the repository.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_util.hpp"

namespace fs = std::filesystem;

namespace {

// Runs `cmd` in `dir` with the environment's TESSERA_HOME unset; stdout and stderr captured.
cli::Result run_in(const fs::path& dir, const std::string& cmd) {
  const fs::path out = dir / "out.txt", err = dir / "err.txt";
  const std::string full = "cd '" + dir.string() + "' && env -u TESSERA_HOME " + cmd + " >'" +
                           out.string() + "' 2>'" + err.string() + "'";
  const int st = std::system(full.c_str());
  cli::Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.out = cli::slurp(out);
  r.err = cli::slurp(err);
  return r;
}

}  // namespace

TEST(Install, InstalledBinaryWorksFromAnotherDirectory) {
  if (!cli::have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const fs::path build = fs::path(TESSERA_BIN).parent_path();
  const fs::path prefix = cli::scratch("install_prefix"), elsewhere = cli::scratch("elsewhere");
  // Without the models' component: hundreds of MB this test does not need.
  auto inst = run_in(elsewhere, "cmake --install '" + build.string() + "' --prefix '" +
                                    prefix.string() + "' --component Unspecified");
  ASSERT_EQ(inst.code, 0) << inst.out << inst.err;
  std::string bin = (prefix / "bin" / "tessera").string();
  bin = '\'' + bin + '\'';  // quoted for the shell
  ASSERT_TRUE(fs::exists(prefix / "share/tessera/data/gpt2/encoder.json"));
  ASSERT_TRUE(fs::exists(prefix / "share/tessera/configs/runs/tiny.toml"));

  // tokenize: the default tokenizer (data/gpt2) from the prefix
  auto tok = run_in(elsewhere, "printf 'The jury said' | " + bin + " tokenize");
  ASSERT_EQ(tok.code, 0) << tok.err;
  EXPECT_EQ(tok.out, "464 9002 531\n");
  // a token shard made here, a model trained here from the installed config (configs/runs/...)
  auto corpus = run_in(elsewhere,
                       "yes 'The jury said it was a fine day for a walk.' | head -n 400 "
                       "> corpus.txt && " +
                           bin +
                           " prepare --corpus text --input corpus.txt "
                           "--val-every 0 --out shards");
  ASSERT_EQ(corpus.code, 0) << corpus.err;
  auto train = run_in(elsewhere, bin +
                                     " train configs/runs/tiny.toml --quiet --set train.steps=2 "
                                     "'data.train=\"shards/train.bin\"' "
                                     "'data.val=\"shards/train.bin\"' 'train.out_dir=\"run\"' "
                                     "sample.tokens=0 train.val_every=0");
  ASSERT_EQ(train.code, 0) << train.err;
  auto sample = run_in(elsewhere, bin +
                                      " sample --model run --prompt 'The jury' --tokens 5 "
                                      "--temperature 0");
  ASSERT_EQ(sample.code, 0) << sample.err;
  EXPECT_EQ(sample.out.rfind("The jury", 0), 0u) << sample.out;
  auto eval =
      run_in(elsewhere, bin + " eval --model run --data shards/train.bin --batch 2 --seq 16");
  ASSERT_EQ(eval.code, 0) << eval.err;
  EXPECT_NE(eval.out.find("perplexity"), std::string::npos) << eval.out;
  // A path found nowhere is still the same clear error.
  auto missing = run_in(elsewhere, bin + " eval --model run --data nowhere/val.bin");
  cli::expect_clean_error(missing, "nowhere/val.bin");
}
