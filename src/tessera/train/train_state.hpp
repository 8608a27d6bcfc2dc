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

// With `resume`, loads the newest complete checkpoint of ckpt_dir (this rank's slices and shards
// of it) and sets the loader's position; otherwise, or when there is none, initializes the
// parameters from train.seed. `sequences_per_step` (all dp ranks) is compared with the
// checkpoint's config on the lead rank, which warns when the data order changes.
TrainProgress resume_or_initialize(const RunConfig& cfg, bool resume, RunModel& model,
                                   data::TokenLoader& train_loader,
                                   const std::filesystem::path& ckpt_dir, bool lead,
                                   std::int64_t sequences_per_step);

// Writes a checkpoint of step `progress.step`, collective over all ranks: every rank that owns a
// part of the AdamW state writes it; the lead rank writes the (consolidated) model and the index,
// and commits after all shards are on disk. Returns the checkpoint's path on the lead rank, an
// empty path on the others.
std::filesystem::path save_checkpoint(const RunConfig& cfg, RunModel& model, comm::Runtime& rt,
                                      const std::filesystem::path& ckpt_dir,
                                      const TrainProgress& progress,
                                      const data::TokenLoader& train_loader);

}  // namespace tessera::train
