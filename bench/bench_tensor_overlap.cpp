// The overlaps of 3D tensor parallelism, measured under mpirun on every rank:
// one forward + backward of the tensor-parallel model (parallel/tensor_model.hpp) per repetition,
// for each 3-axis grid of the world size given (--grids), with every overlap on, each one off
// alone, and all off. Reported per grid: the median time per pass and its ratio to all-on; the
// communication time with all off (the summed duration of the tensor-axis collectives, all
// blocking then); and the fraction of it that the overlaps hide, (t_off - t_on) / comm_off.
// "all on + GEMM layout tuning" runs the linears through the tuner (tuned in the warm-up pass).
// Also, on rank 0 alone (the others wait), the GEMM layout tuner on the rank's local GEMM shapes:
// direct call against the fastest strategy, summed over one pass.
//
//   scripts/mpirun-local -n 4 build/bench/bench_tensor_overlap [--L 4 --C 512 --H 8 --T 128
//       --B 8 --V 8192 --reps 3 --grids 2x2x1,1x1x4,2x1x2]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/gemm_tuner.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/tensor_model.hpp"

using namespace tessera;

namespace {

struct Args : bench::ModelShape {
  Args() : ModelShape{4, 512, 8, 128, 8, 8192, 3} {}
  std::string grids = "2x2x1,1x1x4,2x1x2";
};

Args parse(int argc, char** argv) {
  Args a;
  bench::Options().add_shape(a).add("grids", a.grids).parse(argc, argv);
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  comm::RuntimeOptions ro;
  ro.collective_timeout_s = 600;
  auto rt = comm::Runtime::create(ro);
  const bool lead = rt->world_rank() == 0;
  model::ModelConfig cfg;
  cfg.n_layer = a.L;
  cfg.n_head = a.H;
  cfg.n_embd = a.C;
  cfg.block_size = a.T;
  cfg.vocab_size = a.V;
  const model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  model::init_params(layout, params.data(), 7);
  std::vector<std::int32_t> x(static_cast<std::size_t>(a.B) * a.T), y(x.size());
  Rng rng(3);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<std::int32_t>(rng.uniform() * a.V) % a.V;
    y[i] = static_cast<std::int32_t>(rng.uniform() * a.V) % a.V;
  }
  model::ForwardOptions fo;
  fo.training = true;
  fo.dloss = 1.0f / static_cast<float>(x.size());
  if (lead)
    std::printf(
        "tensor-parallel forward+backward, %d ranks, L=%d C=%d H=%d T=%d B=%d V=%d, %d reps "
        "(median)\n",
        rt->world_size(), a.L, a.C, a.H, a.T, a.B, a.V, a.reps);

  struct Variant {
    const char* name;
    bool dx, dw, pf, tune = false;
  };
  const Variant variants[] = {{"all on", true, true, true},
                              {"dX all-reduce not overlapped", false, true, true},
                              {"dW reduce-scatter not deferred", true, false, true},
                              {"no tz prefetch", true, true, false},
                              {"all off", false, false, false},
                              {"all on + GEMM layout tuning", true, true, true, true}};

  for (const std::string& g : bench::split_list(a.grids)) {
    int tx = 1, ty = 1, tz = 1;
    if (std::sscanf(g.c_str(), "%dx%dx%d", &tx, &ty, &tz) != 3 ||
        tx * ty * tz != rt->world_size()) {
      if (lead)
        std::printf("skipping grid %s (needs tx*ty*tz = %d)\n", g.c_str(), rt->world_size());
      continue;
    }
    comm::Topology topo(comm::GridShape{1, 1, tx, ty, tz}, rt->world_rank());
    if (lead) std::printf("\ngrid tx=%d ty=%d tz=%d\n", tx, ty, tz);
    double t_on = 0, t_off = 0, comm_off = 0;
    for (const auto& v : variants) {
      parallel::TensorModelOptions opt;
      opt.overlap_dx = v.dx;
      opt.defer_dw = v.dw;
      opt.prefetch = v.pf;
      opt.tune_gemm = v.tune;
      parallel::TensorModel tm(cfg, topo, *rt, opt);
      std::vector<float> lp(tm.local_layout().total()), lg(lp.size(), 0.0f);
      tm.extract(params.data(), lp.data());
      model::FlatStore store(tm.local_layout(), lp.data(), lg.data());
      std::vector<double> times;
      double comm_s = 0;
      for (int r = 0; r <= a.reps; ++r) {
        rt->world().barrier();
        rt->log().reset_volumes();
        Timer t;
        tm.forward(store, x.data(), y.data(), a.B, a.T, fo);
        tm.backward(store, x.data(), a.B, a.T, fo.gemm);
        double s = t.seconds();
        rt->world().all_reduce_max(&s, 1);  // the pass ends when its slowest rank does
        if (r == 0) continue;               // warm-up
        times.push_back(s);
        double c = 0;
        for (const auto& [key, vol] : rt->log().volumes())
          if (key.first != "world") c += vol.seconds;
        rt->world().all_reduce_max(&c, 1);
        comm_s += c / a.reps;
        // With every overlap off, the last repetition's collectives by group and kind (rank 0).
        if (r == a.reps && !v.dx && !v.dw && !v.pf && !v.tune)
          for (const auto& [key, vol] : rt->log().volumes())
            if (key.first != "world" && vol.calls > 0)
              std::printf("    rank %d %-10s %-15s %5llu calls %9.1f MB %8.1f ms (%.2f GB/s)\n",
                          rt->world_rank(), key.first.c_str(), key.second.c_str(),
                          static_cast<unsigned long long>(vol.calls), vol.bytes / 1e6,
                          vol.seconds * 1e3, vol.seconds > 0 ? vol.bytes / vol.seconds / 1e9 : 0.0);
      }
      const double m = median(times);
      if (v.dx && v.dw && v.pf && !v.tune) t_on = m;
      if (!v.dx && !v.dw && !v.pf) t_off = m, comm_off = comm_s;
      if (lead)
        std::printf("  %-32s %8.1f ms  (x%.3f of all on)\n", v.name, m * 1e3,
                    t_on > 0 ? m / t_on : 1.0);
    }
    if (lead)
      std::printf(
          "  communication with all off: %.1f ms per pass (%.0f%% of the pass); hidden by "
          "the overlaps: %.0f%%\n",
          comm_off * 1e3, 100 * comm_off / t_off,
          comm_off > 0 ? 100 * (t_off - t_on) / comm_off : 0.0);
  }

  // The GEMM layout tuner on rank 0's local linear shapes of one pass of the first grid given.
  rt->world().barrier();
  if (lead) {
    int tx = 1, ty = 1, tz = 1;
    std::sscanf(a.grids.c_str(), "%dx%dx%d", &tx, &ty, &tz);
    const std::int64_t n = static_cast<std::int64_t>(a.B) * a.T / tz;
    kernels::GemmTuner tuner;
    double direct = 0, best = 0;
    for (auto [K, transposed] : {std::pair{3, false}, {1, true}, {4, false}, {4, true}}) {
      const std::int64_t in = transposed ? static_cast<std::int64_t>(K) * a.C : a.C;
      const std::int64_t out = transposed ? a.C : static_cast<std::int64_t>(K) * a.C;
      const std::int64_t il = in / (transposed ? ty : tx), ol = out / (transposed ? tx : ty);
      for (const auto& s : {kernels::GemmShape{false, true, n, ol, il},     // forward
                            kernels::GemmShape{false, false, n, il, ol},    // dX
                            kernels::GemmShape{true, false, ol, il, n}}) {  // dW
        tuner.choose(kernels::GemmLibrary::OneDnn, s);
        const auto& rec = tuner.records().back();
        direct += a.L * rec.direct().seconds;
        best += a.L * std::min(rec.direct().seconds, rec.fastest().seconds);
      }
    }
    std::printf(
        "\nGEMM layout tuner, rank 0's linear GEMMs of one pass (grid %s): direct %.1f ms, "
        "fastest strategies %.1f ms, gain %+.1f%%\n",
        a.grids.substr(0, a.grids.find(',')).c_str(), direct * 1e3, best * 1e3,
        100 * (direct / best - 1));
  }
  rt->world().barrier();
  return 0;
}
