// Model shapes: configs/models/*.toml, the one catalogue of shapes for the planner and the run
// config's model.preset.
//
//   name = "gpt-175b"
//   n_layer = 96
//   n_head = 96
//   n_embd = 12288
//   vocab_size = 50257     # padded to a multiple of 128 by the model
//   seq_len = 2048         # default sequence length (block_size)
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/model/config.hpp"

namespace tessera::perf {

struct ModelSpec {
  std::string name, source;
  model::ModelConfig cfg;  // block_size = seq_len
};

ModelSpec parse_model_spec(std::string_view toml_text, std::string_view source_name);
ModelSpec load_model_spec(const std::filesystem::path& file);

// The catalogue's folder: configs/models under the working directory, else the source tree's
// (see configs_dir in perf/report.hpp).
std::filesystem::path models_dir();
// The names a model can be given by: the GPT-2 names gpt2, gpt2-medium, gpt2-large and gpt2-xl
// (aliases of the files gpt2-124m, gpt2-350m, gpt2-774m and gpt2-1.5b), then the file names of
// the catalogue, sorted. Empty when there is no catalogue.
std::vector<std::string> model_names();
// The catalogue's file for a name or alias; nullopt when there is none (a path is not a name).
std::optional<std::filesystem::path> find_model_file(std::string_view name);
// A model by name, alias or path to a .toml file; throws tessera::Error ("model file not found")
// listing the names when there is no such file.
ModelSpec load_model(const std::string& name_or_path);

// Parameters of the model (weights and biases, tied embedding counted once), from the shape.
double parameter_count(const model::ModelConfig& cfg);

}  // namespace tessera::perf
