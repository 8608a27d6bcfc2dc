// End-to-end tests of what a hostile user can give the tessera binary: every case is refused
// with one clear error line and exit code 2 (or handled as documented), never a crash, a hang,
// an unbounded allocation, lost run data or a silently wrong number.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include <fmt/format.h>

#include "cli_util.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/safetensors.hpp"

namespace fs = std::filesystem;

namespace {

const std::string k_fixture = TESSERA_FIXTURES "/gpt2_tiny";  // C = 32, V = 100, 16 positions

// One line on stderr starting with "error:", exit code 2 and nothing on stdout.
void expect_refused_before_output(const cli::Result& r, const std::string& needle) {
  cli::expect_clean_error(r, needle);
  EXPECT_EQ(r.out, "") << "nothing may be printed before the error";
}

// A 3 GB address-space limit for the binary, except in AddressSanitizer builds: ASan reserves
// terabytes of shadow address space at start-up, which such a limit forbids.
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* k_address_space_limit = "";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr const char* k_address_space_limit = "";
#else
constexpr const char* k_address_space_limit = "ulimit -v 3000000;";
#endif
#else
constexpr const char* k_address_space_limit = "ulimit -v 3000000;";
#endif

// Runs `tessera <args>` under a shell prefix (a ulimit, a timeout) from the source dir.
cli::Result run_with(const std::string& prefix, const std::string& args) {
  auto dir = cli::scratch("bad_run_with");
  const std::string cmd = "cd '" TESSERA_SOURCE_DIR "' && (" + prefix +
                          " env OMP_WAIT_POLICY=PASSIVE '" TESSERA_BIN "' " + args + ") >'" +
                          (dir / "out").string() + "' 2>'" + (dir / "err").string() + "'";
  int st = std::system(cmd.c_str());
  cli::Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.out = cli::slurp(dir / "out");
  r.err = cli::slurp(dir / "err");
  return r;
}

// Token ids < 100 (the fixture's vocabulary), `n` of them.
std::vector<std::uint32_t> tokens(std::size_t n) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>((i * 7 + i / 5) % 100);
  return t;
}

// Rewrites the model file of checkpoint `dir` with element `at` of tensor `name` set to `value`.
void poison(const fs::path& dir, const std::string& name, std::size_t at, float value) {
  const auto file = dir / "model.safetensors";
  auto src = tessera::io::SafetensorsFile::open(file);
  tessera::io::SafetensorsWriter w;
  for (const auto& t : src.tensors()) {
    auto f = src.read_f32(t.name);
    if (t.name == name) f[at] = value;
    w.add_copy(t.name, tessera::io::DType::F32, t.shape, f.data(), f.size() * 4);
  }
  for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
  w.write(file);
}

// The step of each training row of a metrics file, in order; every line must be whole JSON,
// except, with `torn_tail_ok`, a last line without its newline: a SIGKILL can stop a write()
// to a regular file at a page boundary of the file, so a killed run may leave a partial last
// row (and only that one), which --resume removes.
std::vector<std::int64_t> metric_steps(const fs::path& metrics, bool torn_tail_ok = false) {
  std::vector<std::int64_t> steps;
  const std::string text = cli::slurp(metrics);
  std::istringstream in(text);
  const bool unterminated = !text.empty() && text.back() != '\n';
  for (std::string l; std::getline(in, l);) {
    auto row = nlohmann::json::parse(l, nullptr, false);
    const bool last = in.peek() == EOF;
    if (row.is_discarded() && last && unterminated && torn_tail_ok) break;
    EXPECT_FALSE(row.is_discarded()) << "a damaged row: " << l;
    if (!row.is_discarded() && row.contains("loss"))
      steps.push_back(row["step"].get<std::int64_t>());
  }
  return steps;
}

std::vector<std::int64_t> one_to(std::int64_t n) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

// Training runs of a 1-layer model of the fixture's vocabulary on shards made here: no
// tokenizer needed, each run takes about a second.
class BadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = cli::scratch("bad_data");
    tessera::data::write_shard(data_ / "train.bin", tokens(4000));
    tessera::data::write_shard(data_ / "val.bin", tokens(600));
  }
  static std::string train(const fs::path& out, int steps, const std::string& extra = "") {
    return "train --config configs/runs/tiny.toml --quiet --set model.n_layer=1 "
           "model.vocab_size=100 model.block_size=16 train.seq_len=16 train.val_every=0 "
           "sample.tokens=0 hardware.peak_tflops=1 train.steps=" +
           std::to_string(steps) + " 'data.train=\"" + (data_ / "train.bin").string() +
           "\"' 'data.val=\"" + (data_ / "val.bin").string() + "\"' 'train.out_dir=\"" +
           out.string() + "\"' " + extra;
  }
  static fs::path ckpt(const fs::path& out, int step) {
    return out / "checkpoints" / fmt::format("step_{:08d}", step);
  }
  static inline fs::path data_;
};

}  // namespace

// 1. A thread count the OpenMP runtime cannot start crashed it (exit 139).
TEST_F(BadInput, ThreadCountAboveTheMaximumIsRefused) {
  auto out = cli::scratch("bad_threads");
  expect_refused_before_output(cli::run(train(out, 1, "train.threads=100000")), "train.threads");
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
}

// 2. Absurd or wrong shapes are refused before their memory is allocated, saying how much.
TEST_F(BadInput, AbsurdModelShapeIsRefusedBeforeAllocating) {
  auto d = cli::scratch("bad_shape");
  fs::copy(k_fixture, d, fs::copy_options::recursive);
  auto cfg = nlohmann::json::parse(cli::slurp(d / "config.json"));
  cfg["n_layer"] = 1000000000;
  cfg["n_embd"] = 1000000000;
  cfg["n_head"] = 1;
  std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump();
  auto t0 = std::chrono::steady_clock::now();
  auto r = cli::run("eval --model " + d.string());
  expect_refused_before_output(r, "GB of memory");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // Plausible but wrong: 100 layers of 1024 would take 5 GB; the file's tensors are compared
  // first (under a 3 GB address-space limit, allocating it would fail as out of memory).
  cfg["n_layer"] = 100;
  cfg["n_embd"] = 1024;
  cfg["n_head"] = 16;
  std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump();
  expect_refused_before_output(run_with(k_address_space_limit, "eval --model " + d.string()),
                               "shape mismatch");
  // Training a model this machine cannot hold: refused with the memory it needs.
  auto out = cli::scratch("bad_shape_train");
  expect_refused_before_output(
      cli::run(train(out, 1, "model.n_layer=400 model.n_embd=16384 model.n_head=64")),
      "GB of memory");
  expect_refused_before_output(cli::run(train(out, 1, "model.n_layer=1000000")), "parameters");
}

// 3. A kill leaves whole rows, and --resume continues the file from the checkpoint's step.
TEST_F(BadInput, MetricsContinueFromTheCheckpointOnResume) {
  auto out = cli::scratch("bad_metrics");
  ASSERT_EQ(cli::run(train(out, 6, "train.ckpt_every=3 train.keep_checkpoints=0")).code, 0);
  // As a kill during step 6 left it: rows after the last checkpoint (3) and a partial line.
  fs::remove_all(ckpt(out, 6));
  std::ofstream(out / "metrics.jsonl", std::ios::app) << "{\"step\": 7, \"loss\": 1.2";
  auto r = cli::run(train(out, 8, "--resume --override-schedule"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(8));
}

TEST_F(BadInput, MetricsStayWholeWhenKilled) {
  auto out = cli::scratch("bad_metrics_kill");
  const pid_t pid = cli::spawn(train(out, 100000, "train.ckpt_every=20"), ">/dev/null 2>&1");
  ASSERT_GE(pid, 0);
  // Waits for the first checkpoint (step 20: well under a second on an idle machine; up to a
  // minute allowed, since a loaded CI machine can be many times slower).
  for (int i = 0; i < 1200 && !tessera::io::latest_checkpoint(out / "checkpoints"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  auto latest = tessera::io::latest_checkpoint(out / "checkpoints");
  ASSERT_TRUE(latest.has_value());
  // Whole rows (but perhaps a partial last one), each step once, none missing up to the kill.
  auto before = metric_steps(out / "metrics.jsonl", true);
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(before, one_to(before.back()));
  const int last = std::stoi(latest->filename().string().substr(5));
  auto r = cli::run(train(out, last + 3, "--resume --override-schedule"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(last + 3));
}

// 4. A run directory is never silently reused, and never used by two runs at once.
TEST_F(BadInput, FreshRunIntoAUsedOutDirIsRefusedUnlessOverwrite) {
  auto out = cli::scratch("bad_reuse");
  ASSERT_EQ(cli::run(train(out, 4, "train.ckpt_every=2")).code, 0);
  const auto metrics = cli::slurp(out / "metrics.jsonl");
  expect_refused_before_output(cli::run(train(out, 2)), "holds an earlier run");
  EXPECT_EQ(cli::slurp(out / "metrics.jsonl"), metrics) << "the old run must be untouched";
  EXPECT_TRUE(fs::exists(ckpt(out, 4)));
  // --overwrite deletes the old run first: no old higher-numbered checkpoint survives.
  auto r = cli::run(train(out, 2, "--overwrite"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(ckpt(out, 4)));
  EXPECT_EQ(tessera::io::latest_checkpoint(out / "checkpoints"), ckpt(out, 2));
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(2));
  expect_refused_before_output(cli::run(train(out, 2, "--overwrite --resume")), "--overwrite");
}

TEST_F(BadInput, SecondRunOnALockedOutDirIsRefused) {
  auto out = cli::scratch("bad_lock");
  const pid_t pid = cli::spawn(train(out, 100000), ">/dev/null 2>&1");
  ASSERT_GE(pid, 0);
  for (int i = 0; i < 150 && !fs::exists(out / "metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto r = cli::run(train(out, 3, "--resume"));
  ::kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  expect_refused_before_output(r, "is in use by another tessera run");
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << r.err;
  // The lock dies with its process.
  auto again = cli::run(train(out, 2, "--overwrite"));
  EXPECT_EQ(again.code, 0) << again.err;
}

// 5. A uint32 id >= 2^31 at a target position turned negative and was skipped as "ignored".
TEST_F(BadInput, TokenIdAboveInt32RangeIsAnError) {
  auto d = cli::scratch("bad_bigid");
  auto t = tokens(16 * 8);
  t[64] = 0x80000005u;  // the last target of the one batch of 4 x 16 that fits, never an input
  tessera::data::write_shard(d / "val.bin", t);
  expect_refused_before_output(cli::run("eval --model " + k_fixture + " --data " +
                                        (d / "val.bin").string() + " --seq 16 --batch 4"),
                               "2147483653");
  expect_refused_before_output(cli::run("eval --model " + k_fixture + " --data " +
                                        (d / "val.bin").string() + " --protocol windows --seq 16"),
                               "2147483653");
}

// 6. Nonsense is not reported as a result.
TEST_F(BadInput, NonFiniteWeightsAreRefusedOnLoad) {
  auto d = cli::scratch("bad_nan");
  fs::copy(k_fixture, d, fs::copy_options::recursive);
  poison(d, "h.0.mlp.c_fc.weight", 5, std::numeric_limits<float>::quiet_NaN());
  auto shard = d / "val.bin";
  tessera::data::write_shard(shard, tokens(16 * 8));
  expect_refused_before_output(cli::run("eval --model " + d.string() + " --data " + shard.string()),
                               "h.0.mlp.c_fc.weight");
  expect_refused_before_output(cli::run("eval --model " + k_fixture + " --reference " + d.string() +
                                        " --data " + shard.string()),
                               "h.0.mlp.c_fc.weight");
  // sample: a model of GPT-2's vocabulary (prompts are GPT-2 tokens)
  if (!cli::have_tokenizer()) return;
  auto out = cli::scratch("bad_nan_sample");
  ASSERT_EQ(cli::run(train(out, 1, "model.vocab_size=50257")).code, 0);
  poison(ckpt(out, 1), "wpe.weight", 0, std::numeric_limits<float>::quiet_NaN());
  expect_refused_before_output(cli::run("sample --model " + out.string() + " --tokens 4"),
                               "non-finite");
}

TEST_F(BadInput, EvaluationThatScoresNothingIsRefused) {
  auto d = cli::scratch("bad_llama2");
  tessera::data::write_shard(d / "val.bin", tokens(16 * 8));
  expect_refused_before_output(cli::run("eval --model " + k_fixture + " --data " +
                                        (d / "val.bin").string() + " --protocol llama --seq 2"),
                               "scores no token");
}

// 7. A bad id in the validation shard ended the run at its first validation with nothing saved.
TEST_F(BadInput, BadValidationShardStopsTheRunBeforeTraining) {
  auto d = cli::scratch("bad_valshard");
  auto t = tokens(600);
  t[500] = 60000;
  tessera::data::write_shard(d / "val.bin", t);
  auto out = cli::scratch("bad_valshard_run");
  auto r = cli::run(
      train(out, 50, "train.val_every=40 'data.val=\"" + (d / "val.bin").string() + "\"'"));
  expect_refused_before_output(r, "60000");
  EXPECT_NE(r.err.find("position 500"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
}

// The sample's tokenizer is read before the first step: one that is there but is no tokenizer
// stopped the run only after its training, at the sample.
TEST_F(BadInput, BrokenSampleTokenizerStopsTheRunBeforeTraining) {
  auto d = cli::scratch("bad_sample_tok");
  std::ofstream(d / "empty.gguf") << "";
  auto out = cli::scratch("bad_sample_tok_run");
  auto r = cli::run(
      train(out, 2, "sample.tokens=4 'data.tokenizer=\"" + (d / "empty.gguf").string() + "\"'"));
  expect_refused_before_output(r, "not a GGUF file");
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
}

// 8. Filesystem problems are bad input (exit 2, one line, before any output), not internal bugs.
TEST_F(BadInput, SymlinkLoopsAndAFileAsOutDirAreBadInput) {
  auto d = cli::scratch("bad_loops");
  fs::create_symlink(d / "b", d / "a");
  fs::create_symlink(d / "a", d / "b");
  expect_refused_before_output(cli::run("eval --model " + (d / "a").string()), "symbolic links");
  expect_refused_before_output(cli::run("sample --model " + (d / "a").string()), "symbolic links");
  auto in = d / "corpus";
  fs::create_directories(in);
  std::ofstream(in / "a.txt") << "Some text for the corpus.\n";
  fs::create_symlink(in / "y", in / "x");
  fs::create_symlink(in / "x", in / "y");
  expect_refused_before_output(cli::run("prepare --corpus text --input " + in.string() + " --out " +
                                        (d / "shards").string()),
                               "symbolic links");
  std::ofstream(d / "file") << "not a folder";
  expect_refused_before_output(cli::run(train(d / "file", 1)), "not a directory");
  expect_refused_before_output(cli::run(train(d / "file" / "sub", 1)), "not a directory");
  fs::create_directories(d / "run");
  std::ofstream(d / "run" / "checkpoints") << "not a folder";
  expect_refused_before_output(cli::run(train(d / "run", 1, "--resume")), "not a directory");
  expect_refused_before_output(cli::run(train(d / "run2", 1, "--trace " + d.string())),
                               "is a folder");
  // output folders are checked before the work (prepare tokenized the whole corpus first)
  expect_refused_before_output(cli::run("prepare --corpus text --input " + (in / "a.txt").string() +
                                        " --out " + (d / "file").string()),
                               "cannot create the folder");
  expect_refused_before_output(
      cli::run("outliers -m " + k_fixture + " --calib random -o " + (d / "file" / "o").string()),
      "cannot create the folder");
  expect_refused_before_output(cli::run("convert -m " + k_fixture + " -o ''"), "--out is empty");
}

// 9. A FIFO given as an input file blocked forever (here: 20 s would be a hang).
TEST_F(BadInput, FifoInputsAreRefusedInsteadOfBlocking) {
  auto d = cli::scratch("bad_fifo");
  ASSERT_EQ(::mkfifo((d / "model.safetensors").c_str(), 0644), 0);
  ASSERT_EQ(::mkfifo((d / "shard.bin").c_str(), 0644), 0);
  ASSERT_EQ(::mkfifo((d / "run.toml").c_str(), 0644), 0);
  expect_refused_before_output(
      run_with("timeout 20", "eval --model " + (d / "model.safetensors").string()), "FIFO");
  expect_refused_before_output(
      run_with("timeout 20", "eval --model " + k_fixture + " --data " + (d / "shard.bin").string()),
      "FIFO");
  expect_refused_before_output(
      run_with("timeout 20", "train --config " + (d / "run.toml").string()), "FIFO");
}

// 10. Clear messages.
TEST_F(BadInput, IntegerTooLargeForItsFieldSaysOutOfRange) {
  auto r = cli::run("train --config configs/runs/tiny.toml --set train.steps=99999999999999999999");
  expect_refused_before_output(r, "out of range");
  EXPECT_NE(r.err.find("2147483647"), std::string::npos) << r.err;
  expect_refused_before_output(
      cli::run("train --config configs/runs/tiny.toml --set train.steps=3000000000"),
      "out of range");
}

TEST_F(BadInput, NanOptionsAreRefused) {
  const std::string calib = " --calib random --nsamples 4 --seqlen 16";
  auto d = cli::scratch("bad_damp");
  expect_refused_before_output(cli::run("quantize --model " + k_fixture + " --out " +
                                        (d / "q").string() + " --group 16 --damp nan" + calib),
                               "--damp");
  expect_refused_before_output(
      cli::run("quantize --model " + k_fixture + " --out " + (d / "q").string() +
               " --method llm-int8 --threshold nan" + calib),
      "--threshold");
  if (!cli::have_tokenizer()) return;
  auto out = cli::scratch("bad_nan_temperature");
  ASSERT_EQ(cli::run(train(out, 1, "model.vocab_size=50257")).code, 0);
  expect_refused_before_output(
      cli::run("sample --model " + out.string() + " --tokens 4 --temperature nan"),
      "--temperature");
}

TEST_F(BadInput, NonFiniteWeightsOnResumeAreNamed) {
  auto out = cli::scratch("bad_nan_resume");
  ASSERT_EQ(cli::run(train(out, 2)).code, 0);
  poison(ckpt(out, 2), "wte.weight", 3, std::numeric_limits<float>::infinity());
  auto r = cli::run(train(out, 4, "--resume --override-schedule"));
  expect_refused_before_output(r, "wte.weight");
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("train.lr"), std::string::npos) << r.err;
}

TEST_F(BadInput, CorruptNewestCheckpointSaysHowToResumeFromThePreviousOne) {
  auto out = cli::scratch("bad_corrupt_newest");
  ASSERT_EQ(cli::run(train(out, 4, "train.ckpt_every=2")).code, 0);
  const auto newest = ckpt(out, 4), previous = ckpt(out, 2);
  fs::resize_file(newest / "model.safetensors", fs::file_size(newest / "model.safetensors") / 2);
  auto r = cli::run(train(out, 6, "--resume --override-schedule"));
  expect_refused_before_output(r, newest.string());
  EXPECT_NE(r.err.find("mv " + newest.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(previous.string()), std::string::npos) << r.err;
  // Following the hint continues from the previous checkpoint.
  fs::rename(newest, newest.string() + ".damaged");
  auto again = cli::run(train(out, 6, "--resume --override-schedule"));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("step 2"), std::string::npos) << again.err;
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(6));
}

TEST_F(BadInput, ResumingWithOtherDataOrSeedWarns) {
  auto out = cli::scratch("bad_resume_diff");
  ASSERT_EQ(cli::run(train(out, 4, "--stop-at 2")).code, 0);
  auto r = cli::run(train(out, 4, "train.seed=7 --stop-at 3 --resume"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: resuming with train.seed = 7"), std::string::npos) << r.err;
  // The same settings resume without a word.
  auto same = cli::run(train(out, 4, "train.seed=7 --resume"));
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(same.err.find("warning"), std::string::npos) << same.err;
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(4));
}

// A resume that would change the learning-rate schedule or the batch (the learning rate would
// jump at the resumed step) is refused before any output, naming what changed, unless
// --override-schedule, which continues under the new schedule and says so.
TEST_F(BadInput, ResumeThatChangesTheScheduleIsRefusedUnlessOverridden) {
  auto out = cli::scratch("bad_resume_schedule");
  ASSERT_EQ(cli::run(train(out, 4)).code, 0);
  const auto metrics = cli::slurp(out / "metrics.jsonl");
  for (const auto& [set, named] : std::vector<std::pair<std::string, std::string>>{
           {"", "train.steps 4 -> 6"},
           {"train.lr=1e-2", "train.lr"},
           {"train.warmup_steps=1", "train.warmup_steps"},
           {"train.batch_size=2", "sequences per step 4 -> 2"}}) {
    auto r = cli::run(train(out, set.empty() ? 6 : 4, set + " --resume"));
    expect_refused_before_output(r, named);
    EXPECT_NE(r.err.find("--override-schedule"), std::string::npos) << r.err;
    EXPECT_EQ(cli::slurp(out / "metrics.jsonl"), metrics) << "the run must be untouched";
  }
  auto r = cli::run(train(out, 6, "--resume --override-schedule"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("schedule overridden at step 4 (train.steps 4 -> 6)"), std::string::npos)
      << r.err;
  EXPECT_EQ(metric_steps(out / "metrics.jsonl"), one_to(6));
}

TEST_F(BadInput, BadTensorOffsetInTheStateIndexIsRefused) {
  auto out = cli::scratch("bad_index_offset");
  ASSERT_EQ(cli::run(train(out, 2)).code, 0);
  const auto index = ckpt(out, 2) / "state_index.json";
  auto idx = nlohmann::json::parse(cli::slurp(index));
  idx["tensors"][3]["offset"] = idx["tensors"][3]["offset"].get<std::size_t>() + 1;
  std::ofstream(index, std::ios::trunc) << idx.dump(1);
  auto r = cli::run(train(out, 4, "--resume --override-schedule"));
  expect_refused_before_output(r, "offset");
  EXPECT_NE(r.err.find("state_index.json"), std::string::npos) << r.err;
}

// The llama family through the trainer: a few steps train (the loss falls), the checkpoint is a
// Hugging Face Llama checkpoint that eval reads; bad family settings and grids its heads do not
// split over are refused before any output, one line, exit 2.
TEST_F(BadInput, LlamaTrainsAndBadLlamaConfigsAreRefused) {
  const std::string llama =
      "model.family=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=48 "
      "model.tie_embeddings=false ";
  auto out = cli::scratch("llama_run");
  auto r = cli::run(train(out, 6, llama + "train.lr=1e-2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto cfg = nlohmann::json::parse(cli::slurp(ckpt(out, 6) / "config.json"));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  std::vector<double> losses;
  std::istringstream metrics(cli::slurp(out / "metrics.jsonl"));
  for (std::string l; std::getline(metrics, l);) {
    auto row = nlohmann::json::parse(l, nullptr, false);
    if (!row.is_discarded() && row.contains("loss")) losses.push_back(row["loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front());
  auto ev = cli::run("eval --model " + out.string() + " --data " + (data_ / "val.bin").string() +
                     " --batch 2 --seq 16");
  EXPECT_EQ(ev.code, 0) << ev.err;

  expect_refused_before_output(
      cli::run(train(cli::scratch("llama_kv"), 1, llama + "model.n_kv_head=3")), "n_kv_head");
  expect_refused_before_output(
      cli::run(train(cli::scratch("llama_family"), 1, "model.family=mamba")), "model.family");
  expect_refused_before_output(cli::run(train(cli::scratch("gpt2_kv"), 1, "model.n_kv_head=1")),
                               "llama setting");
  // Tensor parallelism splits the kv heads over ty: 2 kv heads do not split over ty = 4 (said
  // before the rank count, which does not matter for it).
  expect_refused_before_output(
      cli::run(train(cli::scratch("llama_ty"), 1, llama + "parallel.ty=4")),
      "is not divisible by ty=4");
}

// train.init_from starts from a trained model's weights: the validation loss at step 0 of a run
// initialized from another run equals that run's last validation loss (the same validation
// windows, the same weights, the same arithmetic); its shape comes from the model, and a model
// that is not there is one clear error.
TEST_F(BadInput, InitFromStartsFromTheModelsWeights) {
  auto val_losses = [](const fs::path& out) {
    std::vector<std::pair<std::int64_t, double>> v;
    std::istringstream in(cli::slurp(out / "metrics.jsonl"));
    for (std::string l; std::getline(in, l);) {
      auto row = nlohmann::json::parse(l, nullptr, false);
      if (!row.is_discarded() && row.contains("val_loss"))
        v.emplace_back(row["step"].get<std::int64_t>(), row["val_loss"].get<double>());
    }
    return v;
  };
  const std::string llama =
      "model.family=llama model.n_head=4 model.n_kv_head=2 train.val_every=3 ";
  auto a = cli::scratch("init_from_a"), b = cli::scratch("init_from_b");
  auto ra = cli::run(train(a, 3, llama));
  ASSERT_EQ(ra.code, 0) << ra.err;
  // b names no model shape: it comes from a's checkpoint (a gpt2 [model] is ignored)
  auto rb = cli::run(train(b, 1, "train.val_every=3 'train.init_from=\"" + a.string() + "\"'"));
  ASSERT_EQ(rb.code, 0) << rb.err;
  const auto va = val_losses(a), vb = val_losses(b);
  ASSERT_FALSE(va.empty());
  ASSERT_FALSE(vb.empty());
  EXPECT_EQ(va.back().first, 3);
  EXPECT_EQ(vb.front().first, 0);
  EXPECT_EQ(vb.front().second, va.back().second);
  expect_refused_before_output(
      cli::run(train(cli::scratch("init_from_missing"), 1, "train.init_from=no/such/model")),
      "not found");
}
