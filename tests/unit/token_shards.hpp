// A token stream with structure to learn (each token a function of the previous one, half the
// time, over 500 ids), written as DIR/train.bin and DIR/val.bin, for short training runs in tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "tessera/core/rng.hpp"
#include "tessera/data/shard.hpp"

namespace tessera::test_data {

inline std::filesystem::path write_structured_shards(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Rng rng(5);
  for (const char* split : {"train.bin", "val.bin"}) {
    std::vector<std::uint32_t> toks(40000);
    std::uint32_t prev = 0;
    for (auto& t : toks) {
      t = rng.next_u64() % 2 ? (prev * 7 + 3) % 500
                             : static_cast<std::uint32_t>(rng.next_u64() % 500);
      prev = t;
    }
    data::write_shard(dir / split, toks);
  }
  return dir;
}

}  // namespace tessera::test_data
