// The planner seen from the trainer: which of the planner's configurations the trainer runs, the
// run-config keys that set one (tessera plan --emit-set, tessera tune's fragment), and
// parallel.auto = true, where a run plans its own configuration for the ranks it is launched
// with. The plans come from perf::plan with the options the trainer's own prediction uses
// (fp32, each tensor rank sends its own block of activations between pipeline stages).
#pragma once

#include <string>
#include <vector>

#include "tessera/model/config.hpp"
#include "tessera/perf/model.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/run_setup.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::train {

// The options of the performance model that describe the trainer's step on the CPU, in the run's
// precision and gradient reduction.
perf::ModelOptions trainer_model_options(const RunConfig& cfg);

// The planner's search restricted to what the trainer runs (no selective recomputation: the
// trainer's parallel.recompute is full recomputation), keeping the `top` fastest.
perf::PlanSearch trainer_plan_search(int devices, int top);

// The sequences per optimizer step of a run: train.global_batch, else batch_size x grad_accum x
// parallel.dp.
long run_global_batch(const RunConfig& cfg);

// The workload the planner costs for a run: its model, sequence length and global batch.
perf::Workload run_workload(const RunConfig& cfg, const model::ModelConfig& mcfg);

// The run-config keys ("section.key=value") that make a run take plan `p` for `seq`-token
// sequences: the grid, ZeRO stage, recomputation, sequence parallelism, schedule and chunks (and
// an empty parallel.pp_layers, the balanced split the planner costs, when pp > 1), then
// train.global_batch, grad_accum (the plan's micro-batches) and seq_len.
std::vector<std::string> plan_overrides(const perf::PlanPoint& p, int seq);
// The same as one line to paste after `tessera train CONFIG`: "--set parallel.dp=2 ...".
std::string plan_set_line(const perf::PlanPoint& p, int seq);
// The same as a run-config fragment: a [parallel] and a [train] section.
std::string plan_toml_fragment(const perf::PlanPoint& p, int seq);

// `cfg` with plan `p`'s keys set (and parallel.auto off: the result is the run that plans
// chose), then `extra` keys ("section.key=value"), validated like --set overrides.
RunConfig apply_plan(const RunConfig& cfg, const perf::PlanPoint& p,
                     const std::vector<std::string>& extra = {});

// The cluster a run plans on: hardware.cluster when set; else the file `tessera probe` writes
// (configs/clusters/this-machine.toml) when it describes at least `world_size` devices on one
// node; else this machine measured now by the probe's quick pass (collective: every rank calls
// it; a few seconds).
PredictionCluster planning_cluster(const RunConfig& cfg, comm::Runtime& rt);

// The planner's fastest configurations of `cfg`'s run on the runtime's ranks (top k), on
// `cluster`, among those its device runs (on a GPU: data parallelism alone, no ZeRO, no
// recomputation); throws tessera::Error when none fits.
perf::PlanResult plan_for_run(const RunConfig& cfg, const model::ModelConfig& mcfg, int world_size,
                              const perf::ClusterSpec& cluster, int top);

// parallel.auto = true: the run with the fastest configuration that fits set (logged on the lead
// rank with its prediction), and the cluster it was planned on. Collective (planning_cluster).
struct AutoPlan {
  RunConfig cfg;
  PredictionCluster cluster;
};
AutoPlan resolve_auto_plan(const RunConfig& cfg, const model::ModelConfig& mcfg, comm::Runtime& rt);

}  // namespace tessera::train
