#include "tessera/kernels/cuda/device.hpp"

#ifndef TESSERA_WITH_CUDA
namespace tessera::kernels::cuda {
bool compiled_with_cuda() {
  return false;
}
int device_count() {
  return 0;
}
std::string describe_devices() {
  return "built without CUDA (WITH_CUDA=OFF or no nvcc found)";
}
}  // namespace tessera::kernels::cuda
#endif
