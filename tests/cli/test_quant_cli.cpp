// End-to-end tests of quantize / outliers / study and of eval and sample on quantized files,
// on the tiny Hugging Face GPT-2 fixture (C = 32, vocabulary 100, 16 positions).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/model/gpt.hpp"

namespace fs = std::filesystem;

namespace {

const std::string k_fixture = TESSERA_FIXTURES "/gpt2_tiny";

using cli::expect_clean_error;

// A token shard of ids < 100 for the fixture.
fs::path tiny_shard(const fs::path& dir) {
  std::vector<std::uint32_t> t(16 * 12);
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::uint32_t>((i * 7 + i / 5) % 100);
  auto p = dir / "val.bin";
  tessera::data::write_shard(p, t);
  return p;
}

const char* k_calib = " --calib random --nsamples 4 --seqlen 16 ";

}  // namespace

TEST(QuantCli, QuantizeThenEvalOutliersStudy) {
  auto dir = cli::scratch("quant_ok");
  auto shard = tiny_shard(dir);
  auto q = cli::run("quantize -m " + k_fixture + " -o " + (dir / "q").string() +
                    " --method gptq --group 16 --act-order" + k_calib);
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_TRUE(fs::exists(dir / "q" / "model.safetensors"));
  auto e = cli::run("eval -m " + (dir / "q").string() + " --data " + shard.string() +
                    " --reference " + k_fixture);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("non-overlapping windows of 16 tokens"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("llama.cpp chunks of 16 tokens"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("KL(reference || model)"), std::string::npos) << e.out;
  // the plain eval path loads the quantized file too
  auto e2 = cli::run("eval -m " + (dir / "q").string() + " --data " + shard.string() + " --json");
  ASSERT_EQ(e2.code, 0) << e2.err;
  // --json: standard output is the JSON document alone
  EXPECT_TRUE(nlohmann::json::parse(e2.out).contains("perplexity")) << e2.out;
  // W8A8 with simulated activation quantization is evaluated with it
  auto w = cli::run("quantize -m " + k_fixture + " -o " + (dir / "w8a8").string() +
                    " --method smoothquant --alpha 0.5" + k_calib);
  ASSERT_EQ(w.code, 0) << w.err;
  auto e3 = cli::run("eval -m " + (dir / "w8a8").string() + " --data " + shard.string() +
                     " --protocol llama");
  ASSERT_EQ(e3.code, 0) << e3.err;
  EXPECT_NE(e3.out.find("act per-token"), std::string::npos) << e3.out;
  // outliers: JSON + SVG
  auto o = cli::run("outliers -m " + k_fixture + k_calib + "--out " + (dir / "out").string());
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(cli::slurp(dir / "out" / "outliers.json").find("\"linears\""), std::string::npos);
  EXPECT_NE(cli::slurp(dir / "out" / "outliers.svg").find("<svg"), std::string::npos);
  // study: Markdown + CSV, one row per method x set x seed (rtn: once, no calibration)
  auto s = cli::run("study calibration -m " + k_fixture +
                    " --methods rtn,gptq,smoothquant --calib random,punct --seeds 2 --nsamples 2 "
                    "--seqlen 16 --windows 4 --group 16 --data " +
                    shard.string() + " --out " + (dir / "study").string());
  ASSERT_EQ(s.code, 0) << s.err;
  auto csv = cli::slurp(dir / "study" / "study.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 1 + 1 + 2 * 2 * 2);
  EXPECT_NE(cli::slurp(dir / "study" / "study.md").find("| gptq |"), std::string::npos);
  EXPECT_NE(cli::slurp(dir / "study" / "study.svg").find("<svg"), std::string::npos);
  // a method with its own weight format; the rows carry the paired ratio's interval
  auto s2 = cli::run("study calibration -m " + k_fixture +
                     " --methods rtn:w4g16,gptq:w3g16 --calib random --seeds 1 --nsamples 2 "
                     "--seqlen 16 --windows 4 --data " +
                     shard.string() + " --out " + (dir / "study2").string());
  ASSERT_EQ(s2.code, 0) << s2.err;
  const auto md = cli::slurp(dir / "study2" / "study.md");
  EXPECT_NE(md.find("| gptq:w3g16 | random |"), std::string::npos) << md;
  EXPECT_NE(md.find("ppl A / fp32 [95%]"), std::string::npos) << md;
  expect_clean_error(cli::run("study calibration -m " + k_fixture + " --methods gptq:w4x --data " +
                              shard.string() + " --out " + (dir / "study3").string()),
                     "weight format");
  // two texts, long windows for one method, a planted outlier: the long table per text
  auto s3 = cli::run("study calibration -m " + k_fixture +
                     " --methods rtn,w8a8 --long w8a8 --calib random --seeds 1 --nsamples 2 "
                     "--seqlen 16 --windows 2 --long-windows 4 --plant 0:3:50 --text one=" +
                     shard.string() + " --text two=" + shard.string() + " --out " +
                     (dir / "study4").string());
  ASSERT_EQ(s3.code, 0) << s3.err;
  const auto md3 = cli::slurp(dir / "study4" / "study.md");
  EXPECT_NE(md3.find("## The long evaluation"), std::string::npos) << md3;
  EXPECT_NE(md3.find("| w8a8 | - | two |"), std::string::npos) << md3;
  EXPECT_NE(md3.find("outlier planted at 0:3:50"), std::string::npos) << md3;
  EXPECT_NE(s3.err.find("study [1/1] rtn"), std::string::npos) << s3.err;  // progress per run
  const auto base = "study calibration -m " + k_fixture + " --data " + shard.string() + " --out " +
                    (dir / "study5").string();
  expect_clean_error(cli::run(base + " --quick --full"), "exclude each other");
  expect_clean_error(cli::run(base + " --plant 1:2"), "LAYER:CHANNEL:FACTOR");
  expect_clean_error(cli::run(base + " --plant 99:0:10"), "outside the model");
  expect_clean_error(cli::run(base + " --long nope"), "not one of --methods");
  expect_clean_error(
      cli::run("study calibration -m " + k_fixture + " --text " + (dir / "missing.txt").string() +
               " --out " + (dir / "study5").string()),
      "not found");
}

// The study through the packed kernels scores what the dequantized weights score: with fp32
// activations packed_matmul is the dequantized product up to the order of its fp32 sums and the
// fp16 rounding of the scales (2^-11 relative per row), and a per-token W8A8 model's inputs are
// rounded as its simulation rounds them. So a row's KL moves by rounding only: asserted within 2%
// plus 1e-6 (the scale rounding alone measured 1.5e-8 of KL here, where W8A8's own KL is 1.7e-7
// and RTN W4's is orders larger). LLM.int8() cannot run packed and stays simulated: identical.
TEST(QuantCli, StudyThroughThePackedKernelsScoresAsTheDequantizedWeights) {
  auto dir = cli::scratch("quant_study_packed");
  const auto shard = tiny_shard(dir);
  std::vector<std::vector<std::string>> csv[2];
  for (int k = 0; k < 2; ++k) {
    const auto out = dir / (k ? "packed" : "fp32");
    auto s =
        cli::run("study calibration -m " + k_fixture +
                 " --methods rtn,w8a8,llm-int8 --calib random --seeds 1 --nsamples 2 "
                 "--seqlen 16 --windows 2 --long - --group 32 --kernels " +
                 (k ? "packed" : "fp32") + " --data " + shard.string() + " --out " + out.string());
    ASSERT_EQ(s.code, 0) << s.err;
    std::istringstream in(cli::slurp(out / "study.csv"));
    for (std::string line; std::getline(in, line);) {
      csv[k].emplace_back();
      std::istringstream cells(line);
      for (std::string c; std::getline(cells, c, ',');) csv[k].back().push_back(c);
    }
    EXPECT_NE(cli::slurp(out / "study.md").find(k ? "through the packed kernels" : "dequantized"),
              std::string::npos);
  }
  ASSERT_EQ(csv[0].size(), 5u);  // header, fp32, rtn, w8a8, llm-int8
  ASSERT_EQ(csv[1].size(), csv[0].size());
  for (std::size_t r = 2; r < csv[0].size(); ++r) {
    ASSERT_EQ(csv[1][r][0], csv[0][r][0]);
    const double kf = std::stod(csv[0][r][7]), kp = std::stod(csv[1][r][7]);
    EXPECT_GT(kf, 0.0) << csv[0][r][0];
    EXPECT_NEAR(kp, kf, 0.02 * kf + 1e-6) << csv[0][r][0];
    if (csv[0][r][0] == "llm-int8") {
      EXPECT_EQ(csv[1][r][7], csv[0][r][7]);
    }
  }
  expect_clean_error(cli::run("study calibration -m " + k_fixture + " --kernels int4 --out " +
                              (dir / "bad").string()),
                     "kernels");
}

TEST(QuantCli, MalformedOrMismatchedInputsGiveOneLine) {
  auto dir = cli::scratch("quant_bad");
  auto out = " -o " + (dir / "x").string();
  expect_clean_error(cli::run("quantize -m " + k_fixture + out + " --method rtn --bits 9"),
                     "bit width 9");
  expect_clean_error(cli::run("quantize -m " + k_fixture + out + " --method rtn --group -7"),
                     "group size -7");
  expect_clean_error(cli::run("quantize -m " + k_fixture + out + " --method rtn --group 0"),
                     "group size 0");
  expect_clean_error(cli::run("quantize -m " + k_fixture + out +
                              " --method gptq --calib random --nsamples 0 --seqlen 16"),
                     "empty");
  expect_clean_error(cli::run("quantize -m " + k_fixture + out + " --method nope"),
                     "unknown quantization method");
  expect_clean_error(cli::run("quantize -m " + k_fixture + out +
                              " --method gptq --calib nope --nsamples 2 --seqlen 16"),
                     "unknown calibration set");
  // a quantized file, then: re-quantizing it, a config of another model beside it, and a KL
  // reference of another shape
  auto q = dir / "q";
  ASSERT_EQ(
      cli::run("quantize -m " + k_fixture + " -o " + q.string() + " --method rtn --group 16").code,
      0);
  expect_clean_error(cli::run("quantize -m " + q.string() + out + " --method rtn --group 16"),
                     "already quantized");
  // a model already in --out (here the source itself) is kept unless --overwrite says otherwise
  const auto before = cli::slurp(q / "model.safetensors");
  expect_clean_error(
      cli::run("quantize -m " + k_fixture + " -o " + q.string() + " --method rtn --group 32"),
      "already exists");
  EXPECT_EQ(cli::slurp(q / "model.safetensors"), before);
  ASSERT_EQ(cli::run("quantize -m " + k_fixture + " -o " + q.string() +
                     " --method rtn --group 16 --overwrite")
                .code,
            0);
  // numbers CLI11 alone would wrap around or take as the default
  for (const char* opt : {"--seed -1", "--seed 18446744073709551616", "--seqlen -1"})
    expect_clean_error(cli::run("quantize -m " + k_fixture + out +
                                " --method gptq --calib random --nsamples 2 " + opt),
                       std::string(opt).substr(0, std::string(opt).find(' ')));
  expect_clean_error(
      cli::run("quantize -m " + k_fixture + out + " --method rtn --eval x.bin --eval-windows 0"),
      "--eval-windows");
  auto bad = dir / "bad";
  fs::create_directories(bad);
  fs::copy_file(q / "model.safetensors", bad / "model.safetensors");
  std::ofstream(bad / "config.json")
      << R"({"model_type":"gpt2","n_layer":2,"n_head":4,"n_embd":64,"n_positions":16,)"
      << R"("vocab_size":100})";
  auto shard = tiny_shard(dir);
  expect_clean_error(cli::run("eval -m " + bad.string() + " --data " + shard.string()),
                     "does not match");
  tessera::model::ModelConfig other{1, 4, 32, 16, 100};
  tessera::model::ParamLayout layout(other);
  std::vector<float> p(layout.total(), 0.01f);
  tessera::io::save_model(dir / "other", layout, p.data());
  expect_clean_error(cli::run("eval -m " + q.string() + " --data " + shard.string() +
                              " --reference " + (dir / "other").string()),
                     "reference model");
}

// A llama model (the tiny Hugging Face LlamaForCausalLM fixture: 4 heads over 2 kv heads, untied
// head) through every method, each evaluated against the original.
TEST(QuantCli, LlamaQuantizesWithEveryMethod) {
  const std::string llama = TESSERA_FIXTURES "/llama_tiny";
  auto dir = cli::scratch("quant_llama");
  auto shard = tiny_shard(dir);
  for (const char* m : {"rtn", "gptq", "awq", "smoothquant", "w8a8", "llm-int8"}) {
    auto out = (dir / m).string();
    auto q = cli::run("quantize -m " + llama + " -o " + out + " --method " + m + " --group 16" +
                      k_calib);
    ASSERT_EQ(q.code, 0) << m << ": " << q.err;
    auto e = cli::run("eval -m " + out + " --data " + shard.string() + " --reference " + llama);
    ASSERT_EQ(e.code, 0) << m << ": " << e.err;
    EXPECT_NE(e.out.find("KL(reference || model)"), std::string::npos) << e.out;
  }
}

// A model with a tokenizer of its own refuses the default GPT-2 calibration shard (its ids would
// be read as the model's ids), before any work.
TEST(QuantCli, OwnTokenizerNeedsItsOwnCalibrationShard) {
  const fs::path gguf =
      fs::path(TESSERA_DATA) / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << "SmolLM2-135M not fetched (scripts/setup --with-models)";
  auto dir = cli::scratch("quant_own_tok");
  expect_clean_error(cli::run("quantize -m " + gguf.string() + " -o " + (dir / "q").string() +
                              " --method gptq --nsamples 2"),
                     "holds GPT-2's tokens");
}
