// Branch-free elementwise math that the compiler vectorizes (no libm calls in hot loops).
// exp_approx: Cephes-style range reduction + degree-6 polynomial, max relative error ~2e-7
// over the clamped range; tanh_approx built on it. Used by softmax, cross-entropy and GELU.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace tessera::kernels::cpu {

// exp_approx's constants: the clamps, log2(e), ln 2 split in two, the polynomial's coefficients.
inline constexpr float k_exp_hi = 88.3762626647949f, k_exp_lo = -87.3365447504f;
inline constexpr float k_log2e = 1.44269504088896341f, k_ln2_hi = 0.693359375f,
                       k_ln2_lo = 2.12194440e-4f;
inline constexpr float k_exp_poly[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                        4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

inline float exp_approx(float x) {
  x = std::min(x, k_exp_hi);
  x = std::max(x, k_exp_lo);
  float n = std::floor(x * k_log2e + 0.5f);
  float r = x - n * k_ln2_hi + n * k_ln2_lo;
  float r2 = r * r;
  float y = k_exp_poly[0];
  for (int i = 1; i < 6; ++i) y = y * r + k_exp_poly[i];
  y = y * r2 + r + 1.0f;
  float scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return y * scale;
}

inline float tanh_approx(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1); saturates cleanly at both ends.
  float e = exp_approx(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}

#if defined(__AVX2__) && defined(__FMA__)
// exp_approx of 8 values, its steps written out on vectors (multiply-adds where the scalar form's
// are contracted). For loops where the compiler's own vectorization of exp_approx goes wrong: GCC
// may thread a loop through exp_approx's clamps, fold the clamped case to a constant and compute
// that case in every lane before it blends; where the constant meets the input (g / (1 + e^88) in
// SiLU) the discarded lanes are subnormal, and each one costs a microcode assist.
inline __m256 exp_approx8(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(k_exp_hi));
  x = _mm256_max_ps(x, _mm256_set1_ps(k_exp_lo));
  const __m256 n =
      _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(k_log2e), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(k_ln2_lo),
                                   _mm256_fnmadd_ps(n, _mm256_set1_ps(k_ln2_hi), x));
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 y = _mm256_set1_ps(k_exp_poly[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(k_exp_poly[i]));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

}  // namespace tessera::kernels::cpu
