// GPT model shapes for the planner: configs/models/*.toml.
//
//   name = "gpt-175b"
//   n_layer = 96
//   n_head = 96
//   n_embd = 12288
//   vocab_size = 50257     # padded to a multiple of 128 by the model
//   seq_len = 2048         # default sequence length (block_size)
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "tessera/model/config.hpp"

namespace tessera::perf {

struct ModelSpec {
  std::string name, source;
  model::ModelConfig cfg;  // block_size = seq_len
};

ModelSpec parse_model_spec(std::string_view toml_text, std::string_view source_name);
ModelSpec load_model_spec(const std::filesystem::path& file);

// Parameters of the model (weights and biases, tied embedding counted once), from the shape.
double parameter_count(const model::ModelConfig& cfg);

}  // namespace tessera::perf
