// Reading a run's metrics.jsonl back (tessera plot, studies): the rows, and one metric's curve
// over the steps.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::train {

// The rows of RUN_DIR/metrics.jsonl, in order (a torn last line, left by a killed run, is
// skipped). A folder without metrics.jsonl is an Error.
std::vector<nlohmann::json> read_metrics_rows(const std::filesystem::path& run_dir);

// The numbers of `metric` in the rows that have a step, against that step, in file order.
struct MetricCurve {
  std::vector<double> steps, values;
};
MetricCurve metric_curve(const std::vector<nlohmann::json>& rows, const std::string& metric);

// The metrics `metric_curve` can draw from these rows: the numbers of rows with a step, other than
// "step" and "time", sorted.
std::vector<std::string> metric_names(const std::vector<nlohmann::json>& rows);

}  // namespace tessera::train
