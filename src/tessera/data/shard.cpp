#include "tessera/data/shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/paths.hpp"

namespace tessera::data {
namespace {

constexpr const char* k_prepare_hint = "make token shards with 'tessera prepare'";

template <typename U>
void put_le(unsigned char* p, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

template <typename U>
U get_le(const unsigned char* p) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(p[i]) << (8 * i);
  return v;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_shard(const std::filesystem::path& path, std::span<const std::uint32_t> tokens) {
  const std::uint32_t max_id = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  const std::uint32_t tb = max_id < 65536 ? 2 : 4;
  std::string buf(k_shard_header_bytes + tokens.size() * tb, '\0');
  auto* p = reinterpret_cast<unsigned char*>(buf.data());
  put_le<std::uint32_t>(p + 0, k_shard_magic);
  put_le<std::uint32_t>(p + 4, k_shard_version);
  put_le<std::uint32_t>(p + 8, tb);
  put_le<std::uint64_t>(p + 16, tokens.size());
  unsigned char* t = p + k_shard_header_bytes;
  if (tb == 2) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      put_le<std::uint16_t>(t + 2 * i, static_cast<std::uint16_t>(tokens[i]));
  } else {
    for (std::size_t i = 0; i < tokens.size(); ++i) put_le<std::uint32_t>(t + 4 * i, tokens[i]);
  }
  write_file_atomic(path, buf);
}

namespace {

// The size of the open shard `fd`, which must be a non-empty regular file.
std::uint64_t shard_bytes(int fd, const std::string& name) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw Error(fmt::format("cannot stat token shard {}: {}", name, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("token shard {} is not a regular file", name), k_prepare_hint);
  if (st.st_size == 0)
    throw Error(fmt::format("{} is empty, not a tessera token shard", name), k_prepare_hint);
  return static_cast<std::uint64_t>(st.st_size);
}

// Reads the first `want` bytes of `fd` into h.
void read_prefix(int fd, unsigned char* h, std::size_t want, const std::string& name) {
  std::size_t got = 0;
  while (got < want) {
    ssize_t n = ::pread(fd, h + got, want - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(fmt::format("cannot read token shard {}", name));
    got += static_cast<std::size_t>(n);
  }
}

struct ShardHeader {
  std::uint64_t count;
  std::uint32_t token_bytes;
};

// The header h (the first `got` bytes of a file of `file_bytes`), checked against the file.
ShardHeader check_header(const unsigned char* h, std::size_t got, std::uint64_t file_bytes,
                         const std::string& name) {
  if (got < 4 || get_le<std::uint32_t>(h) != k_shard_magic)
    throw Error(fmt::format("{} is not a tessera token shard (bad magic)", name), k_prepare_hint);
  if (got < k_shard_header_bytes)
    throw Error(
        fmt::format("token shard {} is truncated: {} bytes, shorter than its {}-byte header", name,
                    file_bytes, k_shard_header_bytes),
        "re-create it with 'tessera prepare'");
  const auto version = get_le<std::uint32_t>(h + 4);
  if (version != k_shard_version)
    throw Error(fmt::format("token shard {} has version {}, this build reads version {}", name,
                            version, k_shard_version),
                "re-create it with this build's 'tessera prepare'");
  const auto tb = get_le<std::uint32_t>(h + 8);
  if (tb != 2 && tb != 4)
    throw Error(
        fmt::format("token shard {} has a bad token size {} (expected 2 or 4 bytes)", name, tb),
        "the file is corrupt; re-create it with 'tessera prepare'");
  const auto count = get_le<std::uint64_t>(h + 16);
  const std::uint64_t body = file_bytes - k_shard_header_bytes;
  const std::uint64_t held = body / tb;
  const bool fits =
      count <= (std::numeric_limits<std::uint64_t>::max() - k_shard_header_bytes) / tb;
  if (!fits || count > held)
    throw Error(fmt::format("token shard {} is truncated: header says {} tokens but file holds {}",
                            name, count, held),
                "re-create it with 'tessera prepare'");
  if (body != count * tb)
    throw Error(fmt::format("token shard {} has {} extra bytes after its {} tokens", name,
                            body - count * tb, count),
                "the file is corrupt; re-create it with 'tessera prepare'");
  if (file_bytes > std::numeric_limits<std::size_t>::max())
    throw Error(fmt::format("token shard {} is too large to map", name));
  return {count, tb};
}

}  // namespace

ShardReader::ShardReader(const std::filesystem::path& given) : path_(find_data_path(given)) {
  const std::string name = path_.string();
  Fd f;
  f.fd = open_input_file(path_, "token shard", k_prepare_hint);  // a regular file
  const std::uint64_t file_bytes = shard_bytes(f.fd, name);
  unsigned char h[k_shard_header_bytes] = {};
  const auto got = static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, sizeof h));
  read_prefix(f.fd, h, got, name);
  const ShardHeader header = check_header(h, got, file_bytes, name);
  count_ = static_cast<std::size_t>(header.count);
  token_bytes_ = header.token_bytes;
  if (count_ > 0) {
    map_bytes_ = static_cast<std::size_t>(file_bytes);
    void* m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (m == MAP_FAILED)
      throw Error(fmt::format("cannot map token shard {}: {}", name, std::strerror(errno)));
    map_ = m;
    tokens_ = static_cast<const unsigned char*>(m) + k_shard_header_bytes;
  }
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)),
      count_(std::exchange(o.count_, 0)),
      token_bytes_(o.token_bytes_) {}

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
    token_bytes_ = o.token_bytes_;
  }
  return *this;
}

ShardReader::~ShardReader() {
  release();
}

void ShardReader::release() noexcept {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

std::uint32_t ShardReader::operator[](std::size_t i) const {
  TESSERA_CHECK(i < count_, "token {} of a shard of {}", i, count_);
  return token_bytes_ == 2 ? get_le<std::uint16_t>(tokens_ + 2 * i)
                           : get_le<std::uint32_t>(tokens_ + 4 * i);
}

void ShardReader::read(std::size_t offset, std::size_t count, std::uint32_t* out) const {
  TESSERA_CHECK(offset <= count_ && count <= count_ - offset, "tokens [{}, +{}) of a shard of {}",
                offset, count, count_);
  const unsigned char* p = tokens_ + offset * token_bytes_;
  if (token_bytes_ == 2) {
    for (std::size_t i = 0; i < count; ++i) out[i] = get_le<std::uint16_t>(p + 2 * i);
  } else if constexpr (std::endian::native == std::endian::little) {
    if (count) std::memcpy(out, p, count * 4);
  } else {
    for (std::size_t i = 0; i < count; ++i) out[i] = get_le<std::uint32_t>(p + 4 * i);
  }
}

void ShardReader::read(std::size_t offset, std::size_t count, std::int32_t* out) const {
  static_assert(sizeof(std::int32_t) == sizeof(std::uint32_t));
  read(offset, count, reinterpret_cast<std::uint32_t*>(out));
}

std::optional<IdOutside> first_id_outside(const ShardReader& shard, std::uint32_t vocab_size,
                                          std::size_t tokens) {
  const std::size_t n = tokens == 0 ? shard.size() : std::min(tokens, shard.size());
  constexpr std::size_t k_chunk = 1 << 20;
  std::vector<std::uint32_t> buf(std::min(n, k_chunk));
  for (std::size_t at = 0; at < n; at += k_chunk) {
    const std::size_t len = std::min(k_chunk, n - at);
    shard.read(at, len, buf.data());
    const auto end = buf.begin() + static_cast<std::ptrdiff_t>(len);
    const auto bad =
        std::find_if(buf.begin(), end, [&](std::uint32_t id) { return id >= vocab_size; });
    if (bad != end) return IdOutside{at + static_cast<std::size_t>(bad - buf.begin()), *bad};
  }
  return std::nullopt;
}

}  // namespace tessera::data
