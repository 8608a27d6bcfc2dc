// What the commands accept for --model and --tokenizer, resolved in one place:
//   --model      a run directory (its newest checkpoint), a checkpoint directory, a
//                model.safetensors or .gguf file, or the short name of a pretrained model that
//                scripts/setup --with-models fetched ("smollm2-135m", "gemma3-270m").
//   --tokenizer  "" (the default where a model is given): the model's own tokenizer when it has
//                one (a .gguf file, or tokenizer.json beside the checkpoint), else GPT-2's in
//                data/gpt2; or a path / short name as tessera tokenize takes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "tessera/data/bpe.hpp"

namespace tessera::app {

inline constexpr const char* k_gpt2_tokenizer = "data/gpt2";

std::filesystem::path resolve_model_path(const std::filesystem::path& p);
// The tokenizer for a model given as `model_arg` when --tokenizer was `tokenizer_arg`.
std::filesystem::path resolve_tokenizer_path(const std::string& tokenizer_arg,
                                             const std::string& model_arg = "");
// The model's own tokenizer (or the one --tokenizer names), checked against the model's
// vocabulary; nullopt for a model with GPT-2's default tokenizer.
std::optional<data::Tokenizer> own_tokenizer(const std::string& tokenizer_arg,
                                             const std::string& model_arg,
                                             std::int64_t model_vocab);
// Writes the model's own tokenizer (or the one --tokenizer names) into `out_dir` as
// tokenizer.json + tokenizer_config.json (SentencePiece: tokenizer.gguf), so that the directory
// is a complete model; models
// with GPT-2's default tokenizer get none (as before). Returns whether one was written.
bool write_own_tokenizer(const std::filesystem::path& out_dir, const std::string& tokenizer_arg,
                         const std::string& model_arg, std::int64_t model_vocab);

// Refuses (tessera::Error) to write a model where one is: `target` a GGUF file, or a folder that
// holds model.safetensors or a sharded model's index; unless `overwrite` (--overwrite).
void refuse_existing_model(const std::filesystem::path& target, bool gguf, bool overwrite);

}  // namespace tessera::app
