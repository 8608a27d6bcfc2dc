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

// For each group of columns: every row's candidate clipping ranges (shrink 1.0, 0.95, ..., 0.55
// of the row's max |w| in the group) are quantized, and the one whose error d^T S_g d on the
// calibration inputs (S_g: the group's block of X^T X / N) is smallest is kept. The quadratic
// forms of all rows and candidates are one GEMM per group (D S_g, then row dots).
void awq_clip(float* W, int rows, int cols, const std::vector<double>& S, const WeightQuant& spec) {
  const int G = spec.group_size(cols), ng = spec.groups(cols), maxq = spec.maxq();
  const int n_shrink = 10;  // max_shrink 0.5 with a 20-point grid: 1.0, 0.95, ..., 0.55
  const std::size_t R = static_cast<std::size_t>(rows) * n_shrink;
  std::vector<float> D, E, Sg;
  std::vector<double> err(R);
  for (int g = 0; g < ng; ++g) {
    const int c0 = g * G, n = std::min(G, cols - c0);  // the last group may be shorter
    Sg.resize(static_cast<std::size_t>(n) * n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        Sg[static_cast<std::size_t>(i) * n + j] =
            static_cast<float>(S[static_cast<std::size_t>(c0 + i) * cols + c0 + j]);
    D.resize(R * n);
    E.resize(R * n);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const float* w = W + static_cast<std::size_t>(r) * cols + c0;
      float amax = 0;
      for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
      std::vector<float> cw(n);
      for (int k = 0; k < n_shrink; ++k) {
        const float mv = amax * (1.0f - static_cast<float>(k) / 20.0f);
        for (int i = 0; i < n; ++i) cw[i] = std::clamp(w[i], -mv, mv);
        const QParams p = fit(cw.data(), n, 1, spec);
        float* d = D.data() + (static_cast<std::size_t>(r) * n_shrink + k) * n;
        for (int i = 0; i < n; ++i) d[i] = quant_dequant(cw[i], p, maxq) - w[i];
      }
    }
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, false, static_cast<int>(R), n, n, 1.0f,
                  D.data(), n, Sg.data(), n, 0.0f, E.data(), n);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) {
      float* w = W + static_cast<std::size_t>(r) * cols + c0;
      float amax = 0;
      for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
      int best = 0;
      double best_err = 0;
      for (int k = 0; k < n_shrink; ++k) {
        const std::size_t at = (static_cast<std::size_t>(r) * n_shrink + k) * n;
        double e = 0;
        for (int i = 0; i < n; ++i) e += static_cast<double>(E[at + i]) * D[at + i];
        if (k == 0 || e < best_err) {
          best_err = e;
          best = k;
        }
      }
      const float mv = amax * (1.0f - static_cast<float>(best) / 20.0f);
      for (int i = 0; i < n; ++i) w[i] = std::clamp(w[i], -mv, mv);
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
