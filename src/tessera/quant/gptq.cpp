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

// Offset of element (i, j) of a matrix with n columns, row-major.
std::size_t at(int i, int j, std::size_t n) {
  return static_cast<std::size_t>(i) * n + j;
}

// The weights column-major (Wt[c * rows + r] = W[r, c]: each column contiguous, as the updates
// run along them), with every column no input reaches (H_jj = 0) zeroed and its H_jj set to 1,
// so that H stays invertible.
std::vector<float> working_columns(const float* W, int rows, int cols, std::vector<double>& H) {
  std::vector<float> Wt(static_cast<std::size_t>(cols) * rows);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) Wt[at(c, r, rows)] = W[at(r, c, cols)];
  for (int j = 0; j < cols; ++j)
    if (H[at(j, j, cols)] == 0.0) {
      H[at(j, j, cols)] = 1.0;
      std::fill_n(Wt.begin() + at(j, 0, rows), rows, 0.0f);
    }
  return Wt;
}

// Static groups: each row's quantizer for each original group (rows x groups), fitted once on
// the weights before any error reaches them.
std::vector<QParams> static_group_params(const std::vector<float>& Wt, int rows, int cols,
                                         const WeightQuant& spec) {
  const int G = spec.group, ng = spec.groups(cols);
  std::vector<QParams> p(static_cast<std::size_t>(rows) * ng);
  for (int g = 0; g < ng; ++g) {
    const int width = std::min(G, cols - g * G);  // the last group may be shorter
    for (int r = 0; r < rows; ++r)
      p[at(r, g, ng)] = fit(Wt.data() + at(g * G, r, rows), width, rows, spec);
  }
  return p;
}

// The order the columns are quantized in: perm[position] = original column. With act order,
// by descending H_jj, Wt's columns and H's rows and columns permuted to match; else as they are.
std::vector<int> column_order(bool act_order, std::vector<float>& Wt, std::vector<double>& H,
                              int rows, int cols) {
  std::vector<int> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  if (!act_order) return perm;
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int a, int b) { return H[at(a, a, cols)] > H[at(b, b, cols)]; });
  std::vector<float> Wp(Wt.size());
  for (int c = 0; c < cols; ++c)
    std::copy_n(Wt.begin() + at(perm[c], 0, rows), rows, Wp.begin() + at(c, 0, rows));
  Wt.swap(Wp);
  std::vector<double> Hp(H.size());
  for (int i = 0; i < cols; ++i)
    for (int j = 0; j < cols; ++j) Hp[at(i, j, cols)] = H[at(perm[i], perm[j], cols)];
  H.swap(Hp);
  return perm;
}

// U = chol(H^-1), upper, row-major, of H damped by percdamp x mean(diag H), the damping raised
// by percdamp again each time the factorization fails; res records the damping that succeeded.
std::vector<float> damped_inverse_cholesky(const std::vector<double>& H, int rows, int cols,
                                           const GptqOptions& opt, GptqResult& res) {
  double mean_diag = 0;
  for (int j = 0; j < cols; ++j) mean_diag += H[at(j, j, cols)];
  mean_diag /= cols;
  for (int attempt = 0;; ++attempt) {
    const double damp = opt.percdamp * (attempt + 1);
    std::vector<double> U = H;
    for (int j = 0; j < cols; ++j) U[at(j, j, cols)] += damp * mean_diag;
    if (inverse_cholesky_upper(U, cols)) {
      res.damp = damp;
      res.retries = attempt;
      return {U.begin(), U.end()};
    }
    if (attempt >= opt.max_retries)
      throw Error(fmt::format("GPTQ: the Hessian of a {}x{} layer is not positive definite even "
                              "with {:.0f}% damping",
                              rows, cols, 100 * damp),
                  "use more calibration samples or a larger --damp");
  }
}

// GPTQ's state as it quantizes the columns in order: the error-updated weights (column-major,
// in the quantization order), U, each row's current quantizer, and the result.
struct Columns {
  const GptqOptions& opt;
  int rows, cols;
  std::vector<float> Wt, U;
  std::vector<int> perm;
  std::vector<QParams> static_p, cur;
  QuantizedLinear& out;

  // Each row's quantizer for the column at `col` (in the quantization order), recorded in out's
  // scales and zeros: a static group's, else fitted on the error-updated weights at the start of
  // each group (per channel: once, on all of them).
  void choose_quantizers(int col) {
    const WeightQuant& spec = opt.spec;
    const int ng = spec.groups(cols);
    int gid = 0;
    if (spec.group <= 0) {
      if (col == 0) fit_rows(0, cols);
    } else if (opt.static_groups) {
      gid = perm[col] / spec.group;
      for (int r = 0; r < rows; ++r) cur[r] = static_p[at(r, gid, ng)];
    } else {
      gid = col / spec.group;
      if (col % spec.group == 0) fit_rows(col, std::min(spec.group, cols - col));
    }
    for (int r = 0; r < rows; ++r) {
      out.scales[at(r, gid, ng)] = cur[r].scale;
      out.zeros[at(r, gid, ng)] = cur[r].zero;
    }
    out.g_idx[perm[col]] = gid;
  }
  void fit_rows(int c0, int width) {
    for (int r = 0; r < rows; ++r) cur[r] = fit(Wt.data() + at(c0, r, rows), width, rows, opt.spec);
  }

  // Quantizes the column at `col` into out.q, its scaled error into e (rows); returns its share
  // of the loss, sum of (w - q)^2 / d^2 / 2 with d = U_col,col.
  double quantize_column(int col, float* e) {
    const float* w = Wt.data() + at(col, 0, rows);
    const float d = U[at(col, col, cols)];
    const int maxq = opt.spec.maxq();
    double l = 0;
    for (int r = 0; r < rows; ++r) {
      const float code = quantize_code(w[r], cur[r], maxq);
      out.q[at(r, perm[col], cols)] = static_cast<std::uint8_t>(code);
      const float diff = w[r] - dequant(code, cur[r]);
      l += static_cast<double>(diff) * diff / (static_cast<double>(d) * d) / 2.0;
      e[r] = diff / d;
    }
    return l;
  }

  // The columns [i1, i2): each quantized, its loss added to `loss`, its error propagated at once
  // to the rest of the block and, after the block, to every later column in one product (the
  // lazy batch).
  void quantize_block(int i1, int i2, std::vector<float>& Err, double& loss) {
    const int count = i2 - i1;
    for (int i = 0; i < count; ++i) {
      const int col = i1 + i;
      choose_quantizers(col);
      float* e = Err.data() + at(i, 0, rows);
      loss += quantize_column(col, e);
      // W[:, col+1:i2] -= e U[col, col+1:i2]
      for (int j = col + 1; j < i2; ++j) {
        const float u = U[at(col, j, cols)];
        float* wj = Wt.data() + at(j, 0, rows);
        for (int r = 0; r < rows; ++r) wj[r] -= e[r] * u;
      }
    }
    // W[:, i2:] -= Err U[i1:i2, i2:]; column-major Wt[i2:, :] (cols-i2, rows) -= U[i1:i2, i2:]^T
    // (cols-i2, count) @ Err (count, rows).
    if (i2 < cols)
      kernels::gemm(kernels::GemmLibrary::OneDnn, true, false, cols - i2, rows, count, -1.0f,
                    U.data() + at(i1, i2, cols), cols, Err.data(), rows, 1.0f,
                    Wt.data() + at(i2, 0, rows), rows);
  }
};

// An empty result of the given shape: every code 0, scale 1, zero 0.
void shape_result(QuantizedLinear& out, int rows, int cols, const WeightQuant& spec) {
  out.rows = rows;
  out.cols = cols;
  out.spec = spec;
  const int ng = spec.groups(cols);
  out.q.assign(static_cast<std::size_t>(rows) * cols, 0);
  out.scales.assign(static_cast<std::size_t>(rows) * ng, 1.0f);
  out.zeros.assign(static_cast<std::size_t>(rows) * ng, 0.0f);
  out.g_idx.assign(cols, 0);
}
}  // namespace

GptqResult gptq(const float* W, int rows, int cols, std::vector<double> H, const GptqOptions& opt) {
  GptqResult res;
  shape_result(res.q, rows, cols, opt.spec);
  Columns c{opt, rows, cols, working_columns(W, rows, cols, H), {}, {}, {}, {}, res.q};
  if (opt.spec.group > 0 && opt.static_groups)
    c.static_p = static_group_params(c.Wt, rows, cols, opt.spec);
  c.perm = column_order(opt.act_order, c.Wt, H, rows, cols);
  c.U = damped_inverse_cholesky(H, rows, cols, opt, res);
  c.cur.resize(rows);
  const int B = std::max(1, opt.blocksize);
  std::vector<float> Err(static_cast<std::size_t>(B) * rows);
  for (int i1 = 0; i1 < cols; i1 += B) c.quantize_block(i1, std::min(i1 + B, cols), Err, res.loss);
  return res;
}

}  // namespace tessera::quant
