// CUDA device discovery. Built when WITH_CUDA resolves to ON; the CPU build answers "no CUDA".
#pragma once

#include <string>

namespace tessera::kernels::cuda {

bool compiled_with_cuda();
// Number of usable CUDA devices (0 when built without CUDA or when no driver/GPU is present).
int device_count();
// "CUDA 13.0, 1 device(s): NVIDIA H100 ..." or the reason there is none.
std::string describe_devices();

}  // namespace tessera::kernels::cuda
