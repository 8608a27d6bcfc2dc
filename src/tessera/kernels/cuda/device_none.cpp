#include "tessera/kernels/cuda/device.hpp"

#ifndef TESSERA_WITH_CUDA
#include "tessera/core/error.hpp"

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
void use_device(int) {
  throw Error("built without CUDA: there is no device to use");
}
int current_device() {
  return -1;
}
std::string device_name() {
  return "";
}
double dense_bf16_peak_tflops() {
  return 0.0;
}
bool cublaslt_loaded() {
  return false;
}
void load_cublaslt() {
  throw Error("built without CUDA: there is no cuBLASLt to load");
}
struct DeviceProfiler::State {};
DeviceProfiler::DeviceProfiler(void*) {
  throw Error("built without CUDA: DeviceProfiler is unavailable");
}
DeviceProfiler::~DeviceProfiler() = default;
void DeviceProfiler::mark(OpFamily) {}
void DeviceProfiler::finish(Profile&) {}

}  // namespace tessera::kernels::cuda
#endif
