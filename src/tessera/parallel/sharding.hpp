// The one sharding convention of tessera: a range of `total` elements split over `parts` ranks
// gives rank r the elements [r*ceil(total/parts), min(total, (r+1)*ceil(total/parts))) (the last
// shards may be shorter or empty). ZeRO's flat-buffer shards, the tz shards of tensor-parallel
// weight blocks and the checkpoint shards all use it, so any of them can be resharded into
// another by intersecting ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::parallel {

std::size_t shard_begin(std::size_t total, int parts, int rank);
inline std::size_t shard_end(std::size_t total, int parts, int rank) {
  return shard_begin(total, parts, rank + 1);
}

// Elements of [b, e) held by each rank's shard (the counts of a variable-count collective over
// that range).
std::vector<std::size_t> shard_counts(std::size_t total, int parts, std::size_t b, std::size_t e);

// Rows of a batch split evenly over tz (throws tessera::Error when they do not divide).
std::int64_t rows_per_part(std::int64_t n_global, int parts);

}  // namespace tessera::parallel
