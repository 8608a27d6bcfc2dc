// What `tessera plan` and `tessera simulate` share: the model and cluster files, the workload and
// the model options, loaded and checked from their common flags.
#pragma once

#include <optional>
#include <string>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/report.hpp"

namespace tessera::app {

struct PerfSetup {
  perf::ModelSpec ms;
  perf::ClusterSpec cl;
  perf::Workload w;
  perf::ModelOptions o;
};

inline PerfSetup load_perf_setup(const std::string& model, const std::string& cluster, int gpus,
                                 long global_batch, std::optional<int> seq,
                                 const std::string& dtype, bool no_flash, bool no_overlap) {
  PerfSetup s;
  s.ms = perf::load_model(model);
  s.cl = perf::load_cluster(
      perf::resolve_spec(cluster, perf::configs_dir("clusters").string(), "cluster file"));
  perf::check_devices(gpus, "--gpus");
  perf::check_global_batch(global_batch, "--global-batch");
  if (seq && *seq < 1) throw Error(fmt::format("--seq must be >= 1 (got {})", *seq));
  s.w = perf::Workload{s.ms.cfg, seq.value_or(s.ms.cfg.block_size), global_batch};
  s.o.dtype = perf::parse_dtype(dtype);
  s.o.flash_attention = !no_flash;
  s.o.tp_overlap = s.o.dp_overlap = !no_overlap;
  return s;
}

}  // namespace tessera::app
