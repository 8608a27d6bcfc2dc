// Token shards: round trips, and every malformed file is a tessera::Error, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/data/shard.hpp"

using namespace tessera::data;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  return tessera::test::fresh_scratch(name);
}

void write_raw(const fs::path& p, const std::string& bytes) {
  // Remove first: truncating and rewriting a file makes ext4 flush it on close (auto_da_alloc),
  // which turns the fuzz loop into thousands of disk writes.
  fs::remove(p);
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Expects opening `p` to throw a tessera::Error whose message contains `needle` and the path.
void expect_error(const fs::path& p, const std::string& needle) {
  try {
    ShardReader r(p);
    ADD_FAILURE() << "opened a bad shard, expected '" << needle << "'";
  } catch (const tessera::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find(p.string()), std::string::npos) << what;
  }
}

template <typename U>
void poke(std::string& bytes, std::size_t off, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i) bytes[off + i] = static_cast<char>(v >> (8 * i));
}

}  // namespace

TEST(Shard, RoundTripUint16) {
  auto dir = fresh_dir("tessera_shard_rt16");
  std::vector<std::uint32_t> toks = {0, 1, 50256, 65535, 7, 42};
  write_shard(dir / "a.bin", toks);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), k_shard_header_bytes + 2 * toks.size());
  const std::string bytes = tessera::read_file(dir / "a.bin");
  EXPECT_EQ(bytes.substr(0, 4), "TTOK");
  ShardReader r(dir / "a.bin");
  EXPECT_EQ(r.token_bytes(), 2u);
  ASSERT_EQ(r.size(), toks.size());
  for (std::size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(r[i], toks[i]);
  std::vector<std::int32_t> out(3);
  r.read(2, 3, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{50256, 65535, 7}));
  EXPECT_THROW(r.read(4, 3, out.data()), tessera::InternalError);
  fs::remove_all(dir);
}

TEST(Shard, RoundTripUint32) {
  auto dir = fresh_dir("tessera_shard_rt32");
  std::vector<std::uint32_t> toks;
  for (std::uint32_t i = 0; i < 1000; ++i) toks.push_back(i * 4099u);  // up to ~4.1 M
  write_shard(dir / "b.bin", toks);
  ShardReader r(dir / "b.bin");
  EXPECT_EQ(r.token_bytes(), 4u);
  ASSERT_EQ(r.size(), toks.size());
  std::vector<std::uint32_t> out(toks.size());
  r.read(0, toks.size(), out.data());
  EXPECT_EQ(out, toks);
  // Moving keeps the mapping valid.
  ShardReader moved = std::move(r);
  EXPECT_EQ(moved[999], 999u * 4099u);
  fs::remove_all(dir);
}

TEST(Shard, EmptyTokenListIsAValidShard) {
  auto dir = fresh_dir("tessera_shard_zero");
  write_shard(dir / "z.bin", {});
  ShardReader r(dir / "z.bin");
  EXPECT_EQ(r.size(), 0u);
  fs::remove_all(dir);
}

TEST(Shard, MalformedFilesAreClearErrors) {
  auto dir = fresh_dir("tessera_shard_bad");
  std::vector<std::uint32_t> toks = {1, 2, 3, 4, 5};
  write_shard(dir / "good.bin", toks);
  const std::string good = tessera::read_file(dir / "good.bin");
  const auto p = dir / "bad.bin";

  expect_error(dir / "missing.bin", "token shard not found");
  write_raw(p, "");
  expect_error(p, "empty");
  write_raw(p, "TT");
  expect_error(p, "bad magic");
  std::string b = good;
  poke<std::uint32_t>(b, 0, 0x12345678u);
  write_raw(p, b);
  expect_error(p, "not a tessera token shard (bad magic)");
  write_raw(p, good.substr(0, 100));  // right magic, header cut short
  expect_error(p, "truncated");
  b = good;
  poke<std::uint32_t>(b, 4, 2u);
  write_raw(p, b);
  expect_error(p, "version 2");
  b = good;
  poke<std::uint32_t>(b, 8, 3u);
  write_raw(p, b);
  expect_error(p, "bad token size 3");
  write_raw(p, good.substr(0, good.size() - 3));  // 3.5 tokens left
  expect_error(p, "truncated: header says 5 tokens but file holds 3");
  write_raw(p, good.substr(0, k_shard_header_bytes));  // header only
  expect_error(p, "truncated: header says 5 tokens but file holds 0");
  write_raw(p, good + "xyz");
  expect_error(p, "3 extra bytes after its 5 tokens");
  b = good;
  poke<std::uint64_t>(b, 16, ~0ull);  // count that overflows count * token_bytes
  write_raw(p, b);
  expect_error(p, "truncated");
  fs::create_directories(dir / "dir.bin");
  expect_error(dir / "dir.bin", "not a regular file");
  fs::remove_all(dir);
}

TEST(Shard, FuzzedFilesLoadOrThrow) {
  // Random byte mutations, truncations and extensions of a valid shard (header fields are hit
  // most): each must either open and read back, or throw tessera::Error.
  auto dir = fresh_dir("tessera_shard_fuzz");
  std::vector<std::uint32_t> small = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9};
  std::vector<std::uint32_t> wide = {70000, 1, 2, 3};
  write_shard(dir / "s.bin", small);
  write_shard(dir / "w.bin", wide);
  const std::string seeds[2] = {tessera::read_file(dir / "s.bin"),
                                tessera::read_file(dir / "w.bin")};
  tessera::Rng rng(2024);
  const auto p = dir / "f.bin";
  int opened = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string b = seeds[it % 2];
    const int edits = 1 + static_cast<int>(rng.next_u32() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng.next_u32() % 5) {
        case 0:
        case 1: {  // header field byte
          b[rng.next_u32() % 24] = static_cast<char>(rng.next_u32());
          break;
        }
        case 2: {  // any byte
          b[rng.next_u32() % b.size()] = static_cast<char>(rng.next_u32());
          break;
        }
        case 3: {  // truncate
          b.resize(rng.next_u32() % (b.size() + 1));
          if (b.empty()) b = seeds[0].substr(0, 1);
          break;
        }
        default: {  // extend
          b.append(rng.next_u32() % 9, static_cast<char>(rng.next_u32()));
          break;
        }
      }
    }
    write_raw(p, b);
    try {
      ShardReader r(p);
      std::vector<std::uint32_t> out(r.size());
      r.read(0, r.size(), out.data());
      for (std::size_t i = 0; i < r.size(); ++i) ASSERT_EQ(out[i], r[i]);
      ASSERT_EQ(b.size(), k_shard_header_bytes + r.size() * r.token_bytes());
      ++opened;
    } catch (const tessera::Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(rejected, 0);
  fs::remove_all(dir);
}
