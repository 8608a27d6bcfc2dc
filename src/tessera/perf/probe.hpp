// Measuring this machine into a cluster spec (tessera probe): GEMM rates by shape with the
// tessera GEMM (kernels/gemm.hpp), memory bandwidth, and collective bandwidth by message size over
// the world communicator when run under mpirun (comm/runtime.hpp). One rank = one device.
#pragma once

#include <string>
#include <vector>

#include "tessera/comm/runtime.hpp"
#include "tessera/perf/cluster.hpp"

namespace tessera::perf {

struct GemmSample {
  long M = 0, N = 0, K = 0;
  double gflops = 0;  // median of the repetitions
};

struct CollectiveSample {
  std::string op;  // "all_reduce", "all_gather", "reduce_scatter"
  int group = 1;
  double bytes = 0, seconds = 0;
  double bus_gbps = 0;  // 2(p-1)/p * bytes / seconds (all-reduce), (p-1)/p * bytes / seconds
};

struct ProbeOptions {
  std::string name = "this-machine";
  bool quick = false;  // fewer and smaller shapes (tests)
  int reps = 3;
};

struct ProbeResult {
  std::vector<GemmSample> gemm;
  // bf16 GEMMs (kernels::gemm_bf16: native where the CPU has bf16 dot products, emulated
  // otherwise) at shapes also in `gemm`; the spec's bf16 peak is the fp32 peak times their
  // median rate ratio (the efficiency curve's shape taken as the fp32 one)
  std::vector<GemmSample> gemm_bf16;
  std::vector<CollectiveSample> collectives;
  double memory_bw_gbps = 0;
  // GEMM alone, all-reduce alone, both at once (seconds), and the overlap fraction they give
  // (ClusterSpec::overlap); with one rank: 1 and no times.
  double overlap = 1.0;
  std::vector<double> overlap_times;
  // The same with the GEMM cut in 8 row slices and the request tested between them (how tessera's
  // data-parallel reduction runs: its requests are tested at every layer boundary), the GEMM
  // slices alone and with the all-reduce (ClusterSpec::overlap_polled).
  double overlap_polled = 1.0;
  std::vector<double> overlap_polled_times;
  // all-gather / reduce-scatter bus bandwidth over the all-reduce's (ClusterSpec factors)
  double all_gather_factor = 1.0, reduce_scatter_factor = 1.0;
  ClusterSpec spec;  // fitted: peak = best GEMM rate; max_efficiency, half_dim by least squares
};

// Collective over the runtime's world (every rank must call it).
ProbeResult probe_machine(comm::Runtime& rt, const ProbeOptions& o);

// Least-squares fit of the GEMM efficiency curve to samples: sets peak_tflops_fp32,
// gemm_max_efficiency, gemm_half_dim of `c`. Returns the RMS relative error of the fit.
double fit_gemm_curve(const std::vector<GemmSample>& s, ClusterSpec& c);

}  // namespace tessera::perf
