// Branch-free elementwise math that the compiler vectorizes (no libm calls in hot loops).
// exp_approx: Cephes-style range reduction + degree-6 polynomial, max relative error ~2e-7
// over the clamped range; tanh_approx built on it. Used by softmax, cross-entropy and GELU.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace tessera::kernels::cpu {

inline float exp_approx(float x) {
  x = std::min(x, 88.3762626647949f);
  x = std::max(x, -87.3365447504f);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float r2 = r * r;
  float y = 1.9875691500E-4f;
  y = y * r + 1.3981999507E-3f;
  y = y * r + 8.3334519073E-3f;
  y = y * r + 4.1665795894E-2f;
  y = y * r + 1.6666665459E-1f;
  y = y * r + 5.0000001201E-1f;
  y = y * r2 + r + 1.0f;
  float scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return y * scale;
}

inline float tanh_approx(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1); saturates cleanly at both ends.
  float e = exp_approx(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}

}  // namespace tessera::kernels::cpu
