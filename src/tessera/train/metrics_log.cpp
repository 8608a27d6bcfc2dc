#include "tessera/train/metrics_log.hpp"

#include <string>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/timer.hpp"

namespace tessera::train {

namespace {

// The rows of `text` a run resumed at `step` keeps: complete lines, up to the first row of a
// later step.
std::string rows_up_to(const std::string& text, std::int64_t step) {
  std::string kept;
  for (std::size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    const std::string_view line(text.data() + pos, nl - pos);
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object()) continue;  // damaged by an older version
    const auto it = row.find("step");
    if (it != row.end() && it->is_number_integer() && it->get<std::int64_t>() > step) break;
    kept.append(line).push_back('\n');
  }
  return kept;
}

}  // namespace

MetricsLog MetricsLog::open_append(const std::filesystem::path& path, std::int64_t step,
                                   std::int64_t tensorboard_start) {
  MetricsLog log;
  log.file_ = AppendFile(path, "check that train.out_dir is writable");
  log.tensorboard_ = TensorBoardLog::open(path.parent_path() / "tb", tensorboard_start);
  log.step_ = step;
  return log;
}

MetricsLog MetricsLog::start(const std::filesystem::path& path) {
  write_file_atomic(path, "");
  return open_append(path, 0, 0);
}

MetricsLog MetricsLog::resume(const std::filesystem::path& path, std::int64_t step) {
  std::string text;
  if (input_kind(path, "metrics file") != InputKind::Missing)
    text = read_file(path, "metrics file");
  write_file_atomic(path, rows_up_to(text, step));
  return open_append(path, step, step + 1);
}

void MetricsLog::write(const nlohmann::json& row) {
  if (!file_.is_open()) return;
  TESSERA_CHECK(row.contains("event"));
  nlohmann::json timed = row;
  const double now = unix_seconds();
  timed["time"] = now;
  file_.append(timed.dump() + "\n");
  const auto step = row.find("step");
  if (step != row.end() && step->is_number_integer()) step_ = step->get<std::int64_t>();
  tensorboard_.write(step_, now, row_scalars(row));
}

}  // namespace tessera::train
