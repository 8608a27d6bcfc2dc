#include "tessera/perf/report.hpp"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/core/error.hpp"
#include "tessera/core/paths.hpp"

namespace tessera::perf {

using comm::Axis;

std::filesystem::path configs_dir(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path found = find_data_path(fs::path("configs") / name);
  if (fs::is_directory(found, ec)) return found;
  return fs::path(TESSERA_SOURCE_CONFIGS) / name;
}

std::filesystem::path resolve_spec(const std::string& s, const std::string& dir,
                                   const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(s, ec)) return s;
  fs::path cand = fs::path(dir) / (s + ".toml");
  if (fs::is_regular_file(cand, ec)) return cand;
  std::vector<std::string> names;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  throw Error(fmt::format("{} not found: {} (nor {})", what, s, cand.string()),
              names.empty() ? "give a path to a .toml file"
                            : fmt::format("give a path or one of: {}", fmt::join(names, ", ")));
}

comm::GridShape parse_grid(const std::string& s) {
  constexpr const char* hint = "write the grid as dp,pp,tx,ty,tz, e.g. 8,4,1,8,1";
  std::vector<std::string> items;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  if (items.size() != 5)
    throw Error(fmt::format("bad --grid '{}': needs 5 sizes (got {})", s, items.size()), hint);
  comm::GridShape g;
  int* sizes[] = {&g.dp, &g.pp, &g.tx, &g.ty, &g.tz};
  long devices = 1;  // each size is at most k_max_devices, so the product stays in a long
  for (std::size_t i = 0; i < items.size(); ++i) {
    try {
      std::size_t pos = 0;
      *sizes[i] = std::stoi(items[i], &pos);
      if (pos != items[i].size() || *sizes[i] < 1) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw Error(fmt::format("bad --grid '{}': '{}' is not a positive integer", s, items[i]),
                  hint);
    }
    devices = std::min(devices * *sizes[i], k_max_devices + 1);
  }
  if (devices > k_max_devices)
    throw Error(fmt::format("bad --grid '{}': more than the {} devices (2^20) the planner takes", s,
                            k_max_devices),
                hint);
  return g;
}

std::string format_seconds(double s) {
  if (s <= 0) return "0";
  if (s < 1e-3) return fmt::format("{:.0f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

std::string format_bytes(double b) {
  return fmt::format("{:.1f} GiB", b / 1073741824.0);
}

nlohmann::json to_json(const Prediction& p, const ClusterSpec& c) {
  const auto& g = p.point.grid;
  nlohmann::json j;
  j["grid"] = {{"dp", g.dp}, {"pp", g.pp}, {"tx", g.tx}, {"ty", g.ty}, {"tz", g.tz}};
  j["zero"] = p.point.zero;
  j["micro_batch"] = p.point.micro_batch;
  j["micro_batches"] = p.micro_batches;
  j["schedule"] = parallel::schedule_name(p.point.schedule);
  j["chunks"] =
      p.point.schedule == parallel::ScheduleKind::Interleaved ? p.point.virtual_stages : 1;
  j["recompute"] = recompute_name(p.point.recompute);
  j["sequence_parallel"] = p.point.sequence_parallel;
  j["step_s"] = p.step_s;
  j["pipeline_s"] = p.pipeline_s;
  j["bubble_s"] = p.bubble_s;
  j["bubble_fraction"] = p.bubble_fraction;
  j["dp_exposed_s"] = p.dp_exposed_s;
  j["optimizer_s"] = p.optimizer_s;
  // per stage and micro-batch: forward and backward (compute plus exposed tensor communication)
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t st = 0; st < p.chunk_cost.size(); ++st) {
    double f = 0, b = 0;
    for (const auto& cc : p.chunk_cost[st]) {
      f += cc.fwd_compute + cc.fwd_comm;
      b += cc.bwd_compute + cc.bwd_comm;
    }
    stages.push_back({{"stage", st}, {"forward_s", f}, {"backward_s", b}});
  }
  j["per_micro_batch"] = stages;
  j["tflops_per_device"] = p.tflops_per_device;
  j["hfu"] = p.hfu;
  j["mfu"] = p.mfu;
  j["memory_bytes"] = {{"params", p.memory.params},       {"grads", p.memory.grads},
                       {"optimizer", p.memory.optimizer}, {"activations", p.memory.activations},
                       {"logits", p.memory.logits},       {"buffers", p.memory.buffers},
                       {"reserved", p.memory.reserved},   {"total", p.memory.total()}};
  j["capacity_bytes"] = p.capacity;
  j["fits"] = p.fits;
  nlohmann::json cm;
  for (int a = 0; a < comm::k_num_axes; ++a)
    cm[comm::axis_name(static_cast<Axis>(a))] = {{"seconds", p.comm[a].seconds},
                                                 {"exposed_s", p.comm[a].exposed},
                                                 {"bytes", p.comm[a].bytes}};
  j["comm"] = cm;
  j["cluster"] = c.name;
  return j;
}

std::string format_plan_table(const std::vector<Prediction>& ps, const ClusterSpec& c,
                              DType dtype) {
  std::string out = fmt::format(
      "{:>3}  {:<18} {:>4} {:>3} {:<13} {:<9} {:>17} {:>9} {:>8} {:>6} {:>6} {:>7}  {}\n", "#",
      "grid dp.pp.tx.ty.tz", "zero", "mb", "schedule", "recompute", "memory/device", "step",
      "TFLOP/s", "%peak", "MFU", "bubble", "comm exposed (total) per axis: dp pp tx ty tz");
  int i = 0;
  for (const auto& p : ps) {
    const auto& g = p.point.grid;
    std::string sched = g.pp > 1 ? parallel::schedule_name(p.point.schedule) : "-";
    if (g.pp > 1 && p.point.schedule == parallel::ScheduleKind::Interleaved)
      sched += fmt::format(":{}", p.point.virtual_stages);
    std::string rc = recompute_name(p.point.recompute);
    if (p.point.sequence_parallel) rc += "+sp";
    std::string comm;
    for (Axis a : {Axis::DP, Axis::PP, Axis::TX, Axis::TY, Axis::TZ}) {
      const auto& ac = p.comm[static_cast<int>(a)];
      if (ac.seconds <= 0) {
        comm += fmt::format(" {}:-", comm::axis_name(a));
        continue;
      }
      comm += fmt::format(" {}:{}({})", comm::axis_name(a), format_seconds(ac.exposed),
                          format_seconds(ac.seconds));
    }
    out += fmt::format(
        "{:>3}  {:<18} {:>4} {:>3} {:<13} {:<9} {:>7.1f}/{:>5.1f} GiB {:>9} {:>8.1f} {:>5.1f}% "
        "{:>5.1f}% {:>6.1f}% {}\n",
        ++i, fmt::format("{}.{}.{}.{}.{}", g.dp, g.pp, g.tx, g.ty, g.tz), p.point.zero,
        p.point.micro_batch, sched, rc, p.memory.total() / 1073741824.0, p.capacity / 1073741824.0,
        format_seconds(p.step_s), p.tflops_per_device,
        100 * p.tflops_per_device / c.peak_tflops(dtype), 100 * p.mfu, 100 * p.bubble_fraction,
        comm);
  }
  return out;
}

}  // namespace tessera::perf
