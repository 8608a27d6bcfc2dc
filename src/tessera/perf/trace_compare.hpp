// Predicted against measured, instruction by instruction: the simulator's events of one step
// (perf/simulator.hpp, SimResult::events) beside a measured trace of the same plan (tessera train
// --trace). Both name an instruction the same way (parallel::describe) on the thread of its stage.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/chrome_trace.hpp"

namespace tessera::perf {

struct TraceComparison {
  int stage = 0;
  std::string name;                               // "F(0,0)", "RA(1,0)<-0", "OPT"
  double predicted_start_s = 0, predicted_s = 0;  // -1: not in the prediction
  double measured_start_s = 0, measured_s = 0;
};

// One row per measured instruction, in the measured order (stage, then start): its measured
// start and duration, and the predicted ones (the sum of the simulator's events of that name on
// that stage: compute and exposed communication). Measured events of another pid than the
// first one's are left out (a trace file holds one rank).
std::vector<TraceComparison> compare_traces(const std::vector<TraceEvent>& predicted,
                                            const std::vector<TraceEvent>& measured);

}  // namespace tessera::perf
