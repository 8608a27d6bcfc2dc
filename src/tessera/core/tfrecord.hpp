// TFRecord framing (the container of TensorBoard's event files) and the CRC-32C it uses.
// A record is: the data's length (uint64, little-endian), the masked CRC-32C of those 8 bytes
// (uint32), the data, the masked CRC-32C of the data (uint32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF), the
// checksum of iSCSI (RFC 3720) and of TFRecord. `crc` continues an earlier call's result.
std::uint32_t crc32c(std::string_view bytes, std::uint32_t crc = 0);

// TFRecord's masking of a CRC stored next to the data it covers: rotate right by 15, add a
// constant.
std::uint32_t mask_crc32c(std::uint32_t crc);

// `data` framed as one TFRecord.
std::string tfrecord(std::string_view data);

}  // namespace tessera
