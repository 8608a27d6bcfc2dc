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
#include "tessera/parallel/plan.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_dir.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

// The shape of a run's steps and its parallel plan, validated.
struct RunPlan {
  int T = 0;                   // tokens per sequence (train.seq_len)
  parallel::ParallelPlan par;  // the one plan: grid, ZeRO, schedule, layer split (resolved when
                               // pp > 1), micro-batch and count, recomputation, overlaps
  int B() const { return par.micro_batch; }        // sequences per micro-batch on one dp rank
  int accum() const { return par.micro_batches; }  // micro-batches per step (train.grad_accum)
  const comm::GridShape& grid() const { return par.grid; }
  parallel::ScheduleSpec sched() const { return par.schedule_spec(); }
  bool pipeline() const { return par.grid.pp > 1; }
  int tensor_size() const { return par.tensor_size(); }
};

// The run config's parallel plan with micro-batches of `micro_batch` sequences: the one place
// the parallel settings are read (the schedule, chunks and layer split only with parallel.pp > 1,
// recomputation only with tensor or pipeline parallelism: they are ignored otherwise). Not
// checked: plan_run does that. Throws for a malformed parallel.pp_layers.
parallel::ParallelPlan parallel_plan(const RunConfig& cfg, int micro_batch);

// The micro-batch, the grid and the pipeline schedule of `cfg` on `world_size` ranks; throws
// (the first of parallel::plan_problems, with its hint) for a plan that cannot run.
RunPlan plan_run(const RunConfig& cfg, const model::ModelConfig& mcfg, int world_size);

// The cluster file of the performance model: an explicit one must load (checked before any
// work); the default one (written by `tessera probe`) is used when present and readable.
struct PredictionCluster {
  std::filesystem::path path;
  std::optional<perf::ClusterSpec> spec;  // none: no prediction
};
PredictionCluster find_prediction_cluster(const RunConfig& cfg);

// hardware.device = "cuda": data parallelism alone (every other axis 1, ZeRO-0, fp32 gradient
// sums) and a CUDA device present.
void check_device_options(const RunConfig& cfg, const RunPlan& plan);

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
