#include "tessera/perf/model_spec.hpp"

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/perf/toml_read.hpp"

namespace tessera::perf {

namespace {
constexpr const char* k_hint =
    "a model file has name, n_layer, n_head, n_embd, vocab_size and seq_len, and for a llama "
    "family = \"llama\", n_kv_head, intermediate_size and tie_embeddings (see configs/models/)";
}

ModelSpec parse_model_spec(std::string_view text, std::string_view source_name) {
  detail::TomlReader r(text, std::string(source_name), k_hint);
  const auto* root = r.table("", true);
  r.only_keys(root, "",
              {"name", "description", "family", "n_layer", "n_head", "n_embd", "vocab_size",
               "seq_len", "n_kv_head", "intermediate_size", "tie_embeddings"});
  ModelSpec m;
  m.source = std::string(source_name);
  m.name = r.string(root, "", "name", true);
  m.cfg.n_layer = r.integer(root, "", "n_layer", true);
  m.cfg.n_head = r.integer(root, "", "n_head", true);
  m.cfg.n_embd = r.integer(root, "", "n_embd", true);
  m.cfg.vocab_size = r.integer(root, "", "vocab_size", false, 50257);
  m.cfg.block_size = r.integer(root, "", "seq_len", false, 2048);
  const std::string family = r.string(root, "", "family", false, "gpt2");
  if (family != "gpt2" && family != "llama")
    throw Error(fmt::format("{}: unknown family \"{}\"", m.source, family),
                "family is \"gpt2\" or \"llama\"");
  if (family == "llama") {
    m.cfg.family = model::Family::Llama;
    m.cfg.n_kv_head = r.integer(root, "", "n_kv_head", false, 0);
    m.cfg.intermediate_size = r.integer(root, "", "intermediate_size", false, 0);
    m.cfg.tie_embeddings = r.boolean(root, "", "tie_embeddings", false, false);
  }
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
  return model::param_count(c);  // the model's own count (GPT-2: learned positions included)
}

}  // namespace tessera::perf
