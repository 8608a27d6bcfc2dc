// Causal attention on the GPU: the bf16 flash kernels (tensor cores) and cuDNN's fused attention
// (where the machine has cuDNN 9) against the fp32 reference kernels, forward and backward, at a
// training shape. Reports milliseconds and TFLOP/s (causal FLOPs: forward 2 matmuls of B NH T^2 hs
// / 2 multiply-adds each, backward 5). Not a test.
//   bench_gpu_attention [--B 8] [--T 1024] [--NH 12] [--hs 64] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tessera/kernels/cuda/cudnn_attention.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/kernels/cuda/ops.hpp"

namespace gpu = tessera::kernels::cuda;

namespace {

// Median milliseconds of fn over reps runs (after 3 warm-ups), timed with CUDA events.
double time_ms(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int B = 8, T = 1024, NH = 12, hs = 64, reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (k == "--B")
      B = v;
    else if (k == "--T")
      T = v;
    else if (k == "--NH")
      NH = v;
    else if (k == "--hs")
      hs = v;
    else if (k == "--reps")
      reps = v;
  }
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_attention: skipped (%s)\n", gpu::describe_devices().c_str());
    return 0;
  }
  const int C = NH * hs;
  const std::size_t n_qkv = std::size_t(B) * T * 3 * C, n_out = std::size_t(B) * T * C;
  std::vector<float> h(n_qkv);
  unsigned s = 1;
  for (auto& x : h) x = ((s = s * 1664525u + 1013904223u) >> 8) * (1.0f / 16777216.0f) * 2 - 1;
  gpu::DeviceBuffer qkv(n_qkv * 4), out(n_out * 4), lse(std::size_t(B) * NH * T * 4),
      dout(n_out * 4), dqkv(n_qkv * 4);
  gpu::to_device(qkv.data(), h.data(), n_qkv * 4);
  gpu::to_device(dout.data(), h.data(), n_out * 4);
  gpu::DeviceBuffer qkv16(n_qkv * 2), out16(n_out * 2), dout16(n_out * 2), dqkv16(n_qkv * 2),
      ws(gpu::flash_attention_workspace_bytes(B, T, C, NH));
  gpu::float_to_bf16(qkv16.as<std::uint16_t>(), qkv.as<float>(), n_qkv, nullptr);
  gpu::float_to_bf16(dout16.as<std::uint16_t>(), dout.as<float>(), n_out, nullptr);

  const double fwd_flop = 2.0 * 2.0 * B * NH * double(T) * T * hs / 2.0;
  const double bwd_flop = 2.5 * fwd_flop;
  auto report = [&](const char* what, double ms, double flop) {
    std::printf("%-28s %9.3f ms %8.1f TFLOP/s\n", what, ms, flop / (ms * 1e-3) / 1e12);
  };
  std::printf("# %s\n# B=%d T=%d NH=%d hs=%d\n", gpu::describe_devices().c_str(), B, T, NH, hs);
  report("flash bf16 forward",
         time_ms(
             [&] {
               gpu::flash_attention_forward(out16.as<std::uint16_t>(), lse.as<float>(),
                                            qkv16.as<std::uint16_t>(), B, T, C, NH, nullptr);
             },
             reps),
         fwd_flop);
  report("flash bf16 backward",
         time_ms(
             [&] {
               gpu::flash_attention_backward(dqkv16.as<std::uint16_t>(), dout16.as<std::uint16_t>(),
                                             qkv16.as<std::uint16_t>(), out16.as<std::uint16_t>(),
                                             lse.as<float>(), ws.as<float>(), B, T, C, NH, nullptr);
             },
             reps),
         bwd_flop);
  std::string why;
  if (auto cudnn = gpu::CudnnAttention::create(NH, NH, hs, &why); cudnn && cudnn->supports(B, T)) {
    std::printf("# %s\n", cudnn->version().c_str());
    report("cuDNN bf16 forward",
           time_ms(
               [&] {
                 cudnn->forward(out16.as<std::uint16_t>(), lse.as<float>(),
                                qkv16.as<std::uint16_t>(), B, T, nullptr);
               },
               reps),
           fwd_flop);
    report("cuDNN bf16 backward",
           time_ms(
               [&] {
                 cudnn->backward(dqkv16.as<std::uint16_t>(), dout16.as<std::uint16_t>(),
                                 qkv16.as<std::uint16_t>(), out16.as<std::uint16_t>(),
                                 lse.as<float>(), B, T, nullptr);
               },
               reps),
           bwd_flop);
  } else {
    std::printf("# cuDNN attention: %s\n", cudnn ? "no engine for this shape" : why.c_str());
  }
  report("fp32 reference forward",
         time_ms(
             [&] {
               gpu::attention_forward(out.as<float>(), lse.as<float>(), qkv.as<float>(), B, T, NH,
                                      NH, hs, nullptr);
             },
             std::max(2, reps / 5)),
         fwd_flop);
  report("fp32 reference backward",
         time_ms(
             [&] {
               gpu::attention_backward(dqkv.as<float>(), dout.as<float>(), qkv.as<float>(),
                                       out.as<float>(), lse.as<float>(), B, T, NH, NH, hs, nullptr);
             },
             std::max(2, reps / 5)),
         bwd_flop);
  gpu::synchronize();
  return 0;
}
