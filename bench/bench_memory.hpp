// The memory read bandwidth the decoding benchmarks compare with, measured in the same run.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace tessera::bench {

// The parallel read rate of a buffer much larger than the caches: each thread sums its chunk
// with 4 independent AVX2 accumulators (so the adds never limit the loads), best of 5.
inline double stream_read_gbs(std::size_t mib) {
  std::vector<float> buf(mib * 1024 * 1024 / 4);
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = float(i & 1023);
  const std::int64_t n32 = static_cast<std::int64_t>(buf.size() / 32);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    float sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (std::int64_t b = 0; b < n32; ++b) {
      const float* p = buf.data() + b * 32;
      __m256 a = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
      a = _mm256_add_ps(a, _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
      sum += _mm256_cvtss_f32(a);  // one lane: the sum only keeps the loads
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sum < 0) std::printf("%f", sum);
    best = std::max(best, buf.size() * 4.0 / s / 1e9);
  }
  return best;
}

}  // namespace tessera::bench
