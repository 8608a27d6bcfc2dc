#include "tessera/core/cpu.hpp"

#include <cpuid.h>

namespace tessera {

bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c >> 29) & 1u;
}

bool cpu_has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return ((a >> 5) & 1u) && __builtin_cpu_supports("avx512f");
}

}  // namespace tessera
