// Deterministic random numbers with a state that is one 64-bit value, so it can be saved in a
// checkpoint and resumed bit-exactly. xorshift64* for bits, Box-Muller for normals.
#pragma once

#include <cmath>
#include <cstdint>

namespace tessera {

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 1337) { reseed(seed); }
  void reseed(std::uint64_t seed) {
    // splitmix64 so that small seeds give well-mixed, non-zero states
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    state_ = (z ^ (z >> 31)) | 1ull;
  }
  std::uint64_t next_u64() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  std::uint32_t next_u32() { return static_cast<std::uint32_t>(next_u64() >> 32); }
  // Uniform in [0, 1) with 24 bits of precision.
  float uniform() { return static_cast<float>(next_u32() >> 8) / 16777216.0f; }
  // Standard normal (Box-Muller, one value per call; deterministic).
  float normal() {
    double u1 = (static_cast<double>(next_u64() >> 11) + 0.5) / 9007199254740992.0;
    double u2 = static_cast<double>(next_u64() >> 11) / 9007199254740992.0;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  std::uint64_t state() const { return state_; }
  void set_state(std::uint64_t s) { state_ = s ? s : 1ull; }

 private:
  std::uint64_t state_ = 1;
};

}  // namespace tessera
