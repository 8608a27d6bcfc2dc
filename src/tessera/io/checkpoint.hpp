// Checkpoints.
//  - The model: model.safetensors with Hugging Face GPT-2 tensor names and layouts (Conv1D
//    weights (in, out), vocabulary unpadded) + config.json in HF GPT2Config form. A Hugging Face
//    GPT-2 model.safetensors + config.json loads the same way.
//  - The training state: state.safetensors (AdamW moments in tessera's flat layout) whose
//    metadata holds the step, RNG state and data position.
//  - A checkpoint is a directory <out>/checkpoints/step_NNNNNNNN written under a temporary name,
//    completed by a DONE marker, and renamed into place: a crash mid-save never leaves a
//    "newest" checkpoint that is incomplete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::io {

// ---- model files ----
void save_model(const std::filesystem::path& dir, const model::ParamLayout& layout,
                const float* params);

struct LoadedModel {
  model::ModelConfig config;
  Buffer<float> params;  // layout(config).total() floats
};
// `path` is a directory holding model.safetensors (+ config.json), or a .safetensors file
// (config.json beside it). Names may carry a "transformer." prefix; HF's attention-mask buffers
// and a tied lm_head.weight are ignored.
LoadedModel load_model(const std::filesystem::path& path);
model::ModelConfig read_hf_config(const std::filesystem::path& config_json);
model::ModelConfig parse_hf_config(std::string_view json_text, const std::string& source);

// ---- training checkpoints ----
struct TrainState {
  std::int64_t step = 0;  // optimizer steps completed
  std::uint64_t rng_state = 0;
  std::uint64_t data_position = 0;
  std::int64_t tokens_seen = 0;
  std::map<std::string, std::string> extra;  // free-form metadata (e.g. the run config)
};

// Writes <checkpoints_dir>/step_NNNNNNNN atomically; keeps at most `keep` complete checkpoints
// (0 = keep all). Returns the final directory.
std::filesystem::path save_checkpoint(const std::filesystem::path& checkpoints_dir,
                                      const model::ParamLayout& layout, const float* params,
                                      const float* adam_m, const float* adam_v,
                                      const TrainState& state, int keep);

// The newest complete checkpoint (DONE marker present), if any.
std::optional<std::filesystem::path> latest_checkpoint(
    const std::filesystem::path& checkpoints_dir);

// Loads a checkpoint into buffers sized for `layout`; throws tessera::Error (with the file named)
// on a missing file, corrupt data or a model that does not match the run's configuration.
TrainState load_checkpoint(const std::filesystem::path& dir, const model::ParamLayout& layout,
                           float* params, float* adam_m, float* adam_v);

}  // namespace tessera::io
