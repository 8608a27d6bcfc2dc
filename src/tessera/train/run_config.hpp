// Run configuration: a TOML file (configs/runs/*.toml) -> typed structs -> validated.
//
// Every key is read with its exact type (a float key also accepts an integer); unknown sections
// and keys are errors with a hint naming the closest valid key; `--set section.key=value`
// overrides are applied on top of the file and checked the same way. docs/config.md lists every
// key with its type, default and meaning.
#pragma once

#include "tessera/model/config.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/train/goldfish.hpp"

namespace tessera::train {

struct ModelSection {
  // "" or the name of a file of configs/models (the model catalogue, perf/model_spec.hpp), e.g.
  // "gpt2-124m" or "smollm2-135m"; "gpt2", "gpt2-medium", "gpt2-large" and "gpt2-xl" are aliases
  // of gpt2-124m, gpt2-350m, gpt2-774m and gpt2-1.5b. A preset sets family, n_layer, n_head,
  // n_embd, block_size (the file's seq_len), vocab_size, n_kv_head, intermediate_size and
  // tie_embeddings; keys given explicitly override it.
  std::string preset;
  std::string family = "gpt2";  // "gpt2" or "llama" (model/config.hpp says what each is)
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 256;
  int block_size = 128;  // max positions
  int vocab_size = 50257;
  // llama only (0 = the default: as many kv heads as heads, an MLP of 4 * n_embd):
  int n_kv_head = 0;
  int intermediate_size = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // llama's rotary frequency scaling (model/config.hpp): "none", "linear" or "llama3"
  std::string rope_scaling = "none";
  double rope_scaling_factor = 1.0;
  double rope_low_freq_factor = 1.0;       // llama3 only
  double rope_high_freq_factor = 4.0;      // llama3 only
  int rope_original_max_positions = 8192;  // llama3 only: the context trained before scaling
  bool tie_embeddings = true;
  bool operator==(const ModelSection&) const = default;
};

struct DataSection {
  std::string train = "data/brown/train.bin";  // token shard for training
  std::string val = "data/brown/val.bin";      // token shard for validation
  std::string tokenizer =
      "data/gpt2";  // the model's tokenizer (a .gguf, a tokenizer.json or a folder)
  bool operator==(const DataSection&) const = default;
};

inline constexpr int k_max_threads = 1024;  // train.threads

struct TrainSection {
  int batch_size = 8;         // sequences per micro-batch
  int seq_len = 128;          // tokens per sequence, <= model.block_size
  int grad_accum = 1;         // micro-batches per optimizer step
  int global_batch = 0;       // sequences per optimizer step over all ranks; 0 = batch_size x
                              // grad_accum x dp; else batch_size is derived from it
  int steps = 1000;           // optimizer steps
  double lr = 6e-4;           // peak learning rate
  double min_lr_ratio = 0.1;  // cosine decay ends at lr * min_lr_ratio
  int warmup_steps = 50;      // linear warmup from 0 to lr
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // max global grad norm; 0 = off
  std::uint64_t seed = 1337;
  int val_every = 100;  // steps between validations; 0 = never
  int val_batches = 10;
  int ckpt_every = 0;        // steps between checkpoints; 0 = only at the end
  int keep_checkpoints = 2;  // newest checkpoints kept; 0 = keep all
  int log_every = 1;
  std::string out_dir = "runs/demo";
  // A pretrained model to start from instead of random weights (a checkpoint or run directory,
  // model.safetensors, a llama .gguf file, or a short name such as "smollm2-135m"). The model's
  // shape then comes from it; [model] is not used.
  std::string init_from;
  int threads = 0;  // CPU threads; 0 = all cores, at most k_max_threads
  // "fp32", or "bf16": mixed precision (bf16 GEMM and attention inputs, fp32 master weights,
  // gradients and optimizer state); on the GPU only so far
  std::string precision = "fp32";
  // Loss-spike rollback: a step whose loss is not finite, or above spike_factor times the mean
  // of the last spike_window steps, reloads the newest checkpoint and skips that step's data
  // window; after spike_retries rollbacks the run stops with an error. 0 = off (a non-finite
  // loss then stops the run).
  double spike_factor = 0.0;
  int spike_window = 20;
  int spike_retries = 3;
  bool operator==(const TrainSection&) const = default;
};

struct SampleSection {
  int every = 0;    // steps between samples; 0 = only at the end
  int tokens = 64;  // tokens generated per sample; 0 = no sampling
  std::string prompt = "";
  double temperature = 1.0;  // 0 = greedy
  int top_k = 40;            // 0 = no top-k filtering
  bool operator==(const SampleSection&) const = default;
};

struct HardwareSection {
  std::string device = "cpu";    // "cpu", or "cuda": the model, its gradients and optimizer
                                 // state on a GPU per rank (data parallelism only so far)
  // cuda with dp > 1: how the gradients are summed: "auto" (NCCL where every rank has its own
  // GPU, through the host otherwise), "nccl", or "host"
  std::string gpu_reduce = "auto";
  double peak_tflops = 0.0;      // peak dense TFLOP/s for MFU; 0 = look up / unknown
  bool tune_gemm = false;        // tensor parallelism: GEMM layout tuning of the linears
  std::string gemm_tuning_file;  // tuner choices: loaded if present, saved after training
  // cluster file for the performance model's prediction logged next to the measurements;
  // "" = configs/clusters/this-machine.toml when it exists (written by `tessera probe`)
  std::string cluster;
  bool operator==(const HardwareSection&) const = default;
};

// The parallel grid (dp x pp x tx x ty x tz must equal the number of ranks) and ZeRO stage.
struct ParallelSection {
  // true: the run plans its own grid, ZeRO stage, micro-batch, schedule and recomputation for the
  // ranks it is launched with (train/auto_plan.hpp); the keys below that a plan sets are replaced
  bool automatic = false;  // key "auto"
  int dp = 1, pp = 1, tx = 1, ty = 1, tz = 1;
  int zero = 0;  // 0: replicated; 1: AdamW moments sharded over dp; 2: + gradients; 3: + parameters
  bool overlap = true;  // reduce gradient buckets during backward (false: after it, to measure)
  // the data-parallel gradient reduction's dtype: "fp32", or "bf16" (half the bytes; the sum
  // rounded to bf16 at every addition)
  std::string grad_reduce = "fp32";
  // tensor parallelism (tx, ty, tz):
  // the dtype of the activations and their gradients summed or gathered over the tensor axes:
  // "fp32", or "bf16" (half the bytes; sums rounded to bf16 at every addition)
  std::string tensor_dtype = "fp32";
  bool recompute = false;          // recompute each layer's activations in backward
  bool sequence_parallel = false;  // 1D (tx only): split the replicated regions by sequences
  bool overlap_dx = true;          // input-gradient all-reduce during the weight-gradient GEMM
  bool overlap_dw = true;          // dW reduce-scatter during the previous layer's backward
  bool prefetch = true;            // next layer's tz weight gather during this layer
  // pipeline parallelism (pp): the schedule, its chunks per stage and the layer split
  std::string schedule = "1f1b";
  // the dtype of the activations and their gradients sent between pipeline stages: "fp32", or
  // "bf16" (half the bytes; each rounded to bf16 once as it is sent)
  std::string pipeline_dtype = "fp32";  // "gpipe", "1f1b" or "interleaved" (train.grad_accum = m)
  int virtual_stages = 1;               // chunks per stage (v); >= 2 with the interleaved schedule
  std::string pp_layers;    // "" balanced, or layer counts per model chunk, e.g. "0,4,4,0"
  double timeout_s = 60.0;  // a collective longer than this ends the job with its log; 0 = never
  bool operator==(const ParallelSection&) const = default;
};

struct RunConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  SampleSection sample;
  HardwareSection hardware;
  ParallelSection parallel;
  GoldfishConfig goldfish;  // [goldfish]: Goldfish loss masking of the training targets
  std::string source;       // the path (or name) the config came from, used in messages
  bool operator==(const RunConfig&) const = default;
};

// Reads and validates a run config file. `overrides` are "section.key=value" strings (from
// --set); the value is parsed as a TOML value (lr=3e-4, steps=10, out_dir="x"); for string keys a
// value that is not a TOML string is taken literally (out_dir=runs/x). Throws tessera::Error.
RunConfig load_run_config(const std::filesystem::path& file,
                          const std::vector<std::string>& overrides = {});

// Same from TOML text; `source_name` names it in messages and becomes RunConfig::source.
RunConfig parse_run_config(std::string_view toml_text, std::string_view source_name,
                           const std::vector<std::string>& overrides = {});

// Checks ranges and cross-key constraints; throws tessera::Error naming the key and the value.
// Called by load_run_config and parse_run_config.
void validate(const RunConfig& config);

// The resolved config as complete TOML (every key of every section), which parse_run_config
// reads back to an equal RunConfig.
std::string to_toml(const RunConfig& config);

// Sets the shape keys from a preset name (see ModelSection::preset) by reading its file of
// configs/models; false if the catalogue has no such name. "" is not a preset.
bool apply_model_preset(ModelSection& model, std::string_view preset);
// The model the section describes (not validated; model::validate says what is wrong with it).
model::ModelConfig model_config(const ModelSection& model);
// The preset names: the GPT-2 aliases, then the catalogue's file names (perf::model_names).
std::vector<std::string> model_preset_names();

}  // namespace tessera::train
