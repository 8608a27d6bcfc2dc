// Compiled only when the CUDA backend is on. The kernels of the GPU backend join this folder.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "tessera/kernels/cuda/check.hpp"

#include "tessera/kernels/cuda/device.hpp"

namespace tessera::kernels::cuda {

bool compiled_with_cuda() {
  return true;
}

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
  std::string s =
      "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
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

void use_device(int index) {
  TESSERA_CUDA_CHECK(cudaSetDevice(index));
}

int current_device() {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return p.name;
}

double dense_bf16_peak_tflops() {
  const std::string n = device_name();
  if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos) return 989.4;
  if (n.find("A100") != std::string::npos) return 312.0;
  return 0.0;
}

struct DeviceProfiler::State {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> pool;   // reused from step to step
  std::vector<OpFamily> families;  // families[i]: the family that starts at event i
  std::size_t used = 0;
};

DeviceProfiler::DeviceProfiler(void* stream) : s_(std::make_unique<State>()) {
  s_->stream = static_cast<cudaStream_t>(stream);
}

DeviceProfiler::~DeviceProfiler() {
  for (cudaEvent_t e : s_->pool) cudaEventDestroy(e);
}

void DeviceProfiler::mark(OpFamily f) {
  if (s_->used == s_->pool.size()) {
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreate(&e));
    s_->pool.push_back(e);
    s_->families.push_back(f);
  }
  s_->families[s_->used] = f;
  TESSERA_CUDA_CHECK(cudaEventRecord(s_->pool[s_->used], s_->stream));
  ++s_->used;
}

void DeviceProfiler::finish(Profile& into) {
  if (s_->used == 0) return;
  mark(OpFamily::Count);  // the end of the last interval
  TESSERA_CUDA_CHECK(cudaEventSynchronize(s_->pool[s_->used - 1]));
  for (std::size_t i = 0; i + 1 < s_->used; ++i) {
    float ms = 0.0f;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, s_->pool[i], s_->pool[i + 1]));
    into[s_->families[i]] += ms * 1e-3;
  }
  s_->used = 0;
}

}  // namespace tessera::kernels::cuda
