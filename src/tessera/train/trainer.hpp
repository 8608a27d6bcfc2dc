// The single-process training loop: data -> forward/backward over micro-batches -> clipping ->
// AdamW -> metrics, validation, checkpoints and samples.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "tessera/model/config.hpp"
#include "tessera/train/run_config.hpp"

namespace tessera {
namespace comm {
class Runtime;
}
namespace train {

struct TrainOptions {
  bool resume = false;  // continue from the newest complete checkpoint in out_dir, if any
  // A fresh run into an out_dir that holds a run deletes that run's files (checkpoints, metrics,
  // config) first; without it such a run is refused.
  bool overwrite = false;
  // Resume although the run config changes the checkpoint's schedule (steps, warmup, learning
  // rates, sequences per step): the run continues under the new one. Without it such a resume is
  // refused before any step.
  bool override_schedule = false;
  bool quiet = false;  // no per-step terminal lines (metrics are still written)
  // Compare the prediction with the first measured steps (metrics_rows.hpp, check_prediction);
  // off for callers that report both themselves (tessera tune).
  bool check_prediction = true;
  // Stop (with a checkpoint) once this optimizer step is reached, although the schedule runs to
  // train.steps: for preemptible jobs and time limits. 0 = run to train.steps.
  std::int64_t stop_at = 0;
  // Stop (with a checkpoint) before this many seconds have passed since the run started: the
  // last step starts only if it and the checkpoint fit (estimated from the longest step and the
  // last save). 0 = no limit. SIGTERM and SIGUSR1 stop the run the same way, after the step in
  // progress, on every rank.
  double time_limit_s = 0;
  // Write a Chrome/Perfetto trace of one measured step (the second one run, after warm-up) here:
  // each instruction of the schedule per stage, with the simulator's names. Under several ranks
  // each writes PATH with ".rank<k>" before the extension. Empty: no trace.
  std::filesystem::path trace;
  // A stopped run's line says "run again with --resume"; off for callers that do not resume a
  // run but stop as a whole when it stops (its summary's stopped_by says so).
  bool resumable = true;
  // Called on rank 0 after each optimizer step (studies drawing their own progress).
  std::function<void(std::int64_t step, std::int64_t steps, double loss)> on_step;
};

struct TrainSummary {
  std::vector<float> losses;                        // training loss of each step run here
  std::vector<std::pair<std::int64_t, float>> val;  // (step, validation loss)
  std::int64_t first_step = 0, last_step = 0;       // steps run: (first_step, last_step]
  double tokens_per_s = 0;                          // median over the steps run
  std::vector<double> step_s;                       // wall time of each step run here
  double peak_rss_steps_bytes = 0;  // busiest rank's peak resident bytes over the steps
  double predicted_step_s = 0;      // the performance model's, 0: no prediction
  double predicted_peak_bytes = 0;  // per rank
  std::filesystem::path last_checkpoint;
  std::string stopped_by;  // "SIGTERM", "SIGUSR1" or "--time-limit" when stopped early; else ""
};

// Runs on every rank of the runtime (one process: a runtime of one). Throws tessera::Error for
// bad input before any work starts; `started` (if given) turns true once the first step begins.
TrainSummary run_training(const RunConfig& cfg, const TrainOptions& opt, comm::Runtime& rt,
                          bool* started = nullptr);

// The model configuration a run config describes.
model::ModelConfig model_config(const RunConfig& cfg);

}  // namespace train
}  // namespace tessera
