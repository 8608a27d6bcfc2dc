#include "tessera/core/file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "tessera/core/error.hpp"

namespace tessera {

std::string read_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(fmt::format("{} not found: {}", what, path.string()),
                "check the path (relative paths are taken from the current directory)");
  if (std::filesystem::is_directory(path, ec))
    throw Error(fmt::format("{} is a directory, expected a file: {}", what, path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open {} {}: {}", what, path.string(), std::strerror(errno)));
  std::string data;
  in.seekg(0, std::ios::end);
  auto size = in.tellg();
  if (size < 0) throw Error(fmt::format("cannot read {} {}", what, path.string()));
  data.resize(static_cast<std::size_t>(size));
  in.seekg(0);
  in.read(data.data(), size);
  if (!in) throw Error(fmt::format("cannot read {} {}: short read", what, path.string()));
  return data;
}

void fsync_path(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view data) {
  auto tmp = path;
  tmp += fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)),
                "check that the directory exists and is writable");
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(err)),
                  "is the disk full?");
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot flush {}: {}", tmp.string(), std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), std::strerror(err)));
  }
  auto dir = path.parent_path();
  fsync_path(dir.empty() ? std::filesystem::path(".") : dir);
}

}  // namespace tessera
