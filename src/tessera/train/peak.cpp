#include "tessera/train/peak.hpp"

#include <fmt/format.h>

#include "tessera/core/cpu_peak.hpp"

namespace tessera::train {

std::string Peak::describe() const {
  if (flops <= 0) return "unknown peak (MFU not reported; set hardware.peak_tflops)";
  return fmt::format("{:.1f} GFLOP/s ({})", flops / 1e9, source);
}

std::string Peak::describe_gemm() const {
  if (gemm_flops <= 0) return "not measured";
  return fmt::format("{:.1f} GFLOP/s ({})", gemm_flops / 1e9, gemm_source);
}

Peak cpu_hardware_peak(double peak_tflops, int threads, bool bf16) {
  Peak peak;
  if (peak_tflops > 0) {
    peak.flops = peak_tflops * 1e12;
    peak.source = "configured hardware.peak_tflops";
    return peak;
  }
  const CpuPeak cpu = cpu_peak(threads, bf16);
  peak.flops = cpu.flops();
  peak.source = fmt::format("{} peak of this CPU: {}", bf16 ? "bf16" : "fp32", cpu.describe());
  return peak;
}

}  // namespace tessera::train
