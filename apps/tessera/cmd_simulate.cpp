// tessera simulate --model M --cluster C --gpus N --global-batch B [--grid dp,pp,tx,ty,tz]
//                  [--micro-batch b] [--schedule 1f1b] [--chunks v] [--trace out.json] ...
// Replays one training step's per-rank pipeline instruction lists with the model's costs
// (docs/simulate.md).
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "option_checks.hpp"
#include "perf_setup.hpp"
#include "tessera/core/chrome_trace.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/report.hpp"
#include "tessera/perf/simulator.hpp"
#include "tessera/perf/trace_compare.hpp"

namespace tessera::app {

namespace {

// simulate --compare: one line per measured instruction, predicted beside measured.
void print_comparison(const std::string& file, const std::vector<perf::TraceComparison>& rows) {
  if (rows.empty())
    throw Error(fmt::format("{} holds no instruction events", file),
                "pass a trace written by tessera train --trace");
  auto ms = [](double s) { return s < 0 ? std::string("-") : fmt::format("{:.2f}", s * 1e3); };
  std::printf("\npredicted vs measured (%s), per instruction, ms from the step's start:\n",
              file.c_str());
  std::printf("%-6s %-14s %10s %10s %10s %10s %8s\n", "stage", "instruction", "pred start",
              "meas start", "pred dur", "meas dur", "meas/pred");
  double pred = 0, meas = 0;
  for (const auto& r : rows) {
    const std::string ratio =
        r.predicted_s > 0 ? fmt::format("{:.2f}", r.measured_s / r.predicted_s) : "-";
    std::printf("%-6d %-14s %10s %10s %10s %10s %8s\n", r.stage, r.name.c_str(),
                ms(r.predicted_start_s).c_str(), ms(r.measured_start_s).c_str(),
                ms(r.predicted_s).c_str(), ms(r.measured_s).c_str(), ratio.c_str());
    if (r.predicted_s > 0) pred += r.predicted_s, meas += r.measured_s;
  }
  std::printf("instructions in both: predicted %.2f ms, measured %.2f ms (x%.2f)\n", pred * 1e3,
              meas * 1e3, pred > 0 ? meas / pred : 0.0);
}

}  // namespace

void add_simulate_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "simulate",
      "replay one training step's pipeline schedule on every rank with the "
      "performance model's costs (busy, communication, idle per rank; Chrome trace)");
  struct Args {
    std::string model, cluster, dtype = "bf16", grid, schedule = "1f1b", recompute = "full", trace,
                                compare;
    int gpus = 0, micro_batch = 1, chunks = 2, zero = 0, trace_ranks = 64;
    long global_batch = 0;
    std::optional<int> seq;  // none: the model file's seq_len
    bool json = false, no_flash = false, no_overlap = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model, "model file, or a name in configs/models")->required();
  cmd->add_option("--cluster,-c", a->cluster, "cluster file, or a name in configs/clusters")
      ->required();
  cmd->add_option("--gpus,-n", a->gpus, "devices")->required();
  cmd->add_option("--global-batch,-b", a->global_batch, "sequences per step")->required();
  cmd->add_option("--seq", a->seq, "sequence length (default: the model file's seq_len)");
  cmd->add_option("--grid", a->grid,
                  "dp,pp,tx,ty,tz (default: the planner's best configuration, whose other "
                  "choices then replace the options below)");
  cmd->add_option("--micro-batch", a->micro_batch, "sequences per micro-batch")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--schedule", a->schedule, "gpipe, 1f1b or interleaved")->capture_default_str();
  cmd->add_option("--chunks", a->chunks, "chunks per stage (interleaved)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--zero", a->zero, "ZeRO stage")
      ->check(CLI::IsMember({0, 1, 2, 3}))
      ->capture_default_str();
  cmd->add_option("--recompute", a->recompute, "none, selective or full")->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "bf16, fp16 or fp32")->capture_default_str();
  cmd->add_flag("--no-flash-attention", a->no_flash, "attention materializes the scores");
  cmd->add_flag("--no-overlap", a->no_overlap, "no overlap of tensor/data-parallel communication");
  cmd->add_option("--trace", a->trace, "write a Chrome trace (chrome://tracing, Perfetto) here");
  cmd->add_option("--trace-ranks", a->trace_ranks, "stages of the first pipeline in the trace")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--compare", a->compare,
                  "a measured trace of the same plan (tessera train --trace): print predicted "
                  "and measured time per instruction");
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->callback([a] {
    Timer timer;
    auto setup = load_perf_setup(a->model, a->cluster, a->gpus, a->global_batch, a->seq, a->dtype,
                                 a->no_flash, a->no_overlap);
    const auto& ms = setup.ms;
    const auto& cl = setup.cl;
    const auto& w = setup.w;
    const auto& o = setup.o;
    perf::PlanPoint p;
    if (a->grid.empty()) {
      perf::PlanSearch s;
      s.devices = a->gpus;
      s.top = 1;
      auto res = perf::plan(w, cl, s, o);
      if (res.best.empty())
        throw Error(
            fmt::format("no configuration of {} fits on {} x {}", ms.name, a->gpus, cl.device),
            "use more devices or a smaller batch");
      p = res.best[0].point;
    } else {
      p.grid = perf::parse_grid(a->grid);
      if (p.grid.world_size() != a->gpus)
        throw Error(fmt::format("--grid {} has {} devices, --gpus says {}", a->grid,
                                p.grid.world_size(), a->gpus));
      p.micro_batch = a->micro_batch;
      p.schedule = parallel::parse_schedule(a->schedule);
      p.virtual_stages = p.schedule == parallel::ScheduleKind::Interleaved ? a->chunks : 1;
      p.zero = a->zero;
      p.recompute = perf::parse_recompute(a->recompute);
      if (auto why = perf::infeasible_reason(w, p, cl); !why.empty())
        throw Error(fmt::format("configuration {} cannot run: {}", p.describe(), why),
                    "see tessera plan for configurations that can");
    }
    auto pred = perf::predict(w, p, cl, o);
    perf::check_replay_size(pred);
    perf::TraceOptions tr;
    tr.path = a->trace;
    tr.max_ranks = a->trace_ranks;
    tr.keep_events = !a->compare.empty();
    const auto measured = a->compare.empty() ? std::vector<TraceEvent>{}
                                             : read_chrome_trace(a->compare);  // before the work
    auto sim = perf::simulate(pred, tr);
    const double secs = timer.seconds();
    if (sim.deadlock) throw InternalError("the schedule deadlocked in the replay");
    auto frac = [&](double x) { return 100 * x / sim.step_s; };
    if (a->json) {
      nlohmann::json j;
      j["model"] = ms.name;
      j["cluster"] = cl.name;
      j["config"] = perf::to_json(pred, cl);
      j["simulated_step_s"] = sim.step_s;
      j["predicted_step_s"] = pred.step_s;
      j["instructions"] = sim.instructions;
      j["stages"] = nlohmann::json::array();
      for (const auto& s : sim.stages)
        j["stages"].push_back({{"busy_s", s.busy}, {"comm_s", s.comm}, {"idle_s", s.idle}});
      j["seconds"] = secs;
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("%s on %d x %s (%s): %s\n", ms.name.c_str(), a->gpus, cl.device.c_str(),
                cl.name.c_str(), p.describe().c_str());
    std::printf("%d micro-batches per pipeline, %ld instructions on %d ranks replayed in %.2f s\n",
                pred.micro_batches, sim.instructions, p.grid.world_size(), secs);
    std::printf("step: simulated %s, analytical model %s; %.1f TFLOP/s per device\n",
                perf::format_seconds(sim.step_s).c_str(), perf::format_seconds(pred.step_s).c_str(),
                pred.hw_flops / (sim.step_s * p.grid.world_size()) / 1e12);
    const long per_stage = p.grid.world_size() / p.grid.pp;
    std::printf("\n%-7s %-7s %12s %12s %12s %7s %7s %7s\n", "stage", "ranks", "busy", "comm",
                "idle", "busy%", "comm%", "idle%");
    const int rows = p.grid.pp;
    for (int s = 0; s < rows; ++s) {
      if (rows > 24 && s >= 8 && s < rows - 8) {
        if (s == 8) std::printf("%-7s\n", "...");
        continue;
      }
      const auto& t = sim.stages[s];
      std::printf("%-7d %-7ld %12s %12s %12s %6.1f%% %6.1f%% %6.1f%%\n", s, per_stage,
                  perf::format_seconds(t.busy).c_str(), perf::format_seconds(t.comm).c_str(),
                  perf::format_seconds(t.idle).c_str(), frac(t.busy), frac(t.comm), frac(t.idle));
    }
    double bmin = 1e300, bmax = 0, imax = 0;
    for (const auto& r : sim.ranks) {
      bmin = std::min(bmin, r.busy);
      bmax = std::max(bmax, r.busy);
      imax = std::max(imax, r.idle);
    }
    std::printf("\nall %d ranks: busy %.1f%%-%.1f%%, idle up to %.1f%%\n", p.grid.world_size(),
                frac(bmin), frac(bmax), frac(imax));
    if (!a->trace.empty())
      std::printf("trace: %s (stages 0-%d of the first pipeline)\n", a->trace.c_str(),
                  std::min(a->trace_ranks, p.grid.pp) - 1);
    if (!a->compare.empty())
      print_comparison(a->compare, perf::compare_traces(sim.events, measured));
  });
}

}  // namespace tessera::app
