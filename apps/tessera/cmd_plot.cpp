// tessera plot RUN_DIR... [--out FILE] [--metric NAME] [--log-y]
// Draws one metric of one or several training runs (their metrics.jsonl) against the step,
// overlaid, as a PNG or SVG chart (docs/plot.md).
#include <cstdio>

#include <fmt/format.h>

#include "commands.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/suggest.hpp"
#include "tessera/plot/plot.hpp"
#include "tessera/train/metrics_file.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

// The legend name of a run: its folder's name ("runs/a/" and "runs/a" both give "a").
std::string run_name(const fs::path& dir) {
  const fs::path clean = dir.lexically_normal();
  const std::string name = (clean.has_filename() ? clean : clean.parent_path()).filename().string();
  return name.empty() ? dir.string() : name;
}

std::string axis_label(const std::string& metric) {
  if (metric == "loss") return "training loss";
  if (metric == "val_loss") return "validation loss";
  if (metric == "lr") return "learning rate";
  if (metric == "mfu") return "MFU (of the hardware peak)";
  return metric;
}

plot::Series run_series(const fs::path& dir, const std::string& metric) {
  const auto rows = train::read_metrics_rows(dir);
  const auto curve = train::metric_curve(rows, metric);
  if (curve.steps.empty()) {
    const auto names = train::metric_names(rows);
    const std::string near = closest(metric, names);
    throw Error(fmt::format("{} has no metric \"{}\"", dir.string(), metric),
                !near.empty()   ? fmt::format("did you mean \"{}\"?", near)
                : names.empty() ? std::string("its metrics.jsonl holds no step rows yet")
                                : fmt::format("its metrics: {}", fmt::join(names, ", ")));
  }
  return {run_name(dir), curve.steps, curve.values, plot::Style::Line, ""};
}

}  // namespace

void add_plot_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plot", "draw a metric of training runs against the step (PNG or SVG), runs overlaid");
  struct Args {
    std::vector<std::string> runs;
    std::string out, metric = "loss";
    bool log_y = false;
    int width = 960, height = 600;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("runs", a->runs, "run folders (train.out_dir), one curve each")->required();
  cmd->add_option("--metric,-m", a->metric,
                  "a number of the step or validation rows of metrics.jsonl: loss, val_loss, lr, "
                  "grad_norm, tokens_per_s, mfu, step_ms, ...")
      ->capture_default_str();
  cmd->add_option("--out,-o", a->out, "picture to write, .png or .svg (default: METRIC.png)");
  cmd->add_flag("--log-y", a->log_y, "logarithmic y axis");
  cmd->add_option("--width", a->width, "picture width in pixels")->capture_default_str();
  cmd->add_option("--height", a->height, "picture height in pixels")->capture_default_str();
  cmd->callback([a] {
    if (a->width < 200 || a->height < 150 || a->width > 10000 || a->height > 10000)
      throw Error(fmt::format("--width {} --height {} is not a picture size", a->width, a->height),
                  "give 200..10000 by 150..10000 pixels");
    const fs::path out = a->out.empty() ? fs::path(a->metric + ".png") : fs::path(a->out);
    plot::Chart chart;
    chart.title = axis_label(a->metric);
    chart.x_label = "step";
    chart.y_label = axis_label(a->metric);
    chart.log_y = a->log_y;
    for (const auto& run : a->runs) chart.series.push_back(run_series(run, a->metric));
    plot::draw(chart, out, {a->width, a->height, 1});
    std::printf("wrote %s (%s of %zu run%s)\n", out.string().c_str(), a->metric.c_str(),
                a->runs.size(), a->runs.size() == 1 ? "" : "s");
  });
}

}  // namespace tessera::app
