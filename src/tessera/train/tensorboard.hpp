// TensorBoard event files beside metrics.jsonl: <out_dir>/tb/events.out.tfevents.<time>.<host>.
// Every number of a metrics row becomes a scalar tagged "<group>/<key>" at the row's step, the
// group being the row's event ("train" for step rows): train/loss, train/lr, train/mfu,
// val/val_loss, memory/params_bytes, ... A run writes one file per start; a resumed run's file
// begins with a START at the step after its checkpoint, so TensorBoard drops what the earlier
// file recorded after that checkpoint and shows one curve per tag.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/core/append_file.hpp"

namespace tessera::train {

struct Scalar {
  std::string tag;
  double value = 0;
};

// The scalars of one metrics row: every top-level number other than "step" and "time" (null,
// strings, booleans, arrays and objects are not curves).
std::vector<Scalar> row_scalars(const nlohmann::json& row);

class TensorBoardLog {
 public:
  TensorBoardLog() = default;  // closed: writes nothing
  // A new event file in `dir` (created if missing), named after the current time and this host
  // and ordered after every event file already there (TensorBoard reads them in name order).
  // `start_step`: the first step this process writes (0, or the checkpoint's step + 1).
  static TensorBoardLog open(const std::filesystem::path& dir, std::int64_t start_step);

  const std::filesystem::path& path() const { return file_.path(); }
  // One event with these scalars (none: nothing written).
  void write(std::int64_t step, double wall_time, const std::vector<Scalar>& scalars);

 private:
  AppendFile file_;  // one record per append
};

// The name of a new event file in `dir` at Unix time `now_s`: events.out.tfevents.<time>.<host>,
// with <time> raised above that of every event file already there.
std::string event_file_name(const std::filesystem::path& dir, std::int64_t now_s,
                            const std::string& host);

}  // namespace tessera::train
