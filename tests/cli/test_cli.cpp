// End-to-end tests of the tessera binary: bad input gives one clear line and exit code 2;
// training resumes bit-exactly; a kill during a checkpoint save never corrupts the newest one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <csignal>
#include <map>
#include <thread>

#include "cli_util.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/kernels/cuda/device.hpp"

using cli::fs::path;
namespace fs = std::filesystem;

namespace {

using cli::expect_clean_error;

std::string tiny_run_args(const path& data, const path& out, int steps) {
  return "train --config configs/runs/tiny.toml --quiet --set train.steps=" +
         std::to_string(steps) + " 'data.train=\"" + (data / "train.bin").string() +
         "\"' 'data.val=\"" + (data / "val.bin").string() + "\"' 'train.out_dir=\"" + out.string() +
         "\"' sample.tokens=0";
}

// Shared tiny corpus + a trained tiny checkpoint, made once for the suite.
class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!cli::have_tokenizer()) return;
    data_ = cli::scratch("data");
    cli::make_corpus(data_);
    auto r = cli::run("prepare --corpus text --input " + (data_ / "corpus.txt").string() + " " +
                      (data_ / "corpus2.txt").string() + " --val-every 2 --out " + data_.string());
    ASSERT_EQ(r.code, 0) << r.err;
    model_ = cli::scratch("model");
    auto t = cli::run(tiny_run_args(data_, model_, 4));
    ASSERT_EQ(t.code, 0) << t.err;
  }
  void SetUp() override {
    if (!cli::have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  }
  static fs::path checkpoint() { return *tessera::io::latest_checkpoint(model_ / "checkpoints"); }
  static inline path data_, model_;
};

}  // namespace

TEST_F(Cli, HelpAndVersion) {
  auto r = cli::run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* cmd : {"prepare", "tokenize", "train", "sample", "eval"})
    EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
  EXPECT_EQ(cli::run("--version").code, 0);
  auto bare = cli::run("");  // bare tessera: its help, not an error
  EXPECT_EQ(bare.code, 0);
  EXPECT_NE(bare.out.find("quantize"), std::string::npos) << bare.out;
}

// A misspelled command or option is named, with the closest real one, before CLI11 would ask
// for a subcommand or a required option instead.
TEST_F(Cli, UnknownSubcommandOrOption) {
  auto r = cli::run("frobnicate");
  EXPECT_EQ(r.code, 2);
  expect_clean_error(cli::run("train --no-such-flag"), "no-such-flag");
  expect_clean_error(cli::run("smaple -m x"), "did you mean sample?");
  expect_clean_error(cli::run("sample --modle x"), "unknown option --modle for 'tessera sample'");
  expect_clean_error(cli::run("sample --modle x"), "did you mean --model?");
  expect_clean_error(cli::run("study calibraton"), "did you mean calibration?");
  expect_clean_error(cli::run("study calibration --modle=x"), "did you mean --model?");
}

TEST_F(Cli, MissingCheckpoint) {
  expect_clean_error(cli::run("sample --model /nonexistent/model"), "not found");
  expect_clean_error(cli::run("eval --model /nonexistent/model"), "not found");
}

TEST_F(Cli, TruncatedCheckpoint) {
  auto d = cli::scratch("truncated");
  fs::copy(checkpoint(), d, fs::copy_options::recursive);
  auto f = d / "model.safetensors";
  fs::resize_file(f, fs::file_size(f) / 2);
  expect_clean_error(
      cli::run("eval --model " + d.string() + " --data " + (data_ / "val.bin").string()),
      "model.safetensors");
}

TEST_F(Cli, CorruptCheckpointHeaderLength) {
  auto d = cli::scratch("badheader");
  fs::copy(checkpoint(), d, fs::copy_options::recursive);
  auto f = d / "model.safetensors";
  std::string bytes = cli::slurp(f);
  std::uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data(), &huge, 8);
  std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  expect_clean_error(cli::run("sample --model " + d.string() + " --tokens 2"), "header");
}

TEST_F(Cli, CheckpointWithWrongDtype) {
  // Rewrite the model with wte stored as I32: a float tensor is expected.
  auto d = cli::scratch("baddtype");
  fs::copy(checkpoint(), d, fs::copy_options::recursive);
  auto src = tessera::io::SafetensorsFile::open(checkpoint() / "model.safetensors");
  tessera::io::SafetensorsWriter w;
  for (const auto& t : src.tensors()) {
    auto b = src.bytes(t);
    auto dt = t.name == "wte.weight" ? tessera::io::DType::I32 : t.dtype;
    w.add_copy(t.name, dt, t.shape, b.data(), b.size());
  }
  w.write(d / "model.safetensors");
  expect_clean_error(cli::run("sample --model " + d.string() + " --tokens 2"), "I32");
}

TEST_F(Cli, CheckpointShapeMismatch) {
  // config.json promises a wider model than the tensors hold.
  auto d = cli::scratch("badshape");
  fs::copy(checkpoint(), d, fs::copy_options::recursive);
  std::string cfg = cli::slurp(d / "config.json");
  auto pos = cfg.find("\"n_embd\": 32");
  ASSERT_NE(pos, std::string::npos) << cfg;
  cfg.replace(pos, 12, "\"n_embd\": 64");
  std::ofstream(d / "config.json", std::ios::trunc) << cfg;
  expect_clean_error(cli::run("sample --model " + d.string() + " --tokens 2"), "shape mismatch");
}

TEST_F(Cli, ResumeIntoDifferentModelIsRefused) {
  auto out = cli::scratch("resume_mismatch");
  fs::copy(model_, out, fs::copy_options::recursive);
  auto r = cli::run(tiny_run_args(data_, out, 8) + " --resume --set model.n_layer=3");
  expect_clean_error(r, "checkpoint");
}

TEST_F(Cli, ShardWithWrongMagicOrSize) {
  auto d = cli::scratch("badshard");
  std::string bytes = cli::slurp(data_ / "val.bin");
  std::string bad = bytes;
  bad[0] ^= 0x5A;
  std::ofstream(d / "magic.bin", std::ios::binary) << bad;
  expect_clean_error(
      cli::run("eval --model " + checkpoint().string() + " --data " + (d / "magic.bin").string()),
      "magic");
  std::ofstream(d / "short.bin", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  expect_clean_error(
      cli::run("eval --model " + checkpoint().string() + " --data " + (d / "short.bin").string()),
      "short.bin");
  auto r = cli::run(tiny_run_args(data_, cli::scratch("badshard_run"), 2) + " 'data.train=\"" +
                    (d / "magic.bin").string() + "\"'");
  expect_clean_error(r, "magic");
}

TEST_F(Cli, ConfigUnknownKeyAndBadValue) {
  auto d = cli::scratch("badcfg");
  std::ofstream(d / "unknown.toml") << "[train]\nlrr = 0.1\n";
  expect_clean_error(cli::run("train --config " + (d / "unknown.toml").string()), "lrr");
  std::ofstream(d / "badvalue.toml") << "[train]\nlr = -1.0\n";
  expect_clean_error(cli::run("train --config " + (d / "badvalue.toml").string()), "lr");
  std::ofstream(d / "syntax.toml") << "[train\nlr = 1\n";
  expect_clean_error(cli::run("train --config " + (d / "syntax.toml").string()), "syntax.toml");
  expect_clean_error(cli::run("train --config configs/runs/tiny.toml --set train.batch_size=zero"),
                     "batch_size");
  expect_clean_error(cli::run("train --config /nonexistent.toml"), "nonexistent.toml");
}

TEST_F(Cli, MissingCorpus) {
  expect_clean_error(cli::run("prepare --corpus brown --input /nonexistent/brown --out " +
                              cli::scratch("p").string()),
                     "/nonexistent/brown");
  expect_clean_error(cli::run("prepare --corpus text --input /nonexistent/file.txt --out " +
                              cli::scratch("q").string()),
                     "/nonexistent/file.txt");
}

TEST_F(Cli, SampleAndEvalWork) {
  auto r = cli::run("sample --model " + model_.string() +
                    " --prompt 'The quick' --tokens 8 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("The quick", 0), 0u) << r.out;
  // greedy decoding is deterministic
  EXPECT_EQ(cli::run("sample --model " + model_.string() +
                     " --prompt 'The quick' --tokens 8 --temperature 0")
                .out,
            r.out);
  auto e = cli::run("eval --model " + model_.string() + " --data " + (data_ / "val.bin").string() +
                    " --seq 16 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("\"perplexity\""), std::string::npos) << e.out;
}

// --device cuda: without a GPU, one error line naming why; with one, the same loss as the CPU
// (fp32: reordered sums, 1e-5 relative) and, in bf16, within 8 bf16 roundings (3.1e-2).
TEST_F(Cli, EvalOnTheGpuOrAClearErrorWithoutOne) {
  const std::string args = "eval --model " + model_.string() + " --data " +
                           (data_ / "val.bin").string() + " --seq 16 --json";
  if (tessera::kernels::cuda::device_count() == 0) {
    expect_clean_error(cli::run(args + " --device cuda"), "CUDA");
    expect_clean_error(cli::run(args + " --precision bf16"), "GPU only");
    return;
  }
  auto loss = [](const cli::Result& r) {
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false).value("loss", -1.0);
  };
  const double cpu = loss(cli::run(args));
  EXPECT_NEAR(loss(cli::run(args + " --device cuda")), cpu, 1e-5 * cpu);
  EXPECT_NEAR(loss(cli::run(args + " --device cuda --precision bf16")), cpu, 0x1p-8 * 8 * cpu);
}

// sample --device cuda: without a GPU, one error line; with one, text after the prompt in fp32
// and bf16 (greedy decoding is not compared with the CPU's: near-ties of the two precisions and
// summation orders may pick different tokens).
TEST_F(Cli, SampleOnTheGpuOrAClearErrorWithoutOne) {
  const std::string args =
      "sample --model " + model_.string() + " --prompt 'The quick' --tokens 8 --temperature 0";
  if (tessera::kernels::cuda::device_count() == 0) {
    expect_clean_error(cli::run(args + " --device cuda"), "CUDA");
    expect_clean_error(cli::run(args + " --precision bf16"), "GPU only");
    return;
  }
  for (const char* p : {"fp32", "bf16"}) {
    auto r = cli::run(args + " --device cuda --precision " + p);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("The quick", 0), 0u) << r.out;
    EXPECT_GT(r.out.size(), std::string("The quick").size() + 1) << r.out;
  }
}

namespace {
std::vector<std::string> loss_lines(const path& metrics) {
  std::vector<std::string> out;
  std::istringstream in(cli::slurp(metrics));
  for (std::string l; std::getline(in, l);)
    if (l.find("\"loss\"") != std::string::npos) {
      auto a = l.find("\"loss\":");
      out.push_back(l.substr(a, l.find(',', a) - a));
    }
  return out;
}
}  // namespace

TEST_F(Cli, ResumeIsBitExact) {
  // 20 steps in one run, against 10 + resume + 10: identical losses and identical final weights.
  auto one = cli::scratch("resume_one"), two = cli::scratch("resume_two");
  ASSERT_EQ(cli::run(tiny_run_args(data_, one, 20)).code, 0);
  auto first = cli::run(tiny_run_args(data_, two, 20) + " --stop-at 10");
  ASSERT_EQ(first.code, 0) << first.err;
  ASSERT_TRUE(fs::exists(two / "checkpoints" / "step_00000010" / "DONE"));
  auto second = cli::run(tiny_run_args(data_, two, 20) + " --resume");
  ASSERT_EQ(second.code, 0) << second.err;
  auto a = loss_lines(one / "metrics.jsonl"), b = loss_lines(two / "metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  EXPECT_EQ(cli::slurp(one / "checkpoints/step_00000020/model.safetensors"),
            cli::slurp(two / "checkpoints/step_00000020/model.safetensors"));
  // The training state: identical moments and counters.
  tessera::model::ModelConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 32, cfg.block_size = 32;
  tessera::model::ParamLayout layout(cfg);
  tessera::Buffer<float> pa(layout.total()), ma(layout.total()), va(layout.total());
  tessera::Buffer<float> pb(layout.total()), mb(layout.total()), vb(layout.total());
  auto sa = tessera::io::load_checkpoint(one / "checkpoints/step_00000020", layout, pa.data(),
                                         ma.data(), va.data());
  auto sb = tessera::io::load_checkpoint(two / "checkpoints/step_00000020", layout, pb.data(),
                                         mb.data(), vb.data());
  EXPECT_EQ(std::memcmp(ma.data(), mb.data(), ma.bytes()), 0);
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.bytes()), 0);
  EXPECT_EQ(sa.step, sb.step);
  EXPECT_EQ(sa.rng_state, sb.rng_state);
  EXPECT_EQ(sa.data_position, sb.data_position);
  EXPECT_EQ(sa.tokens_seen, sb.tokens_seen);
}

TEST_F(Cli, KillDuringCheckpointSaveLeavesLoadableNewest) {
  // Train with a checkpoint every step and SIGKILL the process at varying moments; whatever
  // was left, the newest complete checkpoint must load.
  auto out = cli::scratch("killed");
  int kills = 0;
  // At least 6 kills; more (with longer runs) while no checkpoint exists yet, as on a loaded
  // machine the start-up alone can outlast the first waits.
  for (int attempt = 0;
       attempt < 6 ||
       (attempt < 20 && !tessera::io::latest_checkpoint(out / "checkpoints").has_value());
       ++attempt) {
    const pid_t pid = cli::spawn(tiny_run_args(data_, out, 400) +
                                     " --set train.ckpt_every=1 train.keep_checkpoints=3 --resume",
                                 ">/dev/null 2>&1");
    ASSERT_GE(pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(600 + 170 * attempt));
    if (kill(pid, SIGKILL) == 0) ++kills;
    int st = 0;
    waitpid(pid, &st, 0);
    auto latest = tessera::io::latest_checkpoint(out / "checkpoints");
    if (!latest) continue;
    tessera::model::ModelConfig cfg;
    cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 32, cfg.block_size = 32;
    tessera::model::ParamLayout layout(cfg);
    tessera::Buffer<float> p(layout.total()), m(layout.total()), v(layout.total());
    EXPECT_NO_THROW(tessera::io::load_checkpoint(*latest, layout, p.data(), m.data(), v.data()))
        << latest->string();
  }
  EXPECT_GT(kills, 0);
  ASSERT_TRUE(tessera::io::latest_checkpoint(out / "checkpoints").has_value());
}

// Closing the loop: with a cluster file, a training run logs the performance model's
// predicted step time and memory next to the measured ones.
TEST_F(Cli, TrainLogsThePerformanceModelPrediction) {
  auto out = cli::scratch("predicted");
  auto r = cli::run(tiny_run_args(data_, out, 3) + " 'hardware.cluster=\"" TESSERA_SOURCE_DIR
                                                   "/configs/clusters/selene.toml\"'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto m = cli::slurp(out / "metrics.jsonl");
  EXPECT_NE(m.find("\"event\":\"prediction\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"predicted_step_ms\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"event\":\"summary\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"peak_rss_bytes\""), std::string::npos) << m;
  // A cluster file given that cannot be read is one error line before any work.
  auto out2 = cli::scratch("predicted_bad");
  auto r2 = cli::run(tiny_run_args(data_, out2, 1) + " 'hardware.cluster=\"/nonexistent.toml\"'");
  expect_clean_error(r2, "/nonexistent.toml");
  EXPECT_FALSE(fs::exists(out2 / "metrics.jsonl"));
}

// tessera sample on quantized files decodes from the packed weights (the library tests compare
// its tokens and distributions with the dequantized path): weight-only files with and without a
// quantized embedding (--vocab-bits 8, which also makes the file smaller), with real zero points
// (--min-offset), groups of 16, and per-token W8A8 files; a group size the packed kernels do not
// take (48) and a per-tensor W8A8 file sample from the dequantized weights with a note; --kernels
// fp32 asks for those. A GGUF file of Q4_1 matrices decodes packed too. The timing line on stderr
// names the kernels.
TEST_F(Cli, SampleOfQuantizedFilesUsesThePackedKernels) {
  auto dir = cli::scratch("quant_packed");
  struct Case {
    std::string name, args;
    bool packed;         // the default kernels take it
    std::string kernel;  // in the timing line with the default kernels
  };
  const Case cases[] = {{"g32", "--method rtn --group 32", true, "int8 activations ("},
                        {"g32v8", "--method rtn --group 32 --vocab-bits 8", true, "embedding W8"},
                        {"g32min", "--method rtn --group 32 --min-offset", true, "asym-min"},
                        {"g16", "--method rtn --group 16", true, "W4 g16"},
                        {"g48", "--method rtn --group 48", false, "dequantized"},
                        {"w8a8", "--method w8a8", true, "int8 activations per token"},
                        {"w8a8t", "--method w8a8 --act per-tensor", false, "dequantized"}};
  for (const Case& c : cases) {
    auto out = (dir / c.name).string();
    auto q = cli::run("quantize -m " + model_.string() + " -o " + out + " " + c.args);
    ASSERT_EQ(q.code, 0) << c.name << ": " << q.err;
    EXPECT_NE(q.out.find("bits per parameter"), std::string::npos) << q.out;
    for (const std::string kernels : {"packed", "fp32"}) {
      auto s = cli::run("sample -m " + out + " --prompt 'The quick' --tokens 6 --temperature 0 " +
                        "--kernels " + kernels);
      ASSERT_EQ(s.code, 0) << c.name << " " << kernels << ": " << s.err;
      EXPECT_EQ(s.out.rfind("The quick", 0), 0u) << s.out;
      const bool note = s.err.find("sampling with the dequantized weights") != std::string::npos;
      EXPECT_EQ(note, !c.packed && kernels == "packed") << c.name << ": " << s.err;
      EXPECT_NE(s.err.find("tokens/s"), std::string::npos) << s.err;
      if (kernels == "packed") {
        EXPECT_NE(s.err.find(c.kernel), std::string::npos) << c.name << ": " << s.err;
      }
    }
  }
  EXPECT_LT(fs::file_size(dir / "g32v8" / "model.safetensors"),
            fs::file_size(dir / "g32" / "model.safetensors"));
  // A GGUF file of Q4_1 (or Q4_0, Q8_0) matrices decodes from its own blocks, packed.
  const auto gguf = (dir / "g32.gguf").string();
  ASSERT_EQ(
      cli::run("convert -m " + (dir / "g32").string() + " --format gguf --dtype q4_1 --out " + gguf)
          .code,
      0);
  for (const std::string kernels : {"packed", "fp32"}) {
    auto s = cli::run("sample -m " + gguf + " --prompt 'The quick' --tokens 6 --temperature 0 " +
                      "--kernels " + kernels);
    ASSERT_EQ(s.code, 0) << kernels << ": " << s.err;
    EXPECT_EQ(s.err.find("asym-min fp16") != std::string::npos, kernels == "packed") << s.err;
  }
  expect_clean_error(cli::run("quantize -m " + model_.string() + " -o " + (dir / "x").string() +
                              " --method rtn --vocab-bits 4"),
                     "--vocab-bits");
}

// tessera sample --kv-cache f16 decodes with keys and values stored as fp16 (the library tests
// bound its logits against the fp32 cache's): the fp32 model and a packed W4 file sample with it
// and say so in the timing line; an unknown type, and the option with --device cuda (whose cache
// is in the model's --precision), are one-line errors.
TEST_F(Cli, SampleWithAnFp16KvCache) {
  auto q = (cli::scratch("kv_f16") / "q").string();
  ASSERT_EQ(
      cli::run("quantize -m " + model_.string() + " -o " + q + " --method rtn --group 32").code, 0);
  for (const std::string& m : {model_.string(), q}) {
    auto s = cli::run("sample -m " + m + " --prompt 'The quick' --tokens 6 --temperature 0 " +
                      "--kv-cache f16");
    ASSERT_EQ(s.code, 0) << m << ": " << s.err;
    EXPECT_EQ(s.out.rfind("The quick", 0), 0u) << s.out;
    EXPECT_NE(s.err.find("KV cache f16"), std::string::npos) << s.err;
  }
  expect_clean_error(cli::run("sample -m " + model_.string() + " --kv-cache f8"), "--kv-cache");
  expect_clean_error(cli::run("sample -m " + model_.string() + " --device cuda --kv-cache f16"),
                     "--kv-cache");
}

// tessera eval on a weight-only quantized file runs every linear through the packed prefill
// kernel by default: the loss of the dequantized weights (--kernels fp32) up to the rounding of
// the packed scales (fp16: 2^-11 relative per row) and summation order, within 1e-3 relative.
// The same file exported as GGUF (Q4_1, its grid exactly) is evaluated from its own blocks
// (the model line names them) and scores as the tessera file does, within the same bound.
TEST_F(Cli, EvalOfQuantizedFilesUsesThePackedKernels) {
  const path dir = cli::scratch("quant_eval");
  const std::string out = (dir / "q").string(), gguf = (dir / "q.gguf").string();
  ASSERT_EQ(cli::run("quantize -m " + model_.string() + " -o " + out +
                     " --method rtn --group 32 --min-offset")
                .code,
            0);
  auto eval = [&](const std::string& m, const std::string& kernels) {
    auto r = cli::run("eval --model " + m + " --data " + (data_ / "val.bin").string() +
                      " --seq 16 --json --protocol windows --kernels " + kernels);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  };
  const auto perplexity = [](const nlohmann::json& j) {
    return j.is_object() ? j["windows"].value("perplexity", -1.0) : -1.0;
  };
  const double fp = perplexity(eval(out, "fp32")), packed = perplexity(eval(out, "packed"));
  EXPECT_GT(fp, 0.0);
  EXPECT_NEAR(std::log(packed), std::log(fp), 1e-3 * std::log(fp));
  ASSERT_EQ(cli::run("convert --model " + out + " --format gguf --dtype q4_1 --out " + gguf).code,
            0);
  const auto from_blocks = eval(gguf, "packed"), dequantized = eval(gguf, "fp32");
  EXPECT_EQ(from_blocks.value("model", "").rfind("GGUF Q4_1 linears", 0), 0u) << from_blocks;
  EXPECT_NE(dequantized.value("model", "").find("dequantized"), std::string::npos) << dequantized;
  EXPECT_NEAR(std::log(perplexity(from_blocks)), std::log(fp), 1e-3 * std::log(fp));
  EXPECT_NEAR(std::log(perplexity(dequantized)), std::log(fp), 1e-3 * std::log(fp));
}

namespace {

// The event files in RUN/tb, in name order (the order TensorBoard reads them in).
std::vector<path> tensorboard_files(const path& run) {
  std::vector<path> files;
  if (fs::is_directory(run / "tb"))
    for (const auto& e : fs::directory_iterator(run / "tb")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// A run of 6 steps, validating and saving every 2 steps, that ends after step 4 as if killed
// before its checkpoint of step 4 (that checkpoint deleted), and is resumed from step 2: steps
// 3 and 4 are done twice, and their first rows and events must not show.
void train_interrupted_and_resumed(const path& data, const path& out) {
  const std::string args = tiny_run_args(data, out, 6) + " train.val_every=2 train.ckpt_every=2";
  auto a = cli::run(args + " --stop-at 4");
  ASSERT_EQ(a.code, 0) << a.err;
  fs::remove_all(out / "checkpoints" / "step_00000004");
  ASSERT_TRUE(fs::exists(out / "checkpoints" / "step_00000002" / "DONE"));
  auto b = cli::run(args + " --resume");
  ASSERT_EQ(b.code, 0) << b.err;
}

}  // namespace

// Every row of metrics.jsonl says what it is and when it was written; TensorBoard files beside
// it, one per start of the run; the step line names both MFU's peak and the GEMM fraction.
TEST_F(Cli, MetricsRowsHaveAnEventAndATime) {
  auto out = cli::scratch("metrics_rows");
  ASSERT_NO_FATAL_FAILURE(train_interrupted_and_resumed(data_, out));
  std::istringstream in(cli::slurp(out / "metrics.jsonl"));
  std::map<std::string, int> events;
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    ASSERT_TRUE(row.contains("event") && row["event"].is_string()) << line;
    EXPECT_TRUE(row["time"].is_number_float()) << line;
    ++events[row["event"].get<std::string>()];
    if (row["event"] == "step") {
      EXPECT_TRUE(row.contains("step_ms") && row.contains("mfu") && row.contains("gemm_fraction"))
          << line;
      EXPECT_NE(row["mfu_peak"].get<std::string>().find("peak of this CPU"), std::string::npos)
          << line;
    }
  }
  EXPECT_EQ(events["step"], 6);
  EXPECT_EQ(events["val"], 4);      // steps 0, 2, 4, 6
  EXPECT_EQ(events["memory"], 2);   // each start
  EXPECT_EQ(events["summary"], 1);  // the first run's was after step 2
  EXPECT_EQ(tensorboard_files(out).size(), 2u);
  // The step line: MFU against the hardware peak, the GEMM fraction named as such.
  std::string loud = tiny_run_args(data_, cli::scratch("metrics_line"), 1);
  loud.erase(loud.find(" --quiet"), 8);
  auto r = cli::run(loud);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string log = r.out + r.err;
  EXPECT_NE(log.find("MFU against the hardware peak"), std::string::npos) << log;
  EXPECT_NE(log.find("of GEMM rate)"), std::string::npos) << log;
}

// TensorBoard's own reader (tools/check_tensorboard.py, EventAccumulator) sees every scalar of
// metrics.jsonl, at its step, with its value, over an interrupted and resumed run: one curve per
// tag, without the steps the interrupted run did after its last checkpoint.
TEST_F(Cli, TensorBoardReaderAgreesWithMetricsJsonl) {
  const std::string python = TESSERA_SOURCE_DIR "/.venv-oracle/bin/python";
  if (std::system(("'" + python + "' -c 'import tensorboard' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "no tensorboard in .venv-oracle (scripts/setup --with-oracle installs it)";
  auto out = cli::scratch("tensorboard");
  ASSERT_NO_FATAL_FAILURE(train_interrupted_and_resumed(data_, out));
  // stdout: the verdict; stderr: TensorBoard's own log (it says when it purges a restart's steps)
  const auto log = out / "check.txt", err = out / "check.err";
  const int st =
      std::system(("'" + python + "' '" TESSERA_SOURCE_DIR "/tools/check_tensorboard.py' '" +
                   out.string() + "' >'" + log.string() + "' 2>'" + err.string() + "'")
                      .c_str());
  EXPECT_EQ(WEXITSTATUS(st), 0) << cli::slurp(log) << cli::slurp(err);
  EXPECT_EQ(cli::slurp(log).rfind("ok: ", 0), 0u) << cli::slurp(log) << cli::slurp(err);
}

// tessera plot: a PNG or SVG of one metric of several runs; a folder that is no run, a metric
// no run has, a picture format it cannot write and an output folder that is not there are each
// one error line.
TEST_F(Cli, PlotDrawsTheCurvesOfRuns) {
  auto dir = cli::scratch("plot");
  auto other = dir / "other";
  ASSERT_EQ(cli::run(tiny_run_args(data_, other, 3)).code, 0);
  const std::string runs = model_.string() + " " + other.string();
  auto png = cli::run("plot " + runs + " --out " + (dir / "loss.png").string());
  ASSERT_EQ(png.code, 0) << png.err;
  EXPECT_EQ(cli::slurp(dir / "loss.png").substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto svg = cli::run("plot " + runs + " --metric lr --log-y --out " + (dir / "lr.svg").string());
  ASSERT_EQ(svg.code, 0) << svg.err;
  EXPECT_NE(cli::slurp(dir / "lr.svg").find("<svg"), std::string::npos);
  expect_clean_error(
      cli::run("plot " + (dir / "nothing").string() + " --out " + (dir / "x.png").string()),
      "is not a run folder");
  expect_clean_error(cli::run("plot " + dir.string() + " --out " + (dir / "x.png").string()),
                     "has no metrics.jsonl");
  expect_clean_error(cli::run("plot " + runs + " --metric los --out " + (dir / "x.png").string()),
                     "did you mean \"loss\"");
  expect_clean_error(cli::run("plot " + runs + " --out " + (dir / "x.gif").string()),
                     "unknown picture format");
  // a folder that does not exist (PLplot alone would retry, then exit the process)
  expect_clean_error(cli::run("plot " + runs + " --out " + (dir / "no" / "x.svg").string()),
                     "cannot write");
  EXPECT_FALSE(fs::exists(dir / "x.png"));
}
