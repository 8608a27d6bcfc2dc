#include "tessera/study/scaling.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/report.hpp"
#include "tessera/perf/simulator.hpp"
#include "tessera/plot/plot.hpp"
#include "tessera/train/metrics_file.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_setup.hpp"

namespace tessera::study {

namespace fs = std::filesystem;

namespace {

std::string quoted(const fs::path& p) {
  return "'" + p.string() + "'";
}

// Runs `command` under the launcher at `ranks` ranks, its output into `log`; throws on failure.
void run_job(const ScalingOptions& o, int ranks, const std::string& command, const fs::path& log) {
  std::string launch = o.launcher;
  if (const auto at = launch.find("{ranks}"); at != std::string::npos)
    launch.replace(at, 7, std::to_string(ranks));
  const std::string full =
      fmt::format("{} {} {} >{} 2>&1", launch, quoted(o.binary), command, quoted(log));
  const int status = std::system(full.c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(fmt::format("scaling study: a job failed ({}); its output: {}", full, log.string()),
                "check the launcher (--launcher) and the log");
}

// The study's run config: the small model, the data, no validation, samples or checkpoints.
train::RunConfig study_run_config(const ScalingOptions& o) {
  train::RunConfig cfg;
  cfg.model.n_layer = o.n_layer;
  cfg.model.n_head = o.n_head;
  cfg.model.n_embd = o.n_embd;
  cfg.model.block_size = o.seq;
  cfg.data.train = cfg.data.val = o.data_train;
  cfg.train.seq_len = o.seq;
  cfg.train.batch_size = o.micro_batch;
  cfg.train.steps = o.steps;
  cfg.train.warmup_steps = 1;
  cfg.train.val_every = 0;
  cfg.train.keep_checkpoints = 1;
  cfg.sample.tokens = 0;
  cfg.source = "tessera study scaling";
  train::validate(cfg);
  return cfg;
}

// The grid keys (--set overrides) of a measured point: its grid at its rank count with its
// global batch (the 1-rank baseline as dp).
std::vector<std::string> grid_keys(const ScalingOptions& o, const MeasuredPoint& p) {
  const std::string grid = p.grid == "any" ? "dp" : p.grid;
  const int dp = grid == "dp" ? p.ranks : 1;
  const long accum = p.global_batch / (static_cast<long>(dp) * o.micro_batch);
  return {fmt::format("parallel.dp={}", dp),
          fmt::format("parallel.tx={}", grid == "tensor" ? p.ranks : 1),
          fmt::format("parallel.pp={}", grid == "pipeline" ? p.ranks : 1),
          fmt::format("train.global_batch={}", p.global_batch),
          fmt::format("train.grad_accum={}", accum)};
}

// The measured points: the 1-rank runs, then each grid at each larger rank count.
std::vector<MeasuredPoint> measured_points(const ScalingOptions& o) {
  std::vector<MeasuredPoint> points;
  for (const char* scaling : {"weak", "strong"})
    for (const auto& grid : o.grids)
      for (int n : o.ranks)
        if (n > 1 || grid == o.grids.front())
          points.push_back(
              {scaling, n == 1 ? "any" : grid, n,
               std::string(scaling) == "weak" ? long{o.micro_batch} * n : long{o.strong_batch}});
  return points;
}

// Every run's config and plan checked as `train` checks them, before the first run: a grid the
// study's model or batch cannot take (a pipeline deeper than the model, a tensor split that does
// not divide its width) is said now, not after the runs before it.
void check_runs(const ScalingOptions& o, const std::vector<MeasuredPoint>& points) {
  const std::string base = train::to_toml(study_run_config(o));
  for (const auto& p : points) {
    try {
      const auto cfg = train::parse_run_config(base, "tessera study scaling", grid_keys(o, p));
      (void)train::plan_run(cfg, train::model_config(cfg.model), p.ranks);
    } catch (const Error& e) {
      throw Error(fmt::format("scaling study: the {} grid on {} ranks ({} scaling) cannot run: {}",
                              p.grid, p.ranks, p.scaling, e.what()),
                  fmt::format("leave {} out of --ranks or {} out of --grids (in train's terms: {})",
                              p.ranks, p.grid, e.hint()));
    }
  }
}

// The median of the steps after the first, and the prediction, of a finished run.
void read_run(const fs::path& dir, MeasuredPoint& p) {
  std::vector<double> steps;
  for (const auto& row : train::read_metrics_rows(dir)) {
    const std::string event = row.value("event", "");
    if (event == "step") steps.push_back(row.value("step_ms", 0.0) / 1e3);
    if (event == "prediction") p.predicted_s = row.value("step_ms", 0.0) / 1e3;
  }
  if (steps.size() < 2)
    throw Error(fmt::format("scaling study: {} has fewer than 2 steps", dir.string()));
  steps.erase(steps.begin());
  std::sort(steps.begin(), steps.end());
  p.step_s = steps[steps.size() / 2];
}

// Whether `dir` holds a finished run (its summary row written): a study run again reads it.
bool finished(const fs::path& dir) {
  if (!fs::exists(dir / "metrics.jsonl")) return false;
  const auto rows = train::read_metrics_rows(dir);
  return std::any_of(rows.begin(), rows.end(),
                     [](const auto& row) { return row.value("event", "") == "summary"; });
}

// Runs every measured point (measured_points) and reads its step time; a run already
// finished in o.out is read, not run again.
std::vector<MeasuredPoint> measure(const ScalingOptions& o, std::vector<MeasuredPoint> points) {
  const fs::path run_toml = o.out / "run.toml";
  write_file_atomic(run_toml, train::to_toml(study_run_config(o)));
  fs::create_directories(o.out / "logs");
  Progress bar("scaling study: runs", static_cast<std::int64_t>(points.size()));
  std::map<int, fs::path> clusters;
  for (std::size_t i = 0; i < points.size(); ++i) {
    auto& p = points[i];
    if (!clusters.count(p.ranks)) {
      const fs::path c = o.out / fmt::format("cluster-{}.toml", p.ranks);
      if (!fs::exists(c))
        run_job(o, p.ranks,
                fmt::format("probe {}--out {} --name this-machine-{}",
                            o.full_probe ? "" : "--quick ", quoted(c), p.ranks),
                o.out / "logs" / fmt::format("probe-{}.log", p.ranks));
      clusters[p.ranks] = c;
    }
    const std::string name = fmt::format("{}-{}-{}", p.scaling, p.grid, p.ranks);
    const fs::path dir = o.out / "runs" / name;
    if (!finished(dir))
      run_job(
          o, p.ranks,
          fmt::format("train {} --quiet --overwrite --set {} train.out_dir={} hardware.cluster={}",
                      quoted(run_toml), fmt::join(grid_keys(o, p), " "), quoted(dir),
                      quoted(clusters[p.ranks])),
          o.out / "logs" / (name + ".log"));
    read_run(dir, p);
    bar.update(static_cast<std::int64_t>(i + 1), name);
  }
  bar.finish();
  return points;
}

// Efficiency against the 1-rank run of the same scaling: weak T1/TN, strong T1/(N TN).
void set_efficiency(std::vector<MeasuredPoint>& points) {
  std::map<std::string, const MeasuredPoint*> one;
  for (const auto& p : points)
    if (p.ranks == 1) one[p.scaling] = &p;
  for (auto& p : points) {
    const MeasuredPoint* base = one.at(p.scaling);
    const double n = p.scaling == "weak" ? 1.0 : p.ranks;
    p.efficiency = base->step_s / (n * p.step_s);
    if (p.predicted_s > 0 && base->predicted_s > 0)
      p.predicted_efficiency = base->predicted_s / (n * p.predicted_s);
  }
}

// What the published clusters' part plans: the model and the clusters, read (and so checked)
// before the measured runs.
struct PublishedInputs {
  perf::ModelSpec ms;
  std::vector<perf::ClusterSpec> clusters;
};

PublishedInputs load_published(const ScalingOptions& o) {
  perf::check_global_batch(o.published_strong_batch, "--published-batch");
  for (long n : o.published_devices) perf::check_devices(n, "--max-devices");
  PublishedInputs in;
  in.ms = perf::load_model(o.published_model);
  for (const auto& name : o.clusters)
    in.clusters.push_back(perf::load_cluster(
        perf::resolve_spec(name, perf::configs_dir("clusters").string(), "cluster file")));
  return in;
}

// The planner's best plan of the published model at each size, predicted and simulated.
std::vector<PublishedPoint> published(const ScalingOptions& o, const PublishedInputs& in) {
  const perf::ModelSpec& ms = in.ms;
  std::vector<PublishedPoint> out;
  for (const perf::ClusterSpec& c : in.clusters) {
    for (const char* scaling : {"weak", "strong"})
      for (long n : o.published_devices) {
        const long batch = std::string(scaling) == "weak" ? o.published_batch_per_8 * n / 8
                                                          : o.published_strong_batch;
        if (c.max_nodes > 0 && (n + c.devices_per_node - 1) / c.devices_per_node > c.max_nodes)
          continue;  // larger than the cluster
        const perf::Workload w{ms.cfg, ms.cfg.block_size, batch};
        perf::PlanSearch s;
        s.devices = static_cast<int>(n);
        s.top = 1;
        const auto res = perf::plan(w, c, s);
        if (res.best.empty()) continue;  // does not fit at this size
        const perf::Prediction p = perf::predict(w, res.best.front().point, c);
        out.push_back(
            {c.name, scaling, n, batch, p.point.describe(), p.step_s, perf::simulate(p).step_s});
      }
  }
  for (auto& p : out) {  // against the cluster's smallest size that fits
    const auto base = std::find_if(out.begin(), out.end(), [&](const PublishedPoint& q) {
      return q.cluster == p.cluster && q.scaling == p.scaling;
    });
    const double n = p.scaling == "weak" ? 1.0 : static_cast<double>(p.devices) / base->devices;
    p.efficiency = base->simulated_s / (n * p.simulated_s);
  }
  return out;
}

// The measured runs' options, checked before the first run.
void check_measured(const ScalingOptions& o) {
  if (o.ranks.empty() || o.ranks.front() != 1)
    throw Error("the scaling study's rank counts must start at 1 (the baseline)");
  if (o.steps < 2) throw Error("--steps must be >= 2 (the first step warms up)");
  if (o.strong_batch < 1)
    throw Error(fmt::format("--strong-batch must be >= 1 (got {})", o.strong_batch));
  // Strong scaling splits the batch into whole micro-batches on each data-parallel rank.
  const bool dp = std::find(o.grids.begin(), o.grids.end(), "dp") != o.grids.end();
  for (int n : o.ranks)
    if (const long split = long{dp ? n : 1} * o.micro_batch; o.strong_batch % split != 0)
      throw Error(fmt::format("--strong-batch {} does not split into micro-batches of {} on {} "
                              "data-parallel ranks",
                              o.strong_batch, o.micro_batch, split / o.micro_batch),
                  "use a multiple of the largest rank count");
}

}  // namespace

ScalingResult run_scaling_study(const ScalingOptions& o) {
  check_measured(o);
  std::vector<MeasuredPoint> points = measured_points(o);
  check_runs(o, points);
  const PublishedInputs inputs = load_published(o);
  fs::create_directories(o.out);
  ScalingResult r;
  r.measured = measure(o, std::move(points));
  set_efficiency(r.measured);
  log_info("scaling study: planning and simulating {} on {}", o.published_model,
           fmt::join(o.clusters, ", "));
  r.published = published(o, inputs);
  return r;
}

namespace {

std::string measured_table(const std::vector<MeasuredPoint>& points, const std::string& scaling) {
  std::string t = fmt::format(
      "| grid | ranks | global batch | measured step | predicted step | model error | measured "
      "efficiency | predicted efficiency |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& p : points)
    if (p.scaling == scaling)
      t += fmt::format("| {} | {} | {} | {} | {} | {:+.0f}% | {:.2f} | {:.2f} |\n", p.grid, p.ranks,
                       p.global_batch, perf::format_seconds(p.step_s),
                       perf::format_seconds(p.predicted_s), 100 * p.error(), p.efficiency,
                       p.predicted_efficiency);
  return t;
}

std::string published_table(const std::vector<PublishedPoint>& points, const std::string& scaling) {
  std::string t =
      "| cluster | devices | global batch | best plan | model step | simulated step | efficiency "
      "|\n|---|---:|---:|---|---:|---:|---:|\n";
  for (const auto& p : points)
    if (p.scaling == scaling)
      t += fmt::format("| {} | {} | {} | {} | {} | {} | {:.2f} |\n", p.cluster, p.devices,
                       p.global_batch, p.plan, perf::format_seconds(p.model_s),
                       perf::format_seconds(p.simulated_s), p.efficiency);
  return t;
}

// Efficiency against ranks, measured or predicted, a line per grid (a grid has the same colour in
// both panels).
plot::Chart measured_chart(const std::vector<MeasuredPoint>& points, const std::string& scaling,
                           const std::vector<std::string>& grids, bool predicted) {
  static const std::map<std::string, std::string> colors = {
      {"dp", "#1f77b4"}, {"tensor", "#2ca02c"}, {"pipeline", "#9467bd"}};
  plot::Chart c{
      fmt::format("{} scaling on this machine, {}", scaling, predicted ? "predicted" : "measured"),
      "ranks",
      "efficiency",
      true,
      false,
      {}};
  for (const auto& grid : grids) {
    plot::Series s{grid, {}, {}, plot::Style::Line, colors.at(grid)};
    for (const auto& q : points)
      if (q.scaling == scaling && (q.grid == grid || q.grid == "any"))
        s.x.push_back(q.ranks), s.y.push_back(predicted ? q.predicted_efficiency : q.efficiency);
    c.series.push_back(std::move(s));
  }
  return c;
}

plot::Chart published_chart(const std::vector<PublishedPoint>& points, const std::string& scaling,
                            const std::string& model) {
  plot::Chart c{fmt::format("{}: {} scaling (simulated)", model, scaling),
                "devices",
                "efficiency",
                true,
                false,
                {}};
  std::vector<std::string> names;
  for (const auto& p : points)
    if (std::find(names.begin(), names.end(), p.cluster) == names.end()) names.push_back(p.cluster);
  for (const auto& name : names) {
    plot::Series s{name, {}, {}, plot::Style::Line, ""};
    for (const auto& p : points)
      if (p.cluster == name && p.scaling == scaling)
        s.x.push_back(static_cast<double>(p.devices)), s.y.push_back(p.efficiency);
    c.series.push_back(std::move(s));
  }
  return c;
}

}  // namespace

std::string write_scaling_report(const ScalingResult& r, const ScalingOptions& o) {
  for (const char* ext : {".png", ".svg"}) {
    plot::draw({measured_chart(r.measured, "weak", o.grids, false),
                measured_chart(r.measured, "weak", o.grids, true),
                measured_chart(r.measured, "strong", o.grids, false),
                measured_chart(r.measured, "strong", o.grids, true)},
               o.out / (std::string("measured") + ext), {1200, 900, 2});
    plot::draw({published_chart(r.published, "weak", o.published_model),
                published_chart(r.published, "strong", o.published_model)},
               o.out / (std::string("published") + ext), {1200, 500, 2});
  }
  std::string md = fmt::format(
      "## Measured on this machine\n\nModel: {} layers, {} heads, {} channels, {} tokens per "
      "sequence, micro-batches of {}; {} steps per run, the median of steps 2-{}. Weak scaling: "
      "{} sequence(s) per rank per step; strong scaling: {} sequences per step. Predicted: the "
      "trainer's prediction row, on the cluster file `tessera probe{}` measured at that "
      "rank count. Model error = predicted / measured - 1.\n\n### Weak scaling\n\n{}\n### Strong "
      "scaling\n\n{}\n",
      o.n_layer, o.n_head, o.n_embd, o.seq, o.micro_batch, o.steps, o.steps, o.micro_batch,
      o.strong_batch, o.full_probe ? "" : " --quick", measured_table(r.measured, "weak"),
      measured_table(r.measured, "strong"));
  md += fmt::format(
      "## Published clusters (simulated)\n\n{} with the planner's best plan at each size (bf16), "
      "its step predicted by the model and replayed by the simulator; efficiency of the "
      "simulated step against the smallest size it fits on (sizes it does not fit on are left "
      "out). Weak scaling: {} sequences per step per 8 devices; strong scaling: {} sequences per "
      "step.\n\n### Weak scaling\n\n{}\n### Strong scaling\n\n{}",
      o.published_model, o.published_batch_per_8, o.published_strong_batch,
      published_table(r.published, "weak"), published_table(r.published, "strong"));
  write_file_atomic(o.out / "scaling.md", md);
  return md;
}

}  // namespace tessera::study
