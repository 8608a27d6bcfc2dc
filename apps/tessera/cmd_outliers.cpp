// tessera outliers --model M [--calib corpus] [--nsamples 32] [--out DIR]
#include <cmath>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "calib_flags.hpp"
#include "commands.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/quant/outliers.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::app {

void add_outliers_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "outliers", "activation outliers of a model: per layer and channel, JSON and SVG");
  struct Args {
    std::string model, out = "outliers";
    CalibFlags cf;  // 32 samples
    int top = 10;
    double ratio = 20;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "model directory, .safetensors, .gguf file, or a pretrained model's short name")
      ->required();
  cmd->add_option("--out,-o", a->out, "folder for outliers.json and outliers.svg")
      ->capture_default_str();
  add_calibration_options(cmd, a->cf);
  cmd->add_option("--ratio", a->ratio, "outlier channel: max|x| >= ratio x median channel")
      ->capture_default_str();
  cmd->add_option("--top", a->top, "outlier channels to print")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->callback([a] {
    namespace fs = std::filesystem;
    if (!std::isfinite(a->ratio) || a->ratio <= 1)
      throw Error(fmt::format("--ratio must be a number > 1, got {}", a->ratio));
    prepare_output_dir(a->out, "--out");  // before the work, not after it
    auto path = resolve_model_path(a->model);
    auto any = quant::load_any_model(path);
    const auto& cfg = any.model.config;
    model::ParamLayout layout(cfg);
    auto calib = calibration_from_flags(a->cf, cfg, a->model);
    auto cap = quant::capture(layout, any.model.params.data(), calib, false);
    auto rep = quant::analyze_outliers(cap, a->ratio);
    auto j = rep.to_json();
    j["model"] = path.string();
    j["calibration"] = calib.describe();
    write_file_atomic(fs::path(a->out) / "outliers.json", j.dump(2) + "\n");
    const int rows = static_cast<int>(cap.layers.size());
    plot::draw(quant::outlier_charts(rep, cap), fs::path(a->out) / "outliers.svg",
               {1600, 60 + 300 * rows, quant::k_num_lin});
    std::printf("%s\n", rep.summary_line().c_str());
    int shown = 0;
    for (const auto& c : rep.channels) {
      if (shown++ >= a->top) break;
      std::printf(
          "outlier channel: %s input channel %d  max|x| %.2f  (%.0fx median)  excess "
          "kurtosis %.1f\n",
          c.linear.c_str(), c.channel, c.maxabs, c.ratio, c.kurtosis);
    }
    for (const auto& f : rep.dettmers)
      std::printf("LLM.int8() outlier feature: dim %d in %.0f%% of layers, %.1f%% of positions\n",
                  f.dim, 100 * f.layer_fraction, 100 * f.position_fraction);
    std::printf("wrote %s and %s\n", (fs::path(a->out) / "outliers.json").string().c_str(),
                (fs::path(a->out) / "outliers.svg").string().c_str());
  });
}

}  // namespace tessera::app
