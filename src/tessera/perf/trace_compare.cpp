#include "tessera/perf/trace_compare.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace tessera::perf {

std::vector<TraceComparison> compare_traces(const std::vector<TraceEvent>& predicted,
                                            const std::vector<TraceEvent>& measured) {
  std::map<std::pair<int, std::string>, std::pair<double, double>> pred;  // start, duration
  for (const auto& e : predicted) {
    auto [it, fresh] = pred.try_emplace({e.tid, e.name}, e.start_s, 0.0);
    it->second.first = std::min(it->second.first, e.start_s);
    it->second.second += e.dur_s;
  }
  std::vector<TraceComparison> rows;
  for (const auto& e : measured) {
    if (e.pid != measured.front().pid) continue;
    TraceComparison r{e.tid, e.name, -1, -1, e.start_s, e.dur_s};
    if (auto it = pred.find({e.tid, e.name}); it != pred.end())
      r.predicted_start_s = it->second.first, r.predicted_s = it->second.second;
    rows.push_back(std::move(r));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.measured_start_s < b.measured_start_s;
  });
  return rows;
}

}  // namespace tessera::perf
