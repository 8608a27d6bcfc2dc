#include "tessera/train/peak.hpp"

#include <fmt/format.h>

#include "tessera/core/buffer.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"

namespace tessera::train {

std::string Peak::describe() const {
  if (flops <= 0) return "unknown peak (MFU not reported)";
  return fmt::format("{:.1f} GFLOP/s ({})", flops / 1e9, source);
}

double measure_gemm_gflops(kernels::GemmLibrary lib, int M, int N, int K, double seconds) {
  Buffer<float> a(static_cast<std::size_t>(M) * K), b(static_cast<std::size_t>(K) * N),
      c(static_cast<std::size_t>(M) * N);
  Rng rng(1);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = rng.uniform() - 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = rng.uniform() - 0.5f;
  kernels::gemm(lib, false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(),
                N);  // warm-up
  Timer t;
  int reps = 0;
  do {
    kernels::gemm(lib, false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
    ++reps;
  } while (t.seconds() < seconds);
  return 2.0 * M * N * K * reps / t.seconds() / 1e9;
}

Peak resolve_peak(double peak_tflops, kernels::GemmLibrary lib) {
  if (peak_tflops > 0) return {peak_tflops * 1e12, "configured hardware.peak_tflops"};
  if (peak_tflops < 0) return {0, "unknown"};
  return {measure_gemm_gflops(lib, 1024, 1024, 1024, 0.3) * 1e9,
          "measured fp32 GEMM 1024^3 on this machine"};
}

}  // namespace tessera::train
