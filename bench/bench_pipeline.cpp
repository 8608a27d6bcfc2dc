// The pipeline bubble: each schedule (GPipe, 1F1B, interleaved 1F1B with v = 2) run
// by the executor (parallel/pipeline.hpp) on pp = world-size stages, for several micro-batch
// counts m, against the ideal bubble fractions (pp-1)/m and (pp-1)/(v*m).
//
// Measured per stage: the step time (first instruction to the last) and the time in forward and
// backward compute; bubble = (step - compute) / compute, the ratio the ideal formula gives for
// equal chunk costs and free messages. Reported: the worst stage and the mean over stages (the
// median of --reps steps after a warm-up step). Also the peak activation slots in flight per
// stage against the schedule's formula.
//
//   scripts/mpirun-local -n 4 build/bench/bench_pipeline [--L 8 --C 256 --H 4 --T 64 --B 2
//       --V 512 --reps 3 --ms 4,8,16]
//
// On a CPU with fewer cores than ranks the stages share cores: a waiting stage sleeps (its core
// goes to the others) but stages computing at the same time slow each other, which inflates the
// compute time of the steady state and so understates the bubble; run with ranks <= cores for
// clean figures.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/pipeline.hpp"
#include "tessera/parallel/tensor_model.hpp"

using namespace tessera;

namespace {

struct Args : bench::ModelShape {
  Args() : ModelShape{8, 256, 4, 64, 2, 512, 3} {}
  std::string ms = "4,8,16";
};

Args parse(int argc, char** argv) {
  Args a;
  bench::Options().add_shape(a).add("ms", a.ms).parse(argc, argv);
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  comm::RuntimeOptions ro;
  ro.force_mpi = true;
  auto rt = comm::Runtime::create(ro);
  const int pp = rt->world_size();
  const bool lead = rt->world_rank() == 0;
  model::ModelConfig cfg;
  cfg.n_layer = a.L;
  cfg.n_head = a.H;
  cfg.n_embd = a.C;
  cfg.block_size = a.T;
  cfg.vocab_size = a.V;
  model::validate(cfg);
  const model::ParamLayout global(cfg);
  std::vector<float> params(global.total());
  model::init_params(global, params.data(), 1234);
  std::vector<int> ms;
  for (const auto& m : bench::split_list(a.ms)) ms.push_back(std::atoi(m.c_str()));
  const int max_m = *std::max_element(ms.begin(), ms.end());
  Rng rng(7);
  std::vector<std::vector<std::int32_t>> x(max_m), y(max_m);
  for (int i = 0; i < max_m; ++i) {
    x[i].resize(static_cast<std::size_t>(a.B) * a.T);
    y[i].resize(x[i].size());
    for (std::size_t j = 0; j < x[i].size(); ++j) {
      x[i][j] = static_cast<std::int32_t>(rng.next_u32() % a.V);
      y[i][j] = static_cast<std::int32_t>(rng.next_u32() % a.V);
    }
  }
  comm::Topology topo(comm::GridShape{1, pp, 1, 1, 1}, rt->world_rank());
  comm::Communicator& ppc = rt->group(topo, {comm::Axis::PP});
  if (lead)
    std::printf(
        "pipeline of %d stages, model L=%d C=%d H=%d V=%d, micro-batch %dx%d, 1 thread per "
        "rank\n%-12s %4s %3s  %9s  %8s  %8s  %8s  %s\n",
        pp, a.L, a.C, a.H, a.V, a.B, a.T, "schedule", "m", "v", "step ms", "ideal", "worst", "mean",
        "in flight per stage (formula)");
  for (const auto kind : {parallel::ScheduleKind::GPipe, parallel::ScheduleKind::OneF1B,
                          parallel::ScheduleKind::Interleaved}) {
    const int v = kind == parallel::ScheduleKind::Interleaved ? 2 : 1;
    if (a.L < pp * v) continue;
    const auto split = parallel::balanced_layer_split(a.L, pp * v);
    parallel::TensorModelOptions opt;
    opt.chunks = parallel::stage_chunks(split, pp, v, topo.coord(comm::Axis::PP));
    parallel::TensorModel tm(cfg, topo, *rt, opt);
    std::vector<float> lp(tm.local_layout().total()), lg(lp.size(), 0.0f);
    tm.extract(params.data(), lp.data());
    model::FlatStore store(tm.local_layout(), lp.data(), lg.data());
    for (int m : ms) {
      const parallel::ScheduleSpec spec{kind, pp, m, v};
      if (kind == parallel::ScheduleKind::Interleaved && m % pp != 0) continue;
      parallel::PipelineExecutor ex(tm, ppc, spec);
      std::vector<const std::int32_t*> in(m), tg(m);
      for (int i = 0; i < m; ++i) in[i] = x[i].data(), tg[i] = y[i].data();
      model::ForwardOptions fo;
      fo.training = true;
      fo.dloss = 1.0f / (static_cast<float>(a.B) * a.T * m);
      std::vector<double> worst, mean, step;
      tm.reset_activation_stats();
      for (int r = 0; r <= a.reps; ++r) {
        rt->world().barrier();
        ex.run(store, in, tg, a.B, a.T, fo);
        std::vector<double> b(pp, 0.0);
        b[ex.stage()] = ex.stats().bubble_fraction();
        rt->world().all_reduce_sum(b.data(), b.size());
        double s = ex.stats().step_s;
        rt->world().all_reduce_max(&s, 1);
        if (r == 0) continue;  // warm-up
        worst.push_back(*std::max_element(b.begin(), b.end()));
        double sum = 0;
        for (double f : b) sum += f;
        mean.push_back(sum / pp);
        step.push_back(s);
      }
      std::vector<double> live(pp, 0.0);
      live[ex.stage()] = tm.activation_stats().peak_live;
      rt->world().all_reduce_sum(live.data(), live.size());
      if (lead) {
        std::string fl;
        for (int s = 0; s < pp; ++s)
          fl += (s ? " " : "") + std::to_string(static_cast<int>(live[s])) + "(" +
                std::to_string(parallel::in_flight_formula(spec, s)) + ")";
        std::printf("%-12s %4d %3d  %9.1f  %8.3f  %8.3f  %8.3f  %s\n",
                    parallel::schedule_name(kind), m, v, median(step) * 1e3,
                    parallel::ideal_bubble_fraction(spec), median(worst), median(mean), fl.c_str());
      }
    }
  }
  return 0;
}
