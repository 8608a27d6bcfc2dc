// tessera train --config FILE [--set-file FRAGMENT] [--set key=value ...] [--resume]
#include <cmath>

#include "commands.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/train/config_fragment.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::app {

namespace {

// "90", "1:30" (minutes:seconds) or "2:00:00" (hours:minutes:seconds) -> seconds.
double parse_time_limit(const std::string& text) {
  const Error bad(fmt::format("--time-limit {} is not a duration", text),
                  "give seconds (5400) or H:MM:SS (1:30:00)");
  double total = 0;
  std::size_t pos = 0;
  int fields = 0;
  while (pos <= text.size()) {
    const std::size_t colon = std::min(text.find(':', pos), text.size());
    const std::string field = text.substr(pos, colon - pos);
    if (field.empty() || field.find_first_not_of("0123456789.") != std::string::npos ||
        ++fields > 3)
      throw bad;
    total = total * 60 + std::stod(field);
    pos = colon + 1;
  }
  if (!(total > 0) || !std::isfinite(total)) throw bad;
  return total;
}

}  // namespace

void add_train_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("train", "train a GPT-2 or Llama model from a run config (TOML)");
  struct Args {
    std::string config = "configs/runs/demo.toml";
    std::vector<std::string> sets;
    std::vector<std::string> set_files;
    bool resume = false;
    bool overwrite = false;
    bool override_schedule = false;
    bool quiet = false;
    bool print_config = false;
    std::int64_t stop_at = 0;
    std::string time_limit, trace;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("config,--config,-c", args->config, "run config file (TOML)")
      ->capture_default_str();
  cmd->add_option("--set,-s", args->sets,
                  "override a config key, e.g. --set train.lr=3e-4 (repeatable)")
      ->take_all();
  cmd->add_option("--set-file", args->set_files,
                  "apply the keys of a run-config fragment (e.g. tessera tune's best.toml) on "
                  "top of the config, before --set (repeatable)");
  cmd->add_flag("--resume", args->resume,
                "continue from the newest complete checkpoint in train.out_dir");
  cmd->add_flag("--overwrite", args->overwrite,
                "start afresh in a train.out_dir that holds a run, deleting its checkpoints and "
                "metrics (without it, such a run is refused)");
  cmd->add_flag("--override-schedule", args->override_schedule,
                "with --resume: continue under the config's schedule (steps, warmup, learning "
                "rates, batch) although it differs from the checkpoint's (refused without it)");
  cmd->add_flag("--quiet,-q", args->quiet, "no per-step lines (metrics.jsonl is still written)");
  cmd->add_option(
      "--stop-at", args->stop_at,
      "stop with a checkpoint after this step (the LR schedule still runs to train.steps)");
  cmd->add_option("--time-limit", args->time_limit,
                  "stop with a checkpoint before this wall-clock time has passed (seconds, or "
                  "H:MM:SS as Slurm writes it); SIGTERM and SIGUSR1 stop the same way");
  cmd->add_option("--trace", args->trace,
                  "write a Chrome/Perfetto trace of one measured step (the second) here; each "
                  "rank writes its own file under mpirun (PATH.rank<k>.json)");
  cmd->add_flag("--print-config", args->print_config, "print the resolved config and exit");
  cmd->callback([args] {
    // The runtime first: under a launcher, a bad config is then reported once, by rank 0.
    auto rt = comm::Runtime::create();
    auto fail_once = [&](const Error& e) {
      if (rt->world_size() == 1) throw e;
      if (rt->world_rank() == 0) std::fprintf(stderr, "%s\n", format_error_line(e).c_str());
      std::fflush(stderr);
      rt.reset();  // MPI_Finalize on every rank
      std::exit(2);
    };
    train::RunConfig cfg;
    try {
      std::vector<std::string> sets;
      for (const auto& f : args->set_files)
        for (auto& k : train::fragment_overrides(f)) sets.push_back(std::move(k));
      sets.insert(sets.end(), args->sets.begin(), args->sets.end());
      cfg = train::load_run_config(args->config, sets);
    } catch (const Error& e) {
      fail_once(e);
    }
    rt->set_collective_timeout(cfg.parallel.timeout_s);
    std::string resolved = train::to_toml(cfg);
    if (args->print_config) {
      std::fputs(resolved.c_str(), stdout);
      return;
    }
    train::TrainOptions opt;
    opt.resume = args->resume;
    opt.overwrite = args->overwrite;
    opt.override_schedule = args->override_schedule;
    opt.quiet = args->quiet;
    if (args->stop_at < 0) throw Error("--stop-at must be >= 0");
    if (args->resume && args->overwrite)
      fail_once(
          Error("--resume and --overwrite cannot be used together",
                "--resume continues the run in train.out_dir; --overwrite deletes it and starts "
                "afresh"));
    opt.stop_at = args->stop_at;
    opt.trace = args->trace;
    if (!opt.trace.empty() && cfg.hardware.device == "cuda")
      fail_once(
          Error("--trace records the CPU executor's schedule; the GPU's step has no trace yet",
                "trace the same run on the CPU"));
    if (!opt.trace.empty()) {  // its file is written after the traced step: checked now
      const std::filesystem::path folder = opt.trace.parent_path();
      std::error_code ec;
      if (std::filesystem::is_directory(opt.trace, ec))
        fail_once(Error(fmt::format("--trace {} is a folder", opt.trace.string()),
                        "give the trace file's name, such as trace.json"));
      if (!folder.empty() && !std::filesystem::is_directory(folder, ec))
        fail_once(Error(fmt::format("--trace: {} is not a folder", folder.string()),
                        "create the folder first, or write the trace elsewhere"));
    }
    try {
      if (!args->time_limit.empty()) opt.time_limit_s = parse_time_limit(args->time_limit);
    } catch (const Error& e) {
      fail_once(e);
    }
    bool started = false;
    try {
      train::run_training(cfg, opt, *rt, &started);
    } catch (const Error& e) {
      if (rt->world_size() == 1) throw;
      if (!started) fail_once(e);  // validation errors are the same on every rank
      // During training an error may hit one rank only: end the whole job rather than hang.
      rt->abort(fmt::format("[rank {}] {}", rt->world_rank(), format_error_line(e)), 2);
    }
  });
}

}  // namespace tessera::app
