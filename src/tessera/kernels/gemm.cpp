#include "tessera/kernels/gemm.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"

namespace tessera::kernels {

GemmLibrary parse_gemm_library(std::string_view name) {
  if (name == "onednn" || name == "dnnl") return GemmLibrary::OneDnn;
  if (name == "openblas" || name == "blas") return GemmLibrary::OpenBlas;
  throw Error(fmt::format("unknown GEMM library '{}'", name), "use 'onednn' or 'openblas'");
}

std::string_view gemm_library_name(GemmLibrary lib) {
  return lib == GemmLibrary::OneDnn ? "onednn" : "openblas";
}

void gemm(GemmLibrary lib, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
          std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
          std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (lib == GemmLibrary::OneDnn) {
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda,
                                  B, ldb, beta, C, ldc);
    TESSERA_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {} (M={} N={} K={})",
                  static_cast<int>(st), M, N, K);
  } else {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
                static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
                static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
                static_cast<blasint>(ldc));
  }
}

double measure_gemm_gflops(GemmLibrary lib, bool trans_b, std::int64_t M, std::int64_t N,
                           std::int64_t K, int min_reps, double min_seconds) {
  Buffer<float> a(static_cast<std::size_t>(M * K)), b(static_cast<std::size_t>(K * N)),
      c(static_cast<std::size_t>(M * N));
  Rng rng(1);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = rng.uniform() - 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = rng.uniform() - 0.5f;
  auto run = [&] {
    gemm(lib, false, trans_b, M, N, K, 1.0f, a.data(), K, b.data(), trans_b ? K : N, 0.0f,
         c.data(), N);
  };
  run();
  run();
  std::vector<double> t;
  Timer total;
  do {
    Timer one;
    run();
    t.push_back(one.seconds());
  } while (static_cast<int>(t.size()) < min_reps || total.seconds() < min_seconds);
  std::sort(t.begin(), t.end());
  return 2.0 * static_cast<double>(M) * N * K / t[t.size() / 2] / 1e9;
}

}  // namespace tessera::kernels
