// Helpers of the GPU tests: the skip rule (no CUDA build or no device: SKIPPED, never passed),
// device copies, bf16 rounding on the host and element-wise bound checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/core/rng.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/kernels/cuda/ops.hpp"

namespace gpu_test {

namespace gpu = tessera::kernels::cuda;
using tessera::Rng;

constexpr double k_u = 0x1p-24;      // fp32 unit roundoff
constexpr double k_u_bf16 = 0x1p-8;  // bf16 unit roundoff (8 significant bits)

// Why this test cannot run here, or empty if it can.
inline std::string gpu_skip_reason() {
#ifndef TESSERA_WITH_CUDA
  return "built without CUDA";
#else
  if (!gpu::compiled_with_cuda()) return "built without CUDA";
  if (gpu::device_count() == 0) return "no CUDA device: " + gpu::describe_devices();
  return {};
#endif
}

#define REQUIRE_GPU()                                                          \
  do {                                                                         \
    if (std::string reason_ = ::gpu_test::gpu_skip_reason(); !reason_.empty()) \
      GTEST_SKIP() << reason_;                                                 \
  } while (0)

// The committed fixtures' folder: $TESSERA_FIXTURES when set (binaries run away from the source
// tree), else the source tree's (TESSERA_FIXTURES, defined by the build).
inline std::filesystem::path fixtures_dir() {
  const char* env = std::getenv("TESSERA_FIXTURES");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(TESSERA_FIXTURES);
}

inline std::vector<float> randn(Rng& rng, std::size_t n, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = offset + scale * rng.normal();
  return v;
}

template <class T>
gpu::DeviceBuffer upload(const std::vector<T>& h) {
  gpu::DeviceBuffer d(h.size() * sizeof(T));
  gpu::to_device(d.data(), h.data(), h.size() * sizeof(T));
  return d;
}

template <class T>
std::vector<T> download(const gpu::DeviceBuffer& d, std::size_t n) {
  std::vector<T> h(n);
  gpu::synchronize();  // surfaces a kernel fault here rather than as a bad copy
  gpu::to_host(h.data(), d.data(), n * sizeof(T));
  return h;
}

// |got - ref| <= bound[i] for every element; reports the count and the worst element.
inline void expect_within(const std::vector<float>& got, const std::vector<float>& ref,
                          const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(bound.size(), ref.size()) << what;
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    double ratio = err / std::max(bound[i], 1e-300);
    if (!(err <= bound[i])) ++bad;  // NaN counts as bad
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                     << " elements out of bound; worst at " << worst << ": gpu " << got[worst]
                     << " cpu " << ref[worst] << " bound " << bound[worst];
}

inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                         double rtol, const std::string& what) {
  std::vector<double> bound(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) bound[i] = atol + rtol * std::abs(ref[i]);
  expect_within(got, ref, bound, what);
}

// Host bf16 rounding, round-to-nearest-even (finite inputs), the same as __float2bfloat16.
inline std::uint16_t to_bf16(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>(b >> 16);
}
inline float from_bf16(std::uint16_t h) {
  std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

}  // namespace gpu_test
