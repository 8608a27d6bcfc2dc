#include "tessera/perf/model_spec.hpp"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/toml_reader.hpp"
#include "tessera/perf/report.hpp"

namespace tessera::perf {

namespace {
constexpr const char* k_hint =
    "a model file has name, n_layer, n_head, n_embd, vocab_size and seq_len, and for a llama "
    "family = \"llama\", n_kv_head, intermediate_size and tie_embeddings (see configs/models/)";

// The GPT-2 names the run config's model.preset took before presets were catalogue files.
struct Alias {
  std::string_view name, file;
};
constexpr Alias k_aliases[] = {{"gpt2", "gpt2-124m"},
                               {"gpt2-medium", "gpt2-350m"},
                               {"gpt2-large", "gpt2-774m"},
                               {"gpt2-xl", "gpt2-1.5b"}};

// A plain file name: no folders, nothing hidden.
bool is_plain_name(std::string_view name) {
  return !name.empty() && name.front() != '.' && name.find('/') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos;
}
}  // namespace

ModelSpec parse_model_spec(std::string_view text, std::string_view source_name) {
  TomlReader r(text, std::string(source_name), k_hint);
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

std::filesystem::path models_dir() {
  return configs_dir("models");
}

std::optional<std::filesystem::path> find_model_file(std::string_view name) {
  for (const auto& a : k_aliases)
    if (name == a.name) name = a.file;
  if (!is_plain_name(name)) return std::nullopt;
  std::error_code ec;
  auto file = models_dir() / (std::string(name) + ".toml");
  if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
  return file;
}

std::vector<std::string> model_names() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(models_dir(), ec))
    if (e.path().extension() == ".toml") files.push_back(e.path().stem().string());
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const auto& a : k_aliases)
    if (std::binary_search(files.begin(), files.end(), a.file)) out.emplace_back(a.name);
  out.insert(out.end(), files.begin(), files.end());
  return out;
}

ModelSpec load_model(const std::string& name_or_path) {
  if (auto file = find_model_file(name_or_path)) return load_model_spec(*file);
  return load_model_spec(resolve_spec(name_or_path, models_dir().string(), "model file"));
}

double parameter_count(const model::ModelConfig& c) {
  return model::param_count(c);  // the model's own count (GPT-2: learned positions included)
}

}  // namespace tessera::perf
