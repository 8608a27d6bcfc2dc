#include "tessera/train/goldfish.hpp"

#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"

namespace tessera::train {
namespace {

const std::vector<float>& hash_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(k_goldfish_table_size);
    Rng rng(k_goldfish_table_seed);
    for (auto& v : t) v = rng.uniform();
    return t;
  }();
  return table;
}

std::uint64_t mix64(std::uint64_t z) {  // splitmix64 finalizer
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t id_mod(std::int32_t id) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(id)) % k_goldfish_table_size;
}

}  // namespace

bool goldfish_hash_drops(const std::int32_t* window, int h, int k) {
  std::uint64_t key = 1;
  for (int i = 0; i < h; ++i) key = key * id_mod(window[i]) % k_goldfish_table_size;
  return static_cast<double>(hash_table()[key]) < 1.0 / k;
}

std::int64_t apply_goldfish(const GoldfishConfig& cfg, std::int32_t* targets, int B, int T,
                            std::uint64_t first_pos, std::int64_t step) {
  if (cfg.k < 0 || cfg.k == 1)
    throw Error(fmt::format("invalid goldfish.k = {}: must be 0 (off) or >= 2", cfg.k),
                "k = 4 drops about a quarter of the targets");
  if (cfg.h < 1)
    throw Error(fmt::format("invalid goldfish.h = {}: must be >= 1", cfg.h), "13 is typical");
  const int k = cfg.k;
  enum { Off, Hash, Static, Random } s = Off;
  if (k > 0) {
    if (cfg.strategy == "hash")
      s = Hash;
    else if (cfg.strategy == "static")
      s = Static;
    else if (cfg.strategy == "random")
      s = Random;
    else
      throw Error(fmt::format("unknown goldfish.strategy \"{}\"", cfg.strategy),
                  "use \"hash\", \"static\" or \"random\"");
  }
  const std::uint64_t step_key = mix64(cfg.seed ^ mix64(static_cast<std::uint64_t>(step)));
  const double threshold = k > 0 ? 1.0 / k : 0.0;
  std::int64_t kept = 0;
  for (int b = 0; b < B; ++b) {
    std::int32_t* row = targets + static_cast<std::size_t>(b) * T;
    // The hash decisions read the original ids: decide the whole row before writing -1s.
    std::vector<char> drop(s == Off ? 0 : static_cast<std::size_t>(T), 0);
    for (int t = 0; t < T && s != Off; ++t) {
      switch (s) {
        case Hash:
          drop[t] = t >= cfg.h - 1 && goldfish_hash_drops(row + t - (cfg.h - 1), cfg.h, k);
          break;
        case Static:
          drop[t] = (t + 1) % k == 0;
          break;
        case Random: {
          const std::uint64_t pos = first_pos + static_cast<std::uint64_t>(b) * T + t;
          const double u = static_cast<double>(mix64(step_key ^ mix64(pos)) >> 11) * 0x1.0p-53;
          drop[t] = u < threshold;
          break;
        }
        default:
          break;
      }
    }
    for (int t = 0; t < T; ++t) {
      if (s != Off && drop[t]) row[t] = -1;
      if (row[t] >= 0) ++kept;
    }
  }
  return kept;
}

}  // namespace tessera::train
