#include "tessera/core/chrome_trace.hpp"

#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera {

void write_chrome_trace(const std::filesystem::path& path, const std::vector<TraceEvent>& events,
                        const std::string& config) {
  nlohmann::json list = nlohmann::json::array();
  std::set<std::pair<int, int>> named;
  for (const auto& e : events) {
    if (named.insert({e.pid, e.tid}).second)
      list.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", e.pid},
                      {"tid", e.tid},
                      {"args", {{"name", fmt::format("stage {}", e.tid)}}}});
    list.push_back({{"name", e.name},
                    {"cat", e.cat},
                    {"ph", "X"},
                    {"pid", e.pid},
                    {"tid", e.tid},
                    {"ts", e.start_s * 1e6},
                    {"dur", e.dur_s * 1e6}});
  }
  const nlohmann::json doc = {
      {"displayTimeUnit", "ms"}, {"otherData", {{"config", config}}}, {"traceEvents", list}};
  write_file_atomic(path, doc.dump(1) + "\n");
}

std::vector<TraceEvent> read_chrome_trace(const std::filesystem::path& path) {
  const auto doc = nlohmann::json::parse(read_file(path, "trace"), nullptr, false);
  const Error bad(
      fmt::format("{} is not a Chrome trace (an object with traceEvents)", path.string()),
      "pass a file written by tessera train --trace or tessera simulate --trace");
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents") ||
      !doc["traceEvents"].is_array())
    throw bad;
  std::vector<TraceEvent> events;
  try {
    for (const auto& e : doc["traceEvents"]) {
      if (!e.is_object() || e.value("ph", "") != "X") continue;
      if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") ||
          !e["dur"].is_number() || !e.contains("name") || !e["name"].is_string())
        throw bad;
      TraceEvent t;
      t.pid = e.value("pid", 0);
      t.tid = e.value("tid", 0);
      t.name = e["name"].get<std::string>();
      t.cat = e.value("cat", "");
      t.start_s = e["ts"].get<double>() / 1e6;
      t.dur_s = e["dur"].get<double>() / 1e6;
      events.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception&) {
    throw bad;  // a field of another type
  }
  return events;
}

}  // namespace tessera
