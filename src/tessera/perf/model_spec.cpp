#include "tessera/perf/model_spec.hpp"

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/perf/toml_read.hpp"

namespace tessera::perf {

namespace {
constexpr const char* k_hint =
    "a model file has name, n_layer, n_head, n_embd, vocab_size and seq_len (see "
    "configs/models/)";
}

ModelSpec parse_model_spec(std::string_view text, std::string_view source_name) {
  detail::TomlReader r(text, std::string(source_name), k_hint);
  const auto* root = r.table("", true);
  r.only_keys(root, "",
              {"name", "description", "n_layer", "n_head", "n_embd", "vocab_size", "seq_len"});
  ModelSpec m;
  m.source = std::string(source_name);
  m.name = r.string(root, "", "name", true);
  m.cfg.n_layer = r.integer(root, "", "n_layer", true);
  m.cfg.n_head = r.integer(root, "", "n_head", true);
  m.cfg.n_embd = r.integer(root, "", "n_embd", true);
  m.cfg.vocab_size = r.integer(root, "", "vocab_size", false, 50257);
  m.cfg.block_size = r.integer(root, "", "seq_len", false, 2048);
  try {
    model::validate(m.cfg);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", m.source, e.what()), e.hint());
  }
  return m;
}

ModelSpec load_model_spec(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw Error(fmt::format("model file not found: {}", file.string()),
                "model specs are in configs/models/ (e.g. configs/models/gpt-175b.toml)");
  return parse_model_spec(read_file(file, "model file"), file.string());
}

double parameter_count(const model::ModelConfig& c) {
  const double h = c.n_embd, l = c.n_layer, V = c.padded_vocab(), s = c.block_size;
  // per layer: qkv 3h^2+3h, proj h^2+h, fc 4h^2+4h, fcproj 4h^2+h, 2 LayerNorms 4h
  return l * (12 * h * h + 13 * h) + V * h + s * h + 2 * h;
}

}  // namespace tessera::perf
