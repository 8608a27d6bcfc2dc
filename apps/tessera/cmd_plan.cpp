// tessera plan --model M --cluster C --gpus N --global-batch B [--seq S] [--top K] [--json] ...
// Ranks the configurations of a training step by predicted step time (docs/plan.md).
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "perf_setup.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/report.hpp"

namespace tessera::app {

void add_plan_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plan",
      "rank parallel configurations (grid, ZeRO, micro-batch, schedule, recomputation) "
      "for a model on a cluster by predicted step time");
  struct Args {
    std::string model, cluster, dtype = "bf16", grid, recompute = "all";
    int gpus = 0, seq = 0, top = 10, max_micro_batch = 16, max_chunks = 4;
    long global_batch = 0;
    std::vector<int> zero = {0, 1, 2, 3};
    bool json = false, no_flash = false, no_overlap = false, one_d = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model, "model file, or a name in configs/models (e.g. gpt-175b)")
      ->required();
  cmd->add_option("--cluster,-c", a->cluster,
                  "cluster file, or a name in configs/clusters (e.g. frontier)")
      ->required();
  cmd->add_option("--gpus,-n", a->gpus, "devices")->required();
  cmd->add_option("--global-batch,-b", a->global_batch, "sequences per step")->required();
  cmd->add_option("--seq", a->seq, "sequence length (default: the model file's seq_len)");
  cmd->add_option("--top", a->top, "configurations to show")->capture_default_str();
  cmd->add_flag("--json", a->json, "print JSON instead of a table");
  cmd->add_option("--dtype", a->dtype, "compute dtype: bf16, fp16 (mixed precision) or fp32")
      ->capture_default_str();
  cmd->add_option("--grid", a->grid, "fix the grid: dp,pp,tx,ty,tz");
  cmd->add_option("--recompute", a->recompute, "none, selective, full or all (search)")
      ->capture_default_str();
  cmd->add_option("--zero", a->zero, "ZeRO stages to consider")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--max-micro-batch", a->max_micro_batch, "largest micro-batch tried")
      ->capture_default_str();
  cmd->add_option("--max-chunks", a->max_chunks, "largest interleaving (chunks per stage)")
      ->capture_default_str();
  cmd->add_flag("--no-flash-attention", a->no_flash,
                "attention materializes the (s x s) scores (memory and traffic)");
  cmd->add_flag("--no-overlap", a->no_overlap,
                "communication is not overlapped with computation (tensor and data parallel)");
  cmd->add_flag("--1d", a->one_d, "only 1D (Megatron) tensor parallelism: tx = tz = 1");
  cmd->callback([a] {
    Timer timer;
    auto setup = load_perf_setup(a->model, a->cluster, a->gpus, a->global_batch, a->seq, a->dtype,
                                 a->no_flash, a->no_overlap);
    if (a->top < 1) throw Error("--top must be >= 1");
    const auto& ms = setup.ms;
    const auto& cl = setup.cl;
    const auto& w = setup.w;
    const auto& o = setup.o;
    perf::PlanSearch s;
    s.devices = a->gpus;
    if (!a->grid.empty()) s.grid = perf::parse_grid(a->grid);
    if (a->recompute != "all") s.recompute = {perf::parse_recompute(a->recompute)};
    for (int z : a->zero)
      if (z < 0 || z > 3) throw Error(fmt::format("--zero: stage {} is not in 0-3", z));
    s.zero_stages = a->zero;
    s.max_micro_batch = a->max_micro_batch;
    s.max_chunks = a->max_chunks;
    s.tensor_3d = !a->one_d;
    s.top = a->top;
    auto res = perf::plan(w, cl, s, o);
    const double secs = timer.seconds();
    if (a->json) {
      nlohmann::json j;
      j["model"] = ms.name;
      j["cluster"] = cl.name;
      j["devices"] = a->gpus;
      j["global_batch"] = a->global_batch;
      j["seq"] = w.seq;
      j["dtype"] = a->dtype;
      j["considered"] = res.considered;
      j["feasible"] = res.feasible;
      j["rejected"] = res.rejected;
      j["plans"] = nlohmann::json::array();
      for (const auto& p : res.best) j["plans"].push_back(perf::to_json(p, cl));
      j["seconds"] = secs;
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("%s on %d x %s (%s), global batch %ld x %d tokens, %s\n", ms.name.c_str(), a->gpus,
                cl.device.c_str(), cl.name.c_str(), a->global_batch, w.seq, a->dtype.c_str());
    std::printf("%ld configurations, %ld fit, searched in %.2f s\n", res.considered, res.feasible,
                secs);
    if (!res.rejected.empty()) {
      std::printf("rejected:");
      for (const auto& [why, n] : res.rejected) std::printf("  %ld %s;", n, why.c_str());
      std::printf("\n");
    }
    if (res.best.empty())
      throw Error(
          fmt::format("no configuration of {} fits on {} x {}", ms.name, a->gpus, cl.device),
          "use more devices, a smaller global batch or sequence, or allow more ZeRO "
          "stages and recomputation");
    std::printf("\n%s", perf::format_plan_table(res.best, cl, o.dtype).c_str());
  });
}

}  // namespace tessera::app
