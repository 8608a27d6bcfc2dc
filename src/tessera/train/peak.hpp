// The peaks a step's FLOP rate is compared with: the hardware's peak FLOP/s (MFU, as papers and
// tools mean it) and, on the CPU, the GEMM rate measured on this machine at start-up
// (gemm_fraction: how close the step comes to what the GEMM library reaches here).
#pragma once

#include <string>

namespace tessera::train {

struct Peak {
  double flops = 0;       // the hardware's peak FLOP/s of one rank (MFU); 0 = unknown
  std::string source;     // "configured hardware.peak_tflops", the CPU's derivation, ...
  double gemm_flops = 0;  // the measured GEMM rate (gemm_fraction); 0 = not measured
  std::string gemm_source;
  std::string describe() const;       // the hardware peak and where it comes from
  std::string describe_gemm() const;  // the GEMM rate and what was measured
};

// The hardware peak of a CPU rank: hardware.peak_tflops when > 0, else this CPU's peak for
// `threads` threads (core/cpu_peak.hpp) in fp32 or bf16.
Peak cpu_hardware_peak(double peak_tflops, int threads, bool bf16);

}  // namespace tessera::train
