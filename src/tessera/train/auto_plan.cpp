#include "tessera/train/auto_plan.hpp"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/perf/probe.hpp"
#include "tessera/perf/report.hpp"

namespace tessera::train {

perf::ModelOptions trainer_model_options(const RunConfig& cfg) {
  perf::ModelOptions options;
  // bf16: the GEMMs at the cluster's bf16 rate, everything else kept as the CPU trainer keeps it
  options.dtype = cfg.train.precision == "bf16" ? perf::DType::BF16 : perf::DType::FP32;
  options.fp32_storage = true;
  options.bf16_grad_reduce = cfg.parallel.grad_reduce == "bf16";
  options.bf16_pipeline = cfg.parallel.pipeline_dtype == "bf16";
  options.bf16_tensor = cfg.parallel.tensor_dtype == "bf16";
  options.pp_scatter_gather = false;  // each tensor rank sends its own block of activations
  return options;
}

perf::PlanSearch trainer_plan_search(int devices, int top) {
  perf::PlanSearch s;
  s.devices = devices;
  s.recompute = {perf::Recompute::None, perf::Recompute::Full};
  s.top = top;
  return s;
}

long run_global_batch(const RunConfig& cfg) {
  const auto& tc = cfg.train;
  return tc.global_batch > 0 ? tc.global_batch
                             : static_cast<long>(tc.batch_size) * tc.grad_accum * cfg.parallel.dp;
}

perf::Workload run_workload(const RunConfig& cfg, const model::ModelConfig& mcfg) {
  return perf::Workload{mcfg, cfg.train.seq_len, run_global_batch(cfg)};
}

std::vector<std::string> plan_overrides(const perf::PlanPoint& p, int seq) {
  if (p.recompute == perf::Recompute::Selective)
    throw Error(fmt::format("plan {} uses selective recomputation, which the trainer does not run",
                            p.describe()),
                "plan with --recompute none or full (parallel.recompute is full recomputation)");
  const auto& g = p.grid;
  std::vector<std::string> keys = {
      fmt::format("parallel.dp={}", g.dp),
      fmt::format("parallel.pp={}", g.pp),
      fmt::format("parallel.tx={}", g.tx),
      fmt::format("parallel.ty={}", g.ty),
      fmt::format("parallel.tz={}", g.tz),
      fmt::format("parallel.zero={}", p.zero),
      fmt::format("parallel.recompute={}", p.recompute == perf::Recompute::Full),
      fmt::format("parallel.sequence_parallel={}", p.sequence_parallel),
      fmt::format("parallel.schedule={}", parallel::schedule_name(p.schedule)),
      fmt::format("parallel.virtual_stages={}", p.chunks())};
  if (g.pp > 1) keys.push_back("parallel.pp_layers=");
  keys.push_back(fmt::format("train.global_batch={}", p.global_batch()));
  keys.push_back(fmt::format("train.grad_accum={}", p.micro_batches));
  keys.push_back(fmt::format("train.seq_len={}", seq));
  return keys;
}

std::string plan_set_line(const perf::PlanPoint& p, int seq) {
  return fmt::format("--set {}", fmt::join(plan_overrides(p, seq), " "));
}

std::string plan_toml_fragment(const perf::PlanPoint& p, int seq) {
  std::string out, section;
  for (const auto& key : plan_overrides(p, seq)) {
    const auto dot = key.find('.'), eq = key.find('=');
    const std::string sec = key.substr(0, dot), name = key.substr(dot + 1, eq - dot - 1),
                      value = key.substr(eq + 1);
    if (sec != section) out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", sec);
    section = sec;
    const bool bare =
        value == "true" || value == "false" ||
        (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos);
    out += fmt::format("{} = {}\n", name, bare ? value : "\"" + value + "\"");
  }
  return out;
}

RunConfig apply_plan(const RunConfig& cfg, const perf::PlanPoint& p,
                     const std::vector<std::string>& extra) {
  auto keys = plan_overrides(p, cfg.train.seq_len);
  keys.push_back("parallel.auto=false");
  keys.insert(keys.end(), extra.begin(), extra.end());
  return parse_run_config(to_toml(cfg), cfg.source, keys);
}

namespace {

// Whether a cluster holds `ranks` devices.
bool holds(const perf::ClusterSpec& c, int ranks) {
  return c.max_nodes == 0 || (ranks + c.devices_per_node - 1) / c.devices_per_node <= c.max_nodes;
}

// This machine measured by the probe's quick pass, every rank given rank 0's file (the ranks'
// measurements differ a little, and every rank must plan the same).
perf::ClusterSpec quick_probe(comm::Runtime& rt) {
  perf::ProbeOptions o;
  o.name = "this-machine";
  o.quick = true;
  const perf::ProbeResult r = perf::probe_machine(rt, o);
  std::string text = rt.world_rank() == 0 ? perf::to_toml(r.spec) : std::string();
  std::uint64_t n = text.size();
  rt.world().broadcast_bytes(&n, sizeof n, 0);
  text.resize(n);
  rt.world().broadcast_bytes(text.data(), n, 0);
  return perf::parse_cluster(text, "tessera probe --quick (this run)");
}

}  // namespace

PredictionCluster planning_cluster(const RunConfig& cfg, comm::Runtime& rt) {
  PredictionCluster found = find_prediction_cluster(cfg);  // an explicit file must load
  const int ranks = rt.world_size();
  if (!cfg.hardware.cluster.empty() || (found.spec && holds(*found.spec, ranks))) return found;
  if (rt.world_rank() == 0)
    log_info("planning: {}; measuring this machine on {} rank{} (tessera probe --quick)",
             found.spec
                 ? fmt::format("{} describes fewer than {} devices", found.path.string(), ranks)
                 : std::string("no cluster file (hardware.cluster, or tessera probe's "
                               "configs/clusters/this-machine.toml)"),
             ranks, ranks == 1 ? "" : "s");
  return PredictionCluster{"tessera probe --quick (this run)", quick_probe(rt)};
}

perf::PlanResult plan_for_run(const RunConfig& cfg, const model::ModelConfig& mcfg, int world_size,
                              const perf::ClusterSpec& cluster, int top) {
  const perf::Workload w = run_workload(cfg, mcfg);
  perf::PlanSearch search = trainer_plan_search(world_size, top);
  if (cfg.hardware.device == "cuda") {  // what the GPU step runs: data parallelism alone
    search.grid = comm::GridShape{world_size, 1, 1, 1, 1};
    search.zero_stages = {0};
    search.recompute = {perf::Recompute::None};
  }
  perf::PlanResult res = perf::plan(w, cluster, search, trainer_model_options(cfg));
  if (res.best.empty())
    throw Error(fmt::format("no configuration of {} with {} sequences of {} tokens per step fits "
                            "{} ranks of {} ({} considered)",
                            model::describe(mcfg), w.global_batch, w.seq, world_size, cluster.name,
                            res.considered),
                "lower train.global_batch or train.seq_len, use a smaller model, or launch more "
                "ranks");
  return res;
}

AutoPlan resolve_auto_plan(const RunConfig& cfg, const model::ModelConfig& mcfg,
                           comm::Runtime& rt) {
  AutoPlan a{cfg, planning_cluster(cfg, rt)};
  const perf::PlanResult res = plan_for_run(cfg, mcfg, rt.world_size(), *a.cluster.spec, 1);
  const perf::Prediction& best = res.best.front();
  a.cfg = apply_plan(cfg, best.point);
  if (rt.world_rank() == 0)
    log_info(
        "parallel.auto: {} of {} configurations fit {} rank{} of {}; chose {}: predicted {} per "
        "step, {:.1f} MB per rank",
        res.feasible, res.considered, rt.world_size(), rt.world_size() == 1 ? "" : "s",
        a.cluster.path.string(), best.point.describe(), perf::format_seconds(best.step_s),
        best.memory.total() / 1e6);
  return a;
}

}  // namespace tessera::train
