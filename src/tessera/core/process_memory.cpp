#include "tessera/core/process_memory.hpp"

#include <fstream>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {
namespace {

std::size_t status_kib(const char* field, const char* file = "/proc/self/status") {
  std::ifstream in(file);
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

std::size_t machine_memory_bytes() {
  return (status_kib("MemTotal", "/proc/meminfo") + status_kib("SwapTotal", "/proc/meminfo")) *
         1024;
}

void check_fits_in_memory(double bytes, std::string_view what, std::string hint) {
  const double have = static_cast<double>(machine_memory_bytes());
  if (have > 0 && bytes > have)
    throw Error(fmt::format("{} needs {:.3g} GB of memory, more than this machine's {:.1f} GB "
                            "(memory and swap)",
                            what, bytes / 1e9, have / 1e9),
                std::move(hint));
}

}  // namespace tessera
