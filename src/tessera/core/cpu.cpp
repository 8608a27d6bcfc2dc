#include "tessera/core/cpu.hpp"

#include <cpuid.h>

namespace tessera {

// CPUID is read once per process: the answer cannot change, and in a virtual machine every
// CPUID traps to the hypervisor (microseconds), which the packed kernels' per-call ISA check
// would pay on every matrix-vector product.
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
  }();
  return has;
}

bool cpu_has_avx512_bf16() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1u) &&
           __builtin_cpu_supports("avx512f");
  }();
  return has;
}

}  // namespace tessera
