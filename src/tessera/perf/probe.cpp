#include "tessera/perf/probe.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "tessera/core/buffer.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::perf {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

GemmSample time_gemm(long M, long N, long K, int reps) {
  std::vector<float> A(static_cast<std::size_t>(M * K), 0.5f),
      B(static_cast<std::size_t>(K * N), 0.25f), C(static_cast<std::size_t>(M * N), 0.f);
  auto run = [&] {
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, M, N, K, 1.f, A.data(), K, B.data(), K,
                  0.f, C.data(), N);
  };
  run();  // warm-up (oneDNN JIT, page faults)
  run();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    Timer tm;
    run();
    t.push_back(tm.seconds());
  }
  // the median: what a training step running under the same conditions will see
  GemmSample s{M, N, K, 2.0 * M * N * K / median(t) / 1e9};
  return s;
}

double stream_triad_gbps(int reps) {
  const std::size_t n = std::size_t{1} << 24;  // 3 x 64 MiB
  std::vector<float> a(n, 1.f), b(n, 2.f), c(n, 0.f);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    Timer tm;
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) c[i] = a[i] + 1.5f * b[i];
    if (r > 0) t.push_back(tm.seconds());
  }
  return 3.0 * n * sizeof(float) / median(t) / 1e9;
}

// A /proc/self/status field in GiB ("VmRSS", "VmHWM").
double status_gib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == field + ":") {
      double kb = 0;
      in >> kb;
      return kb / 1048576.0;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

double total_memory_gib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (in >> key) {
    if (key == "MemTotal:") {
      in >> kb;
      return kb / 1048576.0;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 8.0;
}

}  // namespace

double fit_gemm_curve(const std::vector<GemmSample>& s, ClusterSpec& c) {
  double best = 0;
  for (const auto& g : s) best = std::max(best, g.gflops);
  if (s.empty() || best <= 0) return 0;
  c.peak_tflops_fp32 = best / 1e3;
  // eff(M,N,K) = e * f(M) f(N) f(K), f(d) = d/(d+h): for each h, the best e in closed form
  // (least squares on the relative error), h on a grid.
  double best_err = 1e300, best_e = 1, best_h = 0;
  for (double h = 0; h <= 512; h += 2) {
    double num = 0, den = 0;
    for (const auto& g : s) {
      const double shape = g.M / (g.M + h) * g.N / (g.N + h) * g.K / (g.K + h);
      const double meas = g.gflops / best;
      // minimize sum ((e*shape - meas)/meas)^2
      num += shape / meas;
      den += shape * shape / (meas * meas);
    }
    const double e = std::min(1.0, num / den);
    double err = 0;
    for (const auto& g : s) {
      const double shape = g.M / (g.M + h) * g.N / (g.N + h) * g.K / (g.K + h);
      const double meas = g.gflops / best;
      err += std::pow((e * shape - meas) / meas, 2);
    }
    if (err < best_err) {
      best_err = err;
      best_e = e;
      best_h = h;
    }
  }
  c.gemm_max_efficiency = best_e;
  c.gemm_half_dim = best_h;
  return std::sqrt(best_err / s.size());
}

ProbeResult probe_machine(comm::Runtime& rt, const ProbeOptions& o) {
  ProbeResult r;
  const int reps = std::max(1, o.reps);
  // what the process holds before any work (binary, libraries, MPI): not usable by a model
  const double baseline_gib = status_gib("VmRSS");
  // GEMM shapes: squares and the GEMMs of GPT-2-sized layers (rows = tokens of a micro-batch)
  std::vector<std::array<long, 3>> shapes =
      o.quick ? std::vector<std::array<long, 3>>{{128, 128, 128},
                                                 {256, 256, 256},
                                                 {512, 512, 512},
                                                 {256, 768, 256},
                                                 {64, 512, 512}}
              : std::vector<std::array<long, 3>>{
                    {256, 256, 256},   {512, 512, 512},   {1024, 1024, 1024}, {2048, 2048, 2048},
                    {1024, 2304, 768}, {1024, 768, 768},  {1024, 3072, 768},  {1024, 768, 3072},
                    {4096, 2304, 768}, {4096, 768, 3072}, {256, 3072, 768},   {64, 768, 768},
                    {1024, 1024, 64},  {1024, 64, 1024},  {4096, 4096, 4096}};
  for (const auto& sh : shapes) r.gemm.push_back(time_gemm(sh[0], sh[1], sh[2], reps));
  r.memory_bw_gbps = stream_triad_gbps(reps);

  auto& world = rt.world();
  const int p = world.size();
  if (p > 1) {
    std::vector<double> sizes = o.quick
                                    ? std::vector<double>{4096, 1 << 20}
                                    : std::vector<double>{4096, 65536, 1 << 20, 1 << 24, 1 << 26};
    for (double bytes : sizes) {
      const std::size_t n = static_cast<std::size_t>(bytes / 4);
      std::vector<float> buf(n, 1.f);
      world.all_reduce_sum(buf.data(), n);  // warm-up
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) {
        world.barrier();
        Timer tm;
        world.all_reduce_sum(buf.data(), n);
        double dt = tm.seconds();
        double mx = dt;
        world.all_reduce_max(&mx, 1);
        t.push_back(mx);
      }
      const double sec = median(t);
      r.collectives.push_back({"all_reduce", p, bytes, sec, 2.0 * (p - 1) / p * bytes / sec / 1e9});
    }
  }

  // The spec: one rank = one device; all ranks on this node.
  ClusterSpec& c = r.spec;
  c.name = o.name;
  c.description = fmt::format("measured by tessera probe: {} rank(s), {} thread(s) each", p,
                              omp_get_max_threads());
  c.device = fmt::format("cpu-rank ({} threads)", omp_get_max_threads());
  fit_gemm_curve(r.gemm, c);
  c.memory_gib = total_memory_gib() / p;
  c.memory_bw_gbps = r.memory_bw_gbps;
  c.reserved_gib = std::min(std::max(baseline_gib, 0.01), c.memory_gib / 4);
  c.devices_per_node = p;
  c.max_nodes = 1;
  if (p > 1) {
    LinkLevel l;
    l.name = "shared-memory";
    l.group = p;
    double bw = 0;
    for (const auto& s : r.collectives) bw = std::max(bw, s.bus_gbps);
    l.bw_gbps = bw;
    l.efficiency = 1.0;
    // latency per ring step from the smallest message, after its bandwidth term
    const auto& small = r.collectives.front();
    const double steps = 2.0 * (p - 1);
    l.latency_us =
        std::max(0.0, (small.seconds - 2.0 * (p - 1) / p * small.bytes / (bw * 1e9)) / steps * 1e6);
    c.links.push_back(l);
  }
  c.injection_gbps = 0;
  validate(c);
  return r;
}

}  // namespace tessera::perf
