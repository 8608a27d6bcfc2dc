#include "tessera/parallel/tensor_layernorm.hpp"

#include <algorithm>
#include <cmath>

#include "tessera/kernels/cpu/ops.hpp"

namespace tessera::parallel {

void tensor_layernorm_forward(comm::Communicator& tx, float* out, float* mean, float* rstd,
                              const float* x, const float* w, const float* b, std::int64_t n,
                              int cl, int C, float* sums) {
  if (tx.size() == 1) return kernels::cpu::layernorm_forward(out, mean, rstd, x, w, b, n, C);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    float s = 0.0f;
    for (int k = 0; k < cl; ++k) s += xi[k];
    sums[i] = s;
  }
  if (tx.size() > 1) tx.iall_reduce_sum(sums, static_cast<std::size_t>(n)).wait();
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float m = sums[i] / C;
    mean[i] = m;
    float v = 0.0f;
    for (int k = 0; k < cl; ++k) {
      const float d = xi[k] - m;
      v += d * d;
    }
    sums[n + i] = v;
  }
  if (tx.size() > 1) tx.iall_reduce_sum(sums + n, static_cast<std::size_t>(n)).wait();
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float m = mean[i];
    const float r = 1.0f / std::sqrt(sums[n + i] / C + kernels::cpu::k_layernorm_eps);
    rstd[i] = r;
    float* o = out + i * cl;
    for (int k = 0; k < cl; ++k) o[k] = (xi[k] - m) * r * w[k] + b[k];
  }
}

void tensor_layernorm_backward(comm::Communicator& tx, comm::Communicator& tz, float* dx, float* dw,
                               float* db, const float* g, const float* x, const float* w,
                               const float* mean, const float* rstd, std::int64_t n, int cl, int C,
                               float* sums, float* scratch) {
  if (tx.size() == 1 && tz.size() == 1)
    return kernels::cpu::layernorm_backward(dx, dw, db, g, x, w, mean, rstd, n, C);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float* gi = g + i * cl;
    const float m = mean[i], r = rstd[i];
    float s_dn = 0.0f, s_dn_n = 0.0f;
    for (int k = 0; k < cl; ++k) {
      const float xh = (xi[k] - m) * r;
      const float dn = w[k] * gi[k];
      s_dn += dn;
      s_dn_n += dn * xh;
    }
    sums[i] = s_dn;
    sums[n + i] = s_dn_n;
  }
  if (tx.size() > 1) tx.iall_reduce_sum(sums, static_cast<std::size_t>(2 * n)).wait();
  float* dlw = scratch;
  float* dlb = scratch + cl;
  std::fill(scratch, scratch + 2 * cl, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float* gi = g + i * cl;
    float* dxi = dx + i * cl;
    const float m = mean[i], r = rstd[i];
    const float mean_dn = sums[i] / C, mean_dn_n = sums[n + i] / C;
    for (int k = 0; k < cl; ++k) {
      const float xh = (xi[k] - m) * r;
      const float dn = w[k] * gi[k];
      dlb[k] += gi[k];
      dlw[k] += xh * gi[k];
      dxi[k] += (dn - mean_dn - xh * mean_dn_n) * r;
    }
  }
  if (tz.size() > 1) tz.iall_reduce_sum(scratch, static_cast<std::size_t>(2 * cl)).wait();
  for (int k = 0; k < cl; ++k) {
    dw[k] += dlw[k];
    db[k] += dlb[k];
  }
}

void tensor_rmsnorm_forward(comm::Communicator& tx, float* out, float* rstd, const float* x,
                            const float* w, std::int64_t n, int cl, int C, float eps, float* sums) {
  if (tx.size() == 1) return kernels::cpu::rmsnorm_forward(out, rstd, x, w, n, C, eps);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    float ss = 0.0f;
    for (int k = 0; k < cl; ++k) ss += xi[k] * xi[k];
    sums[i] = ss;
  }
  if (tx.size() > 1) tx.iall_reduce_sum(sums, static_cast<std::size_t>(n)).wait();
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float r = 1.0f / std::sqrt(sums[i] / C + eps);
    rstd[i] = r;
    float* o = out + i * cl;
    for (int k = 0; k < cl; ++k) o[k] = xi[k] * r * w[k];
  }
}

void tensor_rmsnorm_backward(comm::Communicator& tx, comm::Communicator& tz, float* dx, float* dw,
                             const float* g, const float* x, const float* w, const float* rstd,
                             std::int64_t n, int cl, int C, float* sums, float* scratch) {
  if (tx.size() == 1 && tz.size() == 1)
    return kernels::cpu::rmsnorm_backward(dx, dw, g, x, w, rstd, n, C);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float* gi = g + i * cl;
    const float r = rstd[i];
    float s = 0.0f;
    for (int k = 0; k < cl; ++k) s += w[k] * gi[k] * xi[k] * r;
    sums[i] = s;
  }
  if (tx.size() > 1) tx.iall_reduce_sum(sums, static_cast<std::size_t>(n)).wait();
  std::fill(scratch, scratch + cl, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cl;
    const float* gi = g + i * cl;
    float* dxi = dx + i * cl;
    const float r = rstd[i], mean_dn_n = sums[i] / C;
    for (int k = 0; k < cl; ++k) {
      const float nk = xi[k] * r;
      scratch[k] += gi[k] * nk;
      dxi[k] += (w[k] * gi[k] - nk * mean_dn_n) * r;
    }
  }
  if (tz.size() > 1) tz.iall_reduce_sum(scratch, static_cast<std::size_t>(cl)).wait();
  for (int k = 0; k < cl; ++k) dw[k] += scratch[k];
}

}  // namespace tessera::parallel
