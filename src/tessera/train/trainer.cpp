#include "tessera/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/chrome_trace.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/stop_signals.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/pretrained.hpp"
#include "tessera/train/auto_plan.hpp"
#include "tessera/train/metrics_log.hpp"
#include "tessera/train/metrics_rows.hpp"
#include "tessera/train/run_dir.hpp"
#include "tessera/train/run_model.hpp"
#include "tessera/train/run_sample.hpp"
#include "tessera/train/run_setup.hpp"
#include "tessera/train/spike.hpp"
#include "tessera/train/train_state.hpp"
#include "tessera/train/train_step.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

model::ModelConfig model_config(const RunConfig& cfg) {
  if (!cfg.train.init_from.empty())  // the pretrained model's shape; [model] is not used
    return io::read_model_config(io::resolve_model_path(cfg.train.init_from));
  model::ModelConfig m = model_config(cfg.model);
  model::validate(m);
  return m;
}

namespace {

// The long-lived objects of a run, built by run_training's setup and used by its loop.
struct TrainingRun {
  const RunConfig& cfg;
  const TrainOptions& opt;  // quiet on every rank but the lead
  comm::Runtime& rt;
  const RunPlan& plan;
  RunModel& model;
  TrainData& data;
  TrainProgress& progress;
  MetricsLog& metrics;  // open on the lead rank only
  TrainSummary& summary;
  fs::path ckpt_dir;
  bool lead = false;  // logs, metrics, checkpoints, samples
  std::int64_t start_step = 0;
  std::vector<double> tok_rates;  // tokens/s of each step run here
  Timer timer;                    // since the validation before the first step
  const Timer& since_start;       // since run_training began (for --time-limit)
  StopSignals signals{};          // SIGTERM / SIGUSR1: stop after the step in progress
  double longest_step_s = 0, last_save_s = 0;
  std::size_t layout_total = 0;  // parameters of the whole model
  // Loss-spike rollback (train.spike_factor > 0): the guard, the steps whose data windows are
  // skipped when the run reaches them again, and the rollbacks so far.
  std::optional<SpikeGuard> spike{};
  std::map<std::int64_t, int> skip_windows{};  // step -> data windows skipped before it
  int rollbacks = 0;
  bool prediction_checked = false;  // the prediction against the first measured steps
};

// What the step rows report against, fixed over the run (a fast step raises a measured peak).
struct StepReference {
  StepCost cost;
  RunPrediction prediction;
  Peak peak;
};

// The evaluation forward of the training model itself, on the rank's own slices: the GPU model,
// or the CPU model (each tensor group scores a window together; with a pipeline, the stages in
// model order).
eval::ScoreFn training_model_scorer(RunModel& model) {
  if (model.device)
    return [&dev = *model.device](const std::int32_t* x, const std::int32_t* y, int B, int T) {
      return dev.forward(x, y, B, T, false, 0.0f);
    };
  return [&model](const std::int32_t* x, const std::int32_t* y, int B, int T) {
    model::ForwardOptions opt;
    opt.gemm = kernels::GemmLibrary::OneDnn;
    if (model.pipelined()) return model.executor->evaluate(*model.dp, x, y, B, T, opt);
    return model.tensor->forward(*model.dp, x, y, B, T, opt);
  };
}

void validate_at(TrainingRun& run, std::int64_t at) {
  // Every rank scores the same batches (every dp rank holds the model), so the figure is the
  // single-process one whatever the grid.
  const eval::EvalResult r =
      eval::evaluate_shard(run.model.layout->config().vocab_size, run.cfg.data.val, run.plan.B(),
                           run.plan.T, run.cfg.train.val_batches, training_model_scorer(run.model));
  run.summary.val.emplace_back(at, static_cast<float>(r.loss));
  if (run.lead) report_validation(run.metrics, at, r);
}

void checkpoint(TrainingRun& run) {
  Timer save;
  to_host(run.model);  // the GPU's parameters and moments into the host copy that is saved
  const fs::path written =
      save_checkpoint(run.cfg, run.model, run.rt, run.ckpt_dir, run.progress, *run.data.train);
  if (run.lead) run.summary.last_checkpoint = written;
  run.last_save_s = save.seconds();
}

void sample_at(TrainingRun& run, std::int64_t step) {
  if (run.model.device && run.cfg.sample.tokens > 0) to_host(run.model);
  log_sample(run.cfg, run.model, run.rt.world(), run.progress.rng, step, run.lead);
}

// The row and the line of the step just finished, which took `step_s`.
void report_step(TrainingRun& run, StepReference& ref, const StepResult& result, double step_s) {
  const auto& tc = run.cfg.train;
  StepReport report{run.progress.step, run.progress.tokens_seen, step_s,
                    static_cast<double>(ref.cost.tokens) / step_s};
  run.tok_rates.push_back(report.tokens_per_s);
  run.summary.step_s.push_back(step_s);
  run.summary.losses.push_back(static_cast<float>(result.loss));
  report.efficiency =
      step_efficiency(ref.peak, ref.cost.flops_per_rank, step_s, report.step, run.opt.quiet);
  const auto row =
      step_row(report, result, run.model, ref.peak, ref.prediction, run.cfg.goldfish.k > 0);
  if (run.lead) run.metrics.write(row);
  if (run.lead && run.opt.on_step) run.opt.on_step(report.step, tc.steps, result.loss);
  if (!run.opt.quiet && logs_step(tc, report.step, run.start_step))
    log_step(tc, report, result, run.start_step, run.timer.seconds());
}

// Validation, checkpoints and samples on their schedules, after a step.
void run_scheduled(TrainingRun& run, std::int64_t end_step) {
  const auto& tc = run.cfg.train;
  const std::int64_t step = run.progress.step;
  if (tc.val_every > 0 && (step % tc.val_every == 0 || step == tc.steps)) validate_at(run, step);
  if (tc.ckpt_every > 0 && step % tc.ckpt_every == 0 && step != end_step) checkpoint(run);
  if (run.cfg.sample.every > 0 && step % run.cfg.sample.every == 0 && step != end_step)
    sample_at(run, step);
}

// Loss-spike rollback after step `step` (not counted, not reported): every rank reloads the
// newest checkpoint (resume is bit-exact, so the steps up to `step` replay as they ran) and will
// skip the data window of `step` when it comes to it. The metrics rows after the checkpoint go;
// a "rollback" row says what happened. Throws after train.spike_retries rollbacks, or without a
// checkpoint to go back to.
void roll_back(TrainingRun& run, const std::string& why, std::int64_t step) {
  const auto& tc = run.cfg.train;
  const auto latest = io::latest_checkpoint(run.ckpt_dir);
  if (!latest)
    throw Error(
        fmt::format("loss spike at step {}: {}; there is no checkpoint to roll back to", step, why),
        "set train.ckpt_every so that a rollback has a recent checkpoint");
  if (++run.rollbacks > tc.spike_retries)
    throw Error(fmt::format("loss spike at step {}: {}; giving up after {} rollbacks", step, why,
                            tc.spike_retries),
                "lower train.lr or raise train.warmup_steps; check the data around this step");
  const std::int64_t seqs = std::int64_t{run.plan.B()} * run.plan.accum() * run.model.dp->dp_size();
  run.progress = resume_or_initialize(run.cfg, {true, true}, run.model, *run.data.train,
                                      run.ckpt_dir, run.lead, seqs);
  to_device(run.model);
  ++run.skip_windows[step];  // again at the same step: the window after it caused this one
  run.spike->rewind(run.progress.step);
  const auto kept =
      static_cast<std::size_t>(std::max<std::int64_t>(run.progress.step - run.start_step, 0));
  run.summary.losses.resize(std::min(run.summary.losses.size(), kept));
  run.tok_rates.resize(std::min(run.tok_rates.size(), kept));
  run.summary.step_s.resize(std::min(run.summary.step_s.size(), kept));
  std::erase_if(run.summary.val, [&](const auto& v) { return v.first > run.progress.step; });
  if (!run.lead) return;
  log_info(
      "loss spike at step {}: {}; rolled back to step {}, skipping the data window of step "
      "{} (rollback {} of at most {})",
      step, why, run.progress.step, step, run.rollbacks, tc.spike_retries);
  run.metrics = MetricsLog::resume(fs::path(tc.out_dir) / "metrics.jsonl", run.progress.step);
  run.metrics.write({{"event", "rollback"},
                     {"at_step", step},
                     {"to_step", run.progress.step},
                     {"reason", why},
                     {"rollback", run.rollbacks}});
}

// Why the run stops before its next step: a stop signal on any rank, or too little time left
// before --time-limit for one more step and the checkpoint after it (the longest step so far,
// and the last save, or the state's bytes at 100 MB/s before any). Collective: every rank
// decides the same. Empty: go on.
std::string stop_reason(TrainingRun& run) {
  double why = run.signals.requested();
  const double limit = run.opt.time_limit_s;
  if (limit > 0 && why == 0) {
    const double save_s = run.last_save_s > 0
                              ? run.last_save_s
                              : 3.0 * 4.0 * static_cast<double>(run.layout_total) / 100e6;
    if (run.since_start.seconds() + run.longest_step_s + save_s > limit) why = -1;
  }
  run.rt.world().all_reduce_max(&why, 1);
  if (why == 0) return "";
  return why < 0 ? "--time-limit" : StopSignals::name(static_cast<int>(why));
}

// --trace: this rank's file (PATH, or PATH with ".rank<k>" before the extension under several
// ranks) holding the executor's events of the step just run.
void write_step_trace(TrainingRun& run) {
  fs::path path = run.opt.trace;
  const int rank = run.rt.world_rank();
  if (run.rt.world_size() > 1)
    path.replace_filename(
        fmt::format("{}.rank{}{}", path.stem().string(), rank, path.extension().string()));
  std::vector<TraceEvent> events = run.model.executor->trace();
  for (auto& e : events) e.pid = rank;
  write_chrome_trace(path, events,
                     fmt::format("tessera train, step {}, rank {}", run.progress.step + 1, rank));
  if (run.lead) log_info("trace of step {}: {}", run.progress.step + 1, path.string());
}

// The prediction against the run's first measured steps, after its 4th step (or its last when it
// runs 2 or 3). Collective: the busiest rank's peak memory.
void check_prediction_once(TrainingRun& run, const StepReference& ref, std::int64_t end_step) {
  const std::size_t n = run.summary.step_s.size();
  const bool due = n == k_prediction_check_steps || (run.progress.step == end_step && n >= 2);
  if (!run.opt.check_prediction || run.prediction_checked || !due || ref.prediction.step_s <= 0)
    return;
  run.prediction_checked = true;
  double peak = static_cast<double>(peak_resident_bytes());
  run.rt.world().all_reduce_max(&peak, 1);
  check_prediction(run.metrics, ref.prediction, run.summary.step_s, peak, run.lead, run.opt.quiet);
}

void train_steps(TrainingRun& run, StepReference& ref, std::int64_t end_step) {
  StepWorkspace work = make_step_workspace(run.cfg, run.plan);
  while (run.progress.step < end_step) {
    if (auto it = run.skip_windows.find(run.progress.step + 1); it != run.skip_windows.end())
      for (int k = 0; k < it->second; ++k) skip_step_data(run.plan, *run.data.train, work);
    const bool traced = !run.opt.trace.empty() && run.model.executor &&
                        run.progress.step + 1 == std::min(run.start_step + 2, end_step);
    if (traced) run.model.executor->set_tracing(true);
    Timer t;
    const StepResult result =
        train_step(run.cfg, run.plan, run.model, *run.data.train, work, run.progress.step, run.rt);
    if (traced) run.model.executor->set_tracing(false), write_step_trace(run);
    if (run.spike)
      if (std::string why = run.spike->check(run.progress.step + 1, result.loss); !why.empty()) {
        roll_back(run, why, run.progress.step + 1);
        continue;
      }
    ++run.progress.step;
    run.progress.tokens_seen += ref.cost.tokens;
    run.longest_step_s = std::max(run.longest_step_s, t.seconds());
    report_step(run, ref, result, t.seconds());
    // The steps' peak resident memory starts after the first step (its one-time allocations
    // and first touches); validation and checkpoints inside the loop count.
    if (run.progress.step == run.start_step + 1) reset_peak_resident();
    check_prediction_once(run, ref, end_step);
    run_scheduled(run, end_step);
    if (run.progress.step == end_step) break;
    if (std::string why = stop_reason(run); !why.empty()) {
      run.summary.stopped_by = why;
      break;
    }
  }
}

// After the last step: the pipeline and summary rows, the final checkpoint and sample.
void finish_run(TrainingRun& run, const StepReference& ref, const comm::Topology& topo) {
  const std::int64_t step = run.progress.step;
  const bool ran = step > run.start_step;
  // Peak resident bytes of the busiest rank over the steps (before the final checkpoint).
  double steps_rss = static_cast<double>(peak_resident_bytes());
  run.rt.world().all_reduce_max(&steps_rss, 1);
  if (run.model.pipelined() && ran)
    write_pipeline_row(run.metrics, run.cfg, run.plan, run.model, topo, run.rt, run.lead);
  if (ran || !run.progress.resumed) checkpoint(run);
  run.summary.last_step = step;
  run.summary.peak_rss_steps_bytes = steps_rss;
  run.summary.predicted_step_s = ref.prediction.step_s;
  run.summary.predicted_peak_bytes = ref.prediction.peak_bytes;
  if (run.model.tensor && run.lead) run.model.tensor->save_gemm_choices();
  if (run.lead && ran)
    write_summary_row(run.metrics, run.tok_rates, ref.cost.tokens, steps_rss, ref.prediction);
  auto& rates = run.tok_rates;
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
    run.summary.tokens_per_s = rates[rates.size() / 2];
  }
  if (ran && !run.opt.quiet)
    log_info("trained steps {}..{} in {} (median {:.0f} tok/s); checkpoint {}", run.start_step + 1,
             step, fmt_duration(run.timer.seconds()), run.summary.tokens_per_s,
             run.summary.last_checkpoint.string());
  if (!run.summary.stopped_by.empty()) {  // said even when quiet: the job did not finish
    if (run.lead)
      log_info("stopped by {} after step {} of {}{}", run.summary.stopped_by, step,
               run.cfg.train.steps,
               run.opt.resumable ? ", checkpoint saved: run again with --resume" : "");
    return;  // no sample: a stopped job has little time left
  }
  sample_at(run, step);
}

// Everything that can be wrong with the input has been checked by now: print and save the
// resolved config, then start.
void announce_start(const RunConfig& cfg, const TrainOptions& opt, const fs::path& out, bool lead,
                    bool* started, std::int64_t step) {
  if (!opt.quiet) log_info("resolved config ({}):\n{}", cfg.source, to_toml(cfg));
  if (lead) {
    if (opt.overwrite) clear_run(out);
    write_file_atomic(out / "config.toml", to_toml(cfg));
  }
  if (started) *started = true;
  if (step >= cfg.train.steps)
    log_info("nothing to do: the run is already at step {} of {}", step, cfg.train.steps);
}

// How the steps will compute, where it is worth a line: bf16 emulated on a CPU without it, and
// on the GPU, the attention's kernels and how the gradients are summed.
void log_compute_notes(const RunModel& model, const std::string& precision, bool quiet, int ndp) {
  if (model.tensor && precision == "bf16" && !kernels::cpu_has_native_bf16())
    log_info(
        "note: this CPU has no native bf16 (AVX-512 BF16 or AMX): bf16 GEMMs are emulated "
        "(the same arithmetic: exact products, fp32 sums), slower than fp32");
  if (!model.device || quiet) return;
  const std::string why = model.device->attention_fallback_reason();
  log_info("GPU attention: {}{}", model.device->attention_backend(),
           why.empty() ? "" : " (cuDNN not used: " + why + ")");
  if (model.device_reduce)
    log_info("GPU gradients summed over {} data-parallel ranks: {}", ndp,
             model.device_reduce->describe());
}

}  // namespace

TrainSummary run_training(const RunConfig& cfg_in, const TrainOptions& opt_in, comm::Runtime& rt,
                          bool* started) {
  const Timer since_start;
  if (cfg_in.train.threads > 0) omp_set_num_threads(cfg_in.train.threads);
  const model::ModelConfig mcfg = model_config(cfg_in);
  // parallel.auto: the planner's fastest configuration for these ranks, and its cluster
  std::optional<AutoPlan> chosen;
  if (cfg_in.parallel.automatic) chosen = resolve_auto_plan(cfg_in, mcfg, rt);
  const RunConfig& cfg = chosen ? chosen->cfg : cfg_in;
  const auto& tc = cfg.train;
  const auto& pc = cfg.parallel;
  if (tc.seq_len > mcfg.block_size)  // [model] was checked in validation; init_from's is here
    throw Error(fmt::format("train.seq_len = {} is longer than the context of train.init_from's "
                            "model ({})",
                            tc.seq_len, mcfg.block_size),
                "lower train.seq_len");
  check_out_dir(tc.out_dir);  // a file there is bad input, found before any output
  const model::ParamLayout layout(mcfg);

  // The grid and the options, validated before anything else happens.
  const RunPlan plan = plan_run(cfg, mcfg, rt.world_size());
  const PredictionCluster cluster = chosen ? chosen->cluster : find_prediction_cluster(cfg);
  comm::Topology topo(plan.grid(), rt.world_rank());
  check_device_options(cfg, plan);
  // The run directory: checked and locked before any output; the old run's files (with
  // --overwrite) are deleted only once everything else has been checked.
  const fs::path out = tc.out_dir;
  const RunDirLock out_lock = claim_out_dir(out, opt_in, rt);
  check_training_fits(layout, plan.tensor_size() * pc.pp, pc.zero, pc.dp);
  RunModel model = build_run_model(cfg, mcfg, layout, plan, topo, rt);
  const bool lead = rt.world_rank() == 0;
  TrainOptions opt = opt_in;
  if (!lead) opt.quiet = true;
  const int ndp = model.dp->dp_size();
  // Data first: a missing shard should fail before any allocation or output.
  TrainData data = open_train_data(cfg, plan, *model.dp, mcfg.vocab_size);
  check_sample_tokenizer(cfg, mcfg.vocab_size);

  // Resume or initialize, then start.
  const fs::path ckpt_dir = out / "checkpoints";
  TrainProgress progress =
      resume_or_initialize(cfg, {opt.resume, opt.override_schedule}, model, *data.train, ckpt_dir,
                           lead, plan.B() * plan.accum() * ndp);
  to_device(model);  // hardware.device = "cuda": the initialized or resumed state to the GPU
  if (lead) log_compute_notes(model, tc.precision, opt.quiet, ndp);
  announce_start(cfg, opt, out, lead, started, progress.step);
  // Metrics: resuming continues the file from the checkpoint's step, else it starts afresh.
  MetricsLog metrics;
  if (lead)
    metrics = progress.resumed ? MetricsLog::resume(out / "metrics.jsonl", progress.step)
                               : MetricsLog::start(out / "metrics.jsonl");
  report_memory(metrics, cfg, model, rt.world_rank(), lead, opt.quiet);
  StepReference ref;
  ref.prediction = report_prediction(metrics, cfg, mcfg, plan, cluster, lead, opt.quiet);
  ref.cost = step_cost(mcfg, plan, ndp);
  ref.peak = agree_peak(cfg, rt, lead);
  if (!opt.quiet)
    log_run_plan(cfg, mcfg, plan, model, ref.cost, *data.train, ref.peak, rt.world_size());
  if (cfg.goldfish.k > 0 && !opt.quiet) log_goldfish(cfg.goldfish);

  // The steps.
  TrainSummary summary;
  summary.first_step = progress.step;
  TrainingRun run{cfg,     opt,      rt,   plan,          model, data,    progress,   metrics,
                  summary, ckpt_dir, lead, progress.step, {},    Timer(), since_start};
  run.layout_total = layout.total();
  if (tc.spike_factor > 0) run.spike.emplace(tc.spike_factor, tc.spike_window);
  if (tc.val_every > 0 && progress.step == 0) validate_at(run, 0);
  const std::int64_t end_step =
      opt.stop_at > 0 ? std::min<std::int64_t>(opt.stop_at, tc.steps) : tc.steps;
  train_steps(run, ref, end_step);

  // The summary.
  finish_run(run, ref, topo);
  return summary;
}

}  // namespace tessera::train
