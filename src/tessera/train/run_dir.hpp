// The run directory (train.out_dir): config.toml, metrics.jsonl and checkpoints/ of one run.
// A run holds the directory's lock (an flock on <out_dir>/.tessera.lock) while it uses it, so two
// runs can never write into one directory at once, and a fresh run refuses a directory that
// already holds a run unless told to overwrite it (its files are then deleted first).
#pragma once

#include <filesystem>

namespace tessera::train {

// Refuses an out_dir that is not a directory (or cannot become one): a file, a symbolic-link
// loop, a path through a file; or whose checkpoints/ is not one. Checked before anything is
// printed or written.
void check_out_dir(const std::filesystem::path& out_dir);

// Whether `out_dir` holds a run's files (config.toml, metrics.jsonl or checkpoints/).
bool holds_run(const std::filesystem::path& out_dir);

// Deletes a run's files from `out_dir` (config.toml, metrics.jsonl, checkpoints/); other files
// are left alone.
void clear_run(const std::filesystem::path& out_dir);

// The lock of a run directory, held until destruction (or the process's end, even by SIGKILL).
class RunDirLock {
 public:
  RunDirLock() = default;  // holds nothing
  // Creates out_dir if needed and takes its lock; false in `locked()` when another process
  // holds it.
  explicit RunDirLock(const std::filesystem::path& out_dir);
  RunDirLock(RunDirLock&& o) noexcept;
  RunDirLock& operator=(RunDirLock&& o) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();
  bool locked() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace tessera::train
