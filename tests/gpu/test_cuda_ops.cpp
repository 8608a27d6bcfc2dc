// Tests of the CUDA kernels (kernels/cuda/ops.hpp) against the CPU kernels (kernels/cpu/ops.hpp,
// kernels::gemm, optim::adamw_update_range) on the same random inputs. Every test skips itself
// when tessera is built without CUDA or no CUDA device is visible.
//
// Tolerances are |gpu - cpu| <= atol + rtol * |cpu| per element, or an element-wise bound built
// from the magnitudes of the summed terms. Notation: u = 2^-24 (fp32 unit roundoff). A k-term
// sum computed in any order is within gamma_k ~ k*u of the exact sum relative to the sum of the
// magnitudes of its terms; the CPU and GPU sides each carry that error, so two different orders
// differ by at most ~2*k*u * sum|terms|. The CPU's exp/tanh polynomials (vec_math.hpp) are
// accurate to ~2e-7 relative, CUDA's expf/tanhf/logf to a few ulp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/optim/adamw.hpp"

namespace {

using namespace gpu_test;
namespace cpu = tessera::kernels::cpu;
namespace gpu = tessera::kernels::cuda;
using tessera::Rng;
using tessera::kernels::GemmLibrary;

// ---------------------------------------------------------------- cuBLASLt, loaded at first use
// The GPU GEMM loads libcublasLt at its first call instead of linking it (linking costs every
// process ~150 MB of resident memory from its start). Without a device no test here has run a
// GPU GEMM, so the library is not loaded yet; loading it resolves every entry point, which needs
// no device. (A build without CUDA has none to load.)
TEST(CudaGemm, CublasLtIsLoadedAtFirstUse) {
  if (!gpu::compiled_with_cuda()) {
    EXPECT_FALSE(gpu::cublaslt_loaded());
    EXPECT_THROW(gpu::load_cublaslt(), tessera::Error);
    return;
  }
  if (gpu::device_count() == 0) {
    EXPECT_FALSE(gpu::cublaslt_loaded());
  }
  gpu::load_cublaslt();
  EXPECT_TRUE(gpu::cublaslt_loaded());
}

// ---------------------------------------------------------------- skip behaviour
TEST(CudaOps, ReportsWhyItSkips) {
  REQUIRE_GPU();
  EXPECT_TRUE(gpu::compiled_with_cuda());
  EXPECT_GT(gpu::device_count(), 0);
}

// ---------------------------------------------------------------- GEMM
struct GemmCase {
  bool ta, tb;
};
constexpr GemmCase k_gemm_cases[] = {{false, false}, {false, true}, {true, false}, {true, true}};
constexpr std::int64_t k_M = 37, k_N = 53, k_K = 71, k_pad = 3;  // odd sizes, padded strides

struct GemmData {
  std::int64_t lda, ldb, ldc, a_rows, b_rows;
  std::vector<float> A, B, C0;
};

GemmData make_gemm_data(Rng& rng, bool ta, bool tb) {
  GemmData g;
  // Row-major storage: A is (M,K) or, transposed, (K,M); likewise B (K,N) or (N,K).
  g.a_rows = ta ? k_K : k_M;
  g.lda = (ta ? k_M : k_K) + k_pad;
  g.b_rows = tb ? k_N : k_K;
  g.ldb = (tb ? k_K : k_N) + k_pad;
  g.ldc = k_N + k_pad;
  g.A = randn(rng, g.a_rows * g.lda);
  g.B = randn(rng, g.b_rows * g.ldb);
  g.C0 = randn(rng, k_M * g.ldc);
  return g;
}

// (|alpha| |op(A)| |op(B)| + |beta| |C0|) (M,N) with the strides of C: the magnitude sums of the
// K+1 terms of every output element.
std::vector<double> gemm_magnitudes(const GemmData& g, bool ta, bool tb, float alpha, float beta) {
  std::vector<double> m(g.C0.size(), 0.0);
  for (std::int64_t i = 0; i < k_M; ++i)
    for (std::int64_t j = 0; j < k_N; ++j) {
      double s = 0.0;
      for (std::int64_t k = 0; k < k_K; ++k) {
        float a = ta ? g.A[k * g.lda + i] : g.A[i * g.lda + k];
        float b = tb ? g.B[j * g.ldb + k] : g.B[k * g.ldb + j];
        s += std::abs(static_cast<double>(a) * b);
      }
      m[i * g.ldc + j] = std::abs(alpha) * s + std::abs(beta) * std::abs(g.C0[i * g.ldc + j]);
    }
  return m;
}

TEST(CudaOps, GemmFp32MatchesCpuGemm) {
  REQUIRE_GPU();
  Rng rng(11);
  const float alpha = 0.7f, beta = 0.3f;
  for (auto [ta, tb] : k_gemm_cases) {
    SCOPED_TRACE("transa=" + std::to_string(ta) + " transb=" + std::to_string(tb));
    GemmData g = make_gemm_data(rng, ta, tb);
    std::vector<float> ref = g.C0;
    tessera::kernels::gemm(GemmLibrary::OneDnn, ta, tb, k_M, k_N, k_K, alpha, g.A.data(), g.lda,
                           g.B.data(), g.ldb, beta, ref.data(), g.ldc);
    auto dA = upload(g.A), dB = upload(g.B), dC = upload(g.C0);
    gpu::gemm(ta, tb, k_M, k_N, k_K, alpha, dA.as<float>(), g.lda, dB.as<float>(), g.ldb, beta,
              dC.as<float>(), g.ldc, nullptr);
    std::vector<float> got = download<float>(dC, g.C0.size());
    // Both sides sum K+1 products in their own order (no TF32 on the GPU: CUBLAS_COMPUTE_32F),
    // plus the roundings of alpha*, beta*: 2*(K+3)*u times the magnitude sum. The padding
    // columns of C (j >= N) must be untouched: bound 0 there (magnitude 0, and ref == C0).
    std::vector<double> bound = gemm_magnitudes(g, ta, tb, alpha, beta);
    for (auto& b : bound) b *= 2.0 * (k_K + 3) * k_u;
    for (std::int64_t i = 0; i < k_M; ++i)
      for (std::int64_t j = k_N; j < g.ldc; ++j) ASSERT_EQ(got[i * g.ldc + j], g.C0[i * g.ldc + j]);
    expect_within(got, ref, bound, "gemm fp32");
  }
}

TEST(CudaOps, GemmBf16MatchesCpuGemmOfRoundedInputs) {
  REQUIRE_GPU();
  Rng rng(12);
  const float alpha = 0.7f, beta = 0.3f;
  for (auto [ta, tb] : k_gemm_cases) {
    SCOPED_TRACE("transa=" + std::to_string(ta) + " transb=" + std::to_string(tb));
    GemmData g = make_gemm_data(rng, ta, tb);
    // bf16 copies of the inputs; the fp32 reference uses exactly the rounded values, so the
    // difference to it is accumulation and output rounding only.
    std::vector<std::uint16_t> A16(g.A.size()), B16(g.B.size()), C16(g.C0.size());
    std::vector<float> Ar(g.A.size()), Br(g.B.size()), C0r(g.C0.size());
    for (std::size_t i = 0; i < g.A.size(); ++i) Ar[i] = from_bf16(A16[i] = to_bf16(g.A[i]));
    for (std::size_t i = 0; i < g.B.size(); ++i) Br[i] = from_bf16(B16[i] = to_bf16(g.B[i]));
    for (std::size_t i = 0; i < g.C0.size(); ++i) C0r[i] = from_bf16(C16[i] = to_bf16(g.C0[i]));
    GemmData gr = g;
    gr.A = Ar;
    gr.B = Br;

    // fp32 output, C0 in fp32.
    std::vector<float> ref = g.C0;
    tessera::kernels::gemm(GemmLibrary::OneDnn, ta, tb, k_M, k_N, k_K, alpha, Ar.data(), g.lda,
                           Br.data(), g.ldb, beta, ref.data(), g.ldc);
    auto dA = upload(A16), dB = upload(B16), dC = upload(g.C0);
    gpu::gemm_bf16(ta, tb, k_M, k_N, k_K, alpha, dA.as<std::uint16_t>(), g.lda,
                   dB.as<std::uint16_t>(), g.ldb, beta, dC.as<float>(), g.ldc, nullptr);
    std::vector<float> got = download<float>(dC, g.C0.size());
    // Products of bf16 values are exact in fp32; tensor cores accumulate in fp32 but may
    // truncate rather than round the partial sums (an error unit of 2u per add), the CPU rounds:
    // (2 + 1) * (K+3) * u, taken as 4*(K+3)*u, times the magnitude sum.
    std::vector<double> mag = gemm_magnitudes(gr, ta, tb, alpha, beta);
    std::vector<double> bound(mag.size());
    for (std::size_t i = 0; i < mag.size(); ++i) bound[i] = 4.0 * (k_K + 3) * k_u * mag[i];
    expect_within(got, ref, bound, "gemm bf16 -> fp32 vs fp32 gemm of the rounded inputs");

    // Against the fp32 GEMM of the UNROUNDED inputs: each input carries a relative error of at
    // most u_bf16, so each product is off by <= (2 u_bf16 + u_bf16^2) |a||b| ~ 7.8e-3 |a||b|;
    // bound 1e-2 times the magnitude sum (the fp32 accumulation terms above are far smaller).
    std::vector<float> ref32 = g.C0;
    tessera::kernels::gemm(GemmLibrary::OneDnn, ta, tb, k_M, k_N, k_K, alpha, g.A.data(), g.lda,
                           g.B.data(), g.ldb, beta, ref32.data(), g.ldc);
    std::vector<double> mag32 = gemm_magnitudes(g, ta, tb, alpha, beta);
    for (auto& b : mag32) b *= 1e-2;
    expect_within(got, ref32, mag32, "gemm bf16 -> fp32 vs fp32 gemm");

    // bf16 output, C0 given in bf16 (beta reads it in bf16): the same accumulation bound plus
    // the final rounding to bf16, u_bf16 * |result| (+ the bound itself, rounded along).
    std::vector<float> ref16 = C0r;
    tessera::kernels::gemm(GemmLibrary::OneDnn, ta, tb, k_M, k_N, k_K, alpha, Ar.data(), g.lda,
                           Br.data(), g.ldb, beta, ref16.data(), g.ldc);
    auto dC16 = upload(C16);
    gpu::gemm_bf16(ta, tb, k_M, k_N, k_K, alpha, dA.as<std::uint16_t>(), g.lda,
                   dB.as<std::uint16_t>(), g.ldb, beta, dC16.as<std::uint16_t>(), g.ldc, nullptr);
    std::vector<std::uint16_t> got16 = download<std::uint16_t>(dC16, C16.size());
    std::vector<float> got16f(got16.size());
    for (std::size_t i = 0; i < got16.size(); ++i) got16f[i] = from_bf16(got16[i]);
    std::vector<double> mag16 = gemm_magnitudes(
        [&] {
          GemmData t = gr;
          t.C0 = C0r;
          return t;
        }(),
        ta, tb, alpha, beta);
    std::vector<double> bound16(mag16.size());
    for (std::size_t i = 0; i < mag16.size(); ++i)
      bound16[i] =
          (1.0 + k_u_bf16) * 4.0 * (k_K + 3) * k_u * mag16[i] + k_u_bf16 * std::abs(ref16[i]);
    expect_within(got16f, ref16, bound16, "gemm bf16 -> bf16");
  }
}

TEST(CudaOps, GemmZeroKScalesC) {
  REQUIRE_GPU();
  Rng rng(13);
  std::vector<float> C0 = randn(rng, 6 * 5);
  auto dC = upload(C0);
  gpu::gemm(false, false, 6, 5, 0, 1.0f, nullptr, 1, nullptr, 5, 0.5f, dC.as<float>(), 5, nullptr);
  std::vector<float> got = download<float>(dC, C0.size());
  for (std::size_t i = 0; i < C0.size(); ++i) EXPECT_EQ(got[i], 0.5f * C0[i]);  // one rounding
}

// ---------------------------------------------------------------- embedding
TEST(CudaOps, EmbeddingForwardBackward) {
  REQUIRE_GPU();
  Rng rng(21);
  const int B = 3, T = 17, C = 40, V = 11, maxT = 20;
  std::vector<std::int32_t> inp(B * T);
  for (auto& t : inp) t = static_cast<std::int32_t>(rng.next_u32() % V);  // repeats likely
  std::vector<float> wte = randn(rng, V * C), wpe = randn(rng, maxT * C);
  std::vector<float> ref(B * T * C);
  cpu::embedding_forward(ref.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  auto d_inp = upload(inp), d_wte = upload(wte), d_wpe = upload(wpe);
  gpu::DeviceBuffer d_out(ref.size() * sizeof(float));
  gpu::embedding_forward(d_out.as<float>(), d_inp.as<std::int32_t>(), d_wte.as<float>(),
                         d_wpe.as<float>(), B, T, C, nullptr);
  // One fp32 addition of the same operands on both sides: bit-identical.
  expect_close(download<float>(d_out, ref.size()), ref, 0.0, 0.0, "embedding forward");

  std::vector<float> dout = randn(rng, B * T * C);
  std::vector<float> dwte = randn(rng, V * C), dwpe = randn(rng, maxT * C);  // += onto these
  std::vector<float> ref_dwte = dwte, ref_dwpe = dwpe;
  cpu::embedding_backward(ref_dwte.data(), ref_dwpe.data(), dout.data(), inp.data(), B, T, C);
  auto d_dout = upload(dout), d_dwte = upload(dwte), d_dwpe = upload(dwpe);
  gpu::embedding_backward(d_dwte.as<float>(), d_dwpe.as<float>(), d_dout.as<float>(),
                          d_inp.as<std::int32_t>(), B, T, C, nullptr);
  // Each element sums its prefill and up to B*T (dwte) or B (dwpe) gradient terms; atomics add
  // them in any order: 2*(k+1)*u times the magnitude sum, k = B*T for both (an upper bound).
  std::vector<double> mag_te(dwte.size()), mag_pe(dwpe.size());
  for (std::size_t i = 0; i < dwte.size(); ++i) mag_te[i] = std::abs(dwte[i]);
  for (std::size_t i = 0; i < dwpe.size(); ++i) mag_pe[i] = std::abs(dwpe[i]);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < C; ++c) {
      mag_te[static_cast<std::size_t>(inp[r]) * C + c] += std::abs(dout[r * C + c]);
      mag_pe[static_cast<std::size_t>(r % T) * C + c] += std::abs(dout[r * C + c]);
    }
  for (auto& m : mag_te) m *= 2.0 * (B * T + 1) * k_u;
  for (auto& m : mag_pe) m *= 2.0 * (B * T + 1) * k_u;
  expect_within(download<float>(d_dwte, dwte.size()), ref_dwte, mag_te, "embedding dwte");
  expect_within(download<float>(d_dwpe, dwpe.size()), ref_dwpe, mag_pe, "embedding dwpe");
}

// ---------------------------------------------------------------- layernorm
TEST(CudaOps, LayerNormForwardBackward) {
  REQUIRE_GPU();
  Rng rng(31);
  const std::int64_t N = 45;
  const int C = 200;  // not a multiple of the block size
  // x ~ 0.5 + N(0,1): a non-zero mean; |w|, |b| ~ 1; every quantity below is O(1).
  std::vector<float> x = randn(rng, N * C, 1.0f, 0.5f);
  std::vector<float> w = randn(rng, C, 0.5f, 1.0f), b = randn(rng, C, 0.5f);
  std::vector<float> ref(N * C), ref_mean(N), ref_rstd(N);
  cpu::layernorm_forward(ref.data(), ref_mean.data(), ref_rstd.data(), x.data(), w.data(), b.data(),
                         N, C);
  auto dx = upload(x), dw = upload(w), db = upload(b);
  gpu::DeviceBuffer d_out(ref.size() * 4), d_mean(N * 4), d_rstd(N * 4);
  gpu::layernorm_forward(d_out.as<float>(), d_mean.as<float>(), d_rstd.as<float>(), dx.as<float>(),
                         dw.as<float>(), db.as<float>(), N, C, nullptr);
  // mean and variance are C-term sums in another order: 2*C*u relative to sums of O(1)
  // magnitudes (|x| <= ~5, so ~5*2*C*u absolute on the mean); rsqrt adds a few u. Everything
  // downstream is a handful of O(1) multiply-adds: atol = rtol = 8*C*u covers it.
  const double tol = 8.0 * C * k_u;
  expect_close(download<float>(d_mean, N), ref_mean, tol, tol, "layernorm mean");
  expect_close(download<float>(d_rstd, N), ref_rstd, tol, tol, "layernorm rstd");
  expect_close(download<float>(d_out, ref.size()), ref, tol, tol, "layernorm out");

  std::vector<float> dout = randn(rng, N * C);
  std::vector<float> dinp = randn(rng, N * C), dweight = randn(rng, C), dbias = randn(rng, C);
  std::vector<float> r_dinp = dinp, r_dweight = dweight, r_dbias = dbias;
  cpu::layernorm_backward(r_dinp.data(), r_dweight.data(), r_dbias.data(), dout.data(), x.data(),
                          w.data(), ref_mean.data(), ref_rstd.data(), N, C);
  auto d_dout = upload(dout), d_dinp = upload(dinp), d_dweight = upload(dweight),
       d_dbias = upload(dbias), d_rmean = upload(ref_mean), d_rrstd = upload(ref_rstd);
  // The GPU backward gets the CPU's mean/rstd so only the backward's own rounding is compared.
  gpu::layernorm_backward(d_dinp.as<float>(), d_dweight.as<float>(), d_dbias.as<float>(),
                          d_dout.as<float>(), dx.as<float>(), dw.as<float>(), d_rmean.as<float>(),
                          d_rrstd.as<float>(), N, C, nullptr);
  // dinp: the two C-term row sums as above, then O(1) multiply-adds onto the prefill.
  expect_close(download<float>(d_dinp, dinp.size()), r_dinp, tol, tol, "layernorm dinp");
  // dweight, dbias: N-term column sums plus the prefill, in another order (partials and
  // atomics): 2*(N+1)*u times the magnitude sums, plus ~4u per term for n = (x-m)*r.
  std::vector<double> mag_w(C), mag_b(C);
  for (int c = 0; c < C; ++c) {
    mag_w[c] = std::abs(dweight[c]);
    mag_b[c] = std::abs(dbias[c]);
    for (std::int64_t i = 0; i < N; ++i) {
      double n = (x[i * C + c] - ref_mean[i]) * static_cast<double>(ref_rstd[i]);
      mag_w[c] += std::abs(n * dout[i * C + c]);
      mag_b[c] += std::abs(dout[i * C + c]);
    }
    mag_w[c] *= (2.0 * (N + 1) + 4.0) * k_u;
    mag_b[c] *= 2.0 * (N + 1) * k_u;
  }
  expect_within(download<float>(d_dweight, C), r_dweight, mag_w, "layernorm dweight");
  expect_within(download<float>(d_dbias, C), r_dbias, mag_b, "layernorm dbias");
}

// ---------------------------------------------------------------- gelu
TEST(CudaOps, GeluForwardBackward) {
  REQUIRE_GPU();
  Rng rng(41);
  const std::int64_t n = 10007;
  std::vector<float> x = randn(rng, n, 2.0f), dout = randn(rng, n);
  std::vector<float> ref(n), ref_d(n);
  cpu::gelu_forward(ref.data(), x.data(), n);
  cpu::gelu_backward(ref_d.data(), x.data(), dout.data(), n);
  auto dx = upload(x), d_dout = upload(dout);
  gpu::DeviceBuffer d_out(n * 4), d_dinp(n * 4);
  gpu::gelu_forward(d_out.as<float>(), dx.as<float>(), n, nullptr);
  gpu::gelu_backward(d_dinp.as<float>(), dx.as<float>(), d_dout.as<float>(), n, nullptr);
  // tanh differs by ~2e-7 relative (CPU polynomial) + a few ulp (tanhf). For x << 0 the
  // result 0.5*x*(1 + tanh(u)) cancels: that is an ABSOLUTE error of ~3e-7 times 0.5*|x|
  // (x ~ N(0,2), |x| <= ~9 over 1e4 samples), and in the backward times the O(1) derivative
  // factors and |dout| (<= ~4.5): atol 1e-5. Elsewhere a few roundings: rtol 2e-6.
  expect_close(download<float>(d_out, n), ref, 1e-5, 2e-6, "gelu forward");
  expect_close(download<float>(d_dinp, n), ref_d, 1e-5, 2e-6, "gelu backward");
  // dinp may alias dout.
  gpu::gelu_backward(d_dout.as<float>(), dx.as<float>(), d_dout.as<float>(), n, nullptr);
  expect_close(download<float>(d_dout, n), ref_d, 1e-5, 2e-6, "gelu backward in place");
}

// ---------------------------------------------------------------- attention
// Against the CPU op; KV < NH is grouped-query attention (llama), KV = NH GPT-2's.
static void check_attention(int B, int T, int NH, int KV, int hs, std::uint64_t seed) {
  SCOPED_TRACE("NH=" + std::to_string(NH) + " KV=" + std::to_string(KV));
  Rng rng(seed);
  const std::size_t W = static_cast<std::size_t>(NH + 2 * KV) * hs, OC = std::size_t(NH) * hs;
  std::vector<float> qkv = randn(rng, B * T * W);
  std::vector<float> ref(B * T * OC), ref_lse(B * NH * T);
  cpu::attention_forward(GemmLibrary::OneDnn, ref.data(), ref_lse.data(), qkv.data(), B, T, NH, KV,
                         hs);
  auto d_qkv = upload(qkv);
  gpu::DeviceBuffer d_out(ref.size() * 4), d_lse(ref_lse.size() * 4);
  gpu::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), B, T, NH, KV, hs,
                         nullptr);
  // Rounding budget (inputs N(0,1), scores O(1), hs = 16, T = 37): scores are hs-term dots
  // (2*hs*u relative to sum|q||k| ~ hs/sqrt(hs)); exp ~2e-7; softmax sums and P V are <= T
  // terms (2*T*u). Three stages of <= 2*37*u ~ 4.4e-6 each on O(1) values: atol = rtol = 2e-5.
  expect_close(download<float>(d_out, ref.size()), ref, 2e-5, 2e-5, "attention out");
  expect_close(download<float>(d_lse, ref_lse.size()), ref_lse, 2e-5, 2e-5, "attention lse");

  std::vector<float> dout = randn(rng, ref.size());
  std::vector<float> ref_dqkv(qkv.size(), 777.0f);  // overwrite contract: sentinel prefill
  cpu::attention_backward(GemmLibrary::OneDnn, ref_dqkv.data(), dout.data(), qkv.data(), ref.data(),
                          ref_lse.data(), B, T, NH, KV, hs);
  std::vector<float> sentinel(qkv.size(), 777.0f);
  auto d_dout = upload(dout), d_dqkv = upload(sentinel), d_ref = upload(ref),
       d_rlse = upload(ref_lse);
  // The GPU backward gets the CPU forward's out and lse, so only the backward is compared.
  gpu::attention_backward(d_dqkv.as<float>(), d_dout.as<float>(), d_qkv.as<float>(),
                          d_ref.as<float>(), d_rlse.as<float>(), B, T, NH, KV, hs, nullptr);
  // Two more stages than the forward (dP and D, then the T-term sums of dS into dq/dk and of P
  // into dv), on O(1) values with dS ~ P * O(1): atol = rtol = 5e-5; a shared kv head sums the
  // NH/KV heads of its group (x2 here): 1e-4.
  const double tol = KV == NH ? 5e-5 : 1e-4;
  expect_close(download<float>(d_dqkv, qkv.size()), ref_dqkv, tol, tol, "attention dqkv");
}

TEST(CudaOps, AttentionForwardBackward) {
  REQUIRE_GPU();
  check_attention(2, 37, 3, 3, 16, 51);
  check_attention(2, 37, 4, 2, 16, 52);  // grouped-query
}

// RMSNorm, rotary positions and SwiGLU (llama) against the CPU ops, fp32. The norm: C-term sums
// of squares (C = 96) on both sides, a few u relative: 1e-5; its backward adds the dw sums over
// N = 74 rows (atomics here): 1e-4. Rotation and SwiGLU are elementwise: 1e-6 (the rotation's
// angles are computed in double on both sides; exp differs by ~2e-7 relative).
TEST(CudaOps, LlamaOpsMatchCpu) {
  REQUIRE_GPU();
  Rng rng(53);
  const int B = 2, T = 37, C = 96, NH = 4, KV = 2, hs = 16;
  const std::int64_t N = B * T;
  std::vector<float> x = randn(rng, N * C), w = randn(rng, C), g = randn(rng, N * C);
  std::vector<float> out(N * C), rstd(N), dx(N * C, 0.5f), dw(C, 0.25f);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  auto d_x = upload(x), d_w = upload(w), d_g = upload(g);
  gpu::DeviceBuffer d_out(out.size() * 4), d_rstd(rstd.size() * 4);
  auto d_dx = upload(std::vector<float>(N * C, 0.5f)), d_dw = upload(std::vector<float>(C, 0.25f));
  gpu::rmsnorm_forward(d_out.as<float>(), d_rstd.as<float>(), d_x.as<float>(), d_w.as<float>(), N,
                       C, 1e-5f, nullptr);
  gpu::rmsnorm_backward(d_dx.as<float>(), d_dw.as<float>(), d_g.as<float>(), d_x.as<float>(),
                        d_w.as<float>(), d_rstd.as<float>(), N, C, nullptr);
  expect_close(download<float>(d_out, out.size()), out, 1e-5, 1e-5, "rmsnorm out");
  expect_close(download<float>(d_rstd, rstd.size()), rstd, 1e-5, 1e-5, "rmsnorm rstd");
  expect_close(download<float>(d_dx, dx.size()), dx, 1e-4, 1e-4, "rmsnorm dx (+=)");
  expect_close(download<float>(d_dw, dw.size()), dw, 1e-4, 1e-4, "rmsnorm dw (+=)");

  const std::size_t W = static_cast<std::size_t>(NH + 2 * KV) * hs;
  std::vector<float> qkv = randn(rng, B * T * W), r = qkv;
  // Llama 3.1-style scaled frequencies: the kernels read the table, whatever it holds.
  std::vector<double> inv(hs / 2);
  for (int i = 0; i < hs / 2; ++i) inv[i] = std::pow(10000.0, -2.0 * i / hs) / (i % 3 + 1);
  cpu::rope_forward(r.data(), B, T, NH, KV, hs, inv.data());
  auto d_qkv = upload(qkv);
  gpu::rope_forward(d_qkv.as<float>(), B, T, NH, KV, hs, inv.data(), nullptr);
  expect_close(download<float>(d_qkv, qkv.size()), r, 1e-6, 1e-6, "rope forward");
  cpu::rope_backward(r.data(), B, T, NH, KV, hs, inv.data());
  gpu::rope_backward(d_qkv.as<float>(), B, T, NH, KV, hs, inv.data(), nullptr);
  expect_close(download<float>(d_qkv, qkv.size()), r, 1e-6, 1e-6, "rope backward");

  for (const int F : {40, 36}) {  // 8 columns at a time, and one at a time
    std::vector<float> in = randn(rng, N * 2 * F), gd = randn(rng, N * F), so(N * F), sd(N * 2 * F);
    cpu::swiglu_forward(so.data(), in.data(), N, F);
    cpu::swiglu_backward(sd.data(), gd.data(), in.data(), N, F);
    auto d_in = upload(in), d_gd = upload(gd);
    gpu::DeviceBuffer d_so(so.size() * 4), d_sd(sd.size() * 4);
    gpu::swiglu_forward(d_so.as<float>(), d_in.as<float>(), N, F, nullptr);
    gpu::swiglu_backward(d_sd.as<float>(), d_gd.as<float>(), d_in.as<float>(), N, F, nullptr);
    expect_close(download<float>(d_so, so.size()), so, 1e-6, 1e-6, "swiglu forward");
    expect_close(download<float>(d_sd, sd.size()), sd, 1e-6, 1e-6, "swiglu backward");
  }
}

// ---------------------------------------------------------------- cross-entropy
TEST(CudaOps, CrossEntropyForwardBackward) {
  REQUIRE_GPU();
  Rng rng(61);
  const std::int64_t N = 29;
  const int V = 1000, Vp = 1024;
  std::vector<float> logits = randn(rng, N * Vp, 2.0f);
  for (std::int64_t i = 0; i < N; ++i)  // padded columns hold garbage that must not count
    for (int j = V; j < Vp; ++j) logits[i * Vp + j] = 1e4f;
  std::vector<std::int32_t> targets(N);
  for (std::int64_t i = 0; i < N; ++i)
    targets[i] = i % 7 == 3 ? -1 : static_cast<std::int32_t>(rng.next_u32() % V);
  const float dloss = 1.0f / 29.0f;

  std::vector<float> ref_loss(N), ref_fwd_loss(N), ref_grad = logits;
  cpu::cross_entropy_forward(ref_fwd_loss.data(), logits.data(), targets.data(), N, V, Vp);
  cpu::cross_entropy_forward_backward(ref_loss.data(), ref_grad.data(), targets.data(), N, V, Vp,
                                      dloss);
  auto d_logits = upload(logits), d_targets = upload(targets);
  gpu::DeviceBuffer d_loss(N * 4), d_fwd_loss(N * 4);
  gpu::cross_entropy_forward(d_fwd_loss.as<float>(), d_logits.as<float>(),
                             d_targets.as<std::int32_t>(), N, V, Vp, nullptr);
  gpu::cross_entropy_forward_backward(d_loss.as<float>(), d_logits.as<float>(),
                                      d_targets.as<std::int32_t>(), N, V, Vp, dloss, nullptr);
  // loss = max + log(sum of V exps) - logit[t]: the sum is reordered (2*V*u relative to itself,
  // all terms positive) and each exp is off by <= ~2e-7, so log(sum) moves by <= 2*V*u + 3e-7
  // absolute; plus the rounding of the O(10) result (a few u relative).
  const double loss_atol = 2.0 * V * k_u + 3e-7, loss_rtol = 4.0 * k_u;
  expect_close(download<float>(d_fwd_loss, N), ref_fwd_loss, loss_atol, loss_rtol, "ce forward");
  expect_close(download<float>(d_loss, N), ref_loss, loss_atol, loss_rtol, "ce fwd+bwd loss");
  // Padded columns and ignored rows must be exactly 0.
  std::vector<float> got = download<float>(d_logits, logits.size());
  for (std::int64_t i = 0; i < N; ++i)
    for (int j = 0; j < Vp; ++j)
      if (targets[i] < 0 || j >= V) {
        ASSERT_EQ(got[i * Vp + j], 0.0f) << "row " << i << " col " << j;
      }
  // dlogits = dloss * (p - onehot): p is off by the relative error of the sum (2*V*u) plus the
  // exp errors (~3e-7); at the target p - 1 cancels, so the bound has an absolute part in dloss
  // units as well as a relative one.
  const double g_tol = 2.0 * V * k_u + 1e-6;
  expect_close(got, ref_grad, dloss * g_tol, g_tol, "ce dlogits");
}

// ---------------------------------------------------------------- adamw
TEST(CudaOps, AdamWMatchesOptim) {
  REQUIRE_GPU();
  Rng rng(71);
  const std::int64_t n = 5003;
  std::vector<float> p = randn(rng, n), g = randn(rng, n), m = randn(rng, n, 0.1f);
  std::vector<float> v(n);
  for (auto& x : v) x = 0.01f + 0.1f * std::abs(rng.normal());  // second moments are positive
  tessera::optim::AdamWConfig cfg;
  const float lr = 1e-2f;
  for (bool decay : {false, true}) {
    for (std::int64_t step : {1, 7}) {
      SCOPED_TRACE("decay=" + std::to_string(decay) + " step=" + std::to_string(step));
      std::vector<float> rp = p, rm = m, rv = v;
      tessera::optim::adamw_update_range(rp.data(), g.data(), rm.data(), rv.data(), n, cfg, lr,
                                         decay, step);
      auto dp = upload(p), dg = upload(g), dm = upload(m), dv = upload(v);
      gpu::adamw_update(dp.as<float>(), dg.as<float>(), dm.as<float>(), dv.as<float>(), n, lr,
                        cfg.beta1, cfg.beta2, cfg.eps, decay ? cfg.weight_decay : 0.0f, step,
                        nullptr);
      // The same formula element by element; nvcc contracts a*b + c into FMAs, the CPU build
      // (-std=c++20, no contraction) does not: a few roundings of O(1) terms apart. m and v: two
      // products and a sum of magnitude <= ~4: atol 8*4*u, rtol 8u. The step lr*mhat/sqrt(vhat)
      // carries ~10 u relative of |mhat/sqrt(vhat)| <= ~50 (v >= 0.01), times lr: 3e-7; plus
      // the rounding of p (O(1)): atol 1e-6, rtol 8u.
      expect_close(download<float>(dm, n), rm, 32 * k_u, 8 * k_u, "adamw m");
      expect_close(download<float>(dv, n), rv, 32 * k_u, 8 * k_u, "adamw v");
      expect_close(download<float>(dp, n), rp, 1e-6, 8 * k_u, "adamw params");
    }
  }
}

// ---------------------------------------------------------------- elementwise
TEST(CudaOps, Elementwise) {
  REQUIRE_GPU();
  Rng rng(81);
  const std::int64_t n = 70001;
  std::vector<float> a = randn(rng, n), b = randn(rng, n);
  std::vector<float> ref_add(n), ref_inplace = a;
  cpu::add(ref_add.data(), a.data(), b.data(), n);
  cpu::add_inplace(ref_inplace.data(), b.data(), n);
  auto da = upload(a), db = upload(b);
  gpu::DeviceBuffer d_out(n * 4), d_copy(n * 4);
  gpu::add(d_out.as<float>(), da.as<float>(), db.as<float>(), n, nullptr);
  gpu::copy(d_copy.as<float>(), da.as<float>(), n, nullptr);
  // One correctly rounded fp32 operation per element on both sides: bit-identical.
  expect_close(download<float>(d_out, n), ref_add, 0.0, 0.0, "add");
  expect_close(download<float>(d_copy, n), a, 0.0, 0.0, "copy");
  gpu::add_inplace(da.as<float>(), db.as<float>(), n, nullptr);
  expect_close(download<float>(da, n), ref_inplace, 0.0, 0.0, "add_inplace");
}

TEST(CudaOps, BufferMovesAndErrorsAreTesseraErrors) {
  REQUIRE_GPU();
  gpu::DeviceBuffer a(1024);
  void* p = a.data();
  gpu::DeviceBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.bytes(), 1024u);
  // An impossible allocation surfaces as tessera::Error naming the call.
  try {
    gpu::DeviceBuffer huge(std::size_t{1} << 62);
    FAIL() << "allocating 2^62 bytes succeeded";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
}

}  // namespace
