// The analytical performance model: per training step of a GPT on a dp x pp x tx x ty x tz grid,
// its FLOPs, memory per device, communication per axis, pipeline bubble and step time.
// Derivation and validation (against the Megatron-LM paper's table of measured runs) are in
// docs/performance-model.md.
//
// The tensor axes follow parallel/tensor_linear.hpp (AxoNN's 3D algorithm): a normal linear splits
// its input features over tx and its output features over ty, a transposed one the reverse; qkv
// and fc are normal, proj and fcproj transposed; the batch is split over tz and the weights are
// sharded over tz. The trainer's 1D mode is tx alone (the normal linears all-reduce their 3h and
// 4h outputs, the attention core and GELU are replicated over tx), the one grid with sequence
// parallelism (those regions split by sequences over tx: reduce-scatter / all-gather instead of
// the all-reduce). Megatron's column/row-parallel split of degree t is ty = t alone (2
// all-reduces of b*s*h forward, 2 backward per layer). Which plans can run is
// parallel::plan_problems, the trainer's rules.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "tessera/comm/topology.hpp"
#include "tessera/model/config.hpp"
#include "tessera/parallel/plan.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/perf/cluster.hpp"

namespace tessera::perf {

using parallel::parse_recompute;
using parallel::Recompute;
using parallel::recompute_name;

// Software choices that are not part of a configuration point.
struct ModelOptions {
  DType dtype = DType::BF16;      // compute dtype; bf16/fp16 = mixed precision (fp32 master)
  bool flash_attention = true;    // attention never stores / streams the (s x s) scores
  bool tp_overlap = true;         // dx all-reduce hidden behind the dW GEMM; tz gathers prefetched
  bool dp_overlap = true;         // data-parallel reduction overlapped with the last backward
  bool pp_scatter_gather = true;  // pipeline p2p sends 1/(tx*ty) of the activation + all-gather
  // Mixed precision as the CPU trainer keeps it: the dtype sets the GEMM rate only; parameters
  // (AdamW updates them in place: they are the master), gradients, optimizer state, activations
  // and every message stay fp32, plus a bf16 copy of the weights for the GEMMs. false: Megatron's
  // layout (bf16 parameters, gradients, activations and messages; the fp32 master in the
  // optimizer state).
  bool fp32_storage = false;
  // The data-parallel gradient reduction in bf16 (2 bytes per element) whatever the storage.
  bool bf16_grad_reduce = false;
  // The pipeline's activations and gradients sent in bf16 (2 bytes per element) whatever the
  // storage.
  bool bf16_pipeline = false;
  // Tensor parallelism's sums and gathers of activations and their gradients in bf16 (2 bytes per
  // element) whatever the storage.
  bool bf16_tensor = false;
};

// One configuration of a training step: the trainer's plan (parallel/plan.hpp). Its micro-batches
// per step follow from the workload's global batch (predict and infeasible_reason set them).
using PlanPoint = parallel::ParallelPlan;

struct Workload {
  model::ModelConfig cfg;  // shape (block_size unused: seq below)
  int seq = 2048;
  long global_batch = 1;  // samples per step
};

struct Memory {  // bytes per device, the fullest pipeline stage
  double params = 0, grads = 0, optimizer = 0, activations = 0, logits = 0, buffers = 0,
         reserved = 0;
  double total() const {
    return params + grads + optimizer + activations + logits + buffers + reserved;
  }
};

// Time per training step spent in one axis' collectives on one device, and the part of it that
// is not hidden behind computation.
struct AxisComm {
  double seconds = 0, exposed = 0, bytes = 0;
};

// Costs of the pipeline's work items, in seconds, for the simulator: one chunk of one stage for
// one micro-batch (chunk-level compute plus the tensor-parallel communication it waits for).
struct ChunkCost {
  double fwd_compute = 0, fwd_comm = 0;  // comm: exposed tensor-parallel collectives
  double bwd_compute = 0, bwd_comm = 0;  // includes the recomputation
};

struct Prediction {
  PlanPoint point;
  int micro_batches = 0;                     // m per pipeline per step
  double step_s = 0;                         // predicted time of one step
  double pipeline_s = 0;                     // forward/backward of all micro-batches incl. bubble
  double bubble_s = 0, bubble_fraction = 0;  // idle of the fullest stage / step
  double dp_exposed_s = 0, optimizer_s = 0;
  double tied_s = 0;       // pp > 1: the first and last stage exchange the tied wte's gradient
  double compute_s = 0;    // busy (compute only) of the fullest stage
  double hw_flops = 0;     // per step, all devices, counting recomputation
  double model_flops = 0;  // per step, without recomputation (72-factor; MFU)
  double tflops_per_device = 0;                   // hardware FLOPs / step / devices
  double mfu = 0, hfu = 0;                        // of the dtype's peak
  std::array<AxisComm, comm::k_num_axes> comm{};  // indexed by comm::Axis
  Memory memory;
  double capacity = 0;  // usable bytes per device
  bool fits = false;
  // for the simulator
  std::vector<std::vector<ChunkCost>> chunk_cost;  // (pp, v)
  double p2p_s = 0;                                // one activation or gradient message
  double compute_share = 1;  // perf::compute_share of the cluster for this grid (< 1: shared cores)
  std::vector<double> dp_s;  // (pp) exposed data-parallel reduction per stage
};

// Why a point cannot run (empty string: it can, shape-wise): the global batch must split into
// dp x micro-batch, then the plan's first parallel::plan_problems reason (the trainer's rules),
// then the cluster's node count. Memory is not checked here.
std::string infeasible_reason(const Workload& w, const PlanPoint& p, const ClusterSpec& c);
// The point with its micro-batches per step set from the workload's global batch.
PlanPoint with_micro_batches(const Workload& w, PlanPoint p);

// Predicts one point (throws tessera::Error if infeasible_reason is not empty).
Prediction predict(const Workload& w, const PlanPoint& p, const ClusterSpec& c,
                   const ModelOptions& o = {});

// FLOPs per step from the shape alone (Narayanan et al.: 96 B s l h^2 (1 + s/6h + V/16lh) with
// full recomputation, 72 without; selective adds the attention core once more).
double step_flops(const model::ModelConfig& cfg, int seq, long global_batch, Recompute r);

// The activations one layer keeps in the regions split over ty (qkv, attention, MLP), in bytes
// per token and model channel at 2-byte elements: q and the attention output 2 each, k and v
// 2 kv/n_head each, the MLP's GELU input and output 2 F/h each (GPT-2: 4 + 4 + 16 = 24,
// Korthikanti's figure), or llama's gate|up output 4 F/h and SwiGLU output 2 F/h (Llama 3 8B:
// 4 + 1 + 21 = 26).
double split_region_activations(const model::ModelConfig& cfg);

// Activation bytes of one transformer layer for one micro-batch of b sequences held by one
// device (Korthikanti et al. 2022, in the trainer's layouts): s*b*h*(10/tx + (24 + 5*a*s/h)/r)
// * bytes/2, the batch split over tz: the 10 of the residual layout split over tx by channels,
// the 24 (and the scores) of the qkv/attention/MLP regions split over ty by heads and replicated
// over tx, r = ty (tx with sequence parallelism, which splits them by sequences); the 5as/h term
// is absent with selective recomputation or flash attention; full recomputation keeps only the
// layer input, 2*s*b*h/tx. The 24 is split_region_activations(cfg) (family-aware).
double layer_activation_bytes(const model::ModelConfig& cfg, int seq, int b,
                              const comm::GridShape& g, Recompute r, bool seq_parallel,
                              bool flash_attention, DType dt);

// Model-state bytes per device for `params` parameters on this device (already divided by the
// tensor axes) under ZeRO stage `zero` over `dp` ranks: {params, grads, optimizer}. Mixed
// precision: 2 + 2 + 12 bytes per parameter (ZeRO paper); fp32: 4 + 4 + 8.
std::array<double, 3> model_state_bytes(double params, int dp, int zero, DType dt);

// The convenience entry for the trainer: predicted step time and memory of its plan (its overlaps
// set the options' tp_overlap and dp_overlap).
struct StepEstimate {
  double step_s = 0;
  double peak_bytes = 0;  // memory per device (the fullest stage)
  double tflops_per_device = 0;
  bool fits = false;
  std::string reason;  // non-empty when the point is infeasible (then times are 0)
};
StepEstimate predict_step(const model::ModelConfig& cfg, const PlanPoint& plan,
                          const ClusterSpec& cluster, int seq, ModelOptions o = {});

}  // namespace tessera::perf
