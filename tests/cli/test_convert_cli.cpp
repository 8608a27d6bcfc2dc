// End-to-end tests of `tessera convert`: the Hugging Face checkpoint it writes, in one file or
// sharded (--max-shard-size), GPT-2 models as GGUF files and back, and its refusals of bad
// options, each one error line and exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/runner.hpp"

namespace fs = std::filesystem;

namespace {

const std::string k_gpt2 = TESSERA_FIXTURES "/gpt2_tiny";    // 121 KB of fp32 weights
const std::string k_llama = TESSERA_FIXTURES "/llama_tiny";  // untied head

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_same_model(const fs::path& a, const fs::path& b) {
  const auto x = tessera::io::load_model(a), y = tessera::io::load_model(b);
  ASSERT_EQ(x.config, y.config);
  ASSERT_EQ(x.params.size(), y.params.size());
  for (std::size_t i = 0; i < x.params.size(); ++i) ASSERT_EQ(x.params[i], y.params[i]) << i;
}

}  // namespace

// --max-shard-size 30KB splits each fixture into several files with an index; the directory
// loads back as the model it came from, and converts again into one file.
TEST(ConvertCli, ShardedOutputLoadsBackExactly) {
  for (const std::string& model : {k_gpt2, k_llama}) {
    SCOPED_TRACE(model);
    const auto out = cli::scratch("convert_sharded");
    auto r = cli::run("convert --model " + model + " --out " + (out / "m").string() +
                      " --max-shard-size 30KB");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("with model.safetensors.index.json"), std::string::npos) << r.err;
    const auto names = files_in(out / "m");
    ASSERT_GE(names.size(), 5u);  // config.json, the index and at least 3 shards
    EXPECT_EQ(std::count(names.begin(), names.end(), "model.safetensors"), 0);
    EXPECT_EQ(std::count(names.begin(), names.end(), "model.safetensors.index.json"), 1);
    const auto index =
        nlohmann::json::parse(cli::slurp(out / "m" / "model.safetensors.index.json"));
    std::uint64_t total = 0;  // every shard's bytes, each shard once
    for (const auto& name : names)
      if (name.ends_with(".safetensors"))
        total += tessera::io::SafetensorsFile::open(out / "m" / name).data_size();
    EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), total);
    for (const auto& [name, file] : index["weight_map"].items())
      EXPECT_TRUE(fs::exists(out / "m" / file.get<std::string>())) << name;
    expect_same_model(out / "m", model);

    // Without --overwrite a sharded model is not replaced; with it, one file replaces the shards.
    cli::expect_clean_error(cli::run("convert --model " + model + " --out " + (out / "m").string()),
                            "model.safetensors.index.json already exists");
    r = cli::run("convert --model " + (out / "m").string() + " --out " + (out / "m").string() +
                 " --overwrite");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(files_in(out / "m"), (std::vector<std::string>{"config.json", "model.safetensors"}));
    expect_same_model(out / "m", model);
  }
}

TEST(ConvertCli, BadShardSizesAreRefused) {
  const auto out = cli::scratch("convert_bad_shard");
  for (const char* bad : {"0", "5XB", "-1GB", "lots"})
    cli::expect_clean_error(cli::run("convert --model " + k_gpt2 + " --out " +
                                     (out / "m").string() + " --max-shard-size=" + bad),
                            "is not a size");
  cli::expect_clean_error(cli::run("convert --model " + k_llama + " --format gguf --out " +
                                   (out / "m.gguf").string() + " --max-shard-size 1GB"),
                          "--max-shard-size applies to Hugging Face output");
  EXPECT_FALSE(fs::exists(out / "m"));
}

// A GPT-2 model (random weights, GPT-2's vocabulary) as a GGUF file with its tokenizer: converted
// back to a Hugging Face checkpoint it is the same model bit for bit, and `tessera sample` reads
// the .gguf (weights and tokenizer) and writes what it writes from the original.
TEST(ConvertCli, Gpt2ThroughGgufAndBack) {
  if (!cli::have_tokenizer()) GTEST_SKIP() << "data/gpt2 (GPT-2's tokenizer) is absent";
  const auto dir = cli::scratch("convert_gpt2_gguf");
  tessera::model::ModelConfig cfg{1, 4, 32, 16, 50257};  // layers, heads, C, positions, vocab
  const tessera::model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  tessera::model::init_params(layout, params.data(), 5);
  tessera::io::save_model(dir / "hf", layout, params.data());
  auto r = cli::run("convert --model " + (dir / "hf").string() + " --format gguf --out " +
                    (dir / "m.gguf").string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli::run("convert --model " + (dir / "m.gguf").string() + " --out " +
               (dir / "back").string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_model(dir / "back", dir / "hf");
  const std::string sample = " --prompt 'The quick' --tokens 6 --temperature 0";
  const auto from_hf = cli::run("sample --model " + (dir / "hf").string() + sample);
  const auto from_gguf = cli::run("sample --model " + (dir / "m.gguf").string() + sample);
  ASSERT_EQ(from_gguf.code, 0) << from_gguf.err;
  EXPECT_EQ(from_gguf.out, from_hf.out);
  EXPECT_EQ(from_gguf.out.rfind("The quick", 0), 0u) << from_gguf.out;
  r = cli::run("convert --model " + (dir / "hf").string() + " --format gguf --dtype q8_0 --out " +
               (dir / "q8.gguf").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tessera::io::load_model(dir / "q8.gguf").config, cfg);
  // The fixture's vocabulary (100) is not GPT-2's tokenizer's: refused, nothing written.
  cli::expect_clean_error(cli::run("convert --model " + k_gpt2 + " --format gguf --out " +
                                   (dir / "tiny.gguf").string()),
                          "the tokenizer has 50257 tokens but the model only 100");
  EXPECT_FALSE(fs::exists(dir / "tiny.gguf"));
  // A GGUF model without a tokenizer (gguf-py's gpt2 seed): refused before anything is written.
  cli::expect_clean_error(
      cli::run("convert --model " TESSERA_FIXTURES "/../fuzz/corpus/gguf/gpt2_tiny.gguf --out " +
               (dir / "no_tok").string()),
      "carries no tokenizer");
  EXPECT_FALSE(fs::exists(dir / "no_tok" / "model.safetensors"));
}

// A tessera-quantized GPT-2 (RTN W4 g32 symmetric) written as Q4_0 GGUF and decoded by gguf-py
// (the reference decoder llama.cpp's Python tools use): each linear equals, bit for bit, what
// tessera's packed kernels compute with (the codes carried over, scale (q - zero) with the scale
// in fp16, which is Q4_0's d (n - 8)); the norms, biases and positions are the fp32 values; the
// embedding (Q8_0) is within Q8_0's half step of the fp32 weights (|w| < 0.1 here: 4e-4, bound
// 1e-3). The metadata names the quantization. Skipped without .venv-oracle's gguf package.
TEST(ConvertCli, QuantizedModelAsGgufDecodesToTesserasValues) {
  const std::string python = TESSERA_SOURCE_DIR "/.venv-oracle/bin/python";
  if (std::system(("'" + python + "' -c 'import gguf' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "no gguf package in .venv-oracle (scripts/setup --with-oracle installs it)";
  if (!cli::have_tokenizer()) GTEST_SKIP() << "data/gpt2 (GPT-2's tokenizer) is absent";
  const auto dir = cli::scratch("convert_quant_gguf");
  tessera::model::ModelConfig cfg{1, 4, 32, 16, 50257};  // layers, heads, C, positions, vocab
  const tessera::model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  tessera::model::init_params(layout, params.data(), 9);
  tessera::io::save_model(dir / "hf", layout, params.data());
  auto q = cli::run("quantize -m " + (dir / "hf").string() + " --method rtn --bits 4 --group 32 " +
                    "--sym -o " + (dir / "q").string());
  ASSERT_EQ(q.code, 0) << q.err;
  auto c = cli::run("convert --model " + (dir / "q").string() + " --format gguf --dtype q4_0 " +
                    "--out " + (dir / "q.gguf").string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE((c.out + c.err).find("4 of 4 linears carried onto the GGUF grid exactly"),
            std::string::npos)
      << c.out << c.err;
  // a quantized model in a type that would hide its grid: one error line, exit 2
  cli::expect_clean_error(
      cli::run("convert --model " + (dir / "q").string() + " --format gguf --dtype fp16 --out " +
               (dir / "f16.gguf").string()),
      "quantized model");
  const fs::path deq = dir / "deq.safetensors", meta = dir / "meta.json";
  ASSERT_EQ(
      std::system(("'" + python + "' '" TESSERA_SOURCE_DIR "/tools/gguf_dequantize.py' '" +
                   (dir / "q.gguf").string() + "' '" + deq.string() + "' > '" + meta.string() + "'")
                      .c_str()),
      0);
  const auto m = nlohmann::json::parse(cli::slurp(meta));
  EXPECT_EQ(m.value("tessera.quantization.description", ""), "rtn W4 g32 sym act none");
  EXPECT_EQ(m["tensor_types"].value("blk.0.ffn_up.weight", ""), "Q4_0");
  EXPECT_EQ(m["tensor_types"].value("token_embd.weight", ""), "Q8_0");

  const auto any = tessera::quant::load_any_model(dir / "q");
  const auto packed = tessera::quant::pack_model(any, tessera::quant::ScaleType::F16,
                                                 tessera::quant::Isa::Portable);
  std::vector<std::vector<float>> linears;  // what the packed kernels compute with
  for (const auto& pl : packed.linears) {
    linears.emplace_back(static_cast<std::size_t>(pl.rows) * pl.cols);
    pl.dequantize(linears.back().data());
  }
  const auto file = tessera::io::SafetensorsFile::open(deq);
  for (const auto& t : layout.tensors()) {
    const auto name = tessera::io::gpt2_hf_to_gguf_name(t.name);
    ASSERT_TRUE(name) << t.name;
    const std::vector<float> got = file.read_f32(*name);
    const std::size_t n =
        t.vocab_rows ? static_cast<std::size_t>(cfg.vocab_size) * t.shape[1] : t.numel;
    ASSERT_EQ(got.size(), n) << *name;
    const float* want = any.model.params.data() + t.offset;
    for (int k = 0; k < tessera::quant::k_num_lin; ++k)
      if (t.offset == tessera::quant::lin_weight_offset(layout, 0, tessera::quant::Lin(k)))
        want = linears[static_cast<std::size_t>(k)].data();
    for (std::size_t e = 0; e < n; ++e) {
      if (t.vocab_rows)
        ASSERT_NEAR(got[e], want[e], 1e-3) << *name << " element " << e;
      else
        ASSERT_EQ(got[e], want[e]) << *name << " element " << e;
    }
  }
}

namespace {

// llama.cpp's llama-perplexity of `model` on `text` in its protocol (chunks of 512 tokens, BOS
// first, the second half scored; 8 chunks, 2 threads), its output kept in `log`; NaN (and a
// failure) where it does not run or print its estimate.
double llama_cpp_perplexity(const fs::path& exe, const std::string& model, const std::string& text,
                            const fs::path& log) {
  std::string cmd = "'";
  for (const std::string& part : std::initializer_list<std::string>{
           exe.string(), "' -m '", model, "' -f '", text, "' -c 512 -b 512 --chunks 8 -t 2 > '",
           log.string(), "' 2>&1"})
    cmd += part;
  const int rc = std::system(cmd.c_str());
  const std::string s = cli::slurp(log);
  const auto at = s.find("Final estimate: PPL = ");
  if (rc != 0 || at == std::string::npos) {
    ADD_FAILURE() << "llama-perplexity failed: " << s;
    return std::nan("");
  }
  return std::stod(s.substr(at + 22));
}

}  // namespace

// llama.cpp itself (llama-perplexity, which scripts/setup --with-llama-cpp builds from its pinned
// source) reads a quantized model tessera exported as GGUF as tessera reads it: SmolLM2-135M,
// RTN W4 g128 symmetric with an 8-bit head, exported as Q4_0, scored by both on the same text in
// llama.cpp's protocol (chunks of 512 tokens, BOS first, the second half scored). They differ in
// arithmetic only: llama.cpp quantizes the activations to 8 bits per block of 32 for its Q4_0 and
// Q8_0 dot products and keeps an fp16 KV cache, its head is the file's Q8_0 one, where tessera
// (its packed kernels on the quantized directory) quantizes activations likewise but keeps fp32
// elsewhere and its own 8-bit head. Measured on this text (its first 8 chunks as of 2026-11-27;
// the bound does not depend on which English text): perplexity 53.61 (tessera) and 52.91
// (llama.cpp), 0.013 nats apart; the published Q4_1 file, dequantized by tessera and read by
// llama.cpp, 34.85 and 34.76 (0.002). A file read differently moves it further: with the rotary
// base 10,000 instead of the file's 100,000, llama.cpp's perplexity is 58.81 (0.11 nats). Bound:
// 0.05 nats. Skipped without the model or llama-perplexity.
TEST(ConvertCli, LlamaCppScoresAQuantizedExportAsTesseraDoes) {
  const fs::path gguf =
      fs::path(TESSERA_DATA) / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  const fs::path llama_ppl = TESSERA_SOURCE_DIR "/.llama.cpp/bin/llama-perplexity";
  if (!fs::exists(gguf)) GTEST_SKIP() << "SmolLM2-135M not fetched (scripts/setup --with-models)";
  if (!fs::exists(llama_ppl))
    GTEST_SKIP() << "no llama-perplexity (scripts/setup --with-llama-cpp builds it)";
  const auto dir = cli::scratch("convert_llama_cpp");
  const std::string text = TESSERA_SOURCE_DIR "/docs/quantization.md";  // ~12k tokens of English
  const std::string q = (dir / "q").string(), out = (dir / "q.gguf").string();
  auto r = cli::run("quantize -m " + gguf.string() + " --method rtn --bits 4 --group 128 --sym " +
                    "--vocab-bits 8 -o " + q);
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli::run("convert --model " + q + " --format gguf --dtype q4_0 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli::run("prepare --corpus text --input " + text + " --out " + (dir / "shard").string() +
               " --tokenizer " + gguf.string() + " --val-every 0");
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli::run("eval -m " + q + " -d " + (dir / "shard" / "train.bin").string() +
               " --protocol llama --seq 512 --batches 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const double ours = nlohmann::json::parse(r.out)["llama"]["perplexity"].get<double>();

  const double theirs = llama_cpp_perplexity(llama_ppl, out, text, dir / "llama.txt");
  EXPECT_LT(std::fabs(std::log(theirs) - std::log(ours)), 0.05)
      << "llama.cpp " << theirs << ", tessera " << ours;
}

// llama.cpp's K-quant files of SmolLM2 (llama-quantize of the published Q4_1 file,
// --allow-requantize): Q4_K_M mixes Q5_0, Q8_0, Q4_K and Q6_K matrices, Q2_K Q4_0 and Q3_K (the
// 576-wide rows fall back from the K-quants). tessera eval reads each from its own blocks through
// the packed kernels (the model line names them) and scores it as llama-perplexity does, on the
// same text in llama.cpp's protocol. Besides the arithmetic (llama.cpp's int8 activations and
// fp16 KV cache), tessera rounds the K-quants' scales to fp16 (docs/gguf.md): under 2e-4 nats
// against the dequantized files. Measured on 2026-11-30: perplexity 34.836 and 49.398 (tessera),
// 34.724 and 49.401 (llama.cpp), at most 0.003 nats apart. Bound: 0.05 nats, as above. Skipped
// without the model or llama.cpp's tools.
TEST(ConvertCli, LlamaCppKQuantFilesScoreAsLlamaCppScoresThem) {
  const fs::path gguf =
      fs::path(TESSERA_DATA) / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  const fs::path bin = TESSERA_SOURCE_DIR "/.llama.cpp/bin";
  if (!fs::exists(gguf)) GTEST_SKIP() << "SmolLM2-135M not fetched (scripts/setup --with-models)";
  if (!fs::exists(bin / "llama-quantize") || !fs::exists(bin / "llama-perplexity"))
    GTEST_SKIP() << "no llama-quantize (scripts/setup --with-llama-cpp builds it)";
  const auto dir = cli::scratch("eval_k_quants");
  const std::string text = TESSERA_SOURCE_DIR "/docs/quantization.md";
  auto r = cli::run("prepare --corpus text --input " + text + " --out " + (dir / "shard").string() +
                    " --tokenizer " + gguf.string() + " --val-every 0");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::pair<const char*, std::vector<const char*>> files[] = {
      {"Q4_K_M", {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}}, {"Q2_K", {"Q4_0", "Q3_K"}}};
  for (const auto& [kind, types] : files) {
    SCOPED_TRACE(kind);
    const std::string file = (dir / (std::string(kind) + ".gguf")).string();
    const fs::path log = dir / "llama.txt";
    ASSERT_EQ(
        std::system(("'" + (bin / "llama-quantize").string() + "' --allow-requantize '" +
                     gguf.string() + "' '" + file + "' " + kind + " > '" + log.string() + "' 2>&1")
                        .c_str()),
        0)
        << cli::slurp(log);
    r = cli::run("eval -m " + file + " -d " + (dir / "shard" / "train.bin").string() +
                 " --protocol llama --seq 512 --batches 8 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto ours = nlohmann::json::parse(r.out);
    const std::string model = ours["model"].get<std::string>();
    EXPECT_EQ(model.rfind("GGUF", 0), 0u) << model;  // from its blocks, not dequantized
    for (const char* type : types) EXPECT_NE(model.find(type), std::string::npos) << model;
    const double theirs = llama_cpp_perplexity(bin / "llama-perplexity", file, text, log);
    const double mine = ours["llama"]["perplexity"].get<double>();
    EXPECT_LT(std::fabs(std::log(theirs) - std::log(mine)), 0.05)
        << "llama.cpp " << theirs << ", tessera " << mine;
  }
}
