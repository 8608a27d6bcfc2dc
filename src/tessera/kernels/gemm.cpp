#include "tessera/kernels/gemm.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tessera/core/bf16.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/core/cpu.hpp"
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
    gemm(lib, false, trans_b, M, N, K, 1.0f, a.data(), K, b.data(), trans_b ? K : N, 0.0f, c.data(),
         N);
  };
  return 2.0 * static_cast<double>(M) * N * K / median_seconds(run, min_reps, min_seconds) / 1e9;
}

namespace {

// The block (rows, cols) of a stored bf16 matrix (leading dimension ld) widened to fp32 into
// `out` (rows, cols), contiguous: exact (bf16 is the upper half of an fp32).
void widen(const std::uint16_t* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
           Buffer<float>& out) {
  if (out.size() < static_cast<std::size_t>(rows * cols))
    out = Buffer<float>(static_cast<std::size_t>(rows * cols));
  float* o = out.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) o[r * cols + c] = bf16_to_fp32(x[r * ld + c]);
}

// The emulated bf16 GEMM, blocked: C in blocks of at most k_block x k_block, each the sum over
// K-blocks of products of its operands' blocks widened to fp32 by the fp32 GEMM (into C with
// beta, then accumulated); the widened copies stay a few MB whatever the shape (an LM head's
// weights widened whole would be as large as their fp32 copy).
constexpr std::int64_t k_block = 1024;
void gemm_bf16_emulated(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                        float alpha, const std::uint16_t* A, std::int64_t lda,
                        const std::uint16_t* B, std::int64_t ldb, float beta, float* C,
                        std::int64_t ldc) {
  Buffer<float> a, b;
  // op(A) (M, K) block at (m0, k0) and op(B) (K, N) block at (k0, n0), stored as the caller's
  auto widen_a = [&](std::int64_t m0, std::int64_t mb, std::int64_t k0, std::int64_t kb) {
    if (trans_a)
      widen(A + k0 * lda + m0, kb, mb, lda, a);  // stored (K, M)
    else
      widen(A + m0 * lda + k0, mb, kb, lda, a);
  };
  auto widen_b = [&](std::int64_t k0, std::int64_t kb, std::int64_t n0, std::int64_t nb) {
    if (trans_b)
      widen(B + n0 * ldb + k0, nb, kb, ldb, b);  // stored (N, K)
    else
      widen(B + k0 * ldb + n0, kb, nb, ldb, b);
  };
  const bool one_a = M <= k_block && K <= k_block;  // A is one block: widened once
  for (std::int64_t n0 = 0; n0 < N; n0 += k_block) {
    const std::int64_t nb = std::min(k_block, N - n0);
    for (std::int64_t k0 = 0; k0 < K; k0 += k_block) {
      const std::int64_t kb = std::min(k_block, K - k0);
      widen_b(k0, kb, n0, nb);
      for (std::int64_t m0 = 0; m0 < M; m0 += k_block) {
        const std::int64_t mb = std::min(k_block, M - m0);
        if (!one_a || n0 == 0) widen_a(m0, mb, k0, kb);
        gemm(GemmLibrary::OneDnn, trans_a, trans_b, mb, nb, kb, alpha, a.data(), trans_a ? mb : kb,
             b.data(), trans_b ? kb : nb, k0 == 0 ? beta : 1.0f, C + m0 * ldc + n0, ldc);
      }
    }
  }
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
               std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  // oneDNN runs bf16 matmuls from AVX-512 up (natively with AVX-512 BF16 or AMX). Below that
  // (AVX2, or a ONEDNN_MAX_CPU_ISA cap), the emulation: the operands widened to fp32 (exact), then
  // the fp32 GEMM. The products of bf16 values are exact in fp32 either way; both accumulate in
  // fp32, so the two paths differ only in the order of the sums.
  const auto avx512 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
  if ((static_cast<unsigned>(dnnl_get_effective_cpu_isa()) & avx512) != avx512) {
    gemm_bf16_emulated(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  // A transposed operand is the same matrix with swapped strides: op(A) (M,K) stored (K,M).
  const dnnl::memory::desc a_md({M, K}, dt::bf16, trans_a ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc c_md({M, N}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {  // C = alpha * A B + beta * C
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  try {
    // The engine and stream are cheap values; the primitive comes from oneDNN's primitive cache
    // after the first call of a shape.
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(eng);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
    dnnl::memory a_mem(a_md, eng, const_cast<std::uint16_t*>(A));
    dnnl::memory b_mem(b_md, eng, const_cast<std::uint16_t*>(B));
    dnnl::memory c_mem(c_md, eng, C);
    dnnl::matmul(pd).execute(
        stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
  } catch (const dnnl::error& e) {
    TESSERA_CHECK(false, "oneDNN bf16 matmul failed: {} (M={} N={} K={})", e.what(), M, N, K);
  }
}

bool cpu_has_native_bf16() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return cpu_has_avx512_bf16() && (isa & bf16) == bf16;
}

std::string_view bf16_gemm_unit() {
  if (!cpu_has_native_bf16()) return "emulated (fp32 GEMM on widened operands)";
  const auto amx = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
  return (static_cast<unsigned>(dnnl_get_effective_cpu_isa()) & amx) == amx ? "AMX tiles"
                                                                            : "AVX-512 BF16";
}

double measure_gemm_bf16_gflops(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                                int min_reps, double min_seconds) {
  Buffer<std::uint16_t> a(static_cast<std::size_t>(M * K)), b(static_cast<std::size_t>(K * N));
  Buffer<float> c(static_cast<std::size_t>(M * N));
  Rng rng(1);
  // bf16 of uniform(-0.5, 0.5): the upper half of the fp32 bits (truncation is enough here)
  auto bits = [&] {
    const float f = rng.uniform() - 0.5f;
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<std::uint16_t>(u >> 16);
  };
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = bits();
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bits();
  auto run = [&] {
    gemm_bf16(false, trans_b, M, N, K, 1.0f, a.data(), K, b.data(), trans_b ? K : N, 0.0f, c.data(),
              N);
  };
  return 2.0 * static_cast<double>(M) * N * K / median_seconds(run, min_reps, min_seconds) / 1e9;
}

}  // namespace tessera::kernels
