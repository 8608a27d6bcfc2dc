#include "tessera/train/run_model.hpp"

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/device.hpp"

namespace tessera::train {

namespace {

parallel::TensorModelOptions tensor_model_options(const RunConfig& cfg, const RunPlan& plan,
                                                  const comm::Topology& topo) {
  const auto& p = plan.par;
  parallel::TensorModelOptions options;
  if (plan.pipeline())
    options.chunks =
        parallel::stage_chunks(p.layer_split, p.grid.pp, p.chunks(), topo.coord(comm::Axis::PP));
  options.recompute = p.recompute == parallel::Recompute::Full;
  options.sequence_parallel = p.sequence_parallel;
  options.overlap_dx = p.overlap_dx;
  options.defer_dw = p.defer_dw;
  options.prefetch = p.prefetch;
  options.tune_gemm = cfg.hardware.tune_gemm;
  options.gemm_tuning_file = cfg.hardware.gemm_tuning_file;
  options.bf16 = cfg.train.precision == "bf16";
  options.bf16_tensor_wire = cfg.parallel.tensor_dtype == "bf16";
  return options;
}

}  // namespace

RunModel build_run_model(const RunConfig& cfg, const model::ModelConfig& mcfg,
                         const model::ParamLayout& layout, const RunPlan& plan,
                         const comm::Topology& topo, comm::Runtime& rt) {
  RunModel model;
  model.layout = &layout;
  if (cfg.hardware.device != "cuda") {
    model.tensor = std::make_unique<parallel::TensorModel>(mcfg, topo, rt,
                                                           tensor_model_options(cfg, plan, topo));
    // Without a pipeline, the one-stage schedule: each micro-batch's forward and backward, then
    // the optimizer step.
    const parallel::ScheduleSpec one_stage{parallel::ScheduleKind::OneF1B, 1, plan.accum(), 1};
    model.pipe_comm = &rt.group(topo, {comm::Axis::PP});
    model.executor = std::make_unique<parallel::PipelineExecutor>(
        *model.tensor, *model.pipe_comm, plan.pipeline() ? plan.sched() : one_stage,
        cfg.parallel.pipeline_dtype == "bf16");
  }
  model.dp_comm = &rt.group(topo, {comm::Axis::DP});
  model.dp = std::make_unique<parallel::DataParallel>(*model.dp_comm, model.local_layout(),
                                                      plan.par.zero, plan.par.overlap_dp);
  model.dp->set_bf16_reduction(cfg.parallel.grad_reduce == "bf16");
  if (cfg.hardware.device == "cuda") {
    // Each rank of a machine drives the GPU of its index there; more ranks than GPUs share them
    // (correct, and the gradients are then summed through the host).
    kernels::cuda::use_device(rt.local_rank() % kernels::cuda::device_count());
    model.device = std::make_unique<model::DeviceGpt>(
        mcfg,
        cfg.train.precision == "bf16" ? model::DevicePrecision::Bf16 : model::DevicePrecision::Fp32,
        plan.B(), plan.T);
    if (model.dp_comm->size() > 1) {
      const auto& how = cfg.hardware.gpu_reduce;
      model.device_reduce =
          comm::make_device_reducer(*model.dp_comm, how == "nccl"   ? comm::DeviceReduce::Nccl
                                                    : how == "host" ? comm::DeviceReduce::Host
                                                                    : comm::DeviceReduce::Auto);
    }
  }
  return model;
}

void to_device(RunModel& model) {
  if (!model.device) return;
  const std::size_t n = model.layout->total();
  Buffer<float> m(n), v(n);
  model.dp->gather_moments(m.data(), v.data());
  model.device->upload_params(model.dp->full_params());
  model.device->upload_moments(m.data(), v.data());
}

void to_host(RunModel& model) {
  if (!model.device) return;
  const std::size_t n = model.layout->total();
  Buffer<float> p(n), m(n), v(n);
  model.device->download_params(p.data());
  model.device->download_moments(m.data(), v.data());
  model.dp->load(p.data(), m.data(), v.data());
}

const float* full_params(RunModel& model) {
  if (!model.sliced()) return model.dp->full_params();
  model.whole.resize(model.layout->total());
  model.tensor->gather_full(model.dp->full_params(), model.whole.data());
  return model.whole.data();
}

void drop_full_params(RunModel& model) {
  model.whole = Buffer<float>();
}

TrainData open_train_data(const RunConfig& cfg, const RunPlan& plan,
                          const parallel::DataParallel& dp, int vocab_size) {
  TrainData data;
  data.train = std::make_unique<data::TokenLoader>(cfg.data.train, plan.B(), plan.T,
                                                   static_cast<std::size_t>(dp.dp_rank()),
                                                   static_cast<std::size_t>(dp.dp_size()));
  if (cfg.train.val_every > 0)
    data.val = std::make_unique<data::TokenLoader>(cfg.data.val, plan.B(), plan.T);
  data.train->check_ids(static_cast<std::uint32_t>(vocab_size));
  if (data.val) data.val->check_ids(static_cast<std::uint32_t>(vocab_size));
  return data;
}

}  // namespace tessera::train
