// This process's resident memory, from /proc/self (Linux). Each call reads the file once; a
// machine without /proc reads 0 and the reset reports false.
#pragma once

#include <cstddef>

namespace tessera {

// Resident set size now (VmRSS), in bytes.
std::size_t resident_bytes();
// The peak resident set size since the start or the last reset_peak_resident() (VmHWM).
std::size_t peak_resident_bytes();
// Starts a new peak from the current resident size (writes 5 to /proc/self/clear_refs).
bool reset_peak_resident();

}  // namespace tessera
