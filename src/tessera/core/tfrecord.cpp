#include "tessera/core/tfrecord.hpp"

#include <array>

namespace tessera {

namespace {

// The byte-at-a-time table of the reflected polynomial: entry b is the CRC register after
// shifting the byte b through it.
constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t r = b;
    for (int i = 0; i < 8; ++i) r = (r >> 1) ^ ((r & 1u) ? 0x82F63B78u : 0u);
    table[b] = r;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> k_crc32c_table = make_crc32c_table();

void append_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes, std::uint32_t crc) {
  std::uint32_t r = ~crc;
  for (const char c : bytes)
    r = (r >> 8) ^ k_crc32c_table[(r ^ static_cast<unsigned char>(c)) & 0xFFu];
  return ~r;
}

std::uint32_t mask_crc32c(std::uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, mask_crc32c(crc32c(out)), 4);
  out.append(data);
  append_le(out, mask_crc32c(crc32c(data)), 4);
  return out;
}

}  // namespace tessera
