#include "tessera/core/file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tessera/core/error.hpp"

namespace tessera {

namespace {

constexpr const char* k_path_hint =
    "check the path (relative paths are taken from the current directory)";

// The error for a path that cannot be opened or looked at (errno `err`).
Error path_error(const std::filesystem::path& path, std::string_view what, int err,
                 std::string_view missing_hint) {
  if (err == ENOENT || err == ENOTDIR)
    return Error(fmt::format("{} not found: {}", what, path.string()),
                 std::string(missing_hint.empty() ? k_path_hint : missing_hint));
  if (err == ELOOP)
    return Error(
        fmt::format("cannot open {} {}: too many levels of symbolic links", what, path.string()),
        "a symbolic link on this path points (directly or through others) back to itself; fix "
        "or remove it");
  if (err == EACCES)
    return Error(fmt::format("cannot open {} {}: permission denied", what, path.string()),
                 "check the permissions of the file and of the folders above it");
  return Error(fmt::format("cannot open {} {}: {}", what, path.string(), std::strerror(err)));
}

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

}  // namespace

int open_input_file(const std::filesystem::path& path, std::string_view what,
                    std::string_view missing_hint) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type check below refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw path_error(path, what, errno, missing_hint);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw path_error(path, what, err, missing_hint);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{} is {}, not a regular file: {}", what, file_type_name(st.st_mode),
                            path.string()),
                S_ISDIR(st.st_mode) ? "give the path of a file"
                                    : "tessera reads its inputs from regular files; write the "
                                      "data to a file first");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

InputKind input_kind(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return InputKind::Missing;
    throw path_error(path, what, err, {});
  }
  if (S_ISDIR(st.st_mode)) return InputKind::Directory;
  return S_ISREG(st.st_mode) ? InputKind::RegularFile : InputKind::Other;
}

std::string read_file(const std::filesystem::path& path, std::string_view what) {
  const int fd = open_input_file(path, what);
  struct stat st {};
  std::string data;
  if (::fstat(fd, &st) == 0) data.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : 0;
      ::close(fd);
      throw Error(fmt::format("cannot read {} {}: {}", what, path.string(),
                              err ? std::strerror(err) : "short read"));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
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
  commit_temp_file(tmp, path);
}

void prepare_output_dir(const std::filesystem::path& dir, std::string_view option) {
  const std::string hint = fmt::format("choose another {}", option);
  if (dir.empty()) throw Error(fmt::format("{} is empty", option), hint);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec))
    throw Error(fmt::format("cannot create the folder {} ({}): {}", dir.string(), option,
                            ec ? ec.message() : "a file of that name is in the way"),
                hint);
  const auto probe = dir / fmt::format(".tessera-write-test.{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0)
    throw Error(
        fmt::format("cannot write into {} ({}): {}", dir.string(), option, std::strerror(errno)),
        hint);
  ::close(fd);
  ::unlink(probe.c_str());
}

void commit_temp_file(const std::filesystem::path& tmp, const std::filesystem::path& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(
        fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), std::strerror(err)));
  }
  auto dir = path.parent_path();
  fsync_path(dir.empty() ? std::filesystem::path(".") : dir);
}

std::shared_ptr<const FileBytes> FileBytes::map(const std::filesystem::path& path,
                                                std::string_view what) {
  const int fd = open_input_file(path, what);  // a regular file (never a FIFO)
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("cannot stat {}: {}", path.string(), std::strerror(err)));
  }
  auto bytes = std::make_shared<FileBytes>();
  const auto size = static_cast<std::size_t>(st.st_size);
  if (S_ISREG(st.st_mode) && size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      bytes->map_ = m;
      bytes->map_len_ = size;
      bytes->ptr_ = static_cast<const std::byte*>(m);
      bytes->size_ = size;
    }
  }
  ::close(fd);
  if (!bytes->map_) {  // empty, or mmap refused: read it instead
    bytes->owned_ = read_file(path, what);
    bytes->ptr_ = reinterpret_cast<const std::byte*>(bytes->owned_.data());
    bytes->size_ = bytes->owned_.size();
  }
  return bytes;
}

std::shared_ptr<const FileBytes> FileBytes::own(std::string data) {
  auto bytes = std::make_shared<FileBytes>();
  bytes->owned_ = std::move(data);
  bytes->ptr_ = reinterpret_cast<const std::byte*>(bytes->owned_.data());
  bytes->size_ = bytes->owned_.size();
  return bytes;
}

FileBytes::~FileBytes() {
  if (map_) ::munmap(map_, map_len_);
}

}  // namespace tessera
