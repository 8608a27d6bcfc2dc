// CUDA device discovery. Built when WITH_CUDA resolves to ON; the CPU build answers "no CUDA".
#pragma once

#include <memory>
#include <string>

#include "tessera/kernels/profile.hpp"

namespace tessera::kernels::cuda {

bool compiled_with_cuda();
// Number of usable CUDA devices (0 when built without CUDA or when no driver/GPU is present).
int device_count();
// "CUDA 13.0, 1 device(s): NVIDIA H100 ..." or the reason there is none.
std::string describe_devices();
// Makes device `index` (0 <= index < device_count()) the current one of this thread.
void use_device(int index);
int current_device();
// The current device's name ("" without one).
std::string device_name();
// Dense bf16 tensor-core peak of the current device in TFLOP/s from its name (the SXM parts:
// H100/H200 989.4, A100 312), or 0 when unknown.
double dense_bf16_peak_tflops();
// cuBLASLt, which the GPU GEMM loads at its first call rather than linking it (see cublaslt.hpp):
// whether this process has loaded it (false without CUDA), and loading it now (no device needed;
// throws tessera::Error, with a hint, where it cannot be loaded or without CUDA).
bool cublaslt_loaded();
void load_cublaslt();

// Device time per op family on one stream: mark(f) records an event (the ops issued after it, up
// to the next mark, count for f); finish() waits for the stream and adds the elapsed times to a
// Profile. Events cost a few microseconds each; meant for "where does the step go" reports.
class DeviceProfiler {
 public:
  explicit DeviceProfiler(void* stream = nullptr);
  ~DeviceProfiler();
  DeviceProfiler(const DeviceProfiler&) = delete;
  DeviceProfiler& operator=(const DeviceProfiler&) = delete;
  void mark(OpFamily f);
  void finish(Profile& into);  // ends the last family, adds every interval, starts afresh

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tessera::kernels::cuda
