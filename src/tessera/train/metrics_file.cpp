#include "tessera/train/metrics_file.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

std::vector<nlohmann::json> read_metrics_rows(const fs::path& run_dir) {
  if (input_kind(run_dir, "run folder") != InputKind::Directory)
    throw Error(fmt::format("{} is not a run folder", run_dir.string()),
                "give the train.out_dir of a tessera train run");
  const fs::path path = run_dir / "metrics.jsonl";
  if (input_kind(path, "metrics file") == InputKind::Missing)
    throw Error(fmt::format("{} has no metrics.jsonl", run_dir.string()),
                "give the train.out_dir of a tessera train run");
  const std::string text = read_file(path, "metrics file");
  std::vector<nlohmann::json> rows;
  for (std::size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    auto row = nlohmann::json::parse(text.begin() + pos, text.begin() + nl, nullptr, false);
    if (row.is_discarded() || !row.is_object())
      throw Error(fmt::format("{}: line {} is not a JSON object", path.string(), rows.size() + 1),
                  "metrics.jsonl is written by tessera train; was it edited?");
    rows.push_back(std::move(row));
  }
  return rows;  // text after the last newline: a row cut by a kill, skipped
}

MetricCurve metric_curve(const std::vector<nlohmann::json>& rows, const std::string& metric) {
  MetricCurve curve;
  for (const auto& row : rows) {
    const auto step = row.find("step"), value = row.find(metric);
    if (step == row.end() || value == row.end() || !step->is_number() || !value->is_number())
      continue;
    curve.steps.push_back(step->get<double>());
    curve.values.push_back(value->get<double>());
  }
  return curve;
}

std::vector<std::string> metric_names(const std::vector<nlohmann::json>& rows) {
  std::set<std::string> names;
  for (const auto& row : rows) {
    if (!row.contains("step")) continue;
    for (const auto& [key, value] : row.items())
      if (value.is_number() && key != "step" && key != "time") names.insert(key);
  }
  return {names.begin(), names.end()};
}

}  // namespace tessera::train
