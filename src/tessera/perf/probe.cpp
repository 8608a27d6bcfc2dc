#include "tessera/perf/probe.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "tessera/core/buffer.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::perf {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

GemmSample time_gemm(long M, long N, long K, int reps) {
  return {M, N, K,
          kernels::measure_gemm_gflops(kernels::GemmLibrary::OneDnn, true, M, N, K, reps, 0.0)};
}

double stream_triad_gbps(int reps) {
  // An in-place triad, a += s * b, over 2 x 64 MiB: two reads and one write per element, all of
  // which move (a store to a line not read first would also read it: STREAM's c = a + s * b
  // moves 4 arrays and counts 3). The model counts element reads + writes the same way (AdamW's
  // 28 bytes per parameter: 4 reads, 3 writes of lines it has read).
  const std::size_t n = std::size_t{1} << 24;
  std::vector<float> a(n, 1.f), b(n, 2.f);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    Timer tm;
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) a[i] += 1e-3f * b[i];
    if (r > 0) t.push_back(tm.seconds());
  }
  return 3.0 * n * sizeof(float) / median(t) / 1e9;
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

namespace {

// Least squares on the relative error over `s` with the peak `best`: sets e and h of the best
// fit, returns its sum of squared relative errors.
double fit_curve(const std::vector<GemmSample>& s, double best, double& best_e, double& best_h) {
  // eff(M,N,K) = e * f(M) f(N) f(K), f(d) = d/(d+h): for each h, the best e in closed form
  // (least squares on the relative error), h on a grid.
  double best_err = 1e300;
  best_e = 1;
  best_h = 0;
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
  return best_err;
}

}  // namespace

double fit_gemm_curve(const std::vector<GemmSample>& s, ClusterSpec& c) {
  double best = 0;
  for (const auto& g : s) best = std::max(best, g.gflops);
  if (s.empty() || best <= 0) return 0;
  c.peak_tflops_fp32 = best / 1e3;
  double e = 1, h = 0;
  std::vector<GemmSample> kept = s;
  double err = fit_curve(kept, best, e, h);
  // A sample far off the curve (a thread wake-up or a page fault inside a short timing on a
  // shared machine) can pull a relative-error fit far off: fit again without each sample in turn
  // and drop the one whose removal fits the others at least 4x better per sample; repeat, at
  // most a quarter of the samples.
  while (kept.size() >= 5 && 4 * (kept.size() - 1) >= 3 * s.size()) {
    double best_loo = 1e300, le = e, lh = h;
    std::size_t drop = 0;
    for (std::size_t i = 0; i < kept.size(); ++i) {
      std::vector<GemmSample> rest;
      for (std::size_t j = 0; j < kept.size(); ++j)
        if (j != i) rest.push_back(kept[j]);
      double e2 = 1, h2 = 0;
      const double err2 = fit_curve(rest, best, e2, h2) / rest.size();
      if (err2 < best_loo) best_loo = err2, le = e2, lh = h2, drop = i;
    }
    if (!(best_loo * 4 < err / kept.size())) break;
    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(drop));
    e = le, h = lh, err = best_loo * kept.size();
  }
  c.gemm_max_efficiency = e;
  c.gemm_half_dim = h;
  return std::sqrt(err / kept.size());
}

namespace {

// The GEMM rates: squares and the GEMMs of GPT-2-sized layers (rows = tokens of a micro-batch:
// 512, 1024, 4096), forward (tokens x out x in) and the weight gradient's (out x in x tokens).
std::vector<GemmSample> probe_gemms(const ProbeOptions& o, int reps, bool show) {
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
                    {1024, 1024, 64},  {1024, 64, 1024},  {4096, 4096, 4096}, {512, 2304, 768},
                    {512, 3072, 768},  {512, 768, 3072},  {2304, 768, 512},   {3072, 768, 512}};
  {
    // Start the thread pool and the GEMM library's kernels before the first timed shape (the
    // first calls of a process run far slower).
    Timer warm;
    while (warm.seconds() < (o.quick ? 0.02 : 0.2)) time_gemm(512, 512, 512, 1);
  }
  std::vector<GemmSample> gemm;
  std::optional<Progress> bar;  // the lead rank's, after a second
  if (show) bar.emplace("probe: GEMM shapes", static_cast<std::int64_t>(shapes.size()), 1.0);
  for (const auto& sh : shapes) {
    gemm.push_back(time_gemm(sh[0], sh[1], sh[2], reps));
    if (bar)
      bar->update(static_cast<std::int64_t>(gemm.size()),
                  fmt::format("{}x{}x{}: {:.0f} GFLOP/s", sh[0], sh[1], sh[2], gemm.back().gflops));
  }
  if (bar) bar->finish();
  return gemm;
}

// bf16 GEMMs at a few of the fp32 shapes (GPT-2 layers' forward and weight gradient).
std::vector<GemmSample> probe_bf16_gemms(const ProbeOptions& o, int reps) {
  const std::vector<std::array<long, 3>> shapes =
      o.quick ? std::vector<std::array<long, 3>>{{512, 512, 512}}
              : std::vector<std::array<long, 3>>{
                    {1024, 3072, 768}, {1024, 768, 3072}, {2048, 2048, 2048}, {512, 2304, 768}};
  std::vector<GemmSample> out;
  for (const auto& sh : shapes)
    out.push_back({sh[0], sh[1], sh[2],
                   kernels::measure_gemm_bf16_gflops(true, sh[0], sh[1], sh[2], reps, 0.0)});
  return out;
}

// The bf16 peak: the fp32 peak times the median bf16 / fp32 rate ratio over the shared shapes.
double bf16_peak_tflops(const ProbeResult& r) {
  std::vector<double> ratios;
  for (const auto& b : r.gemm_bf16)
    for (const auto& f : r.gemm)
      if (f.M == b.M && f.N == b.N && f.K == b.K && f.gflops > 0)
        ratios.push_back(b.gflops / f.gflops);
  if (ratios.empty()) return 0;
  std::sort(ratios.begin(), ratios.end());
  return r.spec.peak_tflops_fp32 * ratios[ratios.size() / 2];
}

// All-reduce over every rank at several sizes, and (full probe) as inside a training step.
void probe_all_reduce(comm::Communicator& world, const ProbeOptions& o, int reps, ProbeResult& r) {
  const int p = world.size();
  std::vector<double> sizes = o.quick ? std::vector<double>{4096, 1 << 20}
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
  // Inside a training step a collective follows a GEMM on every rank: its buffer is out of
  // the caches (the GEMM's operands took them). The tensor-parallel messages' sizes, each
  // after a GEMM of a micro-batch's layer (512 x 768 x 768) and a barrier (how far apart the
  // ranks arrive is the compute's business, not the link's).
  if (o.quick) return;
  const long M = 512, K = 768;
  std::vector<float> A(M * K, 0.5f), B(K * K, 0.25f), C(M * K, 0.f);
  for (double bytes : {double(1 << 20), double(1 << 21), double(1 << 22)}) {
    const std::size_t n = static_cast<std::size_t>(bytes / 4);
    std::vector<float> buf(n, 1.f);
    world.all_reduce_sum(buf.data(), n);  // warm-up
    std::vector<double> t;
    for (int i = 0; i < 2 * reps; ++i) {
      kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, M, K, K, 1.f, A.data(), K, B.data(),
                    K, 0.f, C.data(), K);
      world.barrier();
      Timer tm;
      world.all_reduce_sum(buf.data(), n);
      t.push_back(tm.seconds());
    }
    std::vector<double> mx = t;  // the slowest rank's time per repetition
    world.all_reduce_max(mx.data(), mx.size());
    const double sec = median(mx);
    r.collectives.push_back(
        {"all_reduce_in_step", p, bytes, sec, 2.0 * (p - 1) / p * bytes / sec / 1e9});
  }
}

// All-gather and reduce-scatter (the non-blocking calls with counts that tessera makes) at the
// size of the largest all-reduce sample: their bus bandwidth relative to the all-reduce's.
void probe_gather_scatter(comm::Communicator& world, int reps, ProbeResult& r) {
  const int p = world.size();
  CollectiveSample ar;  // the largest all-reduce of the all-ranks loop
  for (const auto& c : r.collectives)
    if (c.op == "all_reduce") ar = c;
  const std::size_t n = static_cast<std::size_t>(ar.bytes / 4) / p * p, per = n / p;
  std::vector<float> full(n, 1.f), part(per, 1.f);
  const std::vector<std::size_t> counts(p, per);
  auto timed = [&](auto&& fn) {
    fn();  // warm-up
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      world.barrier();
      Timer tm;
      fn();
      double dt = tm.seconds();
      world.all_reduce_max(&dt, 1);
      t.push_back(dt);
    }
    return median(t);
  };
  const double bytes = static_cast<double>(n) * 4, ring = (p - 1.0) / p * bytes;
  const double t_ag = timed([&] { world.iall_gather(part.data(), full.data(), counts).wait(); });
  const double t_rs =
      timed([&] { world.ireduce_scatter_sum(full.data(), part.data(), counts).wait(); });
  r.collectives.push_back({"all_gather", p, bytes, t_ag, ring / t_ag / 1e9});
  r.collectives.push_back({"reduce_scatter", p, bytes, t_rs, ring / t_rs / 1e9});
  r.all_gather_factor = std::clamp(ring / t_ag / 1e9 / ar.bus_gbps, 0.05, 4.0);
  r.reduce_scatter_factor = std::clamp(ring / t_rs / 1e9 / ar.bus_gbps, 0.05, 4.0);
}

// Overlap: a GEMM and a non-blocking all-reduce of similar length, alone and together (the
// all-reduce posted, the GEMM run, then the wait); the fraction of the shorter one that the
// pair hides. Open MPI without a progress thread moves little data while the GEMM runs.
void probe_overlap(comm::Communicator& world, int reps, ProbeResult& r) {
  const long M = 768;
  std::vector<float> A(M * M, 0.5f), B(M * M, 0.25f), C(M * M, 0.f);
  const std::size_t n = std::size_t{1} << 22;  // 16 MiB
  std::vector<float> buf(n, 1.f);
  auto gemm = [&] {
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, M, M, M, 1.f, A.data(), M, B.data(), M,
                  0.f, C.data(), M);
  };
  auto timed = [&](auto&& fn) {
    std::vector<double> t;
    for (int i = 0; i < reps + 1; ++i) {
      world.barrier();
      Timer tm;
      fn();
      double dt = tm.seconds();
      world.all_reduce_max(&dt, 1);
      if (i > 0) t.push_back(dt);
    }
    return median(t);
  };
  const double t_gemm = timed(gemm);
  const double t_comm = timed([&] { world.iall_reduce_sum(buf.data(), n).wait(); });
  const double t_both = timed([&] {
    auto req = world.iall_reduce_sum(buf.data(), n);
    gemm();
    req.wait();
  });
  r.overlap = std::clamp((t_gemm + t_comm - t_both) / std::min(t_gemm, t_comm), 0.0, 1.0);
  r.overlap_times = {t_gemm, t_comm, t_both};
  // polled: the GEMM in 8 row slices, the request tested between them
  constexpr long k_slices = 8;
  auto slices = [&](comm::Request* req) {
    for (long s = 0; s < k_slices; ++s) {
      const long m0 = s * M / k_slices, m1 = (s + 1) * M / k_slices;
      kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, m1 - m0, M, M, 1.f,
                    A.data() + m0 * M, M, B.data(), M, 0.f, C.data() + m0 * M, M);
      if (req) req->test();
    }
  };
  const double t_sliced = timed([&] { slices(nullptr); });
  const double t_polled = timed([&] {
    auto req = world.iall_reduce_sum(buf.data(), n);
    slices(&req);
    req.wait();
  });
  r.overlap_polled =
      std::clamp((t_sliced + t_comm - t_polled) / std::min(t_sliced, t_comm), 0.0, 1.0);
  r.overlap_polled_times = {t_sliced, t_comm, t_polled};
}

// The shared-memory link of p ranks on this node, from the all-reduce samples.
LinkLevel node_link(const ProbeResult& r, int p) {
  LinkLevel l;
  l.name = "shared-memory";
  l.group = p;
  // The median bus bandwidth of the all-reduces measured as inside a step (after a GEMM, the
  // ranks arriving apart); with --quick, of the all-ranks loop's of 1 MiB and more.
  std::vector<double> bws;
  for (const auto& s : r.collectives)
    if (s.op == "all_reduce_in_step") bws.push_back(s.bus_gbps);
  if (bws.empty())  // --quick: the all-ranks loop's
    for (const auto& s : r.collectives)
      if (s.op == "all_reduce" && s.bytes >= (1 << 20)) bws.push_back(s.bus_gbps);
  if (bws.empty())
    for (const auto& s : r.collectives)
      if (s.op == "all_reduce") bws.push_back(s.bus_gbps);
  const double bw = median(bws);
  l.bw_gbps = bw;
  l.efficiency = 1.0;
  // latency per ring step from the smallest message, after its bandwidth term
  const auto& small = r.collectives.front();  // the smallest all-reduce
  const double steps = 2.0 * (p - 1);
  l.latency_us =
      std::max(0.0, (small.seconds - 2.0 * (p - 1) / p * small.bytes / (bw * 1e9)) / steps * 1e6);
  return l;
}

// The cluster spec of the measurements: one rank = one device; all ranks on this node.
void fill_spec(ProbeResult& r, const ProbeOptions& o, int p, double baseline_gib) {
  ClusterSpec& c = r.spec;
  c.name = o.name;
  c.description = fmt::format("measured by tessera probe: {} rank(s), {} thread(s) each", p,
                              omp_get_max_threads());
  c.device = fmt::format("cpu-rank ({} threads)", omp_get_max_threads());
  fit_gemm_curve(r.gemm, c);
  c.peak_tflops_bf16 = c.peak_tflops_fp16 = bf16_peak_tflops(r);
  c.memory_gib = total_memory_gib() / p;
  c.memory_bw_gbps = r.memory_bw_gbps;
  c.reserved_gib = std::min(std::max(baseline_gib, 0.01), c.memory_gib / 4);
  c.devices_per_node = p;
  c.overlap = p > 1 ? r.overlap : 1.0;
  c.overlap_polled = p > 1 ? r.overlap_polled : 1.0;
  // Ranks that share cores: the rates above were measured with every rank busy.
  const long cores = std::max(1u, std::thread::hardware_concurrency());
  const long slots = std::max<long>(1, cores / std::max(1, omp_get_max_threads()));
  c.compute_slots = slots < p ? static_cast<int>(slots) : 0;
  c.all_gather_factor = r.all_gather_factor;
  c.reduce_scatter_factor = r.reduce_scatter_factor;
  c.max_nodes = 1;
  if (p > 1) c.links.push_back(node_link(r, p));
  c.injection_gbps = 0;
  validate(c);
}

}  // namespace

ProbeResult probe_machine(comm::Runtime& rt, const ProbeOptions& o) {
  ProbeResult r;
  const int reps = std::max(1, o.reps);
  // what the process holds before any work (binary, libraries, MPI): not usable by a model
  const double baseline_gib = static_cast<double>(resident_bytes()) / 1073741824.0;
  auto& world = rt.world();
  const bool lead = world.rank() == 0;
  r.gemm = probe_gemms(o, reps, lead);
  r.gemm_bf16 = probe_bf16_gemms(o, reps);
  r.memory_bw_gbps = stream_triad_gbps(reps);
  const int p = world.size();
  if (p > 1) {
    std::optional<Progress> bar;
    if (lead) bar.emplace("probe: collectives", 3, 1.0);
    probe_all_reduce(world, o, reps, r);
    if (bar) bar->update(1, "all-reduce");
    probe_gather_scatter(world, reps, r);
    if (bar) bar->update(2, "all-gather, reduce-scatter");
    probe_overlap(world, reps, r);
    if (bar) bar->finish("overlap");
  }
  fill_spec(r, o, p, baseline_gib);
  return r;
}

}  // namespace tessera::perf
