// The state of a training run between steps, and its checkpoints: resuming from the newest one
// (any grid resumes any other) or initializing afresh, and the sharded save every rank takes
// part in.
#pragma once

#include <cstdint>
#include <filesystem>

#include "tessera/core/rng.hpp"
#include "tessera/data/loader.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_model.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

// What a checkpoint holds besides the parameters and the AdamW moments (with the loader's
// position, which lives in the loader).
struct TrainProgress {
  std::int64_t step = 0;         // optimizer steps completed
  std::int64_t tokens_seen = 0;  // training tokens, all dp ranks
  Rng rng;                       // the samples' random state
  bool resumed = false;          // continued from a checkpoint
};

struct ResumeOptions {
  bool resume = false;  // continue from the newest complete checkpoint, if any
  // Continue although the run config changes the checkpoint's schedule (steps, warmup, learning
  // rates, sequences per step); without it such a resume is refused.
  bool override_schedule = false;
};

// With `how.resume`, loads the newest complete checkpoint of ckpt_dir (this rank's slices and
// shards of it) and sets the loader's position; otherwise, or when there is none, initializes the
// parameters from train.seed. The run config is compared with the checkpoint's: a changed
// schedule or `seqs_per_step` (all dp ranks) is refused unless how.override_schedule; another
// data shard, seed or sequence length is a warning (the data order changes).
TrainProgress resume_or_initialize(const RunConfig& cfg, const ResumeOptions& how, RunModel& model,
                                   data::TokenLoader& train_loader,
                                   const std::filesystem::path& ckpt_dir, bool lead,
                                   std::int64_t seqs_per_step);

// Writes a checkpoint of step `progress.step`, collective over all ranks: every rank that owns a
// part of the AdamW state writes it; the lead rank writes the (consolidated) model and the index,
// and commits after all shards are on disk. Returns the checkpoint's path on the lead rank, an
// empty path on the others.
std::filesystem::path save_checkpoint(const RunConfig& cfg, RunModel& model, comm::Runtime& rt,
                                      const std::filesystem::path& ckpt_dir,
                                      const TrainProgress& progress,
                                      const data::TokenLoader& train_loader);

}  // namespace tessera::train
