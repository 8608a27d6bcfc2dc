#include "tessera/train/tune.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/perf/report.hpp"
#include "tessera/train/auto_plan.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// What the measurements depend on besides the plan: a results file of another run is not reused.
std::string tune_context(const RunConfig& cfg, const model::ModelConfig& mcfg, int ranks) {
  return fmt::format("{}, {} sequences x {} tokens per step, {} ranks x {} threads",
                     model::describe(mcfg), run_global_batch(cfg), cfg.train.seq_len, ranks,
                     omp_get_max_threads());
}

nlohmann::json to_json(const TuneResult& r) {
  return {{"predicted_rank", r.predicted_rank},
          {"plan", r.plan},
          {"set", r.set_line},
          {"predicted_step_s", r.predicted_step_s},
          {"predicted_peak_bytes", r.predicted_peak_bytes},
          {"step_s", r.step_s},
          {"noise_s", r.noise_s},
          {"peak_bytes", r.peak_bytes}};
}

// The measured candidates of an earlier tuning in `file` (none if there is no file); refuses a
// file of another run.
std::vector<nlohmann::json> read_results(const fs::path& file, const std::string& context) {
  if (!fs::exists(file)) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(file));
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        fmt::format("{} is not a tuning results file: {}", file.string(), library_message(e)),
        "delete it, or choose another --dir");
  }
  if (j.value("context", std::string()) != context)
    throw Error(fmt::format("{} holds the tuning of another run ({}); this one is {}",
                            file.string(), j.value("context", std::string("?")), context),
                "choose another --dir, or delete that one to tune afresh");
  return j.value("results", std::vector<nlohmann::json>());
}

// The lead rank's earlier measurement of `plan`, shared with every rank; false if none.
bool reuse(const std::vector<nlohmann::json>& done, TuneResult& r, comm::Runtime& rt) {
  double m[3] = {0, 0, 0};
  for (const auto& d : done)
    if (d.value("plan", std::string()) == r.plan)
      m[0] = d.value("step_s", 0.0), m[1] = d.value("noise_s", 0.0),
      m[2] = d.value("peak_bytes", 0.0);
  rt.world().broadcast_bytes(m, sizeof m, 0);
  if (m[0] <= 0) return false;
  r.step_s = m[0], r.noise_s = m[1], r.peak_bytes = m[2];
  r.reused = true;
  return true;
}

// Trains candidate `r` (plan `p`) for o.steps steps in its own folder and records the steps
// after the first.
void measure(const RunConfig& cfg, const perf::PlanPoint& p, const TuneOptions& o,
             const fs::path& cluster, TuneResult& r, comm::Runtime& rt) {
  const RunConfig run =
      apply_plan(cfg, p,
                 {fmt::format("train.steps={}", o.steps),
                  fmt::format("train.out_dir={}",
                              (o.dir / fmt::format("candidate-{}", r.predicted_rank)).string()),
                  "train.val_every=0", "train.ckpt_every=0", "sample.tokens=0", "sample.every=0",
                  fmt::format("hardware.cluster={}", cluster.string())});
  TrainOptions opt;
  opt.overwrite = true;
  opt.quiet = true;
  opt.check_prediction = false;  // the table puts both side by side
  opt.resumable = false;
  const TrainSummary s = run_training(run, opt, rt);
  if (!s.stopped_by.empty())  // a part of a measurement is none: the tuning stops here
    throw Error(fmt::format("tune stopped by {} while measuring {}", s.stopped_by, r.plan),
                "the candidates measured before it are kept: run tessera tune again to go on");
  std::vector<double> steps(s.step_s.begin() + 1, s.step_s.end());
  r.step_s = median(steps);
  for (double& t : steps) t = std::fabs(t - r.step_s);
  r.noise_s = median(steps);
  r.peak_bytes = s.peak_rss_steps_bytes;
}

// The cluster the candidates are planned and predicted on, kept in the tune directory so that a
// resumed tuning plans the same candidates.
fs::path tune_cluster(const RunConfig& cfg, const TuneOptions& o, comm::Runtime& rt) {
  const fs::path kept = o.dir / "cluster.toml";
  if (!cfg.hardware.cluster.empty()) return cfg.hardware.cluster;
  if (fs::exists(kept)) return kept;
  const PredictionCluster c = planning_cluster(cfg, rt);
  if (rt.world_rank() == 0)
    write_file_atomic(kept, fmt::format("# the cluster tessera tune planned on ({})\n{}",
                                        c.path.string(), perf::to_toml(*c.spec)));
  rt.world().barrier();
  return kept;
}

}  // namespace

std::vector<TuneResult> run_tune(const RunConfig& cfg, const TuneOptions& o, comm::Runtime& rt) {
  if (o.top < 1) throw Error(fmt::format("--top must be >= 1 (got {})", o.top));
  if (o.steps < 2)
    throw Error(fmt::format("--steps must be >= 2 (got {})", o.steps),
                "the first step of each candidate warms up; the others are measured");
  const bool lead = rt.world_rank() == 0;
  if (lead) fs::create_directories(o.dir);
  const model::ModelConfig mcfg = model_config(cfg);
  const std::string context = tune_context(cfg, mcfg, rt.world_size());
  const fs::path results_file = o.dir / "results.json";
  const auto done = lead ? read_results(results_file, context) : std::vector<nlohmann::json>();
  const fs::path cluster = tune_cluster(cfg, o, rt);
  const auto spec = perf::load_cluster(cluster);
  const perf::PlanResult plans = plan_for_run(cfg, mcfg, rt.world_size(), spec, o.top);
  std::vector<TuneResult> results;
  nlohmann::json file{{"context", context}, {"cluster", cluster.string()}, {"results", {}}};
  for (std::size_t i = 0; i < plans.best.size(); ++i) {
    const perf::Prediction& p = plans.best[i];
    TuneResult r{static_cast<int>(i + 1),
                 p.point.describe(),
                 plan_set_line(p.point, cfg.train.seq_len),
                 plan_toml_fragment(p.point, cfg.train.seq_len),
                 p.step_s,
                 p.memory.total()};
    const bool measured_before = reuse(done, r, rt);
    if (lead)
      log_info("tune: candidate {}/{}: {} (predicted {} per step){}", i + 1, plans.best.size(),
               r.plan, perf::format_seconds(r.predicted_step_s),
               measured_before ? ", measured before: not run again" : "");
    if (!r.reused) measure(cfg, p.point, o, cluster, r, rt);
    if (lead) {
      log_info("tune: candidate {}/{}: {} +- {} per step, peak {:.1f} MB per rank", i + 1,
               plans.best.size(), perf::format_seconds(r.step_s), perf::format_seconds(r.noise_s),
               r.peak_bytes / 1e6);
      file["results"].push_back(to_json(r));
      write_file_atomic(results_file, file.dump(2) + "\n");
    }
    results.push_back(std::move(r));
  }
  std::stable_sort(results.begin(), results.end(),
                   [](const TuneResult& a, const TuneResult& b) { return a.step_s < b.step_s; });
  if (lead)
    write_file_atomic(
        o.dir / "best.toml",
        fmt::format("# tessera tune's fastest configuration of {}: {}, measured {} "
                    "per step (+- {}), predicted {}\n{}",
                    context, results.front().plan, perf::format_seconds(results.front().step_s),
                    perf::format_seconds(results.front().noise_s),
                    perf::format_seconds(results.front().predicted_step_s),
                    results.front().fragment));
  return results;
}

std::string format_tune_table(const std::vector<TuneResult>& results) {
  std::size_t width = 13;  // "configuration"
  for (const auto& r : results) width = std::max(width, r.plan.size());
  std::string out =
      fmt::format("{:>8} {:>9}  {:<{}}  {:>10} {:>22} {:>10} {:>10}\n", "measured", "predicted",
                  "configuration", width, "predicted", "measured step", "pred. MB", "peak MB");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out += fmt::format("{:>8} {:>9}  {:<{}}  {:>10} {:>22} {:>10.1f} {:>10.1f}{}\n", i + 1,
                       r.predicted_rank, r.plan, width, perf::format_seconds(r.predicted_step_s),
                       perf::format_seconds(r.step_s) + " +- " + perf::format_seconds(r.noise_s),
                       r.predicted_peak_bytes / 1e6, r.peak_bytes / 1e6,
                       r.reused ? "  (earlier run)" : "");
  }
  return out;
}

}  // namespace tessera::train
