// tessera tune: the planner's fastest configurations of a run, each trained for a few steps on
// the ranks of the current job, one after another in the same processes (run_training), and
// ranked by measurement beside the planner's ranking. The results go to a file in the tune
// directory as each candidate finishes, so an interrupted tuning resumes where it stopped; the
// winner is written as a run-config fragment ([parallel] and [train] keys).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tessera/train/run_config.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

struct TuneOptions {
  std::filesystem::path dir = "runs/tune";  // results, the cluster file, the candidates' runs
  int top = 5;                              // candidates: the planner's fastest
  int steps = 6;                            // per candidate: the first warms up, the rest count
};

// One candidate, predicted and measured.
struct TuneResult {
  int predicted_rank = 0;  // 1-based place in the planner's ranking
  std::string plan;        // parallel::ParallelPlan::describe()
  std::string set_line;    // its keys for `tessera train CONFIG`
  std::string fragment;    // the same as a run-config fragment
  double predicted_step_s = 0, predicted_peak_bytes = 0;
  double step_s = 0;      // median of the measured steps (2..steps)
  double noise_s = 0;     // median absolute deviation of the measured steps
  double peak_bytes = 0;  // the busiest rank's peak resident bytes over the steps
  bool reused = false;    // read back from the results file, not run now
};

// Plans `cfg`'s run for the runtime's ranks (train/auto_plan.hpp: hardware.cluster, the probe's
// file, or a quick probe kept in the tune directory), measures the top candidates not yet in
// the directory's results, and returns all of them fastest (measured) first. Collective; the
// lead rank writes the files and logs progress. Throws tessera::Error for bad input.
std::vector<TuneResult> run_tune(const RunConfig& cfg, const TuneOptions& o, comm::Runtime& rt);

// The measured ranking beside the predicted one, as a table.
std::string format_tune_table(const std::vector<TuneResult>& results);

}  // namespace tessera::train
