// The long-lived objects of one rank's training run: its slice of the model (tensor and pipeline
// parallelism), the pipeline executor, the data-parallel store of its parameters, gradients and
// AdamW state, and the token loaders.
#pragma once

#include <memory>

#include "tessera/comm/device_reduce.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/data/loader.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"
#include "tessera/parallel/data_parallel.hpp"
#include "tessera/parallel/pipeline.hpp"
#include "tessera/parallel/tensor_model.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_setup.hpp"

namespace tessera::comm {
class Communicator;
class Runtime;
}  // namespace tessera::comm

namespace tessera::train {

struct RunModel {
  const model::ParamLayout* layout = nullptr;  // the whole model
  // The training model on the CPU: this rank's slices of the model on the tensor grid and its
  // pipeline stage (one process: the 1x1x1 grid, the whole model), in fp32 or bf16 mixed
  // precision. Null on the GPU, which trains through model::DeviceGpt.
  std::unique_ptr<parallel::TensorModel> tensor;
  // Runs each step of `tensor` as the stage's instruction list: the pipeline schedule, or the
  // one-stage schedule without a pipeline. Null when `tensor` is.
  std::unique_ptr<parallel::PipelineExecutor> executor;
  comm::Communicator* pipe_comm = nullptr;     // {pp} (one rank without a pipeline)
  comm::Communicator* dp_comm = nullptr;       // {dp}
  std::unique_ptr<parallel::DataParallel> dp;  // works on the local layout over the dp group
  Buffer<float> whole;  // tensor parallelism: the whole model assembled from the slices
  // hardware.device = "cuda": the model, gradients and AdamW moments live on the GPU; dp's host
  // buffers are the staging copy, refreshed by to_host() for checkpoints and samples.
  std::unique_ptr<model::DeviceGpt> device;
  // On GPUs with dp > 1: sums the device gradients over the dp group after each step's last
  // backward (NCCL, or through the host). Null otherwise.
  std::unique_ptr<comm::DeviceReducer> device_reduce;

  // The layout of the parameters this rank stores: its slices, or the whole model.
  const model::ParamLayout& local_layout() const {
    return tensor ? tensor->local_layout() : *layout;
  }
  // The rank stores slices of the model (tensor or pipeline parallelism), not the whole model.
  bool sliced() const { return tensor && !tensor->whole(); }
  // Pipeline parallelism: the executor runs a schedule of several stages.
  bool pipelined() const { return executor && executor->spec().pp > 1; }
};

// Builds the model objects of this rank (collective: creates the pp and dp communicators).
RunModel build_run_model(const RunConfig& cfg, const model::ModelConfig& mcfg,
                         const model::ParamLayout& layout, const RunPlan& plan,
                         const comm::Topology& topo, comm::Runtime& rt);

// hardware.device = "cuda": parameters and AdamW moments from dp's host buffers to the GPU
// (after initializing or resuming), and back (before checkpoints and samples). No-ops otherwise.
void to_device(RunModel& model);
void to_host(RunModel& model);

// The whole model's parameters (collective under tensor parallelism and at ZeRO-3).
const float* full_params(RunModel& model);
// The assembled whole model is not kept between uses (it is the size of the whole model on
// every rank).
void drop_full_params(RunModel& model);

// The training shard of this dp rank and the validation shard (train.val_every > 0).
struct TrainData {
  std::unique_ptr<data::TokenLoader> train;
  std::unique_ptr<data::TokenLoader> val;  // null without validation
};

// Opens both shards and checks every token id of both, before any step: a bad id in the
// validation shard must not end the run at its first validation.
TrainData open_train_data(const RunConfig& cfg, const RunPlan& plan,
                          const parallel::DataParallel& dp, int vocab_size);

}  // namespace tessera::train
