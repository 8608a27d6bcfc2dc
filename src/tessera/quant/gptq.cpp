#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/quant/methods.hpp"

extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
}

namespace tessera::quant {

namespace {
// Upper Cholesky factor U of H^-1 (H^-1 = U^T U), row-major, via LAPACK on the symmetric H
// (row-major == column-major for a symmetric matrix). Returns false if H is not positive
// definite.
bool inverse_cholesky_upper(std::vector<double>& H, int n) {
  int info = 0;
  const char L = 'L';
  dpotrf_(&L, &n, H.data(), &n, &info);  // column-major lower = row-major upper
  if (info != 0) return false;
  dpotri_(&L, &n, H.data(), &n, &info);  // inverse, column-major lower = row-major upper
  if (info != 0) return false;
  // dpotrf reads the column-major lower triangle = the row-major upper triangle: already there.
  dpotrf_(&L, &n, H.data(), &n, &info);
  if (info != 0) return false;
  // Column-major L with Hinv = L L^T is, read row-major, U = L^T (upper). Zero the rest.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) H[static_cast<std::size_t>(i) * n + j] = 0.0;
  return true;
}
}  // namespace

GptqResult gptq(const float* W0, int rows, int cols, std::vector<double> H,
                const GptqOptions& opt) {
  const WeightQuant& spec = opt.spec;
  const int maxq = spec.maxq();
  const int G = spec.group > 0 ? spec.group : cols;
  const bool grouped = spec.group > 0;
  const std::size_t n = cols;
  // Column-major working copy: Wt[c * rows + r] = W[r, c] (columns contiguous).
  std::vector<float> Wt(n * rows);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) Wt[static_cast<std::size_t>(c) * rows + r] = W0[r * n + c];
  // Dead columns.
  for (int j = 0; j < cols; ++j)
    if (H[j * n + j] == 0.0) {
      H[j * n + j] = 1.0;
      std::fill(Wt.begin() + static_cast<std::size_t>(j) * rows,
                Wt.begin() + static_cast<std::size_t>(j + 1) * rows, 0.0f);
    }
  // Static groups: quantizer of each original group from the original weights.
  std::vector<QParams> static_p;
  if (grouped && opt.static_groups) {
    const int ng = spec.groups(cols);
    static_p.resize(static_cast<std::size_t>(rows) * ng);
    std::vector<float> tmp(G);
    for (int g = 0; g < ng; ++g) {
      const int width = std::min(G, cols - g * G);  // the last group may be shorter
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < width; ++i) tmp[i] = Wt[static_cast<std::size_t>(g * G + i) * rows + r];
        static_p[static_cast<std::size_t>(r) * ng + g] = fit(tmp.data(), width, 1, spec);
      }
    }
  }
  // Act-order permutation.
  std::vector<int> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  if (opt.act_order) {
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int a, int b) { return H[a * n + a] > H[b * n + b]; });
    std::vector<float> Wp(Wt.size());
    for (int c = 0; c < cols; ++c)
      std::copy(Wt.begin() + static_cast<std::size_t>(perm[c]) * rows,
                Wt.begin() + static_cast<std::size_t>(perm[c] + 1) * rows,
                Wp.begin() + static_cast<std::size_t>(c) * rows);
    Wt.swap(Wp);
    std::vector<double> Hp(H.size());
    for (int i = 0; i < cols; ++i)
      for (int j = 0; j < cols; ++j) Hp[i * n + j] = H[perm[i] * n + perm[j]];
    H.swap(Hp);
  }
  // Damping with retry, then U = chol(H^-1) upper.
  double mean_diag = 0;
  for (int j = 0; j < cols; ++j) mean_diag += H[j * n + j];
  mean_diag /= cols;
  GptqResult res;
  std::vector<double> U;
  for (int attempt = 0;; ++attempt) {
    double damp = opt.percdamp * (attempt + 1);
    U = H;
    for (int j = 0; j < cols; ++j) U[j * n + j] += damp * mean_diag;
    if (inverse_cholesky_upper(U, cols)) {
      res.damp = damp;
      res.retries = attempt;
      break;
    }
    if (attempt >= opt.max_retries)
      throw Error(fmt::format("GPTQ: the Hessian of a {}x{} layer is not positive definite even "
                              "with {:.0f}% damping",
                              rows, cols, 100 * damp),
                  "use more calibration samples or a larger --damp");
  }
  std::vector<float> Uf(U.begin(), U.end());
  // Outputs.
  QuantizedLinear& out = res.q;
  out.rows = rows;
  out.cols = cols;
  out.spec = spec;
  const int ng = spec.groups(cols);
  out.q.assign(static_cast<std::size_t>(rows) * cols, 0);
  out.scales.assign(static_cast<std::size_t>(rows) * ng, 1.0f);
  out.zeros.assign(static_cast<std::size_t>(rows) * ng, 0.0f);
  out.g_idx.assign(cols, 0);
  std::vector<QParams> cur(rows);
  auto fit_rows = [&](int c0, int width) {  // on the current (error-updated) columns
    for (int r = 0; r < rows; ++r)
      cur[r] = fit(Wt.data() + static_cast<std::size_t>(c0) * rows + r, width, rows, spec);
  };
  if (!grouped) fit_rows(0, cols);
  const int B = std::max(1, opt.blocksize);
  std::vector<float> Err(static_cast<std::size_t>(B) * rows);
  double loss = 0;
  for (int i1 = 0; i1 < cols; i1 += B) {
    const int i2 = std::min(i1 + B, cols), count = i2 - i1;
    for (int i = 0; i < count; ++i) {
      const int col = i1 + i;
      int gid = 0;
      if (grouped) {
        if (opt.static_groups) {
          gid = perm[col] / G;
          for (int r = 0; r < rows; ++r) cur[r] = static_p[static_cast<std::size_t>(r) * ng + gid];
        } else {
          gid = col / G;
          if (col % G == 0) fit_rows(col, std::min(G, cols - col));
        }
        for (int r = 0; r < rows; ++r) {
          out.scales[static_cast<std::size_t>(r) * ng + gid] = cur[r].scale;
          out.zeros[static_cast<std::size_t>(r) * ng + gid] = cur[r].zero;
        }
      } else {
        for (int r = 0; r < rows; ++r) {
          out.scales[r] = cur[r].scale;
          out.zeros[r] = cur[r].zero;
        }
      }
      out.g_idx[perm[col]] = gid;
      float* w = Wt.data() + static_cast<std::size_t>(col) * rows;
      float* e = Err.data() + static_cast<std::size_t>(i) * rows;
      const float d = Uf[static_cast<std::size_t>(col) * n + col];
      double l = 0;
      for (int r = 0; r < rows; ++r) {
        float code = quantize_code(w[r], cur[r], maxq);
        float qv = dequant(code, cur[r]);
        out.q[static_cast<std::size_t>(r) * cols + perm[col]] = static_cast<std::uint8_t>(code);
        float diff = w[r] - qv;
        l += static_cast<double>(diff) * diff / (static_cast<double>(d) * d) / 2.0;
        e[r] = diff / d;
      }
      loss += l;
      // W1[:, i+1:] -= e * U1[i, i+1:] inside the block
      const float* urow = Uf.data() + static_cast<std::size_t>(col) * n;
      for (int j = i + 1; j < count; ++j) {
        const float u = urow[i1 + j];
        float* wj = Wt.data() + static_cast<std::size_t>(i1 + j) * rows;
        for (int r = 0; r < rows; ++r) wj[r] -= e[r] * u;
      }
    }
    // Lazy batch: W[:, i2:] -= Err1 @ U[i1:i2, i2:]; column-major Wt[i2:, :] (cols-i2, rows)
    // -= U[i1:i2, i2:]^T (cols-i2, count) @ Err (count, rows).
    if (i2 < cols)
      kernels::gemm(kernels::GemmLibrary::OneDnn, true, false, cols - i2, rows, count, -1.0f,
                    Uf.data() + static_cast<std::size_t>(i1) * n + i2, static_cast<std::int64_t>(n),
                    Err.data(), rows, 1.0f, Wt.data() + static_cast<std::size_t>(i2) * rows, rows);
  }
  res.loss = loss;
  return res;
}

}  // namespace tessera::quant
