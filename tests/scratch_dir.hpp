// The scratch directory of one test process: <tmp>/<prefix><pid>, made on first use and removed
// with everything under it when the process exits, so that a test suite run leaves no trace in
// the temporary directory (ctest starts one process per test; without this every run left a few
// hundred directories of checkpoints and corpora behind). Set TESSERA_KEEP_SCRATCH=1 to keep
// them for inspecting a failure.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace tessera::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (std::getenv("TESSERA_KEEP_SCRATCH") != nullptr) return;
    std::error_code ec;  // best effort: a destructor at exit must not throw
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// <this process's scratch directory>/<name>, created if missing. The directory is the process's
// own (removed at exit), so tests running at the same time in other processes (ctest -j, the
// whole-suite ISA test beside the single tests, a second checkout's suite) never share a path.
inline std::filesystem::path scratch_path(const std::string& name) {
  static const ScratchDir root("tessera_test_");
  auto d = root.path() / name;
  std::filesystem::create_directories(d);
  return d;
}

// The same, emptied first.
inline std::filesystem::path fresh_scratch(const std::string& name) {
  auto d = scratch_path(name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace tessera::test
