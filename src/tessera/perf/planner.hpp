// The planner: enumerate the configurations of a training step (grid dp x pp x tx x ty x tz,
// ZeRO stage, micro-batch, schedule and chunks, recomputation, sequence parallelism), drop the
// ones that cannot run (counted by reason, out-of-memory included), and rank the rest by the
// performance model's step time (perf/model.hpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/perf/model.hpp"

namespace tessera::perf {

struct PlanSearch {
  int devices = 1;
  std::optional<comm::GridShape> grid;  // fix the grid (only the other choices are searched)
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  int max_micro_batch = 16;  // micro-batches 1, 2, 4, ... up to this (and dividing)
  std::vector<parallel::ScheduleKind> schedules = {parallel::ScheduleKind::OneF1B,
                                                   parallel::ScheduleKind::GPipe,
                                                   parallel::ScheduleKind::Interleaved};
  int max_chunks = 4;             // interleaved: v in 2..max_chunks
  bool sequence_parallel = true;  // also try sequence parallelism where ty > 1
  bool tensor_3d = true;          // false: only ty (1D Megatron) and no tz
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
