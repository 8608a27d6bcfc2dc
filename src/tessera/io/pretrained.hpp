// The pretrained models scripts/setup --with-models unpacks into data/models/, by short name
// ("smollm2-135m", "gemma3-270m"), and the model configuration of any model file tessera reads.
#pragma once

#include <filesystem>

#include "tessera/model/config.hpp"

namespace tessera::io {

// The file of a short name; `p` itself when it is not one or names an existing path. Throws
// tessera::Error when it is a short name whose file is missing (with how to fetch it).
std::filesystem::path resolve_pretrained(const std::filesystem::path& p);

// The folder of the Brown corpus shards made with a short name's tokenizer (`tessera prepare
// --tokenizer smollm2-135m --out data/brown-smollm2`); empty when `p` is not a short name or
// tessera makes none for it.
std::filesystem::path pretrained_brown_shards(const std::filesystem::path& p);

// What a --model (or train.init_from) names, as load_model takes it: a short name's file, the
// newest checkpoint of a run directory or of a checkpoints directory, or `p` itself.
std::filesystem::path resolve_model_path(const std::filesystem::path& p);

// The configuration of the model at `path` (a checkpoint directory, sharded or not,
// model.safetensors with config.json, or a .gguf file) without reading its weights.
model::ModelConfig read_model_config(const std::filesystem::path& path);

}  // namespace tessera::io
