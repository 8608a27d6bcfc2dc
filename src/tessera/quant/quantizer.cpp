#include "tessera/quant/quantizer.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::quant {

void validate(const WeightQuant& q) {
  if (q.bits < 2 || q.bits > 8)
    throw Error(fmt::format("bit width {} is not supported", q.bits),
                "use 2..8 bits (e.g. 4 or 8)");
  if (q.group == 0 || q.group < -1)
    throw Error(fmt::format("group size {} is invalid", q.group),
                "use -1 (per channel) or a positive group size, e.g. 128");
}

std::string describe(const WeightQuant& q) {
  return fmt::format("W{} {} {}", q.bits,
                     q.group <= 0 ? std::string("per-channel") : fmt::format("g{}", q.group),
                     q.sym ? "sym" : (q.min_offset ? "asym-min" : "asym"));
}

QParams fit(const float* v, int n, int stride, const WeightQuant& spec, float clip) {
  const int bits = spec.bits;
  const bool sym = spec.sym;
  float lo = 0.0f, hi = 0.0f;
  if (spec.min_offset && !sym && n > 0) lo = hi = v[0];
  for (int i = 0; i < n; ++i) {
    float x = v[static_cast<std::size_t>(i) * stride];
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  lo *= clip;
  hi *= clip;
  const int maxq = (1 << bits) - 1;
  QParams p;
  if (sym) {
    float m = std::max(-lo, hi);
    if (m <= 0.0f) m = 1.0f;  // all-zero group (GPTQ sets scale for the range [-1, 1])
    p.scale = 2.0f * m / maxq;
    p.zero = static_cast<float>((maxq + 1) / 2);
  } else {
    if (lo == 0.0f && hi == 0.0f) {
      lo = -1.0f;
      hi = 1.0f;
    }
    p.scale = std::max((hi - lo) / maxq, 1e-8f);
    p.offset = spec.min_offset;
    p.zero = p.offset ? -lo / p.scale : std::round(-lo / p.scale);
  }
  return p;
}

void QuantizedLinear::dequantize(float* w) const {
  const int ng = ngroups();
  for (int r = 0; r < rows; ++r) {
    const float* sc = scales.data() + static_cast<std::size_t>(r) * ng;
    const float* ze = zeros.data() + static_cast<std::size_t>(r) * ng;
    const std::uint8_t* qr = q.data() + static_cast<std::size_t>(r) * cols;
    float* wr = w + static_cast<std::size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      int g = g_idx[c];
      wr[c] = sc[g] * (static_cast<float>(qr[c]) - ze[g]);
    }
    if (!in_scale.empty())
      for (int c = 0; c < cols; ++c) wr[c] /= in_scale[c];
  }
}

QuantizedLinear rtn(const float* W, int rows, int cols, const WeightQuant& spec) {
  QuantizedLinear out;
  out.rows = rows;
  out.cols = cols;
  out.spec = spec;
  const int G = spec.group_size(cols), ng = spec.groups(cols), maxq = spec.maxq();
  out.q.resize(static_cast<std::size_t>(rows) * cols);
  out.scales.resize(static_cast<std::size_t>(rows) * ng);
  out.zeros.resize(static_cast<std::size_t>(rows) * ng);
  out.g_idx.resize(cols);
  for (int c = 0; c < cols; ++c) out.g_idx[c] = c / G;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const float* wr = W + static_cast<std::size_t>(r) * cols;
    for (int g = 0; g < ng; ++g) {
      int c0 = g * G, n = std::min(G, cols - c0);
      QParams p = fit(wr + c0, n, 1, spec);
      out.scales[static_cast<std::size_t>(r) * ng + g] = p.scale;
      out.zeros[static_cast<std::size_t>(r) * ng + g] = p.zero;
      for (int c = c0; c < c0 + n; ++c)
        out.q[static_cast<std::size_t>(r) * cols + c] =
            static_cast<std::uint8_t>(quantize_code(wr[c], p, maxq));
    }
  }
  return out;
}

void rtn_inplace(float* W, int rows, int cols, const WeightQuant& spec) {
  const int G = spec.group_size(cols), maxq = spec.maxq();
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    float* wr = W + static_cast<std::size_t>(r) * cols;
    for (int c0 = 0; c0 < cols; c0 += G) {
      int n = std::min(G, cols - c0);
      QParams p = fit(wr + c0, n, 1, spec);
      for (int c = c0; c < c0 + n; ++c) wr[c] = quant_dequant(wr[c], p, maxq);
    }
  }
}

std::vector<float> int8_rows_inplace(float* W, int rows, int cols) {
  std::vector<float> s(rows);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    float* wr = W + static_cast<std::size_t>(r) * cols;
    float m = 0.0f;
    for (int c = 0; c < cols; ++c) m = std::max(m, std::fabs(wr[c]));
    float sc = std::max(m, 1e-8f) / 127.0f;
    for (int c = 0; c < cols; ++c) wr[c] = std::round(wr[c] / sc) * sc;
    s[r] = sc;
  }
  return s;
}

float int8_tensor_inplace(float* W, std::int64_t n) {
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(W[i]));
  float sc = std::max(m, 1e-8f) / 127.0f;
  for (std::int64_t i = 0; i < n; ++i) W[i] = std::round(W[i] / sc) * sc;
  return sc;
}

}  // namespace tessera::quant
