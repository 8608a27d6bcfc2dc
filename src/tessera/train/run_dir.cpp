#include "tessera/train/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {
constexpr const char* k_lock_file = ".tessera.lock";
constexpr const char* k_run_files[] = {"config.toml", "metrics.jsonl", "tb", "checkpoints"};
}  // namespace

void check_out_dir(const fs::path& out_dir) {
  const auto kind = input_kind(out_dir, "train.out_dir");
  if (kind != InputKind::Directory && kind != InputKind::Missing)
    throw Error(fmt::format("train.out_dir {} exists and is not a directory", out_dir.string()),
                "train.out_dir is the folder of the run's checkpoints and metrics; choose "
                "another path");
  const auto ckpts = input_kind(out_dir / "checkpoints", "train.out_dir");
  if (ckpts != InputKind::Directory && ckpts != InputKind::Missing)
    throw Error(fmt::format("{} is not a directory", (out_dir / "checkpoints").string()),
                "the run keeps its checkpoints there: move the file away or choose another "
                "train.out_dir");
  // A missing folder must be creatable: no file on its path.
  for (fs::path p = out_dir.parent_path(); !p.empty(); p = p.parent_path()) {
    const auto k = input_kind(p, "train.out_dir");
    if (k == InputKind::Directory) break;
    if (k != InputKind::Missing)
      throw Error(fmt::format("train.out_dir {} cannot be created: {} is not a directory",
                              out_dir.string(), p.string()),
                  "choose another train.out_dir");
    if (p == p.parent_path()) break;
  }
}

bool holds_run(const fs::path& out_dir) {
  for (const char* f : k_run_files)
    if (input_kind(out_dir / f, "train.out_dir") != InputKind::Missing) return true;
  return false;
}

void clear_run(const fs::path& out_dir) {
  for (const char* f : k_run_files) {
    std::error_code ec;
    fs::remove_all(out_dir / f, ec);
    if (ec)
      throw Error(fmt::format("cannot delete {}: {}", (out_dir / f).string(), ec.message()),
                  "delete the old run's files yourself, or choose another train.out_dir");
  }
}

RunDirLock::RunDirLock(const fs::path& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    throw Error(fmt::format("cannot create train.out_dir {}: {}", out_dir.string(), ec.message()),
                "choose a train.out_dir in a writable folder");
  const fs::path lock = out_dir / k_lock_file;
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(
        fmt::format("cannot create the lock file {}: {}", lock.string(), std::strerror(errno)),
        "choose a train.out_dir in a writable folder");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    return;  // another process holds it
  }
  fd_ = fd;  // locked (or on a filesystem without locks: as good as it gets)
}

RunDirLock::RunDirLock(RunDirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace tessera::train
