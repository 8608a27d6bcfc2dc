#include "tessera/train/tensorboard.hpp"

#include <unistd.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/tfrecord.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/train/tensorboard_event.pb.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view k_prefix = "events.out.tfevents.";

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::vector<Scalar> row_scalars(const nlohmann::json& row) {
  std::vector<Scalar> out;
  if (!row.is_object()) return out;
  const auto ev = row.find("event");
  std::string group = ev != row.end() && ev->is_string() ? ev->get<std::string>() : "train";
  if (group == "step") group = "train";
  for (const auto& [key, value] : row.items()) {
    if (key == "step" || key == "time" || !value.is_number()) continue;
    out.push_back({group + "/" + key, value.get<double>()});
  }
  return out;
}

std::string event_file_name(const fs::path& dir, std::int64_t now_s, const std::string& host) {
  std::int64_t t = now_s;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(k_prefix, 0) != 0) continue;
    const std::string rest = name.substr(k_prefix.size());
    const std::size_t dot = rest.find('.');
    const std::string digits = rest.substr(0, dot);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    t = std::max<std::int64_t>(t, std::stoll(digits) + 1);
  }
  return fmt::format("{}{:010d}.{}", k_prefix, t, host);
}

TensorBoardLog TensorBoardLog::open(const fs::path& dir, std::int64_t start_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(fmt::format("cannot create {}: {}", dir.string(), ec.message()),
                "check that train.out_dir is writable");
  const double now = unix_seconds();
  TensorBoardLog log;
  log.file_ = AppendFile(dir / event_file_name(dir, static_cast<std::int64_t>(now), host_name()),
                         "check that train.out_dir is writable");
  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  log.file_.append(tfrecord(version.SerializeAsString()));
  tensorboard::Event start;
  start.set_wall_time(now);
  start.set_step(start_step);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  log.file_.append(tfrecord(start.SerializeAsString()));
  return log;
}

void TensorBoardLog::write(std::int64_t step, double wall_time,
                           const std::vector<Scalar>& scalars) {
  if (!file_.is_open() || scalars.empty()) return;
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* summary = event.mutable_summary();
  for (const auto& s : scalars) {
    auto* v = summary->add_value();
    v->set_tag(s.tag);
    v->set_simple_value(static_cast<float>(s.value));
  }
  file_.append(tfrecord(event.SerializeAsString()));
}

}  // namespace tessera::train
