#include "tessera/perf/planner.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::perf {

using parallel::ScheduleKind;

namespace {
using parallel::divisors;

// Every choice of one grid: ZeRO stage, micro-batch, schedule and chunks, recomputation and
// sequence parallelism (tx alone). Each point is checked by infeasible_reason (the trainer's
// rules, parallel/plan.hpp) and predicted; those that fit go to `fit`.
template <class Reject>
void search_grid(const Workload& w, const ClusterSpec& c, const PlanSearch& s,
                 const ModelOptions& o, const comm::GridShape& g, Reject& reject, PlanResult& res,
                 std::vector<Prediction>& fit) {
  const long per_dp = w.global_batch / g.dp;
  const bool try_sp = s.sequence_parallel && g.tx > 1 && g.ty == 1 && g.tz == 1;
  for (int zero : s.zero_stages) {
    if (g.dp == 1 && zero > 0) continue;  // identical to stage 0
    // mb in a long: doubling past the largest int must end the loop, not wrap around
    for (long mb = 1; mb <= s.max_micro_batch && mb <= per_dp; mb *= 2) {
      if (per_dp % mb != 0) continue;
      for (ScheduleKind k : s.schedules) {
        if (g.pp == 1 && k != ScheduleKind::OneF1B) continue;
        std::vector<int> vs = {1};
        if (k == ScheduleKind::Interleaved) {
          vs.clear();
          // More chunks than layers leaves a chunk empty, which the trainer refuses.
          for (int v = 2; v <= std::min(s.max_chunks, w.cfg.n_layer); ++v) vs.push_back(v);
        }
        for (int v : vs) {
          if (!s.uneven_splits && w.cfg.n_layer % (g.pp * v) != 0) continue;  // not searched
          for (Recompute rc : s.recompute)
            for (int sp = 0; sp <= (try_sp ? 1 : 0); ++sp) {
              PlanPoint p;
              p.grid = g;
              p.zero = zero;
              p.micro_batch = static_cast<int>(mb);
              p.micro_batches = static_cast<int>(per_dp / mb);
              p.schedule = k;
              p.virtual_stages = v;
              p.recompute = rc;
              p.sequence_parallel = sp == 1;
              if (auto why = infeasible_reason(w, p, c); !why.empty()) {
                reject(why);
                continue;
              }
              Prediction pr = predict(w, p, c, o);
              ++res.considered;
              if (!pr.fits) {
                res.rejected["out of memory"]++;
                continue;
              }
              ++res.feasible;
              pr.chunk_cost.clear();  // the planner's table does not need them
              pr.dp_s.clear();
              fit.push_back(std::move(pr));
            }
        }
      }
    }
  }
}
}  // namespace

void check_devices(long n, const std::string& flag) {
  if (n < 1) throw Error(fmt::format("{} must be >= 1 (got {})", flag, n));
  if (n > k_max_devices)
    throw Error(fmt::format("{} {} is more than the {} devices (2^20) the planner takes", flag, n,
                            k_max_devices),
                "no machine has more; plan a smaller job");
}

void check_global_batch(long batch, const std::string& flag) {
  if (batch < 1 || batch > k_max_global_batch)
    throw Error(
        fmt::format("{} must be in [1, {}] sequences (got {})", flag, k_max_global_batch, batch),
        batch < 1 ? "" : "the performance model counts micro-batches per step in an int");
}

std::vector<comm::GridShape> enumerate_grids(int devices) {
  std::vector<comm::GridShape> out;
  for (int tx : divisors(devices))
    for (int ty : divisors(devices / tx))
      for (int tz : divisors(devices / tx / ty))
        for (int pp : divisors(devices / tx / ty / tz))
          out.push_back({devices / (tx * ty * tz * pp), pp, tx, ty, tz});
  return out;
}

PlanResult plan(const Workload& w, const ClusterSpec& c, const PlanSearch& s,
                const ModelOptions& o) {
  check_devices(s.devices, "--gpus");
  check_global_batch(w.global_batch, "--global-batch");
  if (w.seq < 1) throw Error("--seq must be >= 1");
  if (s.max_micro_batch < 1)
    throw Error(fmt::format("--max-micro-batch must be >= 1 (got {})", s.max_micro_batch));
  if (s.max_chunks < 1)
    throw Error(fmt::format("--max-chunks must be >= 1 (got {})", s.max_chunks),
                "1 searches no interleaved schedule");
  if (c.max_nodes > 0 && (s.devices + c.devices_per_node - 1) / c.devices_per_node > c.max_nodes)
    throw Error(
        fmt::format("{} devices need more than the {} nodes of {}", s.devices, c.max_nodes, c.name),
        "use fewer devices or another cluster file");
  if (s.grid && s.grid->world_size() != s.devices)
    throw Error(fmt::format("grid {} has {} devices, not {}", s.grid->describe(),
                            s.grid->world_size(), s.devices));
  PlanResult res;
  std::vector<comm::GridShape> grids =
      s.grid ? std::vector<comm::GridShape>{*s.grid} : enumerate_grids(s.devices);
  auto reject = [&](const std::string& why, long n = 1) {
    res.rejected[why] += n;
    res.considered += n;
  };
  std::vector<Prediction> fit;
  for (const auto& g : grids) {
    if (!s.tensor_3d && (g.tz > 1 || (g.tx > 1 && g.ty > 1))) continue;
    if (w.global_batch % g.dp != 0) {
      reject("global batch not divisible by dp");
      continue;
    }
    // The grid's own rules first (one rejection per grid): the plan with its smallest valid
    // micro-batch and no other choice made.
    PlanPoint base;
    base.grid = g;
    base.micro_batch = g.tz;
    if (auto why = parallel::plan_infeasible_reason(w.cfg, base)) {
      reject(why->reason);
      continue;
    }
    search_grid(w, c, s, o, g, reject, res, fit);
  }
  const std::size_t k =
      std::min<std::size_t>(fit.size(), static_cast<std::size_t>(std::max(s.top, 1)));
  auto faster = [](const Prediction& a, const Prediction& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    return a.memory.total() < b.memory.total();
  };
  std::partial_sort(fit.begin(), fit.begin() + static_cast<long>(k), fit.end(), faster);
  fit.resize(k);
  res.best = std::move(fit);
  return res;
}

}  // namespace tessera::perf
