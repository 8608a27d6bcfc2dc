// Token shards: one file holding a stream of token ids.
//
// Layout (all fields little-endian):
//   offset  size  field
//        0     4  magic        uint32 0x4B4F5454, i.e. the file starts with the bytes "TTOK"
//        4     4  version      uint32 1
//        8     4  token_bytes  uint32 2 (tokens are uint16) or 4 (tokens are uint32)
//       12     4  reserved     0
//       16     8  count        uint64 number of tokens
//       24  1000  reserved     0 (readers ignore it; a new field means a new version)
//     1024     -  tokens       count * token_bytes bytes, nothing after them
// write_shard picks uint16 when every id is < 65536 (GPT-2's 50257 ids fit) and uint32 otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>

namespace tessera::data {

inline constexpr std::uint32_t k_shard_magic = 0x4B4F5454;  // "TTOK"
inline constexpr std::uint32_t k_shard_version = 1;
inline constexpr std::size_t k_shard_header_bytes = 1024;

// Writes `tokens` (n,) to `path` atomically (temporary file, fsync, rename).
void write_shard(const std::filesystem::path& path, std::span<const std::uint32_t> tokens);

// A validated, memory-mapped, read-only view of a shard. Opening checks the magic, the version,
// the token size, and that the file size is exactly header + count * token_bytes; each failure is
// a tessera::Error naming the file. A shard of zero tokens is valid.
class ShardReader {
 public:
  explicit ShardReader(const std::filesystem::path& path);
  ShardReader(ShardReader&& o) noexcept;
  ShardReader& operator=(ShardReader&& o) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ~ShardReader();

  std::size_t size() const { return count_; }                 // number of tokens
  std::uint32_t token_bytes() const { return token_bytes_; }  // 2 or 4
  const std::filesystem::path& path() const { return path_; }

  // Token i (i < size(), checked).
  std::uint32_t operator[](std::size_t i) const;
  // Tokens [offset, offset + count) -> out (count,). The range must lie inside the shard.
  void read(std::size_t offset, std::size_t count, std::int32_t* out) const;
  void read(std::size_t offset, std::size_t count, std::uint32_t* out) const;

 private:
  void release() noexcept;
  std::filesystem::path path_;
  void* map_ = nullptr;  // the whole file, or nullptr when it holds no tokens
  std::size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // (count_ * token_bytes_,) bytes
  std::size_t count_ = 0;
  std::uint32_t token_bytes_ = 2;
};

// A token id of a shard outside a vocabulary, and where it is.
struct IdOutside {
  std::size_t position = 0;
  std::uint32_t id = 0;
};
// The first id >= vocab_size among the shard's first `tokens` tokens (0 = all of them), or nullopt.
std::optional<IdOutside> first_id_outside(const ShardReader& shard, std::uint32_t vocab_size,
                                          std::size_t tokens = 0);

}  // namespace tessera::data
