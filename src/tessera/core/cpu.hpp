// CPU features that compilers' __builtin_cpu_supports does not name everywhere (clang 14 knows
// neither "f16c" nor "avx512bf16"), read from CPUID directly. x86-64 only.
#pragma once

namespace tessera {

bool cpu_has_f16c();         // CPUID.1:ECX[29], the fp16 <-> fp32 conversions
bool cpu_has_avx512_bf16();  // CPUID.(7,1):EAX[5], AVX-512 BF16 dot products and conversions

}  // namespace tessera
