// Checks of a training run made before any work starts: the batch and grid the config asks for,
// the options that only some grids accept, the run directory's lock and whether the training
// state fits in memory. Each throws tessera::Error (what is wrong, what to do) for bad input.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "tessera/comm/topology.hpp"
#include "tessera/model/config.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_dir.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

// The shape of a run's steps and its grid, validated.
struct RunPlan {
  int B = 0;      // sequences per micro-batch on one dp rank
  int T = 0;      // tokens per sequence (train.seq_len)
  int accum = 0;  // micro-batches per optimizer step (train.grad_accum)
  comm::GridShape grid;
  parallel::ScheduleSpec sched;  // pipeline parallelism: the schedule of one step
  std::vector<int> layer_split;  // pipeline parallelism: layers per chunk; empty otherwise
  bool pipeline = false;         // parallel.pp > 1
  int tensor_size = 1;           // tx * ty * tz
};

// The micro-batch, the grid and the pipeline schedule of `cfg` on `world_size` ranks; throws for
// a combination the grid does not allow.
RunPlan plan_run(const RunConfig& cfg, const model::ModelConfig& mcfg, int world_size);

// The cluster file of the performance model: an explicit one must load (checked before any
// work); the default one (written by `tessera probe`) is used when present and readable.
struct PredictionCluster {
  std::filesystem::path path;
  std::optional<perf::ClusterSpec> spec;  // none: no prediction
};
PredictionCluster find_prediction_cluster(const RunConfig& cfg);

// Sequence parallelism and recomputation apply to some grids only: refused or noted.
void check_tensor_options(const RunConfig& cfg, const RunPlan& plan);

// hardware.device = "cuda": one process on one GPU for now (no parallel axes; the NCCL
// communicator is not built yet), and a CUDA device present.
void check_device_options(const RunConfig& cfg, const RunPlan& plan, int world_size);

// Takes the lock of train.out_dir (the lead rank; every rank gets its answer), and refuses a fresh
// run into a directory holding a run unless told to overwrite it.
RunDirLock claim_out_dir(const std::filesystem::path& out, const TrainOptions& opt,
                         comm::Runtime& rt);

// Refuses, before allocating, a run whose weights, gradients and AdamW moments cannot fit in
// this machine: 16 bytes per parameter of this rank's slice (the model split over `model_split`
// tensor and pipeline ranks), less what ZeRO shards over dp, plus one whole-model copy (4 bytes
// per parameter) at initialization and resumption.
void check_training_fits(const model::ParamLayout& layout, int model_split, int zero, int dp);

}  // namespace tessera::train
