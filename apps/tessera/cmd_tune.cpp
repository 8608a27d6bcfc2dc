// tessera tune CONFIG [--set key=value ...] [--top 5] [--steps 6] [--dir runs/tune]
// Trains the planner's fastest configurations of a run for a few steps each under the current
// launcher, ranks them by measurement beside the prediction and writes the winner as a run-config
// fragment (docs/plan.md, "Tuning by measurement").
#include <cstdio>
#include <cstdlib>

#include "commands.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/train/config_fragment.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/tune.hpp"

namespace tessera::app {

void add_tune_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "tune",
      "train the planner's fastest configurations of a run for a few steps each on this job's "
      "ranks, rank them by measured step time and write the winner as a config fragment");
  struct Args {
    std::string config;
    std::vector<std::string> sets, set_files;
    train::TuneOptions tune;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("config,--config,-c", a->config, "run config file (TOML)")->required();
  cmd->add_option("--set,-s", a->sets, "override a config key, as for train (repeatable)")
      ->take_all();
  cmd->add_option("--set-file", a->set_files,
                  "apply the keys of a run-config fragment, as for train (repeatable)");
  cmd->add_option("--top,-k", a->tune.top, "candidates: the planner's fastest")
      ->capture_default_str();
  cmd->add_option("--steps", a->tune.steps,
                  "steps per candidate; the first warms up, the others are measured")
      ->capture_default_str();
  cmd->add_option("--dir", a->tune.dir,
                  "tune directory: results.json (an interrupted tuning resumes from it), "
                  "cluster.toml, best.toml and each candidate's run")
      ->capture_default_str();
  cmd->callback([a] {
    auto rt = comm::Runtime::create();
    const bool lead = rt->world_rank() == 0;
    train::RunConfig cfg;
    try {  // bad input: the same on every rank, said once
      std::vector<std::string> sets;
      for (const auto& f : a->set_files)
        for (auto& k : train::fragment_overrides(f)) sets.push_back(std::move(k));
      sets.insert(sets.end(), a->sets.begin(), a->sets.end());
      cfg = train::load_run_config(a->config, sets);
    } catch (const Error& e) {
      if (rt->world_size() == 1) throw;
      if (lead) std::fprintf(stderr, "%s\n", format_error_line(e).c_str());
      std::fflush(stderr);
      rt.reset();  // MPI_Finalize on every rank
      std::exit(2);
    }
    rt->set_collective_timeout(cfg.parallel.timeout_s);
    std::vector<train::TuneResult> results;
    try {
      results = train::run_tune(cfg, a->tune, *rt);
    } catch (const Error& e) {
      if (rt->world_size() == 1) throw;
      rt->abort(fmt::format("[rank {}] {}", rt->world_rank(), format_error_line(e)), 2);
    }
    if (!lead) return;
    std::printf("%s", train::format_tune_table(results).c_str());
    std::printf(
        "measured: the median of steps 2-%d of each candidate, +- the median absolute "
        "deviation of those steps (the run-to-run noise)\n",
        a->tune.steps);
    std::printf("fastest: %s\nwrote %s (tessera train CONFIG --set-file %s), or:\n%s\n",
                results.front().plan.c_str(), (a->tune.dir / "best.toml").c_str(),
                (a->tune.dir / "best.toml").c_str(), results.front().set_line.c_str());
  });
}

}  // namespace tessera::app
