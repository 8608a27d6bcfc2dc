// Sharded checkpoints: a state saved in N shards loads into any other split (resharding), the
// index names every tensor's slices, and damaged or incomplete checkpoints are clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../scratch_dir.hpp"
#include "tessera/core/error.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/model/gpt.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {
struct Saved {
  model::ModelConfig cfg{2, 2, 16, 8, 50};
  model::ParamLayout layout{cfg};
  Buffer<float> p{layout.total()}, m{layout.total()}, v{layout.total()};
  fs::path root;
  explicit Saved(const std::string& name, int nshards) {
    root = tessera::test::scratch_path("ckpt") / name;
    fs::remove_all(root);
    model::init_params(layout, p.data(), 3);
    for (std::size_t i = 0; i < layout.total(); ++i) m[i] = 0.001f * i, v[i] = 1.0f + i;
    const std::size_t P = layout.total(), per = (P + nshards - 1) / nshards;
    std::vector<std::pair<std::size_t, std::size_t>> shards;
    io::begin_checkpoint(root, 7);
    for (int r = 0; r < nshards; ++r) {
      std::size_t b = std::min(P, per * r), e = std::min(P, per * (r + 1));
      shards.emplace_back(b, e);
      io::write_state_shard(root, 7, r, nshards, io::StateShard{b, e, m.data() + b, v.data() + b});
    }
    io::TrainState st{7, 123456789012345ull, 999, 4242, {{"note", "x"}}};
    io::commit_checkpoint(root, layout, p.data(), st, shards, 0);
  }
  ~Saved() { fs::remove_all(root); }
  fs::path dir() const { return root / "step_00000007"; }
};
}  // namespace

TEST(Checkpoint, ShardedStateLoadsIntoAnySplit) {
  Saved s("split", 3);
  const std::size_t P = s.layout.total();
  for (int n : {1, 2, 4, 5}) {
    std::size_t per = (P + n - 1) / n;
    for (int r = 0; r < n; ++r) {
      std::size_t b = std::min(P, per * r), e = std::min(P, per * (r + 1));
      Buffer<float> p(P), m(e - b + 1), v(e - b + 1);
      auto st = io::load_checkpoint(s.dir(), s.layout, p.data(), b, e, m.data(), v.data());
      EXPECT_EQ(st.step, 7);
      EXPECT_EQ(st.rng_state, 123456789012345ull);  // 64-bit values survive the JSON index
      EXPECT_EQ(st.data_position, 999u);
      EXPECT_EQ(st.tokens_seen, 4242);
      EXPECT_EQ(st.extra.at("note"), "x");
      for (std::size_t i = b; i < e; ++i) {
        ASSERT_EQ(m[i - b], s.m[i]) << n << " " << r << " " << i;
        ASSERT_EQ(v[i - b], s.v[i]);
      }
      for (std::size_t i = 0; i < P; ++i) ASSERT_EQ(p[i], s.p[i]);
    }
  }
}

TEST(Checkpoint, IndexNamesEveryTensorsSlices) {
  Saved s("index", 3);
  std::ifstream in(s.dir() / "state_index.json");
  auto idx = nlohmann::json::parse(in);
  ASSERT_EQ(idx["shards"].size(), 3u);
  ASSERT_EQ(idx["tensors"].size(), s.layout.tensors().size());
  for (const auto& t : idx["tensors"]) {
    const auto* pt = s.layout.find(t["name"].get<std::string>());
    ASSERT_NE(pt, nullptr);
    EXPECT_EQ(t["shape"].get<std::vector<std::int64_t>>(), pt->shape);
    std::size_t covered = 0;
    for (const auto& sl : t["slices"])
      covered += sl[2].get<std::size_t>() - sl[1].get<std::size_t>();
    EXPECT_EQ(covered, pt->numel) << pt->name;  // the slices of all shards cover the tensor
  }
}

TEST(Checkpoint, DamagedOrIncompleteCheckpointsAreClearErrors) {
  Saved s("damaged", 2);
  Buffer<float> p(s.layout.total()), m(s.layout.total()), v(s.layout.total());
  auto expect_error = [&](const std::string& needle) {
    try {
      io::load_checkpoint(s.dir(), s.layout, p.data(), m.data(), v.data());
      FAIL() << "no error; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // a missing shard file
  fs::rename(s.dir() / "state_00001-of-00002.safetensors", s.dir() / "moved");
  expect_error("state_00001-of-00002.safetensors");
  fs::rename(s.dir() / "moved", s.dir() / "state_00001-of-00002.safetensors");
  // an index that is not JSON
  fs::copy_file(s.dir() / "state_index.json", s.dir() / "index.bak");
  std::ofstream(s.dir() / "state_index.json", std::ios::trunc) << "{ not json";
  expect_error("state_index.json");
  // an index whose shards leave a hole
  auto idx = nlohmann::json::parse(std::ifstream(s.dir() / "index.bak"));
  idx["shards"][1]["begin"] = idx["shards"][1]["begin"].get<std::size_t>() + 1;
  std::ofstream(s.dir() / "state_index.json", std::ios::trunc) << idx.dump();
  expect_error("damaged");
  // no DONE marker: incomplete
  fs::copy_file(s.dir() / "index.bak", s.dir() / "state_index.json",
                fs::copy_options::overwrite_existing);
  fs::remove(s.dir() / "DONE");
  expect_error("incomplete");
  EXPECT_FALSE(io::latest_checkpoint(s.root).has_value());
}

// config.json's rope_scaling: linear and llama3 read and written back as Hugging Face names them;
// other kinds refused.
TEST(Checkpoint, HfConfigRopeScaling) {
  model::ModelConfig c;
  c.family = model::Family::Llama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.intermediate_size = 48;
  c.vocab_size = 100;
  c.rope_theta = 500000.0;
  c.rope_scaling.kind = model::RopeScalingKind::Llama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const std::string text = io::hf_config_text(c, 2);
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(io::parse_hf_config(text, "config.json"), c);

  c.rope_scaling = {};
  c.rope_scaling.kind = model::RopeScalingKind::Linear;
  c.rope_scaling.factor = 2;
  EXPECT_EQ(io::parse_hf_config(io::hf_config_text(c), "config.json"), c);
  c.rope_scaling = {};
  EXPECT_TRUE(nlohmann::json::parse(io::hf_config_text(c))["rope_scaling"].is_null());
  EXPECT_EQ(io::parse_hf_config(io::hf_config_text(c), "config.json"), c);

  // Llama 3.1 8B's object, and the older `type` key.
  auto with = [&](const char* scaling) {
    auto jc = nlohmann::json::parse(io::hf_config_text(c));
    jc["rope_scaling"] = nlohmann::json::parse(scaling);
    return io::parse_hf_config(jc.dump(), "config.json");
  };
  const model::ModelConfig l31 =
      with(R"({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  EXPECT_EQ(l31.rope_scaling.kind, model::RopeScalingKind::Llama3);
  EXPECT_EQ(l31.rope_scaling.factor, 8.0);
  EXPECT_EQ(l31.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l31.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l31.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(with(R"({"type": "linear", "factor": 4.0})").rope_scaling.factor, 4.0);
  EXPECT_EQ(with(R"({"rope_type": "default"})").rope_scaling, model::RopeScaling{});
  for (const char* bad : {R"({"rope_type": "yarn", "factor": 4.0})", R"({"factor": 4.0})",
                          R"({"rope_type": "linear"})", R"({"rope_type": "linear", "factor": 0})",
                          R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4})"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(with(bad), Error);
  }
  // Per-dimension factors (from a GGUF file) have no config.json form.
  c.rope_scaling.freq_factors.assign(4, 2.0f);
  EXPECT_THROW(io::hf_config_text(c), Error);
}

// A GPT-2 config.json that names another LayerNorm epsilon or activation describes a model
// tessera's gpt2 family is not: refused; GPT-2's own values (and their absence) load.
TEST(Checkpoint, HfGpt2ConfigFixedSettings) {
  const model::ModelConfig c{2, 4, 32, 16, 100};
  auto with = [&](const char* key, const nlohmann::json& v) {
    auto jc = nlohmann::json::parse(io::hf_config_text(c));
    jc[key] = v;
    return io::parse_hf_config(jc.dump(), "config.json");
  };
  EXPECT_EQ(with("layer_norm_epsilon", 1e-5), c);
  EXPECT_EQ(with("activation_function", "gelu_new"), c);
  for (const auto& bad : {nlohmann::json(-1), nlohmann::json(1e-6), nlohmann::json("x")})
    EXPECT_THROW(with("layer_norm_epsilon", bad), Error) << bad.dump();
  for (const auto& bad : {nlohmann::json("relu"), nlohmann::json::array({1})})
    EXPECT_THROW(with("activation_function", bad), Error) << bad.dump();
}
