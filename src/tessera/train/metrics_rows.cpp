#include "tessera/train/metrics_rows.hpp"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/pipeline.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/perf/model.hpp"
#include "tessera/train/auto_plan.hpp"

namespace tessera::train {

std::string fmt_duration(double s) {
  // Whole seconds (or minutes) first, so that 179.6 s reads 3m00s, not 2m60s.
  const long sec = std::lround(s);
  if (sec < 60) return fmt::format("{}s", sec);
  if (sec < 3600) return fmt::format("{}m{:02}s", sec / 60, sec % 60);
  const long min = std::lround(s / 60);
  return fmt::format("{}h{:02}m", min / 60, min % 60);
}

void report_memory(MetricsLog& metrics, const RunConfig& cfg, const RunModel& model, int world_rank,
                   bool lead, bool quiet) {
  const auto& pc = cfg.parallel;
  const auto mem = model.dp->memory();
  nlohmann::json row{{"event", "memory"},
                     {"rank", world_rank},
                     {"param_count", model.layout->total()},
                     {"dp", model.dp->dp_size()},
                     {"tensor", {pc.tx, pc.ty, pc.tz}},
                     {"local_param_count", model.local_layout().total()},
                     {"zero", model.dp->stage()},
                     {"params_bytes", mem.params_bytes},
                     {"grads_bytes", mem.grads_bytes},
                     {"optimizer_bytes", mem.optimizer_bytes},
                     {"transient_bytes", mem.transient_bytes}};
  if (lead) metrics.write(row);
  if (!quiet)
    log_info("memory per rank: parameters {:.1f} MB, gradients {:.1f} MB, AdamW state {:.1f} MB",
             mem.params_bytes / 1e6, mem.grads_bytes / 1e6, mem.optimizer_bytes / 1e6);
}

namespace {

perf::StepEstimate predict(const model::ModelConfig& mcfg, const RunPlan& plan,
                           const perf::ClusterSpec& spec, const RunConfig& cfg) {
  return perf::predict_step(mcfg, plan.par, spec, plan.T, trainer_model_options(cfg));
}

}  // namespace

RunPrediction report_prediction(MetricsLog& metrics, const RunConfig& cfg,
                                const model::ModelConfig& mcfg, const RunPlan& plan,
                                const PredictionCluster& cluster, bool lead, bool quiet) {
  RunPrediction prediction;
  if (!cluster.spec) return prediction;
  try {
    const auto est = predict(mcfg, plan, *cluster.spec, cfg);
    prediction.step_s = est.step_s;
    prediction.peak_bytes = est.peak_bytes;
    if (lead)
      metrics.write({{"event", "prediction"},
                     {"cluster", cluster.path.string()},
                     {"step_ms", est.step_s * 1e3},
                     {"peak_bytes", est.peak_bytes},
                     {"fits", est.fits},
                     {"reason", est.reason}});
    if (!quiet)
      log_info("performance model ({}): {:.1f} ms per step, {:.1f} MB per rank{}",
               cluster.path.string(), est.step_s * 1e3, est.peak_bytes / 1e6,
               est.fits ? std::string() : " (" + est.reason + ")");
  } catch (const Error& e) {
    if (!quiet) log_info("(no performance-model prediction: {})", e.what());
  }
  return prediction;
}

StepCost step_cost(const model::ModelConfig& mcfg, const RunPlan& plan, int dp_size) {
  const int B = plan.B(), T = plan.T, accum = plan.accum();
  StepCost cost;
  cost.flops_per_rank = 3.0 * model::forward_flops_per_token(mcfg, T) * static_cast<double>(B) * T *
                        accum / (plan.tensor_size() * plan.grid().pp);
  cost.tokens = static_cast<std::int64_t>(B) * T * accum * dp_size;
  return cost;
}

Peak agree_peak(const RunConfig& cfg, comm::Runtime& rt, bool lead) {
  const bool bf16 = cfg.train.precision == "bf16";
  if (cfg.hardware.device == "cuda") {  // each rank reads its own GPU's peak
    Peak peak;
    const double bf16_tflops = kernels::cuda::dense_bf16_peak_tflops();
    if (cfg.hardware.peak_tflops > 0) {
      peak.flops = cfg.hardware.peak_tflops * 1e12;
      peak.source = "configured hardware.peak_tflops";
    } else if (bf16 && bf16_tflops > 0) {
      peak.flops = bf16_tflops * 1e12;
      peak.source = "dense bf16 tensor-core peak of the " + kernels::cuda::device_name();
    } else {
      peak.source = "unknown (set hardware.peak_tflops)";
    }
    return peak;
  }
  // The hardware peak is the same on every rank (same threads); the GEMM rate is measured on
  // rank 0 only (measuring on all ranks at once would compete), unless the peak is configured.
  Peak peak = cpu_hardware_peak(cfg.hardware.peak_tflops, omp_get_max_threads(), bf16);
  if (cfg.hardware.peak_tflops > 0) return peak;
  double gemm = 0;
  if (lead)
    gemm = bf16 ? kernels::measure_gemm_bf16_gflops(false, 1024, 1024, 1024, 1, 0.3) * 1e9
                : kernels::measure_gemm_gflops(kernels::GemmLibrary::OneDnn, false, 1024, 1024,
                                               1024, 1, 0.3) *
                      1e9;
  rt.world().broadcast_bytes(&gemm, sizeof gemm, 0);
  peak.gemm_flops = gemm;
  peak.gemm_source = fmt::format("{} GEMM 1024^3 measured on {} at start-up",
                                 bf16 ? "bf16" : "fp32", lead ? "this machine" : "rank 0");
  return peak;
}

void log_run_plan(const RunConfig& cfg, const model::ModelConfig& mcfg, const RunPlan& plan,
                  const RunModel& model, const StepCost& cost, const data::TokenLoader& loader,
                  const Peak& peak, int world_size) {
  const auto& pc = cfg.parallel;
  const auto& tc = cfg.train;
  log_info("model: {}", model::describe(mcfg));
  if (model.device)
    log_info(
        "device: {}, {} ({:.2f} GB of device memory for the model, its state and the "
        "activations of a micro-batch)",
        kernels::cuda::device_name(), model::precision_name(model.device->precision()),
        model.device->device_bytes() / 1e9);
  log_info("grid: {} ({} ranks), ZeRO stage {}, gradient overlap {}{}", plan.grid().describe(),
           world_size, model.dp->stage(), pc.overlap ? "on" : "off",
           model.sliced() ? fmt::format(", tensor-parallel slice {:.2f}M parameters per rank{}{}",
                                        model.local_layout().total() / 1e6,
                                        pc.recompute ? ", recomputation" : "",
                                        pc.sequence_parallel ? ", sequence parallelism" : "")
                          : std::string());
  if (model.pipelined())
    log_info(
        "pipeline: {} schedule, {} stages x {} chunk{}, layers per chunk [{}], {} micro-batches "
        "per step, ideal bubble {:.3f}",
        pc.schedule, pc.pp, pc.virtual_stages, pc.virtual_stages > 1 ? "s" : "",
        fmt::join(plan.par.layer_split, ", "), plan.accum(),
        parallel::ideal_bubble_fraction(plan.sched()));
  log_info(
      "train: {} steps x {} micro-batches of {}x{} x dp {} = {} tokens/step, {:.1f} "
      "GFLOP/step/rank, {} threads",
      tc.steps, plan.accum(), plan.B(), plan.T, model.dp->dp_size(), cost.tokens,
      cost.flops_per_rank / 1e9, omp_get_max_threads());
  log_info("data: {} ({} tokens)", cfg.data.train, loader.num_tokens());
  log_info("MFU against the hardware peak {}", peak.describe());
  if (peak.gemm_flops > 0)
    log_info("GEMM rate (the step's fraction of it): {}", peak.describe_gemm());
}

void log_goldfish(const GoldfishConfig& goldfish) {
  log_info("goldfish: k = {}, strategy {}{}", goldfish.k, goldfish.strategy,
           goldfish.strategy == "hash"     ? fmt::format(", h = {}", goldfish.h)
           : goldfish.strategy == "random" ? fmt::format(", seed {}", goldfish.seed)
                                           : std::string());
}

StepEfficiency step_efficiency(Peak& peak, double flops_per_step, double step_s, std::int64_t step,
                               bool quiet) {
  const double rate = flops_per_step / step_s;
  if (peak.gemm_flops > 0 && rate > peak.gemm_flops) {
    // The start-up measurement ran on a busy machine: the GEMM rate is at least this step's.
    // Say so once instead of printing a fraction > 100%.
    if (peak.gemm_source.find("raised") == std::string::npos) {
      peak.gemm_source += ", raised to the best step rate seen";
      if (!quiet)
        log_info(
            "note: step {} ran at {:.1f} GFLOP/s, above the measured GEMM rate; using it as the "
            "GEMM rate",
            step, rate / 1e9);
    }
    peak.gemm_flops = rate;
  }
  return {peak.flops > 0 ? rate / peak.flops : -1,
          peak.gemm_flops > 0 ? rate / peak.gemm_flops : -1};
}

nlohmann::json step_row(const StepReport& report, const StepResult& result, const RunModel& model,
                        const Peak& peak, const RunPrediction& prediction, bool goldfish) {
  const double sec = report.step_s;
  auto known = [](double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json row{{"event", "step"},
                     {"step", report.step},
                     {"loss", result.loss},
                     {"lr", result.lr},
                     {"grad_norm", result.grad_norm},
                     {"step_ms", sec * 1e3},
                     {"tokens_per_s", report.tokens_per_s},
                     {"tokens", report.tokens_seen}};
  if (prediction.step_s > 0) row["predicted_step_ms"] = prediction.step_s * 1e3;
  row["mfu"] = known(report.efficiency.mfu);  // against the hardware peak
  row["mfu_peak"] = peak.describe();
  row["gemm_fraction"] = known(report.efficiency.gemm_fraction);  // of the measured GEMM rate
  if (goldfish)
    row["goldfish_kept"] =
        static_cast<std::int64_t>(result.kept_targets);  // targets in the loss, all dp ranks
  if (!model.pipelined()) {
    row["forward_ms"] = result.forward_s * 1e3;
    row["backward_ms"] = result.backward_s * 1e3;
  }
  row["update_ms"] = result.update_s * 1e3;  // gradient norm, clipping and the optimizer
  if (model.pipelined()) {
    row["bubble"] = model.executor->stats().bubble_fraction();  // this (the lead's) stage
    row["p2p_wait_ms"] = model.executor->stats().recv_wait_s * 1e3;
  }
  if (model.dp->dp_size() > 1) {
    row["grad_overlap"] = model.dp->overlap_fraction();  // fraction reduced before backward ended
    row["comm_wait_ms"] = result.comm_wait_s * 1e3;      // exposed gradient-reduction time
  }
  return row;
}

namespace {

std::string percent(double fraction) {
  return fraction >= 0 ? fmt::format("{:5.1f}%", 100 * fraction) : std::string("unknown");
}

}  // namespace

bool logs_step(const TrainSection& tc, std::int64_t step, std::int64_t start_step) {
  return step % std::max(1, tc.log_every) == 0 || step == tc.steps || step == start_step + 1;
}

void log_step(const TrainSection& tc, const StepReport& report, const StepResult& result,
              std::int64_t start_step, double elapsed_s) {
  const std::int64_t step = report.step;
  double eta =
      elapsed_s / static_cast<double>(step - start_step) * static_cast<double>(tc.steps - step);
  log_info(
      "step {:>6}/{} | loss {:.4f} | lr {:.2e} | norm {:6.3f} | {:7.1f} ms | {:7.0f} tok/s | "
      "MFU {}{} | ETA {}",
      step, tc.steps, result.loss, result.lr, result.grad_norm, report.step_s * 1e3,
      report.tokens_per_s, percent(report.efficiency.mfu),
      report.efficiency.gemm_fraction >= 0
          ? fmt::format(" ({} of GEMM rate)", percent(report.efficiency.gemm_fraction))
          : std::string(),
      fmt_duration(eta));
}

void report_validation(MetricsLog& metrics, std::int64_t step, const eval::EvalResult& result) {
  metrics.write(
      {{"event", "val"}, {"step", step}, {"val_loss", result.loss}, {"val_tokens", result.tokens}});
  log_info("step {:>6} | val loss {:.4f} (ppl {:.1f}, {} tokens)", step, result.loss,
           result.perplexity, result.tokens);
}

void write_pipeline_row(MetricsLog& metrics, const RunConfig& cfg, const RunPlan& plan,
                        RunModel& model, const comm::Topology& topo, comm::Runtime& rt, bool lead) {
  const auto& pc = cfg.parallel;
  const int stage = topo.coord(comm::Axis::PP);
  std::vector<double> info(4 * static_cast<std::size_t>(pc.pp), 0.0);
  const int tensor_rank = rt.group(topo, {comm::Axis::TX, comm::Axis::TY, comm::Axis::TZ}).rank();
  if (model.dp->dp_rank() == 0 && tensor_rank == 0) {
    const auto& st = model.tensor->activation_stats();
    info[4 * stage + 0] = st.peak_live;
    info[4 * stage + 1] = static_cast<double>(st.peak_bytes);
    info[4 * stage + 2] = static_cast<double>(st.slot_bytes_max);
    info[4 * stage + 3] = model.executor->stats().bubble_fraction();
  }
  rt.world().all_reduce_sum(info.data(), info.size());
  if (!lead) return;
  nlohmann::json stages = nlohmann::json::array();
  for (int s2 = 0; s2 < pc.pp; ++s2)
    stages.push_back({{"stage", s2},
                      {"peak_in_flight", info[4 * s2 + 0]},
                      {"in_flight_formula", parallel::in_flight_formula(plan.sched(), s2)},
                      {"peak_activation_bytes", info[4 * s2 + 1]},
                      {"slot_bytes", info[4 * s2 + 2]},
                      {"bubble_last_step", info[4 * s2 + 3]}});
  metrics.write({{"event", "pipeline"},
                 {"schedule", pc.schedule},
                 {"pp", pc.pp},
                 {"v", pc.virtual_stages},
                 {"m", plan.accum()},
                 {"layers", plan.par.layer_split},
                 {"ideal_bubble", parallel::ideal_bubble_fraction(plan.sched())},
                 {"stages", stages}});
}

void write_summary_row(MetricsLog& metrics, std::vector<double> tok_rates,
                       std::int64_t tokens_per_step, double steps_rss,
                       const RunPrediction& prediction) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::sort(tok_rates.begin(), tok_rates.end());
  const double median_step_s =
      static_cast<double>(tokens_per_step) / tok_rates[tok_rates.size() / 2];
  nlohmann::json row{{"event", "summary"},
                     {"median_step_ms", median_step_s * 1e3},
                     {"peak_rss_bytes", static_cast<double>(ru.ru_maxrss) * 1024.0},
                     {"peak_rss_steps_bytes", steps_rss}};
  if (prediction.step_s > 0) {
    row["predicted_step_ms"] = prediction.step_s * 1e3;
    row["predicted_peak_bytes"] = prediction.peak_bytes;
  }
  metrics.write(row);
}

void check_prediction(MetricsLog& metrics, const RunPrediction& prediction,
                      const std::vector<double>& step_s, double peak_bytes, bool lead, bool quiet) {
  if (prediction.step_s <= 0 || step_s.size() < 2 || !lead) return;
  // steps 2-4: the first one warms up (allocations, first touches, the GEMM tuner)
  std::vector<double> measured(step_s.begin() + 1,
                               step_s.begin() + static_cast<long>(std::min<std::size_t>(
                                                    step_s.size(), k_prediction_check_steps)));
  std::sort(measured.begin(), measured.end());
  const double median = measured[measured.size() / 2];
  const double time_off = median / prediction.step_s - 1;
  const double memory_off = peak_bytes / prediction.peak_bytes - 1;
  const bool warn = std::fabs(time_off) > k_prediction_tolerance ||
                    std::fabs(memory_off) > k_prediction_tolerance;
  metrics.write({{"event", "prediction_check"},
                 {"steps", measured.size()},
                 {"median_step_ms", median * 1e3},
                 {"predicted_step_ms", prediction.step_s * 1e3},
                 {"peak_rss_bytes", peak_bytes},
                 {"predicted_peak_bytes", prediction.peak_bytes},
                 {"within_tolerance", !warn}});
  const std::string figures = fmt::format(
      "steps 2-{} took {:.1f} ms (median; predicted {:.1f} ms, {:+.0f}%), peak memory {:.1f} MB "
      "per rank (predicted {:.1f} MB, {:+.0f}%)",
      measured.size() + 1, median * 1e3, prediction.step_s * 1e3, 100 * time_off, peak_bytes / 1e6,
      prediction.peak_bytes / 1e6, 100 * memory_off);
  if (warn)
    log_info(
        "warning: the performance model is off by more than {:.0f}%: {}; its plans may not "
        "be this machine's best (re-run tessera probe under the same launcher, or tessera "
        "tune to measure them)",
        100 * k_prediction_tolerance, figures);
  else if (!quiet)
    log_info("prediction check: {}", figures);
}

}  // namespace tessera::train
