#include "tessera/kernels/cpu/bf16.hpp"

#include <omp.h>

#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels::cpu {

void to_bf16(std::uint16_t* out, const float* in, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = fp32_to_bf16(in[i]);
}

void from_bf16(float* out, const std::uint16_t* in, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(in[i]);
}

const std::uint16_t* Bf16Scratch::round(Buffer<std::uint16_t>& buf, const float* in,
                                        std::int64_t n) {
  if (buf.size() < static_cast<std::size_t>(n)) buf.resize(static_cast<std::size_t>(n));
  to_bf16(buf.data(), in, n);
  return buf.data();
}

void linear_forward_bf16(Bf16Scratch& s, float* out, const float* inp, const std::uint16_t* w,
                         const std::uint16_t* bias16, const float* bias32, std::int64_t N, int IC,
                         int OC, bool accumulate_out) {
  const std::uint16_t* x = Bf16Scratch::round(s.a, inp, N * IC);
  gemm_bf16(false, true, N, OC, IC, 1.0f, x, IC, w, IC, accumulate_out ? 1.0f : 0.0f, out, OC);
  if (!bias16 && !bias32) return;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    float* o = out + i * OC;
    if (bias16) {
#pragma omp simd
      for (int j = 0; j < OC; ++j) o[j] += bf16_to_fp32(bias16[j]);
    } else {
#pragma omp simd
      for (int j = 0; j < OC; ++j) o[j] += bias32[j];
    }
  }
}

void linear_backward_input_bf16(Bf16Scratch& s, float* dinp, const float* dout,
                                const std::uint16_t* w, std::int64_t N, int IC, int OC) {
  const std::uint16_t* g = Bf16Scratch::round(s.b, dout, N * OC);
  gemm_bf16(false, false, N, IC, OC, 1.0f, g, OC, w, IC, 0.0f, dinp, IC);
}

void linear_backward_bf16(Bf16Scratch& s, float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp, const std::uint16_t* w,
                          std::int64_t N, int IC, int OC) {
  const std::uint16_t* g = Bf16Scratch::round(s.b, dout, N * OC);
  if (dinp) gemm_bf16(false, false, N, IC, OC, 1.0f, g, OC, w, IC, 0.0f, dinp, IC);
  // dweight (OC,IC) += bf16(dout)^T (OC,N) @ bf16(inp) (N,IC)
  const std::uint16_t* x = Bf16Scratch::round(s.a, inp, N * IC);
  gemm_bf16(true, false, OC, IC, N, 1.0f, g, OC, x, IC, 1.0f, dweight, IC);
  if (!dbias) return;
    // Column sums in fp32, as the fp32 kernel: each thread owns a block of columns, rows in order.
#pragma omp parallel
  {
    const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int j0 = static_cast<int>(static_cast<std::int64_t>(OC) * tid / nth);
    const int j1 = static_cast<int>(static_cast<std::int64_t>(OC) * (tid + 1) / nth);
    for (std::int64_t i = 0; i < N; ++i) {
      const float* gi = dout + i * OC;
#pragma omp simd
      for (int j = j0; j < j1; ++j) dbias[j] += gi[j];
    }
  }
}

}  // namespace tessera::kernels::cpu
