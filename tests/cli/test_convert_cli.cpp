// End-to-end tests of `tessera convert`: the Hugging Face checkpoint it writes, in one file or
// sharded (--max-shard-size), and its refusals of bad options, each one error line and exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/safetensors.hpp"

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
