// One GEMM interface for every backend. Row-major throughout:
//   C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C
// where op(X) is X or X^T. The library is a value chosen by the caller (run config, bench);
// there is no global backend state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::kernels {

enum class GemmLibrary {
  OneDnn,    // dnnl_sgemm: the fastest fp32 path measured here; threads with OpenMP
  OpenBlas,  // cblas_sgemm: kept for comparison (make bench)
};

GemmLibrary parse_gemm_library(std::string_view name);  // "onednn" | "openblas"
std::string_view gemm_library_name(GemmLibrary lib);

void gemm(GemmLibrary lib, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
          std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
          std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// The rate of one GEMM shape on this machine, C (M,N) = A (M,K) op(B) with op(B) (K,N) (B stored
// (N,K) if trans_b) on random operands: two warm-up runs (JIT, page faults), then timed runs
// until there are at least min_reps and min_seconds have passed; the median run's GFLOP/s, what
// a training step under the same conditions sees. Used for the MFU peak and by tessera probe.
double measure_gemm_gflops(GemmLibrary lib, bool trans_b, std::int64_t M, std::int64_t N,
                           std::int64_t K, int min_reps, double min_seconds);

// bf16 inputs, fp32 accumulation and output (oneDNN's bf16 matmul), the same row-major contract
// as gemm(): C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, A and B bf16 bit patterns
// (the upper 16 bits of an fp32), C fp32. Natively computed with AVX-512 BF16 or AMX; emulated
// (correct, slower) on CPUs without them.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
               std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// Whether this CPU computes bf16 GEMMs natively (AVX-512 BF16 or AMX, as oneDNN sees them: a
// ONEDNN_MAX_CPU_ISA cap below them counts as no).
bool cpu_has_native_bf16();

// Which unit computes gemm_bf16 here: "AMX tiles", "AVX-512 BF16" or the emulation (said so).
std::string_view bf16_gemm_unit();

// measure_gemm_gflops for gemm_bf16 (the weights B stored (N,K) if trans_b).
double measure_gemm_bf16_gflops(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                                int min_reps, double min_seconds);

}  // namespace tessera::kernels
