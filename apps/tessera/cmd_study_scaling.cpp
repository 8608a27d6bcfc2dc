// tessera study scaling [--ranks 1,2,4,8] [--grids dp,tensor,pipeline] [--steps 5] [--out DIR]
//                       [--launcher "mpirun --oversubscribe -n {ranks}"] [--clusters ...]
//                       [--model gpt-175b] [--published-batch 1536] [--max-devices 4096]
// Weak and strong scaling measured on this machine beside the performance model's prediction,
// and simulated on published clusters (docs/scaling.md).
#include <cstdio>
#include <sstream>

#include <fmt/format.h>

#include "commands.hpp"
#include "tessera/core/error.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/study/scaling.hpp"

namespace tessera::app {

void add_study_scaling_command(CLI::App& study) {
  auto* cmd = study.add_subcommand(
      "scaling",
      "weak and strong scaling of dp, tensor and pipeline grids: measured on this machine at "
      "each rank count (one job each, under --launcher) beside the performance model's "
      "prediction, and simulated on published clusters to thousands of devices");
  auto o = std::make_shared<study::ScalingOptions>();
  cmd->add_option("--ranks", o->ranks, "rank counts measured (the first must be 1)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--grids", o->grids, "grids measured: dp, tensor (tx), pipeline (pp)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "steps per run (the first warms up)")->capture_default_str();
  cmd->add_flag("--full-probe", o->full_probe,
                "probe each rank count fully instead of with --quick (a minute or more each; "
                "steadier predictions); cluster files already in --out are reused");
  cmd->add_option("--strong-batch", o->strong_batch, "global batch of strong scaling")
      ->capture_default_str();
  cmd->add_option("--data", o->data_train, "token shard to train on")->capture_default_str();
  cmd->add_option("--launcher", o->launcher,
                  "command that starts a job of {ranks} ranks (the tessera binary and its "
                  "arguments follow)")
      ->capture_default_str();
  cmd->add_option("--clusters", o->clusters, "published clusters (configs/clusters) simulated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--model", o->published_model, "model planned on the published clusters")
      ->capture_default_str();
  cmd->add_option("--published-batch", o->published_strong_batch,
                  "global batch of strong scaling on the published clusters (weak: 16 sequences "
                  "per 8 devices)")
      ->capture_default_str();
  auto max_devices = std::make_shared<long>(4096);
  cmd->add_option("--max-devices", *max_devices,
                  "largest published-cluster size simulated (powers of 2 from 8)")
      ->capture_default_str();
  cmd->add_option("--out,-o", o->out,
                  "folder for the runs, scaling.md and the figures; runs and cluster files "
                  "already there are read, not run again (delete it to measure afresh)")
      ->capture_default_str();
  cmd->callback([o, max_devices] {
    if (*max_devices < 8)
      throw Error(
          fmt::format("--max-devices {} is below 8, the smallest size simulated", *max_devices));
    perf::check_devices(*max_devices, "--max-devices");
    o->published_devices.clear();
    for (long n = 8; n <= *max_devices; n *= 2) o->published_devices.push_back(n);
    for (const auto& g : o->grids)
      if (g != "dp" && g != "tensor" && g != "pipeline")
        throw Error(fmt::format("--grids: unknown grid '{}'", g), "use dp, tensor and pipeline");
    for (int n : o->ranks)
      if (n < 1 || n > 1024) throw Error(fmt::format("--ranks: {} is not a rank count", n));
    o->binary = std::filesystem::read_symlink("/proc/self/exe");
    const auto result = study::run_scaling_study(*o);
    const std::string md = study::write_scaling_report(result, *o);
    std::fputs(md.c_str(), stdout);
    std::printf("wrote %s, measured.png/.svg and published.png/.svg in %s\n",
                (o->out / "scaling.md").c_str(), o->out.c_str());
  });
}

}  // namespace tessera::app
