// tessera plan --model M --cluster C --gpus N --global-batch B [--seq S] [--top K] [--json] ...
// Ranks the configurations of a training step by predicted step time (docs/plan.md).
// tessera plan ... --emit-set [N]
// Prints the `--set parallel.* train.*` line of the Nth plan, for `tessera train CONFIG`.
// tessera plan --show-schedule KIND --pp P --micro-batches M [--chunks V] [--json]
// Draws one pipeline schedule as a text timeline and checks it (docs/plan.md).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "perf_setup.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/report.hpp"
#include "tessera/train/auto_plan.hpp"

namespace tessera::app {

namespace {

// "--a", "--a and --b", "--a, --b and --c"
std::string join_flags(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

std::vector<std::string> given(const std::vector<CLI::Option*>& opts) {
  std::vector<std::string> names;
  for (const auto* o : opts)
    if (o->count() > 0) names.push_back(o->get_name());
  return names;
}

// Largest pp * m * v drawn: the lists and the text grow with it.
constexpr long k_max_schedule_size = 1'000'000;

// chunks: used when `chunks_given`, else 2 for interleaved and 1 otherwise.
void show_schedule(const std::string& kind, int pp, int m, int chunks, bool chunks_given,
                   bool json) {
  parallel::ScheduleSpec spec;
  spec.kind = parallel::parse_schedule(kind);
  spec.pp = pp;
  spec.m = m;
  spec.v = chunks_given ? chunks : spec.kind == parallel::ScheduleKind::Interleaved ? 2 : 1;
  parallel::validate(spec);
  if (static_cast<long>(spec.pp) * spec.m * spec.v > k_max_schedule_size)
    throw Error(fmt::format("--show-schedule draws up to pp * micro-batches * chunks = {} (got "
                            "{} * {} * {})",
                            k_max_schedule_size, spec.pp, spec.m, spec.v),
                "use fewer stages or micro-batches");
  const auto sch = parallel::make_schedule(spec);
  const auto check = parallel::check_schedule(sch);
  if (json) {
    const auto t = parallel::replay_timeline(sch);
    nlohmann::json j;
    j["schedule"] = parallel::schedule_name(spec.kind);
    j["pp"] = spec.pp;
    j["micro_batches"] = spec.m;
    j["chunks"] = spec.v;
    j["forward_columns"] = t.forward_cols;
    j["backward_columns"] = t.backward_cols;
    j["makespan_columns"] = t.makespan;
    j["ideal_bubble"] = parallel::ideal_bubble_fraction(spec);
    j["check"] = {{"ok", check.ok}, {"problems", check.problems}};
    j["stages"] = nlohmann::json::array();
    for (int st = 0; st < spec.pp; ++st) {
      nlohmann::json js;
      js["stage"] = st;
      js["busy_columns"] = t.busy[st];
      js["idle_columns"] = t.idle(st);
      js["bubble"] = t.bubble(st);
      js["max_in_flight"] = parallel::max_in_flight(sch.ranks[st]);
      js["in_flight_formula"] = parallel::in_flight_formula(spec, st);
      js["instructions"] = nlohmann::json::array();
      for (std::size_t i = 0; i < sch.ranks[st].size(); ++i) {
        const auto& in = sch.ranks[st][i];
        js["instructions"].push_back({{"op", parallel::op_name(in.op)},
                                      {"mb", in.mb},
                                      {"chunk", in.chunk},
                                      {"peer", in.peer},
                                      {"start", t.start[st][i]}});
      }
      j["stages"].push_back(std::move(js));
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s", parallel::draw_timeline(sch).c_str());
  if (check.ok) {
    std::printf("schedule check: ok\n");
  } else {
    std::printf("schedule check: %zu problem%s\n", check.problems.size(),
                check.problems.size() == 1 ? "" : "s");
    for (const auto& p : check.problems) std::printf("  %s\n", p.c_str());
  }
}

// --emit-set [N]: N (default 1), checked with the flags it cannot go with; 0 when not given.
int emit_index(const CLI::Option* emit, const std::string& text, bool json,
               const std::string& recompute) {
  if (emit->count() == 0) return 0;
  if (json) throw Error("--emit-set prints a line of run-config keys, not JSON", "drop --json");
  if (recompute == "selective")
    throw Error("--emit-set: the trainer has no selective recomputation",
                "use --recompute none, full or all");
  if (text.empty()) return 1;
  if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 6 ||
      std::stoi(text) < 1)
    throw Error(fmt::format("--emit-set {} is not a plan number", text),
                "give the rank of a plan in the table, 1 for the fastest");
  return std::stoi(text);
}

// --emit-set: the run-config keys of plan `n` (1-based) on stdout, what it is on stderr.
void emit_set(const perf::PlanResult& res, int n, int seq) {
  if (static_cast<std::size_t>(n) > res.best.size())
    throw Error(fmt::format("--emit-set {}: only {} configuration{} fit", n, res.best.size(),
                            res.best.size() == 1 ? "" : "s"),
                "choose a plan of the table (tessera plan without --emit-set lists them)");
  const auto& p = res.best[static_cast<std::size_t>(n - 1)];
  std::fprintf(stderr, "plan %d of the %ld that fit: %s, predicted %s per step, %s per device\n", n,
               res.feasible, p.point.describe().c_str(), perf::format_seconds(p.step_s).c_str(),
               perf::format_bytes(p.memory.total()).c_str());
  std::printf("%s\n", train::plan_set_line(p.point, seq).c_str());
}

// The planner's result as JSON or as the table, with what was searched and rejected.
void print_plans(const perf::PlanResult& res, const PerfSetup& setup, int gpus, long global_batch,
                 const std::string& dtype, bool json, double secs) {
  const auto& ms = setup.ms;
  const auto& cl = setup.cl;
  const auto& w = setup.w;
  const auto& o = setup.o;
  if (json) {
    nlohmann::json j;
    j["model"] = ms.name;
    j["cluster"] = cl.name;
    j["devices"] = gpus;
    j["global_batch"] = global_batch;
    j["seq"] = w.seq;
    j["dtype"] = dtype;
    j["considered"] = res.considered;
    j["feasible"] = res.feasible;
    j["rejected"] = res.rejected;
    j["plans"] = nlohmann::json::array();
    for (const auto& p : res.best) j["plans"].push_back(perf::to_json(p, cl));
    j["seconds"] = secs;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s on %d x %s (%s), global batch %ld x %d tokens, %s\n", ms.name.c_str(), gpus,
              cl.device.c_str(), cl.name.c_str(), global_batch, w.seq, dtype.c_str());
  std::printf("%ld configurations, %ld fit, searched in %.2f s\n", res.considered, res.feasible,
              secs);
  if (!res.rejected.empty()) {
    std::printf("rejected:");
    for (const auto& [why, n] : res.rejected) std::printf("  %ld %s;", n, why.c_str());
    std::printf("\n");
  }
  if (res.best.empty())
    throw Error(fmt::format("no configuration of {} fits on {} x {}", ms.name, gpus, cl.device),
                "use more devices, a smaller global batch or sequence, or allow more ZeRO "
                "stages and recomputation");
  std::printf("\n%s", perf::format_plan_table(res.best, cl, o.dtype).c_str());
}

}  // namespace

void add_plan_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plan",
      "rank parallel configurations (grid, ZeRO, micro-batch, schedule, recomputation) "
      "for a model on a cluster by predicted step time; or draw a pipeline schedule "
      "(--show-schedule)");
  struct Args {
    std::string model, cluster, dtype = "bf16", grid, recompute = "all";
    int gpus = 0, top = 10, max_micro_batch = 16, max_chunks = 4;
    long global_batch = 0;
    std::optional<int> seq;  // none: the model file's seq_len
    std::vector<int> zero = {0, 1, 2, 3};
    bool json = false, no_flash = false, no_overlap = false, one_d = false;
    std::string show_schedule;  // --show-schedule: draw this schedule instead of planning
    std::string emit;           // --emit-set [N]: "" = 1
    int pp = 0, micro_batches = 0, chunks = 0;
  };
  auto a = std::make_shared<Args>();
  // Required unless --show-schedule is given (checked in the callback).
  const std::vector<CLI::Option*> needed = {
      cmd->add_option("--model,-m", a->model,
                      "model file, or a name in configs/models (e.g. gpt-175b)"),
      cmd->add_option("--cluster,-c", a->cluster,
                      "cluster file, or a name in configs/clusters (e.g. frontier)"),
      cmd->add_option("--gpus,-n", a->gpus, "devices"),
      cmd->add_option("--global-batch,-b", a->global_batch, "sequences per step")};
  std::vector<CLI::Option*> planning = {
      cmd->add_option("--seq", a->seq, "sequence length (default: the model file's seq_len)"),
      cmd->add_option("--top", a->top, "configurations to show")->capture_default_str(),
      cmd->add_option("--dtype", a->dtype, "compute dtype: bf16, fp16 (mixed precision) or fp32")
          ->capture_default_str(),
      cmd->add_option("--grid", a->grid, "fix the grid: dp,pp,tx,ty,tz"),
      cmd->add_option("--recompute", a->recompute, "none, selective, full or all (search)")
          ->capture_default_str(),
      cmd->add_option("--zero", a->zero, "ZeRO stages to consider")
          ->delimiter(',')
          ->capture_default_str(),
      cmd->add_option("--max-micro-batch", a->max_micro_batch, "largest micro-batch tried")
          ->capture_default_str(),
      cmd->add_option("--max-chunks", a->max_chunks, "largest interleaving (chunks per stage)")
          ->capture_default_str(),
      cmd->add_flag("--no-flash-attention", a->no_flash,
                    "attention materializes the (s x s) scores (memory and traffic)"),
      cmd->add_flag("--no-overlap", a->no_overlap,
                    "communication is not overlapped with computation (tensor and data parallel)"),
      cmd->add_flag("--1d", a->one_d,
                    "one tensor axis at most: tx alone (1D, with sequence parallelism) or ty alone "
                    "(Megatron), no tz")};
  cmd->add_flag("--json", a->json, "print JSON instead of a table");
  auto* emit = cmd->add_option("--emit-set", a->emit,
                               "print only the --set parallel.* train.* line of plan N (default "
                               "1, the fastest) to paste after 'tessera train CONFIG'; searches "
                               "only what the trainer runs (no selective recomputation)")
                   ->expected(0, 1)
                   ->type_name("[N]");
  auto* show = cmd->add_option("--show-schedule", a->show_schedule,
                               "instead of planning, draw the pipeline schedule gpipe, 1f1b or "
                               "interleaved as a text timeline (with --pp, --micro-batches)")
                   ->type_name("KIND");
  const std::vector<CLI::Option*> drawing = {
      cmd->add_option("--pp", a->pp, "with --show-schedule: pipeline stages"),
      cmd->add_option("--micro-batches", a->micro_batches,
                      "with --show-schedule: micro-batches per step"),
      cmd->add_option("--chunks", a->chunks,
                      "with --show-schedule: chunks per stage (default 2 for interleaved, "
                      "1 otherwise)")};
  planning.push_back(emit);
  cmd->callback([a, needed, planning, drawing, show, emit] {
    if (show->count() > 0) {
      auto unused = given(needed);
      for (auto& n : given(planning)) unused.push_back(n);
      if (!unused.empty())
        throw Error(fmt::format("--show-schedule draws a schedule and does not plan: {} {} not "
                                "used with it",
                                join_flags(unused), unused.size() == 1 ? "is" : "are"),
                    "drop them, or drop --show-schedule to rank configurations");
      std::vector<std::string> missing;
      if (drawing[0]->count() == 0) missing.push_back("--pp");
      if (drawing[1]->count() == 0) missing.push_back("--micro-batches");
      if (!missing.empty())
        throw Error(fmt::format("--show-schedule needs {}", join_flags(missing)),
                    "give the pipeline stages and the micro-batches per step, e.g. tessera plan "
                    "--show-schedule 1f1b --pp 4 --micro-batches 8");
      show_schedule(a->show_schedule, a->pp, a->micro_batches, a->chunks, drawing[2]->count() > 0,
                    a->json);
      return;
    }
    if (auto extra = given(drawing); !extra.empty())
      throw Error(fmt::format("{} {} only used with --show-schedule", join_flags(extra),
                              extra.size() == 1 ? "is" : "are"),
                  "add --show-schedule gpipe|1f1b|interleaved to draw a schedule, or drop them");
    std::vector<std::string> missing;
    for (const auto* o : needed)
      if (o->count() == 0) missing.push_back(o->get_name());
    if (!missing.empty())
      throw Error(
          fmt::format("{} {} required", join_flags(missing), missing.size() == 1 ? "is" : "are"),
          "plan ranks configurations of --model on --gpus devices of --cluster for "
          "--global-batch; or draw a pipeline schedule with --show-schedule KIND --pp P "
          "--micro-batches M");
    Timer timer;
    auto setup = load_perf_setup(a->model, a->cluster, a->gpus, a->global_batch, a->seq, a->dtype,
                                 a->no_flash, a->no_overlap);
    if (a->top < 1) throw Error("--top must be >= 1");
    const int emit_n = emit_index(emit, a->emit, a->json, a->recompute);
    perf::PlanSearch s;
    s.devices = a->gpus;
    if (!a->grid.empty()) s.grid = perf::parse_grid(a->grid);
    if (a->recompute != "all") s.recompute = {perf::parse_recompute(a->recompute)};
    if (emit_n > 0 && a->recompute == "all")  // what the trainer runs
      s.recompute = train::trainer_plan_search(a->gpus, a->top).recompute;
    for (int z : a->zero)
      if (z < 0 || z > 3) throw Error(fmt::format("--zero: stage {} is not in 0-3", z));
    s.zero_stages = a->zero;
    s.max_micro_batch = a->max_micro_batch;
    s.max_chunks = a->max_chunks;
    s.tensor_3d = !a->one_d;
    s.top = std::max(a->top, emit_n);
    auto res = perf::plan(setup.w, setup.cl, s, setup.o);
    const double secs = timer.seconds();
    if (emit_n > 0 && !res.best.empty()) return emit_set(res, emit_n, setup.w.seq);
    print_plans(res, setup, a->gpus, a->global_batch, a->dtype, a->json, secs);
  });
}

}  // namespace tessera::app
