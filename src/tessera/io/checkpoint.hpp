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
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::io {

class SafetensorsFile;

// ---- model files ----
// transformers' default largest file of a sharded checkpoint ("5GB").
inline constexpr std::uint64_t k_default_max_shard_bytes = 5'000'000'000;

// A Hugging Face checkpoint: config.json and model.safetensors with the weights as fp32, bf16 or
// fp16 (rounded to nearest even; fp16 refuses weights beyond its range). Weights of more than
// `max_shard_bytes` are sharded as save_pretrained shards them: the tensors in layout order,
// a new file whenever the next tensor would take the current one past the limit (a tensor larger
// than the limit gets a file of its own), in model-00001-of-0000N.safetensors ...
// with model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {tensor:
// file}}). Every file is written atomically; the index (or model.safetensors) is written last,
// after the old one was removed, so an interrupted save never leaves a model that mixes files of
// two saves. Model files of an earlier save that the new one does not use are removed. Returns
// the names of the weight files written.
std::vector<std::string> save_model(const std::filesystem::path& dir,
                                    const model::ParamLayout& layout, const float* params,
                                    DType dtype = DType::F32,
                                    std::uint64_t max_shard_bytes = k_default_max_shard_bytes);
// A size as transformers' max_shard_size takes it: a positive number of bytes with an optional
// unit, B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), in any case
// ("500MB", "2GB", "1.5GiB", "100000"). Throws tessera::Error naming the text otherwise.
std::uint64_t parse_byte_size(std::string_view text);

struct LoadedModel {
  model::ModelConfig config;
  Buffer<float> params;  // layout(config).total() floats
};
// `path` is a directory holding model.safetensors (+ config.json), a .safetensors file
// (config.json beside it), or a llama.cpp .gguf file (io/gguf_model.hpp: a llama model,
// dequantized to fp32). Names may carry a "transformer." prefix; HF's attention-mask buffers,
// rotary inv_freq buffers and a tied lm_head.weight are ignored.
LoadedModel load_model(const std::filesystem::path& path);
model::ModelConfig read_hf_config(const std::filesystem::path& config_json);
// The Hugging Face GPT2Config of a model shape, as config.json and the safetensors metadata hold
// it.
// torch_dtype: "float32", "bfloat16" or "float16", what the weights are stored as (llama).
std::string hf_config_text(const model::ModelConfig& cfg, int indent = -1,
                           const char* torch_dtype = "float32");
model::ModelConfig parse_hf_config(std::string_view json_text, const std::string& source);

// The pieces of load_model, for loaders of other formats (quantized files):
// the model's config: `config_path` if it exists, else the config embedded in the file.
model::ModelConfig model_config_of(const SafetensorsFile& st,
                                   const std::filesystem::path& config_path);
// Checks, before anything is allocated, that `st` holds every tensor of `layout` (named with
// `prefix`) in the shape Hugging Face files give it; `skip` leaves tensors out of the check.
void check_model_tensors(const SafetensorsFile& st, const model::ParamLayout& layout,
                         const std::string& prefix,
                         const std::function<bool(const model::ParamTensor&)>& skip = {});
// Refuses a model whose fp32 weights would not fit in this machine's memory.
void check_model_fits(const model::ParamLayout& layout, const std::filesystem::path& file);
// Refuses weights that hold NaN or infinity, naming the tensor; `source` names the file.
void check_finite(const model::ParamLayout& layout, const float* params, const std::string& source,
                  const std::function<bool(const model::ParamTensor&)>& skip = {});

// ---- training checkpoints ----
struct TrainState {
  std::int64_t step = 0;  // optimizer steps completed
  std::uint64_t rng_state = 0;
  std::uint64_t data_position = 0;
  std::int64_t tokens_seen = 0;
  std::map<std::string, std::string> extra;  // free-form metadata (e.g. the run config)
};

// Sharded save, collective (see the trainer): the lead rank calls begin_checkpoint; after a
// barrier every rank writes its shard of the AdamW state; after another barrier the lead rank
// commits: it writes the model (consolidated parameters, HF layout), the index
// (state_index.json: every tensor's global shape and offset, and the slice of it each shard
// holds), the DONE marker, and renames the directory into place. Keeps at most `keep` complete
// checkpoints (0 = all). The temporary directory has a fixed name per step, so an interrupted
// save is cleaned up by the next one.
struct StateShard {
  std::size_t begin = 0, end = 0;          // the flat range this shard holds
  const float *m = nullptr, *v = nullptr;  // (end - begin) elements each
};
std::filesystem::path begin_checkpoint(const std::filesystem::path& checkpoints_dir,
                                       std::int64_t step);
void write_state_shard(const std::filesystem::path& checkpoints_dir, std::int64_t step, int rank,
                       int nshards, const StateShard& shard);
std::filesystem::path commit_checkpoint(
    const std::filesystem::path& checkpoints_dir, const model::ParamLayout& layout,
    const float* params, const TrainState& state,
    const std::vector<std::pair<std::size_t, std::size_t>>& shards, int keep);

// Single-process save (one shard): begin, write, commit.
std::filesystem::path save_checkpoint(const std::filesystem::path& checkpoints_dir,
                                      const model::ParamLayout& layout, const float* params,
                                      const float* adam_m, const float* adam_v,
                                      const TrainState& state, int keep);

// The newest complete checkpoint (DONE marker present), if any.
std::optional<std::filesystem::path> latest_checkpoint(
    const std::filesystem::path& checkpoints_dir);

// Loads a checkpoint: all parameters (layout.total()) and the moments of the flat range
// [begin, end) into adam_m/adam_v (end - begin elements), from whichever shards hold them, so any
// number of shards loads into any other. Throws tessera::Error (naming the file) on a missing
// file, damaged data or a model that does not match the run's configuration.
TrainState load_checkpoint(const std::filesystem::path& dir, const model::ParamLayout& layout,
                           float* params, std::size_t begin, std::size_t end, float* adam_m,
                           float* adam_v);
TrainState load_checkpoint(const std::filesystem::path& dir, const model::ParamLayout& layout,
                           float* params, float* adam_m, float* adam_v);

}  // namespace tessera::io
