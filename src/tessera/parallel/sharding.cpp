#include "tessera/parallel/sharding.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

std::size_t shard_begin(std::size_t total, int parts, int rank) {
  const std::size_t n = static_cast<std::size_t>(parts);
  const std::size_t per = (total + n - 1) / n;
  return std::min(total, per * static_cast<std::size_t>(rank));
}

std::vector<std::size_t> shard_counts(std::size_t total, int parts, std::size_t b, std::size_t e) {
  std::vector<std::size_t> c(static_cast<std::size_t>(parts));
  for (int r = 0; r < parts; ++r) {
    std::size_t lo = std::max(b, shard_begin(total, parts, r)),
                hi = std::min(e, shard_end(total, parts, r));
    c[r] = hi > lo ? hi - lo : 0;
  }
  return c;
}

std::int64_t rows_per_part(std::int64_t n_global, int parts) {
  if (n_global % parts != 0)
    throw Error(fmt::format("a batch of {} rows cannot be split over tz={}", n_global, parts),
                "use a batch (rows = micro-batch x sequence) divisible by tz");
  return n_global / parts;
}

}  // namespace tessera::parallel
