// Timings of the planner and the simulator at scale (targets: `tessera plan` for the
// 1T model on 3072 devices in <= 5 s; `tessera simulate` of a 3072-device 1F1B step in <= 10 s).
// Run from the repository root (reads configs/). Prints medians of --reps runs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tessera/core/timer.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/simulator.hpp"

using namespace tessera::perf;

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto one_t = load_model_spec("configs/models/gpt-1t.toml");
  auto meg_1t = load_model_spec("configs/models/megatron-1t.toml");
  for (const char* cl : {"frontier", "selene"}) {
    auto c = load_cluster(std::string("configs/clusters/") + cl + ".toml");
    Workload w{one_t.cfg, 2048, 3072};
    PlanSearch s;
    s.devices = 3072;
    s.top = 10;
    std::vector<double> t;
    PlanResult r;
    for (int i = 0; i < reps; ++i) {
      tessera::Timer tm;
      r = plan(w, c, s);
      t.push_back(tm.seconds());
    }
    std::printf(
        "plan gpt-1t on 3072 x %s: %.3f s (median of %d; limit 5 s), %ld configurations, "
        "%ld fit, best %s\n",
        cl, median(t), reps, r.considered, r.feasible,
        r.best.empty() ? "-" : r.best[0].point.describe().c_str());
  }
  {
    auto c = load_cluster("configs/clusters/selene.toml");
    Workload w{meg_1t.cfg, 2048, 3072};
    PlanPoint p;
    p.recompute = Recompute::Full;  // the point's former default
    p.grid = tessera::comm::GridShape{6, 64, 1, 8, 1};
    p.micro_batch = 1;
    p.schedule = tessera::parallel::ScheduleKind::OneF1B;
    auto pred = predict(w, p, c);
    std::vector<double> t;
    SimResult r;
    for (int i = 0; i < reps; ++i) {
      tessera::Timer tm;
      r = simulate(pred);
      t.push_back(tm.seconds());
    }
    std::printf(
        "simulate megatron-1t 1F1B on 3072 x selene (dp=6 pp=64 ty=8, 512 micro-batches): "
        "%.3f s (median of %d; limit 10 s), %ld instructions, step %.2f s\n",
        median(t), reps, r.instructions, r.step_s);
  }
  return 0;
}
