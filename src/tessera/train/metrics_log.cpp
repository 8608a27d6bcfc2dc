#include "tessera/train/metrics_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

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

MetricsLog MetricsLog::open_append(const std::filesystem::path& path) {
  MetricsLog log;
  log.path_ = path;
  log.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log.fd_ < 0)
    throw Error(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)),
                "check that train.out_dir is writable");
  return log;
}

MetricsLog MetricsLog::start(const std::filesystem::path& path) {
  write_file_atomic(path, "");
  return open_append(path);
}

MetricsLog MetricsLog::resume(const std::filesystem::path& path, std::int64_t step) {
  std::string text;
  if (input_kind(path, "metrics file") != InputKind::Missing)
    text = read_file(path, "metrics file");
  write_file_atomic(path, rows_up_to(text, step));
  return open_append(path);
}

MetricsLog::MetricsLog(MetricsLog&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

MetricsLog& MetricsLog::operator=(MetricsLog&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const nlohmann::json& row) {
  if (fd_ < 0) return;
  const std::string line = row.dump() + "\n";
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd_, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(fmt::format("cannot write {}: {}", path_.string(), std::strerror(errno)),
                  "is the disk full?");
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace tessera::train
