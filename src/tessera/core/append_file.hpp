// A file written as a log of records: opened for appending, each record written with one
// write() (repeated only if the kernel writes part of it), so that a process killed at any
// moment leaves whole records, except possibly the one being written (a kill can stop a write to
// a regular file at a page boundary).
#pragma once

#include <filesystem>
#include <string_view>

namespace tessera {

class AppendFile {
 public:
  AppendFile() = default;  // closed: append() does nothing
  // Opens `path` for appending, creating it if missing; `hint` is the error's hint.
  AppendFile(const std::filesystem::path& path, std::string_view hint);
  AppendFile(AppendFile&& o) noexcept;
  AppendFile& operator=(AppendFile&& o) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  bool is_open() const { return fd_ >= 0; }
  const std::filesystem::path& path() const { return path_; }
  void append(std::string_view record);

 private:
  int fd_ = -1;
  std::filesystem::path path_;
};

}  // namespace tessera
