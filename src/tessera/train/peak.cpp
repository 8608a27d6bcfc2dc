#include "tessera/train/peak.hpp"

#include <fmt/format.h>

namespace tessera::train {

std::string Peak::describe() const {
  if (flops <= 0) return "unknown peak (MFU not reported)";
  return fmt::format("{:.1f} GFLOP/s ({})", flops / 1e9, source);
}

Peak resolve_peak(double peak_tflops, kernels::GemmLibrary lib) {
  if (peak_tflops > 0) return {peak_tflops * 1e12, "configured hardware.peak_tflops"};
  if (peak_tflops < 0) return {0, "unknown"};
  return {kernels::measure_gemm_gflops(lib, false, 1024, 1024, 1024, 1, 0.3) * 1e9,
          "measured fp32 GEMM 1024^3 on this machine"};
}

}  // namespace tessera::train
