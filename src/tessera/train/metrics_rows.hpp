// What a training run reports: the JSON rows of metrics.jsonl (memory, prediction, steps,
// validation, pipeline, summary) and the terminal lines beside them. Rows are written by the
// lead rank only; the lines are printed unless the run is quiet.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/comm/topology.hpp"
#include "tessera/data/loader.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/model/config.hpp"
#include "tessera/train/metrics_log.hpp"
#include "tessera/train/peak.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_model.hpp"
#include "tessera/train/run_setup.hpp"
#include "tessera/train/train_step.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

// "42s", "3m07s", "2h05m".
std::string fmt_duration(double s);

// The "memory" row: what this rank holds, measured from the buffers themselves (ZeRO accounting,
// fp32), and its log line.
void report_memory(MetricsLog& metrics, const RunConfig& cfg, const RunModel& model, int world_rank,
                   bool lead, bool quiet);

// The performance model's prediction for this run (docs/performance-model.md), logged next to
// what is measured: per-step time in every row, peak memory in the closing summary.
struct RunPrediction {
  double step_s = 0;      // 0: no prediction
  double peak_bytes = 0;  // per rank
};
RunPrediction report_prediction(MetricsLog& metrics, const RunConfig& cfg,
                                const model::ModelConfig& mcfg, const RunPlan& plan,
                                const PredictionCluster& cluster, bool lead, bool quiet);

// The prediction against the run's first measured steps: the median of steps 2-4 (`step_s` holds
// the run's steps so far; step 1 warms up) and `peak_bytes`, the busiest rank's peak resident
// memory over them. The lead rank writes a "prediction_check" row and one line: a warning (even
// when quiet) when either differs from the prediction by more than k_prediction_tolerance.
inline constexpr double k_prediction_tolerance = 0.25;
inline constexpr std::size_t k_prediction_check_steps = 4;
void check_prediction(MetricsLog& metrics, const RunPrediction& prediction,
                      const std::vector<double>& step_s, double peak_bytes, bool lead, bool quiet);

// The work of one optimizer step. Per rank: MFU is per device (a tensor group shares its
// micro-batch's FLOPs, the pipeline stages its layers).
struct StepCost {
  double flops_per_rank = 0;
  std::int64_t tokens = 0;  // all dp ranks
};
StepCost step_cost(const model::ModelConfig& mcfg, const RunPlan& plan, int dp_size);

// The peaks of every rank: the hardware's (hardware.peak_tflops, the GPU's table, or this
// CPU's cores x clock x FLOPs per cycle) and on the CPU, unless the peak is configured, rank 0's
// measured GEMM rate. Collective.
Peak agree_peak(const RunConfig& cfg, comm::Runtime& rt, bool lead);

// The lines that describe the run before its first step: model, grid, pipeline, batch, data.
void log_run_plan(const RunConfig& cfg, const model::ModelConfig& mcfg, const RunPlan& plan,
                  const RunModel& model, const StepCost& cost, const data::TokenLoader& loader,
                  const Peak& peak, int world_size);
void log_goldfish(const GoldfishConfig& goldfish);

// A step's FLOP rate against the peaks (< 0: unknown).
struct StepEfficiency {
  double mfu = -1;            // of the hardware peak
  double gemm_fraction = -1;  // of the measured GEMM rate
};

// One finished step, as measured around train_step.
struct StepReport {
  std::int64_t step = 0;         // optimizer steps completed
  std::int64_t tokens_seen = 0;  // all dp ranks, up to this step
  double step_s = 0;
  double tokens_per_s = 0;
  StepEfficiency efficiency = {};
};

// The step's MFU and GEMM fraction. A step faster than the measured GEMM rate raises it (the
// start-up measurement ran on a busy machine), said once; the hardware peak is never raised.
StepEfficiency step_efficiency(Peak& peak, double flops_per_step, double step_s, std::int64_t step,
                               bool quiet);

// The step's row of metrics.jsonl.
nlohmann::json step_row(const StepReport& report, const StepResult& result, const RunModel& model,
                        const Peak& peak, const RunPrediction& prediction, bool goldfish);

// Whether the step gets a terminal line (every train.log_every steps, the last, and the first
// one run here).
bool logs_step(const TrainSection& tc, std::int64_t step, std::int64_t start_step);
void log_step(const TrainSection& tc, const StepReport& report, const StepResult& result,
              std::int64_t start_step, double elapsed_s);

void report_validation(MetricsLog& metrics, std::int64_t step, const eval::EvalResult& result);

// The "pipeline" row: what each stage kept in flight and how long it idled, from one rank per
// stage (collective).
void write_pipeline_row(MetricsLog& metrics, const RunConfig& cfg, const RunPlan& plan,
                        RunModel& model, const comm::Topology& topo, comm::Runtime& rt, bool lead);

// The "summary" row: measured against predicted, once per run (lead rank).
void write_summary_row(MetricsLog& metrics, std::vector<double> tok_rates,
                       std::int64_t tokens_per_step, double steps_rss,
                       const RunPrediction& prediction);

}  // namespace tessera::train
