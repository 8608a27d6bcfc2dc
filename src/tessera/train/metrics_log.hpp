// metrics.jsonl: one JSON object per line, and the same numbers as TensorBoard scalars in
// tb/ beside it (train/tensorboard.hpp). Each row is written with one write() of the line, so
// that a process killed at any moment leaves complete rows instead of a block-buffered tail cut
// mid-object; only the row being written can be cut (a kill can stop a write to a regular file
// at a page boundary), and resuming drops such a partial last line.
//
// Every row has an "event" (step, val, memory, prediction, pipeline, summary) and a "time"
// (seconds since the Unix epoch, added here). Its TensorBoard step is its "step", or for rows
// without one (memory, prediction, pipeline, summary) the last step written before it (the start
// step for the rows written before the first step).
#pragma once

#include <cstdint>
#include <filesystem>

#include <nlohmann/json_fwd.hpp>

#include "tessera/core/append_file.hpp"
#include "tessera/train/tensorboard.hpp"

namespace tessera::train {

class MetricsLog {
 public:
  MetricsLog() = default;  // closed: write() does nothing (ranks other than the lead)
  // A fresh log: an existing file is emptied; the TensorBoard files go to `path`'s folder's tb/.
  static MetricsLog start(const std::filesystem::path& path);
  // The log of a run resumed from the checkpoint of `step`: the rows after that step (and
  // whatever followed the first of them), and a partial last line, are dropped before appending,
  // so the file holds each step once, in order. A new TensorBoard file starts at step + 1.
  static MetricsLog resume(const std::filesystem::path& path, std::int64_t step);

  // Writes `row` (which has an "event") with the current time.
  void write(const nlohmann::json& row);

 private:
  static MetricsLog open_append(const std::filesystem::path& path, std::int64_t step,
                                std::int64_t tensorboard_start);
  AppendFile file_;
  TensorBoardLog tensorboard_;
  std::int64_t step_ = 0;  // of the last row with a step (the start step before any)
};

}  // namespace tessera::train
