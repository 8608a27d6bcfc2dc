#include "tessera/train/train_step.hpp"

#include <cmath>
#include <functional>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/parallel/schedule.hpp"
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

// The GPU's step runs the same one-stage instruction list as the CPU's executor (F0 B0 F1 B1 ...
// OPT): Forward is the device model's forward (the host waits for the micro-batch's loss),
// Backward its backward (timed to its end), OptimizerStep the caller's update. The device model
// keeps one micro-batch's activations, which is all the one-stage list has in flight.
void run_device_schedule(const RunPlan& plan, model::DeviceGpt& dev, StepWorkspace& work,
                         const std::function<void(double loss_sum)>& optimizer_step,
                         StepResult& result) {
  const parallel::ScheduleSpec one_stage{parallel::ScheduleKind::OneF1B, 1, plan.accum(), 1};
  const auto list = parallel::make_stage_schedule(one_stage, 0);
  double loss = 0;  // summed over the step's targets: each micro-batch's mean times its targets
  for (const parallel::Instr& in : list) {
    Timer phase;
    switch (in.op) {
      case parallel::OpKind::Forward:
        loss += dev.forward(work.gx[in.mb].data(), work.gy[in.mb].data(), plan.B(), plan.T, true,
                            work.forward.dloss) *
                static_cast<double>(work.kept[in.mb]);
        result.forward_s += phase.seconds();
        break;
      case parallel::OpKind::Backward:
        dev.backward();
        dev.synchronize();
        result.backward_s += phase.seconds();
        break;
      case parallel::OpKind::OptimizerStep:
        optimizer_step(loss);
        break;
      default:
        throw Error("internal: the one-stage schedule has no sends or receives");
    }
  }
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
  result.update_s = update_timer.seconds();
  result.grad_norm = norm;
  result.lr = lr;
}

// The mean over every target in the loss (all micro-batches and dp ranks) from this rank's sum.
// When it is not finite it throws (before any update), unless the run rolls loss spikes back
// (train.spike_factor > 0): the caller then skips the update and the trainer reloads.
double global_mean_loss(const RunConfig& cfg, RunModel& model, double loss_sum, double kept_targets,
                        std::int64_t step) {
  model.dp_comm->all_reduce_sum(&loss_sum, 1);
  const double loss = kept_targets > 0 ? loss_sum / kept_targets : 0.0;
  if (!std::isfinite(loss) && cfg.train.spike_factor <= 0)
    throw Error(fmt::format("the loss became {} at step {}", loss, step + 1),
                "lower train.lr or raise train.warmup_steps; check the data");
  return loss;
}

// The step as the executor's instruction list (the one-stage schedule without a pipeline): its
// OptimizerStep reduces the gradients, then takes the loss of the step (known on the last stage,
// sent to the others) and updates the parameters.
void run_schedule(const RunConfig& cfg, const RunPlan& plan, RunModel& model, StepWorkspace& work,
                  std::int64_t step, comm::Runtime& rt, StepResult& result) {
  const int accum = plan.accum();
  std::vector<const std::int32_t*> in(accum), tg(accum);
  for (int a = 0; a < accum; ++a) in[a] = work.gx[a].data(), tg[a] = work.gy[a].data();
  parallel::PipelineExecutor::StepHooks hooks;
  hooks.dp = model.dp.get();
  hooks.optimizer_step = [&](const std::vector<float>& mb_losses) {
    double loss = 0;
    for (int a = 0; a < accum; ++a)
      loss += static_cast<double>(mb_losses[a]) * static_cast<double>(work.kept[a]);
    model.pipe_comm->broadcast_bytes(&loss, sizeof loss, model.executor->spec().pp - 1);
    result.loss = global_mean_loss(cfg, model, loss, result.kept_targets, step);
    if (std::isfinite(result.loss)) update_params(cfg, model, work, step, rt, result);
  };
  model.executor->run(*model.dp, in, tg, plan.B(), plan.T, work.forward, &hooks);
  const auto& st = model.executor->stats();
  result.forward_s = st.forward_s;
  result.backward_s = st.backward_s;
  result.comm_wait_s = st.reduce_wait_s;
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

void skip_step_data(const RunPlan& plan, data::TokenLoader& loader, StepWorkspace& work) {
  for (int a = 0; a < plan.accum(); ++a) loader.next(work.gx[a].data(), work.gy[a].data());
}

StepResult train_step(const RunConfig& cfg, const RunPlan& plan, RunModel& model,
                      data::TokenLoader& loader, StepWorkspace& work, std::int64_t step,
                      comm::Runtime& rt) {
  StepResult result;
  result.kept_targets = read_step(cfg, plan, model, loader, work, step);
  if (model.device)
    model.device->zero_grads();
  else
    model.dp->begin_step();
  if (model.executor) {  // the parallel model: every phase is an instruction of the schedule
    run_schedule(cfg, plan, model, work, step, rt, result);
    return result;
  }
  run_device_schedule(
      plan, *model.device, work,
      [&](double loss_sum) {
        if (model.device_reduce) {  // data parallelism: every rank's gradients summed
          Timer reduce;
          model.device_reduce->all_reduce_sum(model.device->device_grads(), model.layout->total(),
                                              model.device->stream());
          model.device->synchronize();  // grad_norm() would wait for it anyway
          result.comm_wait_s = reduce.seconds();
        }
        result.loss = global_mean_loss(cfg, model, loss_sum, result.kept_targets, step);
        if (std::isfinite(result.loss)) update_params(cfg, model, work, step, rt, result);
      },
      result);
  return result;
}

}  // namespace tessera::train
