#include "model_paths.hpp"

#include "tessera/core/file.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/pretrained.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

fs::path resolve_model_path(const fs::path& given) {
  return io::resolve_model_path(given);
}

fs::path resolve_tokenizer_path(const std::string& tokenizer_arg, const std::string& model_arg) {
  if (!tokenizer_arg.empty()) return io::resolve_pretrained(tokenizer_arg);
  if (model_arg.empty()) return k_gpt2_tokenizer;
  const fs::path m = resolve_model_path(model_arg);
  if (m.extension() == ".gguf") return m;
  const fs::path dir = input_kind(m, "model") == InputKind::Directory ? m : m.parent_path();
  if (fs::exists(dir / "tokenizer.json")) return dir / "tokenizer.json";
  return k_gpt2_tokenizer;
}

}  // namespace tessera::app
