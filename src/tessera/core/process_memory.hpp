// This process's resident memory, from /proc/self (Linux). Each call reads the file once; a
// machine without /proc reads 0 and the reset reports false.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera {

// Resident set size now (VmRSS), in bytes.
std::size_t resident_bytes();
// The peak resident set size since the start or the last reset_peak_resident() (VmHWM).
std::size_t peak_resident_bytes();
// Starts a new peak from the current resident size (writes 5 to /proc/self/clear_refs).
bool reset_peak_resident();

// This machine's memory and swap (MemTotal + SwapTotal of /proc/meminfo), in bytes; 0 if unknown.
std::size_t machine_memory_bytes();

// Refuses, before anything is allocated, work that needs more memory than this machine has:
// throws tessera::Error "<what> needs N GB of memory, more than this machine's M GB" with `hint`.
// Does nothing when the machine's memory is unknown.
void check_fits_in_memory(double bytes, std::string_view what, std::string hint);

}  // namespace tessera
