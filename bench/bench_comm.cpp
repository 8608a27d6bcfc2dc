// Communicator bandwidth against raw MPI calls on the same buffers (run under mpirun).
//   mpirun -n 2 bench_comm [--sizes 1048576,16777216] [--reps 10]
// Reports, per size: bus bandwidth of tessera's all_reduce / reduce_scatter and of
// MPI_Allreduce / MPI_Reduce_scatter_block, and their ratio (goal >= 0.95). The two are
// alternated rep by rep so that both see the same machine conditions; medians are compared.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/comm/runtime.hpp"

using namespace tessera;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes = {1 << 20, 1 << 24};
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) sizes.push_back(std::stoull(t));
    } else {
      std::fprintf(stderr, "usage: mpirun -n N bench_comm [--sizes a,b,...] [--reps R]\n");
      return 2;
    }
  }
  comm::RuntimeOptions ro;
  ro.force_mpi = true;
  auto rt = comm::Runtime::create(ro);
  auto& w = rt->world();
  const int n = w.size();
  if (rt->world_rank() == 0)
    std::printf(
        "%d ranks; bus bandwidth = bytes * 2(n-1)/n / time (all-reduce), bytes * (n-1)/n / time "
        "(reduce-scatter)\n",
        n);
  for (std::size_t count : sizes) {
    count = count / n * n;
    std::vector<float> buf(count, 1.0f), out(count / n);
    std::vector<double> t_ar, t_mpi_ar, t_rs, t_mpi_rs;
    for (int r = 0; r < reps + 1; ++r) {
      auto timed = [&](auto&& f) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        f();
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return t;
      };
      auto ours_ar = [&] { return timed([&] { w.all_reduce_sum(buf.data(), count); }); };
      auto mpi_ar = [&] {
        return timed([&] {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        });
      };
      auto ours_rs = [&] {
        return timed([&] { w.reduce_scatter_sum(buf.data(), out.data(), count / n); });
      };
      auto mpi_rs = [&] {
        return timed([&] {
          MPI_Reduce_scatter_block(buf.data(), out.data(), static_cast<int>(count / n), MPI_FLOAT,
                                   MPI_SUM, MPI_COMM_WORLD);
        });
      };
      // Alternate which of the pair goes first, so neither always pays a first-touch cost.
      double a, b, c, d;
      if (r % 2) {
        a = ours_ar(), b = mpi_ar(), c = ours_rs(), d = mpi_rs();
      } else {
        b = mpi_ar(), a = ours_ar(), d = mpi_rs(), c = ours_rs();
      }
      std::fill(buf.begin(), buf.end(), 1.0f);  // keep values finite
      if (r == 0) continue;                     // warm-up
      t_ar.push_back(a), t_mpi_ar.push_back(b), t_rs.push_back(c), t_mpi_rs.push_back(d);
    }
    if (rt->world_rank() == 0) {
      double bytes = count * 4.0;
      double ar = bytes * 2 * (n - 1) / n / median(t_ar) / 1e9,
             mar = bytes * 2 * (n - 1) / n / median(t_mpi_ar) / 1e9;
      double rs = bytes * (n - 1) / n / median(t_rs) / 1e9,
             mrs = bytes * (n - 1) / n / median(t_mpi_rs) / 1e9;
      std::printf(
          "%10zu floats (%7.1f MB): all_reduce %6.2f GB/s vs MPI %6.2f GB/s (ratio %.3f) | "
          "reduce_scatter %6.2f GB/s vs MPI %6.2f GB/s (ratio %.3f)\n",
          count, bytes / 1e6, ar, mar, ar / mar, rs, mrs, rs / mrs);
    }
  }
  return 0;
}
