#include "tessera/core/append_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "tessera/core/error.hpp"

namespace tessera {

AppendFile::AppendFile(const std::filesystem::path& path, std::string_view hint) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)),
                std::string(hint));
}

AppendFile::AppendFile(AppendFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

AppendFile& AppendFile::operator=(AppendFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(std::string_view record) {
  if (fd_ < 0) return;
  std::size_t off = 0;
  while (off < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + off, record.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(fmt::format("cannot write {}: {}", path_.string(), std::strerror(errno)),
                  "is the disk full?");
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace tessera
