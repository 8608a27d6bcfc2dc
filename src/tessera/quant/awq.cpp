#include <algorithm>
#include <cmath>

#include "tessera/kernels/gemm.hpp"
#include "tessera/quant/methods.hpp"

namespace tessera::quant {

double output_mse(const float* Wq, const float* W, int rows, int cols,
                  const std::vector<double>& S) {
  const std::size_t n = cols;
  std::vector<float> D(static_cast<std::size_t>(rows) * cols);
  for (std::size_t i = 0; i < D.size(); ++i) D[i] = Wq[i] - W[i];
  std::vector<float> Sf(S.begin(), S.end());
  std::vector<float> DS(D.size());
  kernels::gemm(kernels::GemmLibrary::OneDnn, false, false, rows, cols, cols, 1.0f, D.data(), cols,
                Sf.data(), cols, 0.0f, DS.data(), cols);
  double tot = 0;
#pragma omp parallel for reduction(+ : tot) schedule(static)
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (std::size_t c = 0; c < n; ++c) acc += static_cast<double>(DS[r * n + c]) * D[r * n + c];
    tot += acc;
  }
  return tot / rows;
}

std::vector<float> awq_search_scales(const float* W, int rows, int cols,
                                     const std::vector<double>& mean_abs_x,
                                     const std::vector<double>& S, const WeightQuant& spec,
                                     int n_grid, float* best_alpha) {
  std::vector<float> best(cols, 1.0f), s(cols), Wq(static_cast<std::size_t>(rows) * cols);
  double best_loss = -1;
  float balpha = 0;
  for (int g = 0; g < n_grid; ++g) {
    const float alpha = static_cast<float>(g) / n_grid;
    float mx = 0, mn = 1e30f;
    for (int j = 0; j < cols; ++j) {
      s[j] = std::max(static_cast<float>(std::pow(mean_abs_x[j], alpha)), 1e-4f);
      mx = std::max(mx, s[j]);
      mn = std::min(mn, s[j]);
    }
    const float norm = std::sqrt(mx * mn);
    for (int j = 0; j < cols; ++j) s[j] /= norm;
    // W' = Q(W diag(s)) diag(s)^-1
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j)
        Wq[static_cast<std::size_t>(r) * cols + j] =
            W[static_cast<std::size_t>(r) * cols + j] * s[j];
    rtn_inplace(Wq.data(), rows, cols, spec);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) Wq[static_cast<std::size_t>(r) * cols + j] /= s[j];
    double loss = output_mse(Wq.data(), W, rows, cols, S);
    if (best_loss < 0 || loss < best_loss) {
      best_loss = loss;
      best = s;
      balpha = alpha;
    }
  }
  if (best_alpha) *best_alpha = balpha;
  return best;
}

void awq_clip(float* W, int rows, int cols, const std::vector<double>& S, const WeightQuant& spec) {
  const int G = spec.group_size(cols), ng = spec.groups(cols), maxq = spec.maxq();
  const int n_shrink = 10;  // max_shrink 0.5 with a 20-point grid: 1.0, 0.95, ..., 0.55
#pragma omp parallel for schedule(dynamic)
  for (int r = 0; r < rows; ++r) {
    std::vector<float> d(G), cw(G);
    for (int g = 0; g < ng; ++g) {
      float* w = W + static_cast<std::size_t>(r) * cols + static_cast<std::size_t>(g) * G;
      const int c0 = g * G, n = std::min(G, cols - c0);  // the last group may be shorter
      float amax = 0;
      for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
      double best_err = -1;
      float best_max = amax;
      for (int k = 0; k < n_shrink; ++k) {
        float mv = amax * (1.0f - static_cast<float>(k) / 20.0f);
        for (int i = 0; i < n; ++i) cw[i] = std::clamp(w[i], -mv, mv);
        QParams p = fit(cw.data(), n, 1, spec);
        for (int i = 0; i < n; ++i) d[i] = quant_dequant(cw[i], p, maxq) - w[i];
        double err = 0;
        for (int i = 0; i < n; ++i) {
          const double* srow = S.data() + static_cast<std::size_t>(c0 + i) * cols + c0;
          double acc = 0;
          for (int j = 0; j < n; ++j) acc += srow[j] * d[j];
          err += acc * d[i];
        }
        if (best_err < 0 || err < best_err) {
          best_err = err;
          best_max = mv;
        }
      }
      for (int i = 0; i < n; ++i) w[i] = std::clamp(w[i], -best_max, best_max);
    }
  }
}

std::vector<float> smooth_scales(const std::vector<float>& act_max, const float* W, int rows,
                                 int cols, float alpha) {
  std::vector<float> wmax(cols, 0.0f), s(cols);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j)
      wmax[j] = std::max(wmax[j], std::fabs(W[static_cast<std::size_t>(r) * cols + j]));
  for (int j = 0; j < cols; ++j) {
    float a = std::max(act_max[j], 1e-5f), w = std::max(wmax[j], 1e-5f);
    s[j] = std::max(static_cast<float>(std::pow(a, alpha) / std::pow(w, 1.0f - alpha)), 1e-5f);
  }
  return s;
}

}  // namespace tessera::quant
