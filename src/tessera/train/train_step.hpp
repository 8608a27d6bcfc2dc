// One optimizer step of a rank: read (and, with the goldfish loss, mask) the step's micro-batches,
// forward and backward over the parallel model or the pipeline executor, the step's loss over all
// dp ranks, the gradient norm, clipping and the AdamW update.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/data/loader.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_model.hpp"
#include "tessera/train/run_setup.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

// What the steps read and write besides the model, kept over the run.
struct StepWorkspace {
  // The step's micro-batches, read before the first forward: accum x (B, T).
  std::vector<std::vector<std::int32_t>> gx, gy;
  std::vector<std::int64_t> kept;  // targets in the loss of each micro-batch (Goldfish: kept)
  // dloss = 1 / (targets in the loss of the step, all micro-batches and dp ranks), set each step
  model::ForwardOptions forward;
  optim::AdamWConfig adamw;
};

StepWorkspace make_step_workspace(const RunConfig& cfg, const RunPlan& plan);

// What a step measured.
struct StepResult {
  double loss = 0;                       // mean over the step's (kept) targets, all dp ranks
  double grad_norm = 0;                  // before clipping
  float lr = 0;                          // the learning rate of the update
  double kept_targets = 0;               // targets in the loss, all micro-batches and dp ranks
  double forward_s = 0, backward_s = 0;  // where the step's time goes (non-pipeline path)
  double comm_wait_s = 0;                // exposed gradient-reduction time
  double update_s = 0;                   // gradient norm, clipping and the optimizer
};

// Reads one step's micro-batches and drops them: the data window a loss-spike rollback skips.
void skip_step_data(const RunPlan& plan, data::TokenLoader& loader, StepWorkspace& work);

// Runs optimizer step `step` + 1 (collective over all ranks). When the loss is not finite no
// update is made, and it throws tessera::Error unless the run rolls loss spikes back
// (train.spike_factor > 0: the result's loss is then the non-finite value).
StepResult train_step(const RunConfig& cfg, const RunPlan& plan, RunModel& model,
                      data::TokenLoader& loader, StepWorkspace& work, std::int64_t step,
                      comm::Runtime& rt);

}  // namespace tessera::train
