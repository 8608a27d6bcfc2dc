// Discrete-event replay of one training step: every rank of the grid runs its pipeline stage's
// instruction list (parallel/schedule.hpp, the lists the executor runs) with the costs of the
// performance model (perf/model.hpp: Prediction::chunk_cost, p2p_s, dp_s, optimizer_s).
//
// Per rank, in list order: Forward/Backward take their compute time and then their exposed
// tensor-parallel communication; a send is posted (non-blocking) and its message arrives p2p_s
// later; a receive waits for its message (idle); OptimizerStep waits for the rank's data-parallel
// group, runs the exposed gradient reduction and the update. Ranks are replayed in rounds until
// all lists finish (a round without progress is a deadlock, reported).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tessera/core/chrome_trace.hpp"
#include "tessera/perf/model.hpp"

namespace tessera::perf {

struct RankTime {
  double busy = 0, comm = 0, idle = 0;  // seconds within the step
};

struct SimResult {
  double step_s = 0;
  std::vector<RankTime> ranks;  // (world size), rank order of comm::Topology's default order
  long instructions = 0;        // replayed, all ranks
  bool deadlock = false;
  // Per pipeline stage (every rank of a stage has the same costs): the first rank's times.
  std::vector<RankTime> stages;
  // The first pipeline's instructions on the step's clock (TraceOptions::keep_events).
  std::vector<TraceEvent> events;
};

struct TraceOptions {
  std::filesystem::path path;  // empty: no trace
  int max_ranks = 64;          // ranks written (the first pipeline's stages first)
  bool keep_events = false;    // return the events in SimResult::events
};

SimResult simulate(const Prediction& p, const TraceOptions& trace = {});

// What a replay may cost: the instruction lists held (stages x micro-batches x chunks, some
// hundred MB at most) and the instructions replayed (ranks x micro-batches x chunks, seconds).
constexpr long k_max_schedule_slots = 1'000'000;
constexpr double k_max_replay_slots = 5e7;
// Throws tessera::Error when simulating `p` would cost more, before any work.
void check_replay_size(const Prediction& p);

}  // namespace tessera::perf
