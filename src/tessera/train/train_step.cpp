#include "tessera/train/train_step.hpp"

#include <cmath>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/train/goldfish.hpp"

namespace tessera::train {

namespace {

// Reads the step's micro-batches before the first forward and counts the targets in the loss:
// all of them, or those the Goldfish mask keeps. The loss and its gradient are normalised by that
// count over every micro-batch and dp rank, which the gradient scale (dloss) needs before the
// first backward. Returns the count.
double read_step(const RunConfig& cfg, const RunPlan& plan, RunModel& model,
                 data::TokenLoader& loader, StepWorkspace& work, std::int64_t step) {
  const int B = plan.B(), T = plan.T;
  double kept_total = 0;
  for (int a = 0; a < plan.accum(); ++a) {
    const std::uint64_t pos = loader.position();
    loader.next(work.gx[a].data(), work.gy[a].data());
    const std::uint64_t first_target =
        pos + static_cast<std::uint64_t>(model.dp->dp_rank()) * B * T + 1;  // stream index
    work.kept[a] = cfg.goldfish.k > 0
                       ? apply_goldfish(cfg.goldfish, work.gy[a].data(), B, T, first_target, step)
                       : static_cast<std::int64_t>(B) * T;
    kept_total += static_cast<double>(work.kept[a]);
  }
  model.dp_comm->all_reduce_sum(&kept_total, 1);
  work.forward.dloss = kept_total > 0 ? static_cast<float>(1.0 / kept_total) : 0.0f;
  return kept_total;
}

// The stage's instruction list over the step's micro-batches; gradients accumulate (no reduction
// before the list ends), then the tied embedding's two copies and the dp reduction of every
// block. Returns the loss summed over the targets of this rank's micro-batches (each
// micro-batch's mean times its targets), known on every stage.
double run_pipeline_step(const RunConfig& cfg, const RunPlan& plan, RunModel& model,
                         StepWorkspace& work, StepResult& result) {
  parallel::DataParallel& dp = *model.dp;
  const int accum = plan.accum();
  std::vector<const std::int32_t*> in(accum), tg(accum);
  for (int a = 0; a < accum; ++a) in[a] = work.gx[a].data(), tg[a] = work.gy[a].data();
  dp.begin_micro_batch(false);
  const auto mb_losses = model.pipeline->run(dp, in, tg, plan.B(), plan.T, work.forward);
  Timer comm_timer;
  model.pipeline->sum_tied_embedding_grads(dp);
  dp.begin_micro_batch(true);
  for (int b = model::num_blocks(model.local_layout()) - 1; b >= 0; --b) dp.grads_done(b);
  dp.end_micro_batch();
  result.comm_wait_s += comm_timer.seconds();
  double loss = 0;
  for (int a = 0; a < accum; ++a)
    loss += static_cast<double>(mb_losses[a]) * static_cast<double>(work.kept[a]);
  // The losses are known on the last stage.
  model.pipe_comm->broadcast_bytes(&loss, sizeof loss, cfg.parallel.pp - 1);
  return loss;
}

// Forward and backward of one micro-batch on the GPU (the host waits for the forward's losses;
// the backward is timed to its end). Returns its mean loss.
double device_micro_batch(model::DeviceGpt& dev, const std::int32_t* x, const std::int32_t* y,
                          int B, int T, float dloss, StepResult& result) {
  Timer phase;
  const float mb = dev.forward(x, y, B, T, true, dloss);
  result.forward_s += phase.seconds();
  phase.reset();
  dev.backward();
  dev.synchronize();
  result.backward_s += phase.seconds();
  return mb;
}

// Forward and backward of each micro-batch over the parallel model (or the one-process model),
// the dp reductions overlapping the backward. Returns the loss summed as run_pipeline_step's.
double run_micro_batches(const RunPlan& plan, RunModel& model, model::Activations& acts,
                         StepWorkspace& work, StepResult& result) {
  parallel::DataParallel& dp = *model.dp;
  const int B = plan.B(), T = plan.T, accum = plan.accum();
  const auto gemm = work.forward.gemm;
  double loss = 0;
  for (int a = 0; a < accum; ++a) {
    const std::int32_t* xa = work.gx[a].data();
    const std::int32_t* ya = work.gy[a].data();
    // forward returns the mean over the micro-batch's targets: weight it back to a sum
    const double kept = static_cast<double>(work.kept[a]);
    if (model.device) {
      loss += device_micro_batch(*model.device, xa, ya, B, T, work.forward.dloss, result) * kept;
      continue;
    }
    dp.begin_micro_batch(a + 1 == accum);  // reductions start as backward finishes each block
    Timer phase;
    const float mb = model.tensor
                         ? model.tensor->forward(dp, xa, ya, B, T, work.forward)
                         : model::forward(*model.layout, dp, acts, xa, ya, B, T, work.forward);
    loss += static_cast<double>(mb) * kept;
    result.forward_s += phase.seconds();
    phase.reset();
    if (model.tensor)
      model.tensor->backward(dp, xa, B, T, gemm);
    else
      model::backward(*model.layout, dp, acts, xa, B, T, gemm, nullptr, work.forward.bf16_params);
    result.backward_s += phase.seconds();
    Timer comm_timer;
    dp.end_micro_batch();  // waits for the reductions still in flight
    result.comm_wait_s += comm_timer.seconds();
  }
  return loss;
}

// The gradient norm, the learning rate, and the AdamW update with the clipping fused.
void update_params(const RunConfig& cfg, RunModel& model, StepWorkspace& work, std::int64_t step,
                   comm::Runtime& rt, StepResult& result) {
  const auto& tc = cfg.train;
  parallel::DataParallel& dp = *model.dp;
  Timer update_timer;
  double norm = 0;
  const float lr = optim::lr_at(step, tc.steps, tc.warmup_steps, work.adamw.lr,
                                static_cast<float>(tc.min_lr_ratio));
  if (model.device) {
    norm = model.device->grad_norm();
    model.device->adamw_step(work.adamw, lr, step + 1, optim::clip_scale(norm, tc.grad_clip));
    model.device->synchronize();
  } else if (model.sliced()) {
    // Each element once: the slices this rank owns, over every rank.
    double sq = dp.grad_sumsq(model.tensor->owner_mask().data());
    rt.world().all_reduce_sum(&sq, 1);
    norm = std::sqrt(sq);
  } else {
    norm = dp.grad_norm();
  }
  if (!model.device)  // the clipping fused into the update, as on the device
    dp.step(work.adamw, lr, step + 1, optim::clip_scale(norm, tc.grad_clip));
  refresh_bf16(model);  // bf16 on the CPU: the GEMMs' copy of the updated master weights
  result.update_s = update_timer.seconds();
  result.grad_norm = norm;
  result.lr = lr;
}

}  // namespace

StepWorkspace make_step_workspace(const RunConfig& cfg, const RunPlan& plan) {
  const auto& tc = cfg.train;
  const int B = plan.B(), T = plan.T, accum = plan.accum();
  StepWorkspace work;
  work.adamw = optim::AdamWConfig{static_cast<float>(tc.lr), static_cast<float>(tc.beta1),
                                  static_cast<float>(tc.beta2), static_cast<float>(tc.eps),
                                  static_cast<float>(tc.weight_decay)};
  work.forward.gemm = kernels::GemmLibrary::OneDnn;
  work.forward.training = true;
  // The step's micro-batches, read (and, under the Goldfish loss, masked: training targets only;
  // validation scores every token) before the first forward; dloss is set per step from the
  // targets in the loss (read_step).
  work.gx.assign(accum, std::vector<std::int32_t>(static_cast<std::size_t>(B) * T));
  work.gy = work.gx;
  work.kept.assign(accum, 0);
  return work;
}

StepResult train_step(const RunConfig& cfg, const RunPlan& plan, RunModel& model,
                      model::Activations& acts, data::TokenLoader& loader, StepWorkspace& work,
                      std::int64_t step, comm::Runtime& rt) {
  StepResult result;
  result.kept_targets = read_step(cfg, plan, model, loader, work, step);
  if (model.device)
    model.device->zero_grads();
  else
    model.dp->begin_step();
  double loss = model.pipeline ? run_pipeline_step(cfg, plan, model, work, result)
                               : run_micro_batches(plan, model, acts, work, result);
  // the mean over every target in the loss, all micro-batches and dp ranks
  model.dp_comm->all_reduce_sum(&loss, 1);
  loss = result.kept_targets > 0 ? loss / result.kept_targets : 0.0;
  if (!std::isfinite(loss))
    throw Error(fmt::format("the loss became {} at step {}", loss, step + 1),
                "lower train.lr or raise train.warmup_steps; check the data");
  result.loss = loss;
  update_params(cfg, model, work, step, rt, result);
  return result;
}

}  // namespace tessera::train
