// Compiled only when the CUDA backend is on. The kernels of the GPU backend join this folder.
#include <cuda_runtime.h>

#include <string>

#include "tessera/kernels/cuda/device.hpp"

namespace tessera::kernels::cuda {

bool compiled_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::string describe_devices() {
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  std::string s = "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    s += ", no device (" + std::string(cudaGetErrorString(err)) + ")";
    cudaGetLastError();
    return s;
  }
  s += ", " + std::to_string(n) + " device(s)";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess) s += std::string(i ? "; " : ": ") + p.name;
  }
  return s;
}

}  // namespace tessera::kernels::cuda
