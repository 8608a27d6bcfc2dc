// bf16 bit patterns (the upper 16 bits of an fp32) and fp32: the one definition of the rounding,
// shared by the CPU kernels and the communicators' bf16 reductions.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera {

// Round to nearest even; NaN stays a (quiet) NaN.
inline std::uint16_t fp32_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
// Exact.
inline float bf16_to_fp32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

}  // namespace tessera
