// The peak FLOP/s of this CPU, as papers and tools mean it for MFU: cores x clock x FLOPs per
// cycle per core, the last from the widest vector unit and its FMA pipes (read from CPUID) and the
// clock from the kernel (cpufreq's maximum, else /proc/cpuinfo). x86-64 only; elsewhere unknown.
#pragma once

#include <string>
#include <string_view>

namespace tessera {

// What decides a core's FLOPs per cycle.
struct CpuVectorUnits {
  bool amd = false, intel = false;
  int family = 0, model = 0;  // CPUID.1 display family and model
  bool avx = false, avx2 = false, fma = false, avx512f = false;
  bool avx512_bf16 = false, amx_bf16 = false;
};
CpuVectorUnits cpu_vector_units();  // this CPU

// FLOPs per cycle per core (an FMA counts 2) and a name of the unit that gives them:
//   AVX-512, Intel (Skylake-SP and later servers, two 512-bit FMA pipes):      2 x 16 x 2 = 64
//   AVX-512, AMD Zen 4 (family 0x19: 512-bit ops run as two 256-bit halves):   2 x  8 x 2 = 32
//   AVX-512, AMD Zen 5 and later (family >= 0x1A, full 512-bit pipes):         2 x 16 x 2 = 64
//   AVX2 + FMA (Haswell and later, Zen 2 and 3):                               2 x  8 x 2 = 32
//   AVX2 + FMA on Zen 1 / Zen+ (family 0x17, model < 0x30: 128-bit pipes):     2 x  4 x 2 = 16
//   AVX without FMA (one 256-bit add and one multiply pipe):                   8 + 8      = 16
//   SSE:                                                                       4 + 4      =  8
// Intel parts with a single 512-bit FMA pipe (some Xeon Bronze/Silver) have half the AVX-512
// figure; set hardware.peak_tflops there. bf16: AMX tiles 1024 (Sapphire Rapids and later); the
// AVX-512 BF16 dot product twice the fp32 figure; without either, bf16 runs on the fp32 units.
int fp32_flops_per_cycle(const CpuVectorUnits& units, std::string* unit_name = nullptr);
int bf16_flops_per_cycle(const CpuVectorUnits& units, std::string* unit_name = nullptr);

// From the text of /proc/cpuinfo: the physical cores (distinct "physical id" / "core id" pairs;
// the "processor" count when those are absent) and the highest "cpu MHz".
struct CpuInfo {
  int physical_cores = 0;
  double max_mhz = 0;
};
CpuInfo parse_cpuinfo(std::string_view text);

struct CpuPeak {
  int cores = 0;            // physical cores the threads run on
  double ghz = 0;           // clock
  int flops_per_cycle = 0;  // per core
  std::string unit;         // "AVX2 FMA", "AVX-512 (2 FMA pipes)", ...
  std::string clock_source;
  double flops() const { return cores * ghz * 1e9 * flops_per_cycle; }  // 0: unknown
  std::string describe() const;  // "2 cores x 2.45 GHz (/proc/cpuinfo) x 32 FLOP/cycle (...)"
};

// The peak of `threads` threads of this CPU (at most one per physical core counts), for fp32 or
// bf16 arithmetic.
CpuPeak cpu_peak(int threads, bool bf16);

}  // namespace tessera
