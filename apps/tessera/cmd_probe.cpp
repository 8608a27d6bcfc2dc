// tessera probe [--out FILE] [--name NAME] [--quick] [--reps N]
// Measures this machine (GEMM rates by shape, memory bandwidth, all-reduce bandwidth by size
// when run under mpirun) and writes a cluster file for plan/simulate (docs/probe.md).
#include <cstdio>

#include <fmt/format.h>

#include "commands.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/perf/probe.hpp"
#include "tessera/perf/report.hpp"

namespace tessera::app {

void add_probe_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "probe",
      "measure this machine (GEMM rates, memory and collective bandwidth) into a "
      "cluster file");
  struct Args {
    std::string out = "configs/clusters/this-machine.toml", name = "this-machine";
    bool quick = false;
    int reps = 3;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--out,-o", a->out, "cluster file to write")->capture_default_str();
  cmd->add_option("--name", a->name, "cluster name in the file")->capture_default_str();
  cmd->add_flag("--quick", a->quick, "small shapes and messages only (seconds)");
  cmd->add_option("--reps", a->reps, "timed repetitions per measurement (the median is kept)")
      ->capture_default_str();
  cmd->callback([a] {
    if (a->reps < 1) throw Error("--reps must be >= 1");
    auto rt = comm::Runtime::create();
    perf::ProbeOptions o;
    o.name = a->name;
    o.quick = a->quick;
    o.reps = a->reps;
    auto r = perf::probe_machine(*rt, o);
    if (rt->world_rank() != 0) return;
    std::printf("GEMM (fp32, tessera oneDNN path), median of %d:\n", a->reps);
    std::printf("  %6s %6s %6s %10s %10s\n", "M", "N", "K", "GFLOP/s", "model");
    for (const auto& g : r.gemm)
      std::printf("  %6ld %6ld %6ld %10.1f %10.1f\n", g.M, g.N, g.K, g.gflops,
                  r.spec.peak_tflops_fp32 * 1e3 * perf::gemm_efficiency(r.spec, g.M, g.N, g.K));
    std::printf("  fit: peak %.1f GFLOP/s, max_efficiency %.3f, half_dim %.0f\n",
                r.spec.peak_tflops_fp32 * 1e3, r.spec.gemm_max_efficiency, r.spec.gemm_half_dim);
    for (const auto& g : r.gemm_bf16)
      std::printf("  bf16 %ldx%ldx%ld: %.1f GFLOP/s\n", g.M, g.N, g.K, g.gflops);
    std::printf("  bf16 peak %.1f GFLOP/s (%s)\n", r.spec.peak_tflops_bf16 * 1e3,
                std::string(kernels::bf16_gemm_unit()).c_str());
    std::printf("memory bandwidth (triad): %.1f GB/s per rank\n", r.memory_bw_gbps);
    if (!r.collectives.empty()) {
      std::printf("collectives over %d ranks:\n  %-15s %12s %10s %10s\n", rt->world_size(), "op",
                  "bytes", "time", "bus GB/s");
      for (const auto& c : r.collectives)
        std::printf("  %-15s %12.0f %10s %10.2f\n", c.op.c_str(), c.bytes,
                    perf::format_seconds(c.seconds).c_str(), c.bus_gbps);
      std::printf(
          "  all-gather at %.2f, reduce-scatter at %.2f of the all-reduce's bus bandwidth\n",
          r.all_gather_factor, r.reduce_scatter_factor);
      if (r.overlap_times.size() == 3)
        std::printf(
            "overlap: GEMM %s, all-reduce %s, both at once %s: %.0f%% of the shorter hidden\n",
            perf::format_seconds(r.overlap_times[0]).c_str(),
            perf::format_seconds(r.overlap_times[1]).c_str(),
            perf::format_seconds(r.overlap_times[2]).c_str(), 100 * r.overlap);
      if (r.overlap_polled_times.size() == 3)
        std::printf(
            "overlap, GEMM in 8 slices with a test between them: %s, all-reduce %s, both %s: "
            "%.0f%% hidden\n",
            perf::format_seconds(r.overlap_polled_times[0]).c_str(),
            perf::format_seconds(r.overlap_polled_times[1]).c_str(),
            perf::format_seconds(r.overlap_polled_times[2]).c_str(), 100 * r.overlap_polled);
    } else {
      std::printf("one rank: no collectives measured (run under mpirun -n N for them)\n");
    }
    if (r.spec.compute_slots > 0)
      std::printf(
          "shared cores: %d of the %d ranks compute at full speed at once (compute_slots); the "
          "rates above are with every rank busy\n",
          r.spec.compute_slots, rt->world_size());
    write_file_atomic(a->out, "# written by tessera probe\n" + perf::to_toml(r.spec));
    std::printf("wrote %s\n", a->out.c_str());
  });
}

}  // namespace tessera::app
