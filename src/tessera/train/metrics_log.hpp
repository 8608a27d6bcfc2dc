// metrics.jsonl: one JSON object per line. Each row is written with one write() of the line, so
// that a process killed at any moment leaves complete rows instead of a block-buffered tail cut
// mid-object; only the row being written can be cut (a kill can stop a write to a regular file
// at a page boundary), and resuming drops such a partial last line.
#pragma once

#include <cstdint>
#include <filesystem>

#include <nlohmann/json_fwd.hpp>

namespace tessera::train {

class MetricsLog {
 public:
  MetricsLog() = default;  // closed: write() does nothing (ranks other than the lead)
  // A fresh log: an existing file is emptied.
  static MetricsLog start(const std::filesystem::path& path);
  // The log of a run resumed from the checkpoint of `step`: the rows after that step (and
  // whatever followed the first of them), and a partial last line, are dropped before appending,
  // so the file holds each step once, in order.
  static MetricsLog resume(const std::filesystem::path& path, std::int64_t step);
  MetricsLog(MetricsLog&& o) noexcept;
  MetricsLog& operator=(MetricsLog&& o) noexcept;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();

  void write(const nlohmann::json& row);

 private:
  static MetricsLog open_append(const std::filesystem::path& path);
  int fd_ = -1;
  std::filesystem::path path_;
};

}  // namespace tessera::train
