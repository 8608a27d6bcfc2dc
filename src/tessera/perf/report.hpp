// Printing and JSON of predictions (tessera plan / simulate), and resolving model and cluster
// names ("gpt-175b" -> configs/models/gpt-175b.toml).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/perf/planner.hpp"

namespace tessera::perf {

// The catalogue configs/<name> (models, clusters): under the working directory when it has one,
// else in the source tree the binary was built from (whether or not that exists).
std::filesystem::path configs_dir(const std::string& name);

// `name_or_path` as given if it is a file, else <dir>/<name>.toml if that exists; throws
// tessera::Error listing what was tried and the names in `dir`.
std::filesystem::path resolve_spec(const std::string& name_or_path, const std::string& dir,
                                   const std::string& what);

// "dp,pp,tx,ty,tz" -> GridShape; throws tessera::Error.
comm::GridShape parse_grid(const std::string& s);

nlohmann::json to_json(const Prediction& p, const ClusterSpec& c);

// The planner's table: one line per prediction.
std::string format_plan_table(const std::vector<Prediction>& ps, const ClusterSpec& c, DType dtype);

std::string format_seconds(double s);  // "812 us", "3.4 ms", "2.71 s"
std::string format_bytes(double b);    // "12.3 GiB"

}  // namespace tessera::perf
