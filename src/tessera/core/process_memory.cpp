#include "tessera/core/process_memory.hpp"

#include <fstream>
#include <string>

namespace tessera {
namespace {

std::size_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string want = std::string(field) + ":";
  std::string key;
  while (in >> key) {
    if (key == want) {
      std::size_t kb = 0;
      in >> kb;
      return kb;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

}  // namespace

std::size_t resident_bytes() {
  return status_kib("VmRSS") * 1024;
}

std::size_t peak_resident_bytes() {
  return status_kib("VmHWM") * 1024;
}

bool reset_peak_resident() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace tessera
