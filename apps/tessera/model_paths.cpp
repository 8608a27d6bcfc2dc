#include "model_paths.hpp"

#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/pretrained.hpp"
#include "tessera/io/tokenizer_files.hpp"

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
  for (const char* file : {"tokenizer.json", "tokenizer.gguf"})  // io::write_tokenizer_beside's
    if (fs::exists(dir / file)) return dir / file;
  return k_gpt2_tokenizer;
}

std::optional<data::Tokenizer> own_tokenizer(const std::string& tokenizer_arg,
                                             const std::string& model_arg,
                                             std::int64_t model_vocab) {
  const fs::path path = resolve_tokenizer_path(tokenizer_arg, model_arg);
  if (tokenizer_arg.empty() && path == k_gpt2_tokenizer) return std::nullopt;
  auto tok = io::load_tokenizer(path);
  io::require_tokenizer_fits(tok, model_vocab);
  return tok;
}

bool write_own_tokenizer(const fs::path& out_dir, const std::string& tokenizer_arg,
                         const std::string& model_arg, std::int64_t model_vocab) {
  const auto tok = own_tokenizer(tokenizer_arg, model_arg, model_vocab);
  if (tok) io::write_tokenizer_beside(out_dir, tok->vocab());
  return tok.has_value();
}

void refuse_existing_model(const std::filesystem::path& target, bool gguf, bool overwrite) {
  if (overwrite) return;
  for (const auto& file :
       gguf ? std::vector{target}
            : std::vector{target / "model.safetensors", target / "model.safetensors.index.json"})
    if (std::filesystem::exists(file))
      throw Error(fmt::format("{} already exists", file.string()),
                  "choose another --out, or add --overwrite");
}

}  // namespace tessera::app
