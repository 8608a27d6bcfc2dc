// The memory read bandwidth the decoding benchmarks compare with, measured in the same run, and
// the core's clock at the time.
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

// Bytes a decode step reads, where they lie.
struct Span {
  const void* data;
  std::size_t bytes;
};

// Seconds for one streaming read of every span, the best of `reps`: one parallel region, each
// thread reading its share of each span in turn (no barrier between spans), 128 bytes at a time
// (four 32-byte loads added pairwise, their max kept: the arithmetic never limits the loads).
// Reading the weights themselves makes the reference independent of where a
// separate test buffer's pages happen to lie (on shared machines the same loop reads a fresh
// buffer at rates that differ by 1.7x from one allocation to the next).
inline double read_spans_seconds(const std::vector<Span>& spans, int reps = 3) {
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    float sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sum)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      __m256 acc = _mm256_setzero_ps();
      for (const Span& sp : spans) {
        const std::size_t n128 = sp.bytes / 128;
        const auto* base = static_cast<const char*>(sp.data);
        for (std::size_t b = n128 * t / nt; b < n128 * (t + 1) / nt; ++b) {
          const float* p = reinterpret_cast<const float*>(base + 128 * b);
          __m256 a = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
          a = _mm256_add_ps(a, _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
          acc = _mm256_max_ps(acc, a);  // keeps the loads; codes read as floats may be NaN
        }
      }
      sum += _mm256_cvtss_f32(acc);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sum == 12345.0f) std::printf(" ");
    best = rep == 0 ? s : std::min(best, s);
  }
  return best;
}

// The parallel read rate of a buffer much larger than the caches (GB/s): read_spans_seconds
// over the one buffer, best of `reps`.
inline double stream_read_gbs(std::size_t mib, int reps = 5) {
  std::vector<float> buf(mib * 1024 * 1024 / 4);
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = float(i & 1023);
  const std::size_t bytes = buf.size() * sizeof(float);
  return bytes / read_spans_seconds({{buf.data(), bytes}}, reps) / 1e9;
}

// The calling thread's core clock now (GHz): a chain of dependent one-cycle integer adds for
// `seconds`. On the shared VMs the benchmarks run on it ranges from 2.3 to 3.7 GHz from one
// minute to the next, and the decode step's arithmetic follows it. 0 where not measured (not
// x86-64).
inline double core_clock_ghz(double seconds = 0.05) {
#if defined(__x86_64__)
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t x = 0, n = 0;
  double s = 0;
  do {
    for (int i = 0; i < 1000000; ++i) asm volatile("add $1, %0" : "+r"(x));
    n += 1000000;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (s < seconds);
  return static_cast<double>(n) / s / 1e9;
#else
  (void)seconds;
  return 0.0;
#endif
}

}  // namespace tessera::bench
