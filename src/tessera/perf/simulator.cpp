#include "tessera/perf/simulator.hpp"

#include "tessera/core/chrome_trace.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::perf {

using parallel::Instr;
using parallel::OpKind;

namespace {

// Replays one pipeline (pp stages). Returns per-stage times and the time each stage reaches its
// OptimizerStep; records events when `events` is not null.
struct PipeReplay {
  std::vector<double> clock;
  std::vector<RankTime> t;
  long instructions = 0;
  bool deadlock = false;
};

// The replay's state and what one instruction does to it.
struct Replayer {
  const parallel::Schedule& sch;
  const Prediction& p;
  std::vector<TraceEvent>* events;
  int max_stages;
  PipeReplay r;
  std::vector<double> arrival;  // of each message (parallel::message_key); NaN: not sent yet

  std::size_t slot(int st, const Instr& in) const {
    return static_cast<std::size_t>(parallel::message_key(sch.spec, st, in));
  }
  void record(int st, const char* cat, const Instr& in, double start, double dur) {
    if (events && st < max_stages && dur > 0)
      events->push_back({0, st, parallel::describe(in), cat, start, dur});
  }
  void compute(int st, const Instr& in) {
    const auto& cc = p.chunk_cost[st][in.chunk];
    const bool f = in.op == OpKind::Forward;
    const double comp = f ? cc.fwd_compute : cc.bwd_compute;
    const double com = f ? cc.fwd_comm : cc.bwd_comm;
    double& clk = r.clock[st];
    record(st, "compute", in, clk, comp);
    record(st, "comm", in, clk + comp, com);
    clk += comp + com;
    r.t[st].busy += comp;
    r.t[st].comm += com;
  }
  // Stage st's instruction in; false (nothing done) for a receive whose message is not sent.
  bool execute(int st, const Instr& in) {
    double& clk = r.clock[st];
    switch (in.op) {
      case OpKind::Forward:
      case OpKind::Backward:
        compute(st, in);
        break;
      case OpKind::SendAct:
      case OpKind::SendGrad:
        arrival[slot(st, in)] = clk + p.p2p_s;
        break;
      case OpKind::RecvAct:
      case OpKind::RecvGrad: {
        const double at = arrival[slot(st, in)];
        if (std::isnan(at)) return false;
        if (at > clk) {
          record(st, "idle", in, clk, at - clk);
          r.t[st].idle += at - clk;
          clk = at;
        }
        break;
      }
      case OpKind::OptimizerStep:
        break;
    }
    return true;
  }
};

// Runs each stage's instructions until it waits for a message, stage after stage, until none
// can go on; the OptimizerStep each ends with is the caller's (a data-parallel collective).
PipeReplay replay_pipeline(const parallel::Schedule& sch, const Prediction& p,
                           std::vector<TraceEvent>* events, int max_stages) {
  const int pp = sch.spec.pp;
  const auto messages = static_cast<std::size_t>(2) * pp * sch.spec.v * sch.spec.m;
  Replayer x{sch,    p,
             events, max_stages,
             {},     std::vector<double>(messages, std::numeric_limits<double>::quiet_NaN())};
  x.r.clock.assign(pp, 0.0);
  x.r.t.assign(pp, RankTime{});
  std::vector<std::size_t> pc(pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < pp; ++st)
      for (const auto& list = sch.ranks[st]; pc[st] < list.size(); ++pc[st]) {
        const Instr& in = list[pc[st]];
        if (in.op == OpKind::OptimizerStep || !x.execute(st, in)) break;
        ++x.r.instructions;
        progress = true;
      }
  }
  for (int st = 0; st < pp; ++st)
    if (pc[st] + 1 != sch.ranks[st].size()) x.r.deadlock = true;
  return x.r;
}

// Shared cores (the model's rule): the replay ran at the every-stage-busy rate; a stage runs up to
// 1/share faster while others idle, and the node cannot do more than its cores: each stage ends
// at the longer of its full-speed end and the mean stage's work. (The trace keeps the
// every-stage-busy timeline.)
void share_cores(PipeReplay& r, double compute_share) {
  const auto pp = r.t.size();
  double work = 0;
  for (const auto& t : r.t) work += t.busy + t.comm;
  work /= static_cast<double>(pp);
  for (std::size_t st = 0; st < pp; ++st) {
    auto& t = r.t[st];
    const double end = std::max(compute_share * r.clock[st], work);
    const double bc = t.busy + t.comm;
    if (bc > end) t.busy *= end / bc, t.comm *= end / bc;  // ran faster than listed
    t.idle = end - t.busy - t.comm;
    r.clock[st] = end;
  }
}

// The OptimizerStep after the pipelines' replays (`ready`: each pipeline's stage clocks): the
// data-parallel group of each (stage, tensor coordinate) starts its reduction when its last
// member arrives. Adds each rank's wait, reduction and update to `res`; returns each rank's end.
std::vector<double> optimizer_steps(const Prediction& p,
                                    const std::vector<std::vector<double>>& ready, SimResult& res,
                                    std::vector<TraceEvent>* events, int max_stages) {
  const auto& g = p.point.grid;
  const long T = static_cast<long>(g.tx) * g.ty * g.tz;
  std::vector<double> end(static_cast<std::size_t>(g.world_size()), 0);
  for (long inner = 0; inner < T; ++inner)
    for (int st = 0; st < g.pp; ++st) {
      double start = 0;
      for (long d = 0; d < g.dp; ++d)
        start = std::max(start, ready[static_cast<std::size_t>(inner + T * d)][st]);
      const double dp =
          (p.dp_s.empty() ? 0 : p.dp_s[st]) + (st == 0 || st == g.pp - 1 ? p.tied_s : 0);
      for (long d = 0; d < g.dp; ++d) {
        const long rank = inner + T * (st + static_cast<long>(g.pp) * d);
        auto& rt = res.ranks[static_cast<std::size_t>(rank)];
        rt.idle += start - ready[static_cast<std::size_t>(inner + T * d)][st];
        rt.comm += dp;
        rt.busy += p.optimizer_s;
        end[static_cast<std::size_t>(rank)] = start + dp + p.optimizer_s;
        ++res.instructions;
      }
      if (inner == 0 && events && st < max_stages) {
        parallel::Instr opt{OpKind::OptimizerStep, -1, 0, -1};
        if (dp > 0) events->push_back({0, st, "dp-reduce", "comm", start, dp});
        events->push_back({0, st, parallel::describe(opt), "optimizer", start + dp, p.optimizer_s});
      }
    }
  return end;
}

}  // namespace

void check_replay_size(const Prediction& p) {
  const auto& g = p.point.grid;
  const int v =
      p.point.schedule == parallel::ScheduleKind::Interleaved ? p.point.virtual_stages : 1;
  const double per_stage = static_cast<double>(p.micro_batches) * v;
  const double schedule = per_stage * g.pp, replay = per_stage * g.world_size();
  if (schedule > k_max_schedule_slots || replay > k_max_replay_slots)
    throw Error(fmt::format("simulating {} micro-batches x {} chunk(s) on {} ranks in {} stages "
                            "is beyond the replay's limits ({} per stage list, {:.3g} in all)",
                            p.micro_batches, v, g.world_size(), g.pp, k_max_schedule_slots,
                            k_max_replay_slots),
                "use a smaller --global-batch, or a larger --micro-batch or data-parallel size");
}

SimResult simulate(const Prediction& p, const TraceOptions& trace) {
  const auto& g = p.point.grid;
  TESSERA_CHECK(static_cast<int>(p.chunk_cost.size()) == g.pp, "prediction without chunk costs");
  const int v =
      p.point.schedule == parallel::ScheduleKind::Interleaved ? p.point.virtual_stages : 1;
  const auto sch = parallel::make_schedule({p.point.schedule, g.pp, p.micro_batches, v});
  const long T = static_cast<long>(g.tx) * g.ty * g.tz;
  const long pipelines = T * g.dp;
  SimResult res;
  res.ranks.assign(static_cast<std::size_t>(g.world_size()), RankTime{});
  std::vector<TraceEvent> events;
  const bool traced_any = !trace.path.empty() || trace.keep_events;
  // Every pipeline (one per dp, tx, ty, tz coordinate) replays its lists.
  std::vector<std::vector<double>> ready(static_cast<std::size_t>(pipelines));
  for (long q = 0; q < pipelines; ++q) {
    const bool traced = q == 0 && traced_any;
    auto r = replay_pipeline(sch, p, traced ? &events : nullptr, trace.max_ranks);
    if (p.compute_share < 1 && g.pp > 1) share_cores(r, p.compute_share);
    res.instructions += r.instructions;
    res.deadlock = res.deadlock || r.deadlock;
    const long inner = q % T, dpc = q / T;
    for (int st = 0; st < g.pp; ++st) {
      const long rank = inner + T * (st + static_cast<long>(g.pp) * dpc);
      res.ranks[static_cast<std::size_t>(rank)] = r.t[st];
    }
    ready[static_cast<std::size_t>(q)] = std::move(r.clock);
  }
  const auto end = optimizer_steps(p, ready, res, traced_any ? &events : nullptr, trace.max_ranks);
  for (double e : end) res.step_s = std::max(res.step_s, e);
  for (std::size_t i = 0; i < res.ranks.size(); ++i) res.ranks[i].idle += res.step_s - end[i];
  res.stages.resize(static_cast<std::size_t>(g.pp));
  for (int st = 0; st < g.pp; ++st)
    res.stages[static_cast<std::size_t>(st)] = res.ranks[static_cast<std::size_t>(T * st)];
  if (!trace.path.empty()) write_chrome_trace(trace.path, events, p.point.describe());
  if (trace.keep_events) res.events = std::move(events);
  return res;
}

}  // namespace tessera::perf
