// The parallel plan of a training step, and the one answer to "can it run?".
//
// A ParallelPlan is every parallel choice of a step: the grid dp x pp x tx x ty x tz, the ZeRO
// stage, the pipeline schedule with its chunks per stage and layer split, the micro-batch and the
// micro-batches per step, recomputation, sequence parallelism and the overlaps. The trainer builds
// one from its run config (train/run_setup.hpp, plan_run), the performance model predicts one
// (perf/model.hpp, whose PlanPoint it is) and the planner enumerates them (perf/planner.hpp).
//
// plan_problems() is the one feasibility function all three call: the shape rules of the
// implementation (parallel/tensor_*.hpp, pipeline.hpp, data_parallel.hpp), each with a short
// reason (what the planner counts), a message with the numbers and a hint (what the trainer
// prints). It depends on the model's shape and the plan only: no communicator, no cluster.
//
// The tensor axes (parallel/tensor_linear.hpp): a normal linear (qkv, fc) splits its input
// features over tx and its output features over ty, a transposed one (proj, fcproj) the reverse;
// attention heads (and llama's key-value heads) are split over ty and replicated over tx; the
// residual stream is split over tx by channels; the vocabulary over tx*ty; tz splits the
// micro-batch by sequences and shards the weight blocks (unevenly if need be). The 1D mode of the
// trainer is tx alone (ty = tz = 1), the only grid with sequence parallelism: the regions
// replicated over tx (attention core, GELU) split by whole sequences. (Megatron-LM's column- and
// row-parallel split is ty alone in these terms.)
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessera/comm/topology.hpp"
#include "tessera/model/config.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::parallel {

enum class Recompute { None, Selective, Full };
const char* recompute_name(Recompute r);  // "none", "selective", "full"
Recompute parse_recompute(const std::string& s);

struct ParallelPlan {
  comm::GridShape grid;
  int zero = 0;  // ZeRO stage over dp (0-3)
  ScheduleKind schedule = ScheduleKind::OneF1B;
  int virtual_stages = 1;        // chunks per stage (>= 2 with the interleaved schedule only)
  std::vector<int> layer_split;  // layers per model chunk (pp x chunks entries, model order, each
                                 // >= 0); empty: balanced_layer_split
  int micro_batch = 1;           // sequences per micro-batch of one pipeline (split over tz)
  int micro_batches = 1;         // micro-batches per step (gradient accumulation)
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;  // 1D mode (tx alone): the tx-replicated regions by sequences
  // Overlaps (each can be switched off, to measure it):
  bool overlap_dx = true;  // input-gradient all-reduce during the weight-gradient GEMM
  bool defer_dw = true;    // weight-gradient reduce-scatter during the previous layer's backward
  bool prefetch = true;    // next layer's tz weight gather during this layer
  bool overlap_dp = true;  // data-parallel reduction during the backward

  int chunks() const { return schedule == ScheduleKind::Interleaved ? virtual_stages : 1; }
  int tensor_size() const { return grid.tx * grid.ty * grid.tz; }
  long global_batch() const { return static_cast<long>(micro_batch) * micro_batches * grid.dp; }
  ScheduleSpec schedule_spec() const { return {schedule, grid.pp, micro_batches, chunks()}; }
  // "dp=1 pp=2 tx=2 ty=1 tz=1 zero=1 mb=4 sched=1f1b rc=full sp" (and ":v", "split=...")
  std::string describe() const;
  bool operator==(const ParallelPlan&) const = default;
};

// The divisors of n (n >= 1) in increasing order; O(sqrt n), without overflow for any int.
std::vector<int> divisors(int n);

// Why a plan cannot run: `reason` is short and fixed (counted by the planner), `message` names the
// numbers, `hint` says what to change.
struct PlanProblem {
  std::string reason, message, hint;
};

// Every rule the plan breaks on this model, in a fixed order (empty: it can run, shape-wise;
// memory and the job's rank count are not checked here).
std::vector<PlanProblem> plan_problems(const model::ModelConfig& m, const ParallelPlan& p);
// The first of them, or none.
std::optional<PlanProblem> plan_infeasible_reason(const model::ModelConfig& m,
                                                  const ParallelPlan& p);

// The layers of each model chunk (chunk c*pp + s is stage s's local chunk c): the plan's split, or
// the balanced one. The plan must be feasible.
std::vector<int> plan_layer_split(const model::ModelConfig& m, const ParallelPlan& p);
// Layers of pipeline stage `stage` (the sum over its chunks).
int stage_layers(const std::vector<int>& split, int pp, int stage);

// Layers per model chunk (`chunks` = pp*v entries, in model order). Balanced: n_layer / chunks
// each, the remainder one by one to the middle chunks first (the first chunk also runs the
// embedding, the last the LM head), then to the last and the first. Throws tessera::Error when
// there are fewer layers than chunks.
std::vector<int> balanced_layer_split(int n_layer, int chunks);
// parallel.pp_layers: "" (none: balanced) or comma-separated layer counts, one per model chunk,
// each >= 0 ("0,6,6,0" puts the embedding and the head on stages of their own). Throws
// tessera::Error for a malformed list; the counts are checked against the model by plan_problems.
std::vector<int> parse_layer_counts(const std::string& text);
// parse_layer_counts, then the counts checked against n_layer and chunks (balanced if empty).
std::vector<int> parse_layer_split(const std::string& text, int n_layer, int chunks);

}  // namespace tessera::parallel
