// What `tessera plan` and `tessera simulate` share: the model and cluster files, the workload and
// the model options, loaded and checked from their common flags.
#pragma once

#include <string>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/report.hpp"

namespace tessera::app {

struct PerfSetup {
  perf::ModelSpec ms;
  perf::ClusterSpec cl;
  perf::Workload w;
  perf::ModelOptions o;
};

inline PerfSetup load_perf_setup(const std::string& model, const std::string& cluster, int gpus,
                                 long global_batch, int seq, const std::string& dtype,
                                 bool no_flash, bool no_overlap) {
  PerfSetup s;
  s.ms = perf::load_model(model);
  s.cl = perf::load_cluster(
      perf::resolve_spec(cluster, perf::configs_dir("clusters").string(), "cluster file"));
  if (gpus < 1) throw Error(fmt::format("--gpus must be >= 1 (got {})", gpus));
  if (global_batch < 1) throw Error("--global-batch must be >= 1");
  s.w = perf::Workload{s.ms.cfg, seq > 0 ? seq : s.ms.cfg.block_size, global_batch};
  s.o.dtype = perf::parse_dtype(dtype);
  s.o.flash_attention = !no_flash;
  s.o.tp_overlap = s.o.dp_overlap = !no_overlap;
  return s;
}

}  // namespace tessera::app
