// Llama models from GGUF files (io/gguf_model.hpp).
//
// The round trips need no downloaded data: a tiny llama (random weights, or the Hugging Face
// fixture tests/fixtures/llama_tiny*) is written as llama.cpp's converter writes it (llama.*
// metadata, GGUF names, q/k rows permuted to GGUF's order), read back and compared bit for bit,
// config, parameters and loss. The bad-input tests edit such a file one thing at a time. The
// SmolLM2-135M tests run on the real file when scripts/setup --with-models has fetched it: they
// check its shape, that it completes "The capital of France is" with " Paris", and print its
// perplexity on a paragraph of English (and what it would be with the q/k rows left in GGUF's
// order, the mistake the permutation guards against).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "expect_error.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/runner.hpp"

using namespace tessera;
using io::GgmlType;
using io::GgufFile;
using io::GgufValue;
using io::GgufWriter;
using tessera::test::expect_error;
namespace fs = std::filesystem;

namespace {

const fs::path k_fixtures = TESSERA_FIXTURES;
const fs::path k_smollm2 =
    fs::path(TESSERA_DATA) / "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf";

model::ModelConfig tiny_llama(bool tied) {
  model::ModelConfig c;
  c.family = model::Family::Llama;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 48;
  c.vocab_size = 100;
  c.block_size = 16;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_embeddings = tied;
  return c;
}

// The content of a llama GGUF file, editable before it is written.
struct LlamaGguf {
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> dims;  // innermost first
    std::vector<float> values;
  };
  std::vector<std::pair<std::string, GgufValue>> meta;
  std::vector<Tensor> tensors;

  void set(const std::string& key, GgufValue v) {
    for (auto& [k, old] : meta)
      if (k == key) {
        old = std::move(v);
        return;
      }
    meta.emplace_back(key, std::move(v));
  }
  void erase(const std::string& key) {
    std::erase_if(meta, [&](const auto& m) { return m.first == key; });
  }
  Tensor& tensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("test: no tensor " + name);
  }
  void erase_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const Tensor& t) { return t.name == name; });
  }
  GgufWriter writer() const {
    GgufWriter w;
    for (const auto& [k, v] : meta) w.set_metadata(k, v);
    for (const auto& t : tensors) w.add_f32(t.name, GgmlType::F32, t.dims, t.values);
    return w;
  }
  std::string bytes() const { return writer().to_bytes(); }
  GgufFile file(const std::string& name = "tiny.gguf") const {
    return GgufFile::from_bytes(bytes(), name);
  }
};

// What llama.cpp's convert_hf_to_gguf.py writes for a LlamaForCausalLM (io::gguf_model_writer,
// whose output gguf-py reads and which round-trips the real SmolLM2 file byte for byte), with a
// token list of the vocabulary's size, as an editable file.
LlamaGguf to_gguf(const model::ModelConfig& c, const float* params) {
  const auto f = GgufFile::from_bytes(
      io::gguf_model_writer(model::ParamLayout(c), params, GgmlType::F32, nullptr, "tiny")
          .to_bytes(),
      "tiny.gguf");
  LlamaGguf g;
  for (const auto& m : f.metadata()) g.meta.emplace_back(m.key, m.value);
  for (const auto& t : f.tensors()) g.tensors.push_back({t.name, t.dims, f.dequantize(t)});
  std::vector<std::string> tokens;
  for (int i = 0; i < c.vocab_size; ++i) tokens.push_back(fmt::format("t{}", i));
  g.set("tokenizer.ggml.tokens", GgufValue::array_string(tokens));
  return g;
}

Buffer<float> random_params(const model::ModelConfig& c, std::uint64_t seed) {
  const model::ParamLayout layout(c);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), seed);
  // init_params gives norm weights of exactly 1: make them random too, so that a mixed-up norm
  // would show.
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::normal_distribution<float> nd(1.0f, 0.1f);
  for (const auto& t : layout.tensors())
    if (t.shape.size() == 1)
      for (std::size_t i = 0; i < t.numel; ++i) p[t.offset + i] = nd(rng);
  return p;
}

void expect_same_params(const io::LoadedModel& got, const model::ModelConfig& cfg,
                        const float* want) {
  ASSERT_EQ(got.config, cfg);
  const model::ParamLayout layout(cfg);
  ASSERT_EQ(got.params.size(), layout.total());
  for (const auto& t : layout.tensors())
    for (std::size_t i = 0; i < t.numel; ++i)
      ASSERT_EQ(got.params[t.offset + i], want[t.offset + i]) << t.name << " element " << i;
}

float loss_of(const model::ModelConfig& cfg, const float* params,
              const std::vector<std::int32_t>& tokens) {
  const model::ParamLayout layout(cfg);
  model::Activations acts;
  const int T = static_cast<int>(tokens.size()) - 1;
  return model::forward(layout, params, acts, tokens.data(), tokens.data() + 1, 1, T, {});
}

std::vector<std::int32_t> some_tokens(int n, int vocab) {
  std::vector<std::int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + 11) % vocab);
  return t;
}

}  // namespace

// ---- round trips ----

class GgufModelRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(GgufModelRoundTrip, ConfigParamsAndLossAreExact) {
  const model::ModelConfig cfg = tiny_llama(GetParam());
  const Buffer<float> params = random_params(cfg, 7);
  const LlamaGguf g = to_gguf(cfg, params.data());
  EXPECT_EQ(g.file().find("output.weight") == nullptr, cfg.tie_embeddings);
  EXPECT_EQ(io::gguf_model_config(g.file()), cfg);
  const io::LoadedModel loaded = io::load_gguf_model(g.file());
  expect_same_params(loaded, cfg, params.data());
  const auto tokens = some_tokens(cfg.block_size + 1, cfg.vocab_size);
  const float want = loss_of(cfg, params.data(), tokens);
  EXPECT_TRUE(std::isfinite(want));
  EXPECT_EQ(loss_of(loaded.config, loaded.params.data(), tokens), want);
}

TEST_P(GgufModelRoundTrip, LoadModelReadsAGgufFile) {
  const model::ModelConfig cfg = tiny_llama(GetParam());
  const Buffer<float> params = random_params(cfg, 11);
  const fs::path file = fs::temp_directory_path() /
                        (std::string("tessera_gguf_model_") + (GetParam() ? "tied" : "untied") +
                         std::to_string(::getpid()) + ".gguf");
  to_gguf(cfg, params.data()).writer().write(file);
  const io::LoadedModel loaded = io::load_model(file);  // dispatches on the .gguf extension
  expect_same_params(loaded, cfg, params.data());
  fs::remove(file);
}

TEST(GgufModelFiles, LoadModelErrors) {
  expect_error([] { io::load_model("/nonexistent/model.gguf"); },
               "GGUF file not found: /nonexistent/model.gguf");
  // llama.cpp's vocabulary-only files: a Llama 3 tokenizer with Llama 3's hyperparameters.
  const fs::path vocab = fs::path(TESSERA_DATA) / "models/vocab/ggml-vocab-llama-bpe.gguf";
  if (fs::exists(vocab))
    expect_error([&] { io::load_model(vocab); }, "has no tensor 'token_embd.weight'");
  const fs::path gemma = fs::path(TESSERA_DATA) / "models/gemma3-270m/gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(gemma)) GTEST_SKIP() << gemma << " is absent: run scripts/setup --with-models";
  expect_error([&] { io::load_model(gemma); }, "model architecture \"gemma3\" is not supported");
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, GgufModelRoundTrip, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

// The Hugging Face fixtures (transformers' LlamaForCausalLM), converted as llama.cpp converts
// them, give the same parameters and PyTorch's loss.
TEST(GgufModelFixture, HuggingFaceFixturesThroughGgufMatchPyTorch) {
  for (const char* name : {"llama_tiny", "llama_tiny_tied"}) {
    SCOPED_TRACE(name);
    const fs::path dir = k_fixtures / name;
    if (!fs::exists(dir / "expected.safetensors")) GTEST_SKIP() << dir << " missing";
    const io::LoadedModel hf = io::load_model(dir);
    const io::LoadedModel loaded = io::load_gguf_model(to_gguf(hf.config, hf.params.data()).file());
    expect_same_params(loaded, hf.config, hf.params.data());
    // PyTorch's loss on the fixture's batch (as test_model_fixture.cpp reads it).
    const auto expected = io::SafetensorsFile::open(dir / "expected.safetensors");
    const auto tok = expected.read_i64("tokens");  // (B, T+1)
    constexpr int B = 2, T = 8;
    ASSERT_EQ(tok.size(), std::size_t(B * (T + 1)));
    std::vector<std::int32_t> inputs, targets;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        inputs.push_back(static_cast<std::int32_t>(tok[b * (T + 1) + t]));
        targets.push_back(static_cast<std::int32_t>(tok[b * (T + 1) + t + 1]));
      }
    const model::ParamLayout layout(loaded.config);
    model::Activations acts;
    const float loss =
        model::forward(layout, loaded.params.data(), acts, inputs.data(), targets.data(), B, T, {});
    const float want = expected.read_f32("loss")[0];
    EXPECT_NEAR(loss, want, 2e-6 * std::fabs(want));
  }
}

// Other value types than llama.cpp's (a float64 epsilon, a uint64 count), a rope_freqs.weight of
// ones and llama.rope.scaling.type "none" change nothing.
TEST(GgufModelConfig, HarmlessVariantsLoad) {
  const model::ModelConfig cfg = tiny_llama(true);
  const Buffer<float> params = random_params(cfg, 3);
  LlamaGguf g = to_gguf(cfg, params.data());
  g.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f64(1e-5));
  g.set("llama.block_count", GgufValue::u64(2));
  g.set("llama.rope.scaling.type", GgufValue::string("none"));
  g.erase("llama.rope.freq_base");  // default 10000
  g.erase("llama.attention.head_count_kv");
  g.tensors.push_back(
      {"rope_freqs.weight", {cfg.head_dim() / 2}, std::vector<float>(cfg.head_dim() / 2, 1.0f)});
  model::ModelConfig want = cfg;
  want.n_kv_head = cfg.n_head;  // head_count_kv absent: as many as the heads
  EXPECT_EQ(io::gguf_model_config(g.file()), want);
  // The k_proj is now (C, C): give it one.
  for (int l = 0; l < cfg.n_layer; ++l)
    for (const char* kv : {"attn_k", "attn_v"}) {
      auto& t = g.tensor("blk." + std::to_string(l) + "." + kv + ".weight");
      t.dims = {cfg.n_embd, cfg.n_embd};
      t.values.resize(static_cast<std::size_t>(cfg.n_embd) * cfg.n_embd, 0.01f);
    }
  EXPECT_EQ(io::load_gguf_model(g.file()).config, want);
}

// Rotary scaling in the forms llama.cpp's converter writes it: linear as the scaling keys, Llama
// 3.1-style as rope_freqs.weight. The writer writes them so; the reader reads them back.
TEST(GgufModelConfig, RopeScalingRoundTrips) {
  model::ModelConfig cfg = tiny_llama(true);
  cfg.rope_theta = 500000.0;  // head size 8: wavelengths 6.3, 167, 4443 and 118000
  cfg.rope_scaling.kind = model::RopeScalingKind::Llama3;
  cfg.rope_scaling.factor = 8;
  const Buffer<float> params = random_params(cfg, 6);
  LlamaGguf g = to_gguf(cfg, params.data());
  // llama.cpp's factors, independently: 1 for wavelengths below 8192 / 4, 8 above 8192 / 1,
  // 1 / ((1 - s) / 8 + s) between, s = (8192 / wavelength - 1) / (4 - 1).
  const auto& factors = g.tensor("rope_freqs.weight").values;
  ASSERT_EQ(factors.size(), 4u);
  const double wavelen2 = 2 * std::numbers::pi * std::pow(500000.0, 0.5),
               s = (8192 / wavelen2 - 1) / 3;
  EXPECT_EQ(factors[0], 1.0f);
  EXPECT_EQ(factors[1], 1.0f);
  EXPECT_NEAR(factors[2], 1 / ((1 - s) / 8 + s), 1e-6);
  EXPECT_EQ(factors[3], 8.0f);
  EXPECT_EQ(io::gguf_model_config(g.file()), cfg);
  EXPECT_EQ(io::load_gguf_model(g.file()).config, cfg);

  // Factors of no llama3 parameters are kept and applied as they are.
  g.tensor("rope_freqs.weight").values = {1.0f, 2.0f, 3.0f, 4.0f};
  model::ModelConfig odd = cfg;
  odd.rope_scaling = {};
  odd.rope_scaling.freq_factors = {1.0f, 2.0f, 3.0f, 4.0f};
  EXPECT_EQ(io::gguf_model_config(g.file()), odd);
  const auto inv = model::rope_inv_freq(odd);
  EXPECT_DOUBLE_EQ(inv[2], std::pow(500000.0, -0.5) / 3);

  cfg.rope_scaling = {};
  cfg.rope_scaling.kind = model::RopeScalingKind::Linear;
  cfg.rope_scaling.factor = 4;
  g = to_gguf(cfg, params.data());
  EXPECT_THROW(g.tensor("rope_freqs.weight"), std::runtime_error);
  EXPECT_EQ(io::gguf_model_config(g.file()), cfg);
  // The older key of the factor, without a type, is linear scaling too.
  g.erase("llama.rope.scaling.type");
  g.erase("llama.rope.scaling.factor");
  g.set("llama.rope.scale_linear", GgufValue::f32(4.0f));
  EXPECT_EQ(io::gguf_model_config(g.file()), cfg);
}

TEST(GgufModelConfig, SmolLM2StyleValues) {
  // float32 metadata reads back as the decimal the converter was given.
  model::ModelConfig cfg = tiny_llama(true);
  cfg.norm_eps = 1e-6;
  cfg.rope_theta = 100000.0;
  const Buffer<float> params = random_params(cfg, 5);
  EXPECT_EQ(io::gguf_model_config(to_gguf(cfg, params.data()).file()), cfg);
}

// ---- bad inputs: one tessera::Error each ----

class GgufModelBadInput : public ::testing::Test {
 protected:
  const model::ModelConfig cfg = tiny_llama(false);
  const Buffer<float> params = random_params(cfg, 1);
  LlamaGguf g = to_gguf(cfg, params.data());
  void expect_refused(const std::string& needle) {
    expect_error([&] { io::load_gguf_model(g.file("bad.gguf")); }, needle);
    expect_error([&] { io::load_gguf_model(g.file("bad.gguf")); }, "bad.gguf");
  }
};

TEST_F(GgufModelBadInput, OtherArchitecture) {
  g.set("general.architecture", GgufValue::string("gemma3"));
  expect_refused("model architecture \"gemma3\" is not supported");
  g.erase("general.architecture");
  expect_refused("no metadata 'general.architecture'");
}

TEST_F(GgufModelBadInput, MissingOrBadKeys) {
  for (const char* key : {"llama.block_count", "llama.embedding_length",
                          "llama.attention.head_count", "llama.feed_forward_length",
                          "llama.context_length", "llama.attention.layer_norm_rms_epsilon"}) {
    SCOPED_TRACE(key);
    const LlamaGguf saved = g;
    g.erase(key);
    expect_refused(key);
    g = saved;
  }
  g.set("llama.block_count", GgufValue::string("2"));
  expect_refused("llama.block_count");
  g.set("llama.block_count", GgufValue::u32(0));
  expect_refused("'llama.block_count' is 0");
  g.set("llama.block_count", GgufValue::u64(1ull << 40));
  expect_refused("'llama.block_count' is 1099511627776");
  g.set("llama.block_count", GgufValue::u32(2));
  g.set("llama.attention.head_count_kv", GgufValue::u32(3));  // does not divide 4
  expect_refused("not divisible by model.n_kv_head");
  g.set("llama.attention.head_count_kv", GgufValue::u32(2));
  g.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(NAN));
  expect_refused("norm_eps");
}

TEST_F(GgufModelBadInput, InconsistentValues) {
  g.set("llama.rope.dimension_count", GgufValue::u32(4));
  expect_refused("'llama.rope.dimension_count' is 4, but the head size");
  g.set("llama.rope.dimension_count", GgufValue::u32(8));
  g.set("llama.attention.key_length", GgufValue::u32(16));
  expect_refused("'llama.attention.key_length' is 16");
  g.erase("llama.attention.key_length");
  g.set("llama.vocab_size", GgufValue::u32(99));
  expect_refused("llama.vocab_size is 99, but token_embd.weight has 100 rows");
  g.erase("llama.vocab_size");
  g.set("tokenizer.ggml.tokens", GgufValue::array_string(std::vector<std::string>(101, "x")));
  expect_refused("the tokenizer has 101 tokens, but token_embd.weight has 100 rows");
  g.set("tokenizer.ggml.tokens", GgufValue::u32(100));
  expect_refused("'tokenizer.ggml.tokens' is uint32");
  g.erase("tokenizer.ggml.tokens");
  g.set("llama.expert_count", GgufValue::u32(8));
  expect_refused("mixture of experts");
}

// Linear and Llama 3.1-style scaling load (GgufModelConfig.RopeScalingRoundTrips); other kinds,
// and factors of the wrong shape or value, are refused.
TEST_F(GgufModelBadInput, RopeScaling) {
  g.set("llama.rope.scaling.type", GgufValue::string("yarn"));
  g.set("llama.rope.scaling.factor", GgufValue::f32(4.0f));
  expect_refused("llama.rope.scaling.type = \"yarn\" is not supported");
  g.set("llama.rope.scaling.type", GgufValue::string("none"));
  expect_refused("llama.rope.scaling.factor = 4 with llama.rope.scaling.type \"none\"");
  g.set("llama.rope.scaling.type", GgufValue::string("linear"));
  g.set("llama.rope.scaling.factor", GgufValue::f32(-2.0f));
  expect_refused("rope_scaling factor must be positive");
  g.erase("llama.rope.scaling.type");
  g.erase("llama.rope.scaling.factor");
  g.tensors.push_back({"rope_freqs.weight", {3}, {1, 1, 8}});
  expect_refused("tensor 'rope_freqs.weight' has GGUF dims [3]");
  g.tensor("rope_freqs.weight") = {"rope_freqs.weight", {cfg.head_dim() / 2}, {1, 1, 0, 8}};
  expect_refused("a rotary frequency factor is 0");
}

TEST_F(GgufModelBadInput, WrongShapes) {
  auto& down = g.tensor("blk.1.ffn_down.weight");  // (C, F) stored as dims [F, C]
  std::swap(down.dims[0], down.dims[1]);
  expect_refused(
      "tensor 'blk.1.ffn_down.weight' (model.layers.1.mlp.down_proj.weight) has shape "
      "[48, 32] (GGUF dims [32, 48]), but the model");
  std::swap(down.dims[0], down.dims[1]);
  auto& emb = g.tensor("token_embd.weight");
  emb.dims = {16, 200};
  expect_refused("token_embd.weight has GGUF dims [16, 200]");
  emb.dims = {32, 100};
  auto& head = g.tensor("output.weight");
  head.dims = {32, 50};
  head.values.resize(32 * 50);
  expect_refused("tensor 'output.weight' (lm_head.weight) has shape [50, 32]");
  g.erase_tensor("output.weight");  // tied now, a valid file
  EXPECT_TRUE(io::load_gguf_model(g.file()).config.tie_embeddings);
  g.tensor("output_norm.weight").dims = {32, 1};  // a trailing dim of 1: the same tensor
  EXPECT_NO_THROW(io::load_gguf_model(g.file()));
  g.tensor("output_norm.weight").dims = {16, 2};
  expect_refused("output_norm.weight");
}

TEST_F(GgufModelBadInput, MissingAndUnknownTensors) {
  LlamaGguf good = g;
  g.erase_tensor("blk.1.ffn_up.weight");
  expect_refused("has no tensor 'blk.1.ffn_up.weight' (model.layers.1.mlp.up_proj.weight)");
  g = good;
  g.tensors.push_back({"blk.0.attn_q.bias", {32}, std::vector<float>(32)});
  expect_refused("tensor 'blk.0.attn_q.bias' is a bias");
  g = good;
  g.tensors.push_back({"blk.2.attn_norm.weight", {32}, std::vector<float>(32, 1.0f)});
  expect_refused("holds tensor 'blk.2.attn_norm.weight', which the model");
  g = good;
  g.tensors.push_back({"blk.0.ffn_gate_exps.weight", {32, 48, 2}, std::vector<float>(32 * 48 * 2)});
  expect_refused("mixture of experts");
  g = good;
  g.tensors.push_back({"something_else", {4}, std::vector<float>(4)});
  expect_refused("holds tensor 'something_else'");
  g = good;
  g.erase_tensor("token_embd.weight");
  expect_refused("no tensor 'token_embd.weight'");
}

TEST_F(GgufModelBadInput, NonFiniteWeights) {
  g.tensor("blk.0.attn_v.weight").values[5] = INFINITY;
  expect_refused("tensor 'model.layers.0.self_attn.v_proj.weight' holds 1 non-finite value");
}

TEST_F(GgufModelBadInput, UndecodableType) {
  // A tensor of a type tessera cannot dequantize (Q8_1), refused before anything is allocated.
  GgufWriter w;
  for (const auto& [k, v] : g.meta) w.set_metadata(k, v);
  for (const auto& t : g.tensors) {
    if (t.name != "blk.0.ffn_up.weight") {
      w.add_f32(t.name, GgmlType::F32, t.dims, t.values);
      continue;
    }
    const auto& info = io::ggml_type_info(GgmlType::Q8_1);
    std::vector<std::byte> bytes(static_cast<std::size_t>(t.dims[0] / info.block_size) *
                                 info.block_bytes * t.dims[1]);
    w.add_encoded(t.name, GgmlType::Q8_1, t.dims, bytes);
  }
  expect_error([&] { io::load_gguf_model(GgufFile::from_bytes(w.to_bytes(), "q81.gguf")); },
               "has type Q8_1, which tessera cannot dequantize");
}

// Damaged files: every single-byte change of a valid file either loads or is one tessera::Error.
TEST_F(GgufModelBadInput, ByteFlipsNeverCrash) {
  const std::string good = g.bytes();
  const GgufFile f = GgufFile::from_bytes(good, "x.gguf");
  const std::size_t header_end = f.data_offset();
  std::mt19937 rng(42);
  int refused = 0, loaded = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = good;
    // Mostly the header, metadata and tensor infos; some of the data.
    const std::size_t pos = (i % 4 == 3) ? rng() % bytes.size() : rng() % header_end;
    bytes[pos] = static_cast<char>(rng() & 0xff);
    try {
      const auto m = io::load_gguf_model(GgufFile::from_bytes(bytes, "flipped.gguf"));
      ++loaded;
    } catch (const Error& e) {
      ++refused;
      ASSERT_NE(std::string(e.what()).find("flipped.gguf"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(loaded, 100);
}

// ---- SmolLM2-135M (scripts/setup --with-models) ----

namespace {

struct SmolLM2 {
  io::LoadedModel model;
  data::Tokenizer tok;
};

// Logits (Vp per position) of one sequence.
std::vector<float> logits_of(const io::LoadedModel& m, const std::vector<std::int32_t>& tokens) {
  const model::ParamLayout layout(m.config);
  model::Activations acts;
  const int T = static_cast<int>(tokens.size());
  model::forward(layout, m.params.data(), acts, tokens.data(), nullptr, 1, T, {});
  const float* p = acts.at(acts.logits);
  return std::vector<float>(p, p + static_cast<std::size_t>(T) * m.config.padded_vocab());
}

std::vector<std::int32_t> ids_of(const data::Tokenizer& tok, const std::string& text) {
  std::vector<std::int32_t> out;
  for (auto id : tok.encode(text)) out.push_back(static_cast<std::int32_t>(id));
  return out;
}

// The top k of the first `vocab` logits, best first.
std::vector<int> top_k(const float* logits, int vocab, int k) {
  std::vector<int> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  idx.resize(k);
  return idx;
}

// About 300 tokens of plain English prose.
constexpr const char* k_english =
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, "
    "a goldsmith from the German city of Mainz, developed a system of movable metal type. Before "
    "his invention, books in Europe were copied by hand, usually by monks working in "
    "monasteries, and a single volume could take months or even years to complete. As a result, "
    "books were rare and expensive, and only the wealthy and the clergy could afford to own "
    "them. Gutenberg's press changed this almost overnight. By combining a screw press, similar "
    "to those used for making wine and olive oil, with individual letters cast in metal, he made "
    "it possible to print hundreds of identical pages in a single day. The first major book he "
    "produced was the Bible, and about one hundred and eighty copies were made. Within a few "
    "decades, printing shops had opened in more than two hundred cities across Europe, and "
    "millions of books had been printed. The spread of printed material helped to increase "
    "literacy, made scientific knowledge easier to share, and played an important role in the "
    "religious and political changes of the following century. Today, historians often "
    "describe the printing press as one of the most important inventions in human history, "
    "because it allowed ideas to travel faster and further than ever before.";

}  // namespace

class GgufSmolLM2 : public ::testing::Test {
 protected:
  // Loaded once for the suite; a file that is present but does not load fails every test.
  static void SetUpTestSuite() {
    if (!fs::exists(k_smollm2)) return;
    try {
      const auto t0 = std::chrono::steady_clock::now();
      auto m = io::load_model(k_smollm2);  // through the .gguf dispatch
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("loaded %s in %.2f s: %s\n", k_smollm2.filename().c_str(), s,
                  model::describe(m.config).c_str());
      smol_ = new SmolLM2{std::move(m), io::load_tokenizer(k_smollm2)};
    } catch (const std::exception& e) {
      load_error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    delete smol_;
    smol_ = nullptr;
  }
  void SetUp() override {
    if (!fs::exists(k_smollm2))
      GTEST_SKIP() << k_smollm2 << " is absent: run scripts/setup --with-models";
    ASSERT_NE(smol_, nullptr) << "loading " << k_smollm2 << " failed: " << load_error_;
  }
  static SmolLM2* smol_;
  static std::string load_error_;
};
SmolLM2* GgufSmolLM2::smol_ = nullptr;
std::string GgufSmolLM2::load_error_;

TEST_F(GgufSmolLM2, Shape) {
  const auto& c = smol_->model.config;
  EXPECT_TRUE(c.llama());
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.kv_heads(), 3);
  EXPECT_EQ(c.ffn(), 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.block_size, 8192);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(smol_->tok.vocab_size(), 49152u);
  const model::ParamLayout layout(c);
  EXPECT_EQ(layout.count_unpadded(), 134515008u);  // SmolLM2-135M's parameters
}

TEST_F(GgufSmolLM2, CapitalOfFranceIsParis) {
  const auto& m = smol_->model;
  const auto prompt = ids_of(smol_->tok, "The capital of France is");
  ASSERT_FALSE(prompt.empty());
  const auto t0 = std::chrono::steady_clock::now();
  const auto logits = logits_of(m, prompt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int Vp = m.config.padded_vocab(), V = m.config.vocab_size;
  const float* last = logits.data() + (prompt.size() - 1) * Vp;
  for (int v = 0; v < V; ++v) ASSERT_TRUE(std::isfinite(last[v])) << v;
  const auto top = top_k(last, V, 5);
  std::printf("forward of %zu tokens: %.3f s; top 5 after \"The capital of France is\":\n",
              prompt.size(), s);
  for (int id : top)
    std::printf("  %6d %-12s logit %.3f\n", id,
                ("\"" + smol_->tok.token_bytes(static_cast<std::uint32_t>(id)) + "\"").c_str(),
                last[id]);
  EXPECT_EQ(smol_->tok.token_bytes(static_cast<std::uint32_t>(top[0])), " Paris");

  // The KV-cache decoder gives the same logits, and greedy decoding goes on sensibly.
  const model::ParamLayout layout(m.config);
  model::Decoder dec(layout, m.params.data(), 64, kernels::GemmLibrary::OneDnn);
  const float* step = nullptr;
  for (std::size_t i = 0; i < prompt.size(); ++i)
    step = dec.step(prompt[i], i + 1 == prompt.size());
  float worst = 0;
  for (int v = 0; v < V; ++v) worst = std::max(worst, std::fabs(step[v] - last[v]));
  std::printf("decoder vs forward logits: largest difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-3f) << "decoder and forward logits differ";
  std::vector<std::uint32_t> generated;
  for (int i = 0; i < 12; ++i) {
    const int next = top_k(step, V, 1)[0];
    generated.push_back(static_cast<std::uint32_t>(next));
    step = dec.step(next);
  }
  std::printf("greedy: \"The capital of France is%s\"\n", smol_->tok.decode(generated).c_str());
}

TEST_F(GgufSmolLM2, Fp16KvCacheFollowsTheFp32One) {
  // The decoder with an fp16 cache, fed the fp32 decoder's greedy continuation of "The capital of
  // France is": its keys and values are rounded by at most u = 2^-11 relative, which 30 layers
  // carry to the logits. Measured (printed): ~1e-3 relative to the logits' scale. Bound: 0.02 of
  // (1 + max |logit|) at every position, and the same greedy token wherever the fp32 decoder's
  // top two logits are further apart than twice the largest change seen at that position.
  const auto& m = smol_->model;
  const model::ParamLayout layout(m.config);
  const auto prompt = ids_of(smol_->tok, "The capital of France is");
  const int V = m.config.vocab_size;
  model::Decoder d32(layout, m.params.data(), 64, kernels::GemmLibrary::OneDnn);
  model::Decoder d16(layout, m.params.data(), 64, kernels::GemmLibrary::OneDnn, {},
                     model::KvCache::F16);
  std::vector<std::int32_t> seq(prompt.begin(), prompt.end());
  double worst = 0;
  std::vector<std::uint32_t> generated;
  for (std::size_t i = 0; i < prompt.size() + 24; ++i) {
    const float* a = d32.step(seq[i]);
    const float* b = d16.step(seq[i]);
    double scale = 0, diff = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(double(a[v])));
      diff = std::max(diff, std::fabs(double(b[v]) - a[v]));
    }
    worst = std::max(worst, diff / (1 + scale));
    ASSERT_LE(diff, 0.02 * (1 + scale)) << "position " << i;
    if (i + 1 < prompt.size()) continue;
    const auto top = top_k(a, V, 2);
    if (a[top[0]] - a[top[1]] > 2 * diff) {
      EXPECT_EQ(top_k(b, V, 1)[0], top[0]) << "position " << i;
    }
    seq.push_back(top[0]);
    generated.push_back(static_cast<std::uint32_t>(top[0]));
  }
  std::printf(
      "fp16 cache vs fp32: largest logit change %.3g of (1 + max |logit|); greedy: \"The "
      "capital of France is%s\"\n",
      worst, smol_->tok.decode(generated).c_str());
}

// The file's own Q4_1 blocks packed (quant/gguf_import.hpp, as `tessera sample` reads it): every
// linear and the Q8_0 embedding, the linears' fp32 pages never written. Its decoder with fp32
// activations against the dequantized model's, fed the latter's greedy continuation of "The
// capital of France is": the weights differ by at most 2^-21 (16 |d| + |m|) (Q4_1's d (n + m /
// d) against d n + m, ~1e-6 of a weight), the sums by their order; 30 layers carry both to
// ~1e-5 of the logits' scale; measured (printed) 3.4e-6. Bound: 1e-4 (1 + max |logit|). With
// int8 activations (the default, as llama.cpp computes Q4_1) the logits move by up to ~5% of
// their scale over these positions (printed, not bounded here: the kernels' own tests bound
// each product), and the first token is still " Paris", which leads the next by 2.5.
TEST_F(GgufSmolLM2, PackedQ4_1BlocksFollowTheDequantizedModel) {
  const auto& m = smol_->model;
  const model::ParamLayout layout(m.config);
  quant::PackedModel pm;
  std::string why;
  const auto any = quant::load_packed_model(k_smollm2, pm, why);
  ASSERT_EQ(why, "");
  EXPECT_EQ(any.description, "GGUF Q4_1 linears, embedding Q8_0");
  ASSERT_EQ(pm.linears.size(), 120u);
  EXPECT_EQ(pm.embed.rows, m.config.vocab_size);
  EXPECT_EQ(any.model.params[quant::lin_weight_offset(layout, 7, quant::Lin::Fc)], 0.0f);
  const auto prompt = ids_of(smol_->tok, "The capital of France is");
  const int V = m.config.vocab_size;
  model::Decoder plain(layout, m.params.data(), 64, kernels::GemmLibrary::OneDnn);
  pm.int8_activations = false;
  model::Decoder a16(layout, any.model.params.data(), 64, kernels::GemmLibrary::OneDnn,
                     pm.decoder_kernels());
  quant::PackedModel pm8 = pm;
  pm8.int8_activations = true;
  model::Decoder a8(layout, any.model.params.data(), 64, kernels::GemmLibrary::OneDnn,
                    pm8.decoder_kernels());
  std::vector<std::int32_t> seq(prompt.begin(), prompt.end());
  double worst = 0, worst8 = 0;
  for (std::size_t i = 0; i < prompt.size() + 12; ++i) {
    const float* want = plain.step(seq[i]);
    const float* got = a16.step(seq[i]);
    const float* got8 = a8.step(seq[i]);
    double scale = 0, diff = 0, diff8 = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(double(want[v])));
      diff = std::max(diff, std::fabs(double(got[v]) - want[v]));
      diff8 = std::max(diff8, std::fabs(double(got8[v]) - want[v]));
    }
    ASSERT_LE(diff, 1e-4 * (1 + scale)) << "position " << i;
    worst = std::max(worst, diff / (1 + scale));
    worst8 = std::max(worst8, diff8 / (1 + scale));
    if (i + 1 == prompt.size()) {
      EXPECT_EQ(smol_->tok.token_bytes(static_cast<std::uint32_t>(top_k(got8, V, 1)[0])), " Paris");
    }
    if (i + 1 >= prompt.size()) seq.push_back(top_k(want, V, 1)[0]);
  }
  std::printf(
      "packed Q4_1 blocks vs the dequantized model: largest logit change %.3g of (1 + max "
      "|logit|) with fp32 activations, %.3g with int8 activations\n",
      worst, worst8);
}

TEST_F(GgufSmolLM2, PerplexityOnEnglish) {
  const auto& m = smol_->model;
  const auto ids = ids_of(smol_->tok, k_english);
  ASSERT_GT(ids.size(), 200u);
  const auto t0 = std::chrono::steady_clock::now();
  const float loss = loss_of(m.config, m.params.data(), ids);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(std::isfinite(loss));
  std::printf("SmolLM2-135M Q4_1 on %zu tokens of English: loss %.4f, perplexity %.2f (%.2f s)\n",
              ids.size(), loss, std::exp(loss), s);
  EXPECT_LT(std::exp(loss), 40.0);  // a damaged model (e.g. q/k rows out of order) is far above

  // The same with the q/k rows left in GGUF's order: RoPE then pairs the wrong elements.
  const model::ParamLayout layout(m.config);
  Buffer<float> wrong(layout.total());
  std::copy(m.params.data(), m.params.data() + layout.total(), wrong.data());
  for (const auto& t : layout.tensors()) {
    const bool q = t.name.ends_with("q_proj.weight"), k = t.name.ends_with("k_proj.weight");
    if (!q && !k) continue;
    const auto v =
        io::permute_qk_to_gguf(std::span<const float>(m.params.data() + t.offset, t.numel),
                               q ? m.config.n_head : m.config.kv_heads(), t.shape[0], t.shape[1]);
    std::copy(v.begin(), v.end(), wrong.data() + t.offset);
  }
  const float wrong_loss = loss_of(m.config, wrong.data(), ids);
  std::printf("with q/k rows in GGUF's order instead: loss %.4f, perplexity %.2f\n", wrong_loss,
              std::exp(wrong_loss));
  EXPECT_GT(wrong_loss, loss + 0.5f);
}

// The same weights in Hugging Face transformers 4.45.2 (LlamaForCausalLM, fp32, eager attention;
// tools/make_smollm2_logits.py wrote tests/fixtures/smollm2_logits.json from the checkpoint
// `tessera convert` makes of the GGUF file): for three prompts, at every position the argmax,
// the max logit and the log-sum-exp, and at the last position the 10 largest logits. Bound: both
// sides are fp32 through 30 layers with sums in other orders (and tessera's polynomial exp,
// ~2e-7 relative); relative differences of ~1e-6 per layer compound to ~1e-5 relative on
// logits of magnitude ~20, i.e. ~2e-4 absolute at most. Measured: 4.4e-5 (printed); the bound,
// 5e-4, is ~10x that. An argmax may differ only where the top two logits are within the bound.
TEST_F(GgufSmolLM2, LogitsMatchTransformers) {
  const fs::path fixture = fs::path(TESSERA_FIXTURES) / "smollm2_logits.json";
  std::ifstream in(fixture);
  ASSERT_TRUE(in) << fixture;
  const auto ref = nlohmann::json::parse(in);
  constexpr double bound = 5e-4;
  const auto& m = smol_->model;
  const int Vp = m.config.padded_vocab(), V = m.config.vocab_size;
  double worst = 0;
  for (const auto& p : ref["prompts"]) {
    SCOPED_TRACE(p["text"].get<std::string>());
    const auto ids = p["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(ids_of(smol_->tok, p["text"].get<std::string>()), ids) << "tokenization";
    const auto logits = logits_of(m, ids);
    for (std::size_t t = 0; t < ids.size(); ++t) {
      const float* row = logits.data() + t * Vp;
      const int arg = static_cast<int>(std::max_element(row, row + V) - row);
      double lse = 0;
      for (int v = 0; v < V; ++v) lse += std::exp(double(row[v]) - row[arg]);
      lse = row[arg] + std::log(lse);
      const double d_max = std::abs(row[arg] - p["max"][t].get<double>());
      const double d_lse = std::abs(lse - p["logsumexp"][t].get<double>());
      worst = std::max({worst, d_max, d_lse});
      EXPECT_LE(d_max, bound) << "position " << t;
      EXPECT_LE(d_lse, bound) << "position " << t;
      const int want = p["argmax"][t].get<int>();
      if (arg != want) {
        EXPECT_LE(std::abs(row[arg] - row[want]), bound) << "position " << t;
      }
    }
    const float* last = logits.data() + (ids.size() - 1) * Vp;
    for (std::size_t k = 0; k < 10; ++k) {
      const int id = p["top10_ids"][k].get<int>();
      const double d = std::abs(last[id] - p["top10_logits"][k].get<double>());
      worst = std::max(worst, d);
      EXPECT_LE(d, bound) << "top-" << k << " token " << id;
    }
  }
  std::printf("SmolLM2-135M vs transformers on %zu prompts: worst logit difference %.3g\n",
              ref["prompts"].size(), worst);
}

// tessera writes llama models as GGUF (io::save_gguf_model, `tessera convert --format gguf`):
// an F32 file loads back bit for bit, and writing what was read gives the same bytes; Q8_0
// matrices load back within Q8_0's rounding (half a step of each 32-block's scale); the
// tokenizer written into the file tokenizes as the one it came from.
TEST(GgufModelWrite, LlamaRoundTripsWithItsTokenizer) {
  model::ModelConfig cfg = tiny_llama(false);
  cfg.vocab_size = 259;        // the tokenizer's
  cfg.intermediate_size = 64;  // Q8_0 blocks are 32 values of a row: rows of 32 and 64
  const model::ParamLayout layout(cfg);
  io::LoadedModel src{cfg, random_params(cfg, 3)};
  const fs::path tok_file =  // a small SmolLM-style tokenizer (a fuzz seed)
      fs::path(TESSERA_FIXTURES) / ".." / "fuzz" / "corpus" / "gguf" / "tokenizer_smollm.gguf";
  const auto tok = io::load_tokenizer(tok_file);
  const auto dir = fs::temp_directory_path() / ("tessera_gguf_write_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  io::save_gguf_model(dir / "m.gguf", layout, src.params.data(), io::GgmlType::F32, &tok.vocab());
  const auto back = io::load_model(dir / "m.gguf");
  ASSERT_EQ(back.config, src.config);
  for (std::size_t i = 0; i < layout.total(); ++i) ASSERT_EQ(back.params[i], src.params[i]) << i;
  const auto tok2 = io::load_tokenizer(dir / "m.gguf");
  const std::string text = "Hello, world! 123 <|endoftext|> caf\xc3\xa9";
  EXPECT_EQ(tok2.encode(text), tok.encode(text));
  fs::create_directories(dir / "again");
  io::save_gguf_model(dir / "again" / "m.gguf", layout, back.params.data(), io::GgmlType::F32,
                      &tok2.vocab());
  EXPECT_EQ(read_file(dir / "m.gguf", "a"), read_file(dir / "again" / "m.gguf", "b"));

  io::save_gguf_model(dir / "q8.gguf", layout, src.params.data(), io::GgmlType::Q8_0, nullptr);
  const auto q8 = io::load_model(dir / "q8.gguf");
  for (const auto& t : layout.tensors()) {
    const bool matrix = t.shape.size() == 2;
    for (std::size_t i = 0; i < t.numel; ++i) {
      const float a = src.params[t.offset + i], b = q8.params[t.offset + i];
      // scale = max|block| / 127 with weights ~N(0, 0.02) (|w| < 0.1): error <= scale / 2 plus
      // the fp16 rounding of the scale (2^-11 relative) < 4e-4; bound 1e-3
      if (matrix)
        ASSERT_LE(std::abs(a - b), 1e-3f) << t.name;
      else
        ASSERT_EQ(a, b) << t.name << " (norms stay F32)";
    }
  }
  // Q4_0: the linears in 4 bits (within half a step, max|block| / 8, of 0.1 at most: 7e-3 plus
  // the scale's fp16 rounding; bound 1e-2), the embedding and head in Q8_0 (bound as above).
  io::save_gguf_model(dir / "q4.gguf", layout, src.params.data(), GgmlType::Q4_0, nullptr);
  const auto q4 = io::load_model(dir / "q4.gguf");
  for (const auto& t : layout.tensors())
    for (std::size_t i = 0; i < t.numel; ++i) {
      const float a = src.params[t.offset + i], b = q4.params[t.offset + i];
      if (t.shape.size() == 1)
        ASSERT_EQ(a, b) << t.name;
      else
        ASSERT_LE(std::abs(a - b), t.vocab_rows ? 1e-3f : 1e-2f) << t.name;
    }
  EXPECT_THROW(
      io::save_gguf_model(dir / "q5.gguf", layout, src.params.data(), GgmlType::Q5_0, nullptr),
      Error);
  fs::remove_all(dir);
}

// A llama model read from an F16 or Q8_0 file and written again in the same type gives the same
// bytes: F16 widens exactly to fp32, and a Q8_0 block's values d * q re-encode to the same d and
// q (the largest |q| is 127, so max |d q| / 127 is d again; see GgufRoundTrip in test_gguf.cpp).
TEST(GgufModelWrite, LlamaF16AndQ8_0FilesRoundTripBitExactly) {
  model::ModelConfig cfg = tiny_llama(false);
  cfg.intermediate_size = 64;  // Q8_0 blocks are 32 values of a row: rows of 32 and 64
  const model::ParamLayout layout(cfg);
  const auto params = random_params(cfg, 5);
  for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
    SCOPED_TRACE(static_cast<int>(type));
    const std::string first =
        io::gguf_model_writer(layout, params.data(), type, nullptr, "m").to_bytes();
    const io::LoadedModel back = io::load_gguf_model(GgufFile::from_bytes(first, "m.gguf"));
    ASSERT_EQ(back.config, cfg);
    const std::string again =
        io::gguf_model_writer(layout, back.params.data(), type, nullptr, "m").to_bytes();
    EXPECT_TRUE(first == again);
  }
}

// ---- gpt2 ----

namespace {

model::ModelConfig tiny_gpt2(int vocab = 100) {
  model::ModelConfig c;  // gpt2: LayerNorm, learned positions, GELU MLP of 4 C, tied head
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = vocab;
  return c;
}

std::map<std::string, const io::GgufTensorInfo*> tensors_by_name(const GgufFile& f) {
  std::map<std::string, const io::GgufTensorInfo*> m;
  for (const auto& t : f.tensors()) m[t.name] = &t;
  return m;
}

}  // namespace

// GGUF's gpt2 names are llama.cpp's (gguf-py's MODEL_TENSORS[GPT2]) and map back to every
// tensor of tessera's gpt2 layout.
TEST(GgufGpt2, TensorNames) {
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("wte.weight"), "token_embd.weight");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("wpe.weight"), "position_embd.weight");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("h.11.attn.c_attn.bias"), "blk.11.attn_qkv.bias");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("h.0.attn.c_proj.weight"), "blk.0.attn_output.weight");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("h.3.mlp.c_fc.weight"), "blk.3.ffn_up.weight");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("h.3.mlp.c_proj.bias"), "blk.3.ffn_down.bias");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("h.1.ln_1.weight"), "blk.1.attn_norm.weight");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("h.1.ln_2.bias"), "blk.1.ffn_norm.bias");
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("ln_f.bias"), "output_norm.bias");
  EXPECT_EQ(io::gpt2_gguf_to_hf_name("output.weight"), std::nullopt);
  EXPECT_EQ(io::gpt2_gguf_to_hf_name("blk.01.attn_qkv.weight"), std::nullopt);
  EXPECT_EQ(io::gpt2_hf_to_gguf_name("model.layers.0.self_attn.q_proj.weight"), std::nullopt);
  const model::ParamLayout layout(tiny_gpt2());
  for (const auto& t : layout.tensors()) {
    const auto g = io::gpt2_hf_to_gguf_name(t.name);
    ASSERT_TRUE(g.has_value()) << t.name;
    EXPECT_EQ(io::gpt2_gguf_to_hf_name(*g), t.name);
  }
}

// The Hugging Face GPT-2 fixture (transformers' Conv1D layout) written as GGUF: llama.cpp's
// names, dims and types, no output.weight (the head is tied); it loads back bit for bit with
// PyTorch's loss, and writing what was read gives the same bytes. F16 and Q8_0 files keep the
// 1-D tensors and the position embedding in F32, as llama.cpp's converter does.
TEST(GgufGpt2, FixtureRoundTripsBitExactly) {
  const fs::path fixture = k_fixtures / "gpt2_tiny";
  const io::LoadedModel hf = io::load_model(fixture);
  const model::ModelConfig& cfg = hf.config;
  const model::ParamLayout layout(cfg);
  const auto dir = fs::temp_directory_path() / ("tessera_gguf_gpt2_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  io::save_gguf_model(dir / "g.gguf", layout, hf.params.data(), GgmlType::F32, nullptr);
  const auto f = GgufFile::open(dir / "g.gguf");
  EXPECT_EQ(f.get_string("general.architecture"), "gpt2");
  EXPECT_EQ(f.get_int("gpt2.block_count"), 2);
  EXPECT_EQ(f.get_int("gpt2.context_length"), 16);
  EXPECT_EQ(f.get_int("gpt2.embedding_length"), 32);
  EXPECT_EQ(f.get_int("gpt2.feed_forward_length"), 128);
  EXPECT_EQ(f.get_int("gpt2.attention.head_count"), 4);
  EXPECT_EQ(f.get_float("gpt2.attention.layer_norm_epsilon"), double(1e-5f));
  EXPECT_EQ(f.get_int("general.file_type"), 0);
  const auto by_name = tensors_by_name(f);
  EXPECT_EQ(by_name.size(), layout.tensors().size());
  EXPECT_FALSE(by_name.contains("output.weight"));
  EXPECT_EQ(by_name.at("token_embd.weight")->dims, (std::vector<std::int64_t>{32, 100}));
  EXPECT_EQ(by_name.at("position_embd.weight")->dims, (std::vector<std::int64_t>{32, 16}));
  EXPECT_EQ(by_name.at("blk.1.attn_qkv.weight")->dims, (std::vector<std::int64_t>{32, 96}));
  EXPECT_EQ(by_name.at("blk.1.ffn_up.weight")->dims, (std::vector<std::int64_t>{32, 128}));
  EXPECT_EQ(by_name.at("blk.1.ffn_down.weight")->dims, (std::vector<std::int64_t>{128, 32}));
  EXPECT_EQ(by_name.at("blk.0.attn_qkv.bias")->dims, (std::vector<std::int64_t>{96}));
  // GGUF row r of attn_qkv is HF Conv1D column r: c_attn.weight is (in, out) in the fixture.
  const auto conv = io::SafetensorsFile::open(fixture / "model.safetensors")
                        .read_f32("h.1.attn.c_attn.weight");  // (32, 96)
  const auto qkv = f.dequantize(*by_name.at("blk.1.attn_qkv.weight"));
  for (int r = 0; r < 96; ++r)
    for (int c = 0; c < 32; ++c) ASSERT_EQ(qkv[r * 32 + c], conv[c * 96 + r]) << r << "," << c;

  const io::LoadedModel back = io::load_model(dir / "g.gguf");
  expect_same_params(back, cfg, hf.params.data());
  const auto tokens = some_tokens(cfg.block_size + 1, cfg.vocab_size);
  EXPECT_EQ(loss_of(back.config, back.params.data(), tokens),
            loss_of(cfg, hf.params.data(), tokens));
  fs::create_directories(dir / "again");
  io::save_gguf_model(dir / "again" / "g.gguf", layout, back.params.data(), GgmlType::F32, nullptr);
  EXPECT_TRUE(read_file(dir / "g.gguf", "a") == read_file(dir / "again" / "g.gguf", "b"));

  for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
    const auto q = GgufFile::from_bytes(
        io::gguf_model_writer(layout, hf.params.data(), type, nullptr, "q").to_bytes(), "q.gguf");
    for (const auto& t : q.tensors()) {
      const bool f32 = t.dims.size() == 1 || t.name == "position_embd.weight";
      EXPECT_EQ(t.type, f32 ? GgmlType::F32 : type) << t.name;
    }
    EXPECT_EQ(q.get_int("general.file_type"), type == GgmlType::F16 ? 1 : 7);
    EXPECT_EQ(io::load_gguf_model(q).config, cfg);
  }
  fs::remove_all(dir);
}

// GPT-2's tokenizer (encoder.json + vocab.bpe) goes into tokenizer.ggml.* as llama.cpp's own
// GPT-2 vocabulary file holds it, and the file's tokenizer encodes as the original.
TEST(GgufGpt2, WrittenWithGpt2sTokenizer) {
  const fs::path gpt2_dir = fs::path(TESSERA_DATA) / "gpt2";
  if (!fs::exists(gpt2_dir / "encoder.json")) GTEST_SKIP() << gpt2_dir << " is absent";
  const auto tok = io::load_tokenizer(gpt2_dir);
  model::ModelConfig cfg = tiny_gpt2(50257);
  cfg.n_layer = 1;
  const model::ParamLayout layout(cfg);
  const Buffer<float> params = random_params(cfg, 9);
  const auto f = GgufFile::from_bytes(
      io::gguf_model_writer(layout, params.data(), GgmlType::F32, &tok.vocab(), "gpt2").to_bytes(),
      "gpt2.gguf");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");
  const auto back = data::Tokenizer::from_vocab(io::gguf_bpe_vocab(f));
  const std::string text = "Hello, world! It's 2024 <|endoftext|> caf\xc3\xa9  spaces\n";
  EXPECT_EQ(back.encode(text), tok.encode(text));
  expect_same_params(io::load_gguf_model(f), cfg, params.data());

  const fs::path ref = fs::path(TESSERA_DATA) / "models/vocab/ggml-vocab-gpt-2.gguf";
  if (!fs::exists(ref)) GTEST_SKIP() << ref << " is absent: run scripts/setup --with-models";
  const auto r = GgufFile::open(ref);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens"), r.get_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(f.get_ints("tokenizer.ggml.token_type"), r.get_ints("tokenizer.ggml.token_type"));
  EXPECT_EQ(f.get_strings("tokenizer.ggml.merges"), r.get_strings("tokenizer.ggml.merges"));
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), r.get_string("tokenizer.ggml.pre"));
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), r.get_int("tokenizer.ggml.bos_token_id"));
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), r.get_int("tokenizer.ggml.eos_token_id"));
  // llama.cpp's GPT-2 file holds GPT-2's hyperparameters under the same keys.
  for (const char* key : {"gpt2.block_count", "gpt2.context_length", "gpt2.embedding_length",
                          "gpt2.feed_forward_length", "gpt2.attention.head_count"})
    EXPECT_EQ(f.find_metadata(key)->type(), r.find_metadata(key)->type()) << key;
  EXPECT_EQ(f.metadata("gpt2.attention.layer_norm_epsilon").encoding(),
            r.metadata("gpt2.attention.layer_norm_epsilon").encoding());
}

// A gpt2 file written by gguf-py's own GGUFWriter (the fuzz seed gpt2_tiny.gguf: the keys of
// llama.cpp's GPT2Model converter, random F32 tensors) loads with each tensor where the layout
// puts its Hugging Face name.
TEST(GgufGpt2, FileWrittenByGgufPyLoads) {
  const auto f = GgufFile::open(k_fixtures / ".." / "fuzz" / "corpus" / "gguf" / "gpt2_tiny.gguf");
  model::ModelConfig want = tiny_gpt2(16);
  want.n_layer = 1;
  want.n_head = 2;
  want.n_embd = 8;
  want.block_size = 4;
  const io::LoadedModel m = io::load_gguf_model(f);
  ASSERT_EQ(m.config, want);
  const model::ParamLayout layout(want);
  for (const auto& g : f.tensors()) {
    const auto hf = io::gpt2_gguf_to_hf_name(g.name);
    ASSERT_TRUE(hf.has_value()) << g.name;
    const model::ParamTensor* t = layout.find(*hf);
    ASSERT_NE(t, nullptr) << *hf;
    const std::vector<float> v = f.dequantize(g);
    for (std::size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(m.params[t->offset + i], v[i]) << g.name << " " << i;
  }
}

// What tessera's gpt2 family cannot run is refused with one error naming the file.
TEST(GgufGpt2, BadInput) {
  const model::ModelConfig cfg = tiny_gpt2();
  const Buffer<float> params = random_params(cfg, 4);
  const model::ParamLayout layout(cfg);
  auto edit = [&] {
    const auto f = GgufFile::from_bytes(
        io::gguf_model_writer(layout, params.data(), GgmlType::F32, nullptr, "g").to_bytes(),
        "g.gguf");
    LlamaGguf g;
    for (const auto& m : f.metadata()) g.meta.emplace_back(m.key, m.value);
    for (const auto& t : f.tensors()) g.tensors.push_back({t.name, t.dims, f.dequantize(t)});
    return g;
  };
  auto refused = [](const LlamaGguf& g, const std::string& needle) {
    expect_error([&] { io::load_gguf_model(g.file("bad.gguf")); }, needle);
    expect_error([&] { io::load_gguf_model(g.file("bad.gguf")); }, "bad.gguf");
  };
  LlamaGguf g = edit();
  g.set("gpt2.feed_forward_length", GgufValue::u32(100));
  refused(g, "gpt2.feed_forward_length is 100, not 4 x embedding_length (128)");
  g = edit();
  g.set("gpt2.attention.layer_norm_epsilon", GgufValue::f32(1e-6f));
  refused(g, "gpt2.attention.layer_norm_epsilon is 1e-06");
  g = edit();
  g.set("gpt2.attention.head_count_kv", GgufValue::u32(2));
  refused(g, "gpt2.attention.head_count_kv is 2");
  g = edit();
  g.erase("gpt2.block_count");
  refused(g, "gpt2.block_count");
  g = edit();
  g.tensor("position_embd.weight").dims = {32, 8};
  g.tensor("position_embd.weight").values.resize(256);
  refused(g, "position_embd.weight");
  g = edit();
  g.erase_tensor("blk.1.ffn_down.bias");
  refused(g, "has no tensor 'blk.1.ffn_down.bias'");
  g = edit();
  g.tensors.push_back({"blk.0.attn_q.weight", {32, 32}, std::vector<float>(1024, 0.0f)});
  refused(g, "holds tensor 'blk.0.attn_q.weight'");
  // An untied head: tessera's gpt2 has none. A copy of the embedding (older converters) loads.
  g = edit();
  auto head = g.tensor("token_embd.weight");
  head.name = "output.weight";
  g.tensors.push_back(head);
  expect_same_params(io::load_gguf_model(g.file()), cfg, params.data());
  g.tensor("output.weight").values[5] += 1.0f;
  refused(g, "output.weight differs from token_embd.weight");
  g = edit();
  g.tensor("blk.0.attn_norm.bias").values[3] = std::numeric_limits<float>::quiet_NaN();
  refused(g, "non-finite");
}
