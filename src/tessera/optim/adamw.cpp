#include "tessera/optim/adamw.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessera::optim {

void adamw_update_range(float* p, const float* g, float* m, float* v, std::size_t n,
                        const AdamWConfig& c, float lr, bool decay, std::int64_t step,
                        float grad_scale) {
  const float b1 = c.beta1, b2 = c.beta2;
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(b2, static_cast<float>(step));
  const float wd = decay ? c.weight_decay : 0.0f;
  const float eps = c.eps;
  const std::int64_t N = static_cast<std::int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    float gi = g[i] * grad_scale;  // x * 1.0f == x: unclipped steps are unchanged
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    // decoupled decay first (as torch.optim.AdamW does), then the Adam step
    float pi = p[i] * (1.0f - lr * wd);
    p[i] = pi - lr * mhat / (std::sqrt(vhat) + eps);
  }
}

void adamw_step(const model::ParamLayout& layout, float* params, const float* grads, float* m,
                float* v, const AdamWConfig& cfg, float lr, std::int64_t step, float grad_scale) {
  for (const auto& t : layout.tensors())
    adamw_update_range(params + t.offset, grads + t.offset, m + t.offset, v + t.offset, t.numel,
                       cfg, lr, t.decay, step, grad_scale);
}

float lr_at(std::int64_t step, std::int64_t total, std::int64_t warmup, float lr, float min_ratio) {
  if (warmup > 0 && step < warmup)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  const float min_lr = lr * min_ratio;
  if (step >= total) return min_lr;
  double span = static_cast<double>(total - warmup);
  double frac = span > 0 ? static_cast<double>(step - warmup) / span : 1.0;
  double coeff = 0.5 * (1.0 + std::cos(M_PI * frac));
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

namespace {

// Sum of squares with fixed chunking independent of the thread count, chunk sums combined in
// order (deterministic); with a mask, only the elements whose mask byte is set.
template <bool Masked>
double sumsq_fixed_order(const float* g, const std::uint8_t* mask, std::size_t n) {
  constexpr std::size_t k_chunk = 1 << 16;
  std::size_t chunks = (n + k_chunk - 1) / k_chunk;
  std::vector<double> part(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (std::size_t c = 0; c < chunks; ++c) {
    std::size_t e = std::min(n, (c + 1) * k_chunk);
    double s = 0.0;
    // float sums over short blocks (vectorized), accumulated in double
    for (std::size_t b = c * k_chunk; b < e; b += 256) {
      std::size_t be = std::min(e, b + 256);
      float fs = 0.0f;
      if constexpr (Masked) {
#pragma omp simd reduction(+ : fs)
        for (std::size_t i = b; i < be; ++i) fs += mask[i] ? g[i] * g[i] : 0.0f;
      } else {
#pragma omp simd reduction(+ : fs)
        for (std::size_t i = b; i < be; ++i) fs += g[i] * g[i];
      }
      s += fs;
    }
    part[c] = s;
  }
  double s = 0.0;
  for (double x : part) s += x;
  return s;
}

}  // namespace

double global_norm(const float* g, std::size_t n) {
  return std::sqrt(sumsq_fixed_order<false>(g, nullptr, n));
}

double masked_sumsq(const float* g, const std::uint8_t* mask, std::size_t n) {
  return sumsq_fixed_order<true>(g, mask, n);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

float clip_by_global_norm(float* g, std::size_t n, double norm, double max_norm) {
  const float scale = clip_scale(norm, max_norm);
  if (scale == 1.0f) return 1.0f;
  const std::int64_t N = static_cast<std::int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < N; ++i) g[i] *= scale;
  return scale;
}

}  // namespace tessera::optim
