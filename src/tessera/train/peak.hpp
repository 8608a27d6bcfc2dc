// Peak FLOP/s for MFU: the configured value, or the fp32 GEMM rate measured on this machine.
#pragma once

#include <string>

#include "tessera/kernels/gemm.hpp"

namespace tessera::train {

struct Peak {
  double flops = 0;    // FLOP/s; 0 = unknown
  std::string source;  // "configured", "measured fp32 GEMM", "unknown"
  std::string describe() const;
};

// peak_tflops > 0: configured. 0: measure a large fp32 GEMM for ~0.3 s (a measured value: CPUs
// have no reliable peak table; the GPU backend will add a device table). If the measurement
// fails to give a positive rate, the peak is unknown and MFU is reported as "unknown".
Peak resolve_peak(double peak_tflops, kernels::GemmLibrary lib);

}  // namespace tessera::train
