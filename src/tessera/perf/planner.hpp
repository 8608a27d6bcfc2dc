// The planner: enumerate the configurations of a training step (grid dp x pp x tx x ty x tz,
// ZeRO stage, micro-batch, schedule and chunks, recomputation, sequence parallelism), drop the
// ones that cannot run (counted by reason, out-of-memory included; the reasons are the trainer's,
// parallel::plan_problems), and rank the rest by the performance model's step time
// (perf/model.hpp). Pipelines get the trainer's balanced layer split.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/perf/model.hpp"

namespace tessera::perf {

// The largest global batch, in sequences per step: the model counts micro-batches in an int.
constexpr long k_max_global_batch = 2147483647;
// Throws tessera::Error naming `flag` unless 1 <= batch <= k_max_global_batch.
void check_global_batch(long batch, const std::string& flag);
// Throws tessera::Error naming `flag` unless 1 <= n <= k_max_devices.
void check_devices(long n, const std::string& flag);  // k_max_devices: cluster.hpp

struct PlanSearch {
  int devices = 1;
  std::optional<comm::GridShape> grid;  // fix the grid (only the other choices are searched)
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  int max_micro_batch = 16;  // micro-batches 1, 2, 4, ... up to this (and dividing)
  std::vector<parallel::ScheduleKind> schedules = {parallel::ScheduleKind::OneF1B,
                                                   parallel::ScheduleKind::GPipe,
                                                   parallel::ScheduleKind::Interleaved};
  int max_chunks = 4;  // interleaved: v in 2..max_chunks
  // false: only pipelines whose layers divide evenly into pp x chunks (Megatron-LM's rule; the
  // trainer also runs the balanced uneven split)
  bool uneven_splits = true;
  bool sequence_parallel = true;  // also try sequence parallelism where tx > 1 alone
  // false: one tensor axis at most, tx alone (the trainer's 1D mode) or ty alone (Megatron's
  // column/row-parallel split); no tz
  bool tensor_3d = true;
  int top = 10;
};

struct PlanResult {
  std::vector<Prediction> best;  // the fastest `top` that fit, fastest first
  long considered = 0, feasible = 0;
  std::map<std::string, long> rejected;  // reason -> count
};

PlanResult plan(const Workload& w, const ClusterSpec& c, const PlanSearch& s,
                const ModelOptions& o = {});

// All (dp, pp, tx, ty, tz) with product `devices`.
std::vector<comm::GridShape> enumerate_grids(int devices);

}  // namespace tessera::perf
