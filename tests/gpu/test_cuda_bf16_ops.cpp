// The mixed-precision ops (kernels/cuda/ops_bf16.cu) and the GEMM epilogues (gemm.cu) against
// the CPU ops on the same inputs. Inputs that are bf16 on the GPU are rounded on the host first
// and the CPU reference computes in fp32 from exactly those values, so the differences are the
// output rounding (u16 = 2^-8 relative, round-to-nearest: half of that) plus fp32 reordering
// (u = 2^-24 per term of a sum, on both sides).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_test_util.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/optim/adamw.hpp"

namespace {

using namespace gpu_test;
namespace cpu = tessera::kernels::cpu;
using tessera::kernels::GemmLibrary;

std::vector<std::uint16_t> bf16_of(const std::vector<float>& x, std::vector<float>& rounded) {
  std::vector<std::uint16_t> bits(x.size());
  rounded.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) rounded[i] = from_bf16(bits[i] = to_bf16(x[i]));
  return bits;
}
std::vector<float> widen(const std::vector<std::uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) v[i] = from_bf16(bits[i]);
  return v;
}
// bound[i] = rel * |ref[i]| + abs
std::vector<double> bounds(const std::vector<float>& ref, double rel, double abs) {
  std::vector<double> b(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) b[i] = rel * std::abs(ref[i]) + abs;
  return b;
}

// C = 100: the block-per-row kernels; 96 and 768: the warp-per-row kernels (C % 8 == 0), with
// lanes holding 1 and 3 chunks of 8 columns.
class CudaBf16LayerNorm : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Widths, CudaBf16LayerNorm, ::testing::Values(100, 96, 768));

TEST_P(CudaBf16LayerNorm, ForwardBackward) {
  REQUIRE_GPU();
  const int N = 37, C = GetParam();
  Rng rng(21);
  auto x = randn(rng, N * C, 2.0f, 0.5f), w = randn(rng, C, 0.5f, 1.0f), b = randn(rng, C, 0.1f);
  std::vector<float> ref(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(ref.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  auto dx = upload(x), dw = upload(w), db = upload(b);
  gpu::DeviceBuffer out(N * C * 2), dmean(N * 4), drstd(N * 4);
  gpu::layernorm_forward_bf16(out.as<std::uint16_t>(), dmean.as<float>(), drstd.as<float>(),
                              dx.as<float>(), dw.as<float>(), db.as<float>(), N, C, nullptr);
  // fp32 statistics (sums of C terms in another order: 1e-5 covers 2 C u), bf16 output rounding
  expect_within(widen(download<std::uint16_t>(out, N * C)), ref, bounds(ref, k_u_bf16, 1e-5),
                "layernorm_forward_bf16");
  expect_close(download<float>(dmean, N), mean, 1e-6, 1e-5, "mean");
  expect_close(download<float>(drstd, N), rstd, 0, 1e-5, "rstd");

  std::vector<float> g_r;
  auto g16 = bf16_of(randn(rng, N * C), g_r);
  auto dinp0 = randn(rng, N * C), dw0 = randn(rng, C), db0 = randn(rng, C);
  std::vector<float> ref_dinp = dinp0, ref_dw = dw0, ref_db = db0;
  cpu::layernorm_backward(ref_dinp.data(), ref_dw.data(), ref_db.data(), g_r.data(), x.data(),
                          w.data(), mean.data(), rstd.data(), N, C);
  auto d_dinp = upload(dinp0), d_dw = upload(dw0), d_db = upload(db0), d_g = upload(g16);
  gpu::DeviceBuffer copy16(N * C * 2);
  gpu::layernorm_backward_bf16(d_dinp.as<float>(), copy16.as<std::uint16_t>(), d_dw.as<float>(),
                               d_db.as<float>(), d_g.as<std::uint16_t>(), dx.as<float>(),
                               dw.as<float>(), dmean.as<float>(), drstd.as<float>(), N, C, nullptr);
  auto got_dinp = download<float>(d_dinp, N * C);
  // sums of C (dinp) or N (dweight, dbias) terms of size ~3: a few 1e-5 absolute at most
  expect_close(got_dinp, ref_dinp, 2e-5, 1e-5, "layernorm_backward_bf16 dinp");
  expect_close(download<float>(d_dw, C), ref_dw, 2e-5, 1e-5, "dweight");
  expect_close(download<float>(d_db, C), ref_db, 2e-5, 1e-5, "dbias");
  auto copy = download<std::uint16_t>(copy16, N * C);
  for (int i = 0; i < N * C; ++i) ASSERT_EQ(copy[i], to_bf16(got_dinp[i])) << "bf16 copy " << i;
}

// The llama ops with bf16 activations. RMSNorm at C = 100 (the general warp-per-row kernel), 96
// and 768 (the 16-byte kernel shared with LayerNorm, 1 and 3 chunks per lane), bounds as for
// LayerNorm above. The rotation and SwiGLU: bf16 inputs rounded on the host, the same fp32
// arithmetic on both sides (cos and sin from the same double angles; exp within ~2e-7
// relative), so the difference is the bf16 rounding of the output: u16 relative, plus 1e-6.
// Rows of 37 tokens, head sizes 64 and 12 (pairs 8 at a time and one at a time), SwiGLU widths
// F = 40 (8 columns at a time) and 36 (one at a time).
class CudaBf16RmsNorm : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Widths, CudaBf16RmsNorm, ::testing::Values(100, 96, 768));

TEST_P(CudaBf16RmsNorm, ForwardBackward) {
  REQUIRE_GPU();
  const int N = 37, C = GetParam();
  Rng rng(23);
  auto x = randn(rng, N * C, 2.0f, 0.5f), w = randn(rng, C, 0.5f, 1.0f);
  std::vector<float> ref(N * C), rstd(N);
  cpu::rmsnorm_forward(ref.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  auto dx = upload(x), dw = upload(w);
  gpu::DeviceBuffer out(N * C * 2), drstd(N * 4);
  gpu::rmsnorm_forward_bf16(out.as<std::uint16_t>(), drstd.as<float>(), dx.as<float>(),
                            dw.as<float>(), N, C, 1e-5f, nullptr);
  expect_within(widen(download<std::uint16_t>(out, N * C)), ref, bounds(ref, k_u_bf16, 1e-5),
                "rmsnorm_forward_bf16");
  expect_close(download<float>(drstd, N), rstd, 0, 1e-5, "rstd");

  std::vector<float> g_r;
  auto g16 = bf16_of(randn(rng, N * C), g_r);
  auto dinp0 = randn(rng, N * C), dw0 = randn(rng, C);
  std::vector<float> ref_dinp = dinp0, ref_dw = dw0;
  cpu::rmsnorm_backward(ref_dinp.data(), ref_dw.data(), g_r.data(), x.data(), w.data(), rstd.data(),
                        N, C);
  auto d_dinp = upload(dinp0), d_dw = upload(dw0), d_g = upload(g16);
  gpu::DeviceBuffer copy16(N * C * 2);
  gpu::rmsnorm_backward_bf16(d_dinp.as<float>(), copy16.as<std::uint16_t>(), d_dw.as<float>(),
                             d_g.as<std::uint16_t>(), dx.as<float>(), dw.as<float>(),
                             drstd.as<float>(), N, C, nullptr);
  auto got_dinp = download<float>(d_dinp, N * C);
  expect_close(got_dinp, ref_dinp, 2e-5, 1e-5, "rmsnorm_backward_bf16 dinp");
  expect_close(download<float>(d_dw, C), ref_dw, 2e-5, 1e-5, "dweight");
  auto copy = download<std::uint16_t>(copy16, N * C);
  for (int i = 0; i < N * C; ++i) ASSERT_EQ(copy[i], to_bf16(got_dinp[i])) << "bf16 copy " << i;
}

TEST(CudaBf16Ops, RopeAndSwiGluMatchCpu) {
  REQUIRE_GPU();
  Rng rng(29);
  const int B = 2, T = 37, NH = 4, KV = 2;
  const std::int64_t N = B * T;
  for (const int hs : {64, 12})  // pairs 8 at a time, and one at a time
    for (const bool back : {false, true}) {
      const std::int64_t W = (NH + 2 * KV) * hs;
      std::vector<double> inv(hs / 2);
      for (int i = 0; i < hs / 2; ++i) inv[i] = std::pow(10000.0, -2.0 * i / hs);
      std::vector<float> r;
      auto q16 = bf16_of(randn(rng, N * W), r);
      if (back)
        cpu::rope_backward(r.data(), B, T, NH, KV, hs, inv.data());
      else
        cpu::rope_forward(r.data(), B, T, NH, KV, hs, inv.data());
      auto d_q = upload(q16);
      if (back)
        gpu::rope_backward_bf16(d_q.as<std::uint16_t>(), B, T, NH, KV, hs, inv.data(), nullptr);
      else
        gpu::rope_forward_bf16(d_q.as<std::uint16_t>(), B, T, NH, KV, hs, inv.data(), nullptr);
      expect_within(
          widen(download<std::uint16_t>(d_q, N * W)), r, bounds(r, k_u_bf16, 1e-6),
          (back ? "rope_backward_bf16 hs=" : "rope_forward_bf16 hs=") + std::to_string(hs));
    }
  for (const int F : {40, 36}) {
    std::vector<float> in_r, gd_r;
    auto in16 = bf16_of(randn(rng, N * 2 * F, 2.0f), in_r);
    auto gd16 = bf16_of(randn(rng, N * F), gd_r);
    std::vector<float> so(N * F), sd(N * 2 * F);
    cpu::swiglu_forward(so.data(), in_r.data(), N, F);
    cpu::swiglu_backward(sd.data(), gd_r.data(), in_r.data(), N, F);
    auto d_in = upload(in16), d_gd = upload(gd16);
    gpu::DeviceBuffer d_so(N * F * 2), d_sd(N * 2 * F * 2);
    gpu::swiglu_forward_bf16(d_so.as<std::uint16_t>(), d_in.as<std::uint16_t>(), N, F, nullptr);
    gpu::swiglu_backward_bf16(d_sd.as<std::uint16_t>(), d_gd.as<std::uint16_t>(),
                              d_in.as<std::uint16_t>(), N, F, nullptr);
    const double rel = k_u_bf16 + 1e-6;
    expect_within(widen(download<std::uint16_t>(d_so, N * F)), so, bounds(so, rel, 1e-6),
                  "swiglu_forward_bf16 F=" + std::to_string(F));
    expect_within(widen(download<std::uint16_t>(d_sd, N * 2 * F)), sd, bounds(sd, rel, 1e-6),
                  "swiglu_backward_bf16 F=" + std::to_string(F));
  }
}

TEST(CudaBf16Ops, GeluAndBiasBackward) {
  REQUIRE_GPU();
  const int n = 1003;  // not a multiple of 8: the scalar tail too
  Rng rng(22);
  std::vector<float> x_r, g_r;
  auto x16 = bf16_of(randn(rng, n, 2.0f), x_r);
  auto g16 = bf16_of(randn(rng, n), g_r);
  std::vector<float> ref(n), dref(n);
  cpu::gelu_forward(ref.data(), x_r.data(), n);
  cpu::gelu_backward(dref.data(), x_r.data(), g_r.data(), n);
  auto dx = upload(x16), dg = upload(g16);
  gpu::DeviceBuffer out(n * 2), din(n * 2);
  gpu::gelu_forward_bf16(out.as<std::uint16_t>(), dx.as<std::uint16_t>(), n, nullptr);
  gpu::gelu_backward_bf16(din.as<std::uint16_t>(), dx.as<std::uint16_t>(), dg.as<std::uint16_t>(),
                          n, nullptr);
  // One bf16 rounding of the output, plus the fp32 formula differences of the fp32 GELU test
  // (CudaOps.GeluForwardBackward): the CPU's polynomial tanh against tanhf, in terms that
  // cancel for x << 0 and near gelu'(x) = 0: 1e-5 absolute.
  expect_within(widen(download<std::uint16_t>(out, n)), ref, bounds(ref, k_u_bf16, 1e-5),
                "gelu_forward_bf16");
  expect_within(widen(download<std::uint16_t>(din, n)), dref, bounds(dref, k_u_bf16, 1e-5),
                "gelu_backward_bf16");

  // column sums, fp32 and bf16 input, accumulating into a non-zero bias gradient
  const int N = 300, OC = 70;
  auto d32 = randn(rng, N * OC);
  std::vector<float> d16_r;
  auto d16 = bf16_of(d32, d16_r);
  auto db0 = randn(rng, OC);
  std::vector<float> ref32 = db0, ref16 = db0;
  std::vector<double> mag(OC, 0.0);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < OC; ++c) {
      ref32[c] += d32[i * OC + c];
      ref16[c] += d16_r[i * OC + c];
      mag[c] += std::abs(d32[i * OC + c]);
    }
  auto dd32 = upload(d32), dd16 = upload(d16), b32 = upload(db0), b16 = upload(db0);
  gpu::bias_backward(b32.as<float>(), dd32.as<float>(), N, OC, nullptr);
  gpu::bias_backward_bf16(b16.as<float>(), dd16.as<std::uint16_t>(), N, OC, nullptr);
  std::vector<double> bound(OC);
  for (int c = 0; c < OC; ++c) bound[c] = 2.0 * (N + 1) * k_u * (mag[c] + std::abs(db0[c]));
  expect_within(download<float>(b32, OC), ref32, bound, "bias_backward");
  expect_within(download<float>(b16, OC), ref16, bound, "bias_backward_bf16");
}

TEST(CudaBf16Ops, CrossEntropyForwardBackward) {
  REQUIRE_GPU();
  const int N = 6, V = 1000, Vp = 1024;
  Rng rng(23);
  std::vector<float> lr_;
  auto l16 = bf16_of(randn(rng, N * Vp, 3.0f), lr_);
  std::vector<std::int32_t> targets = {3, 999, -1, 0, 512, 7};
  std::vector<float> ref_loss(N), ref_grad = lr_;
  cpu::cross_entropy_forward_backward(ref_loss.data(), ref_grad.data(), targets.data(), N, V, Vp,
                                      0.25f);
  auto dl = upload(l16), dt = upload(targets);
  gpu::DeviceBuffer loss(N * 4), loss2(N * 4);
  gpu::cross_entropy_forward_bf16(loss2.as<float>(), dl.as<std::uint16_t>(), dt.as<std::int32_t>(),
                                  N, V, Vp, nullptr);
  gpu::cross_entropy_forward_backward_bf16(loss.as<float>(), dl.as<std::uint16_t>(),
                                           dt.as<std::int32_t>(), N, V, Vp, 0.25f, nullptr);
  // losses: fp32 log-sum-exp over V terms; dlogits: one bf16 rounding
  expect_close(download<float>(loss, N), ref_loss, 1e-5, 1e-5, "losses");
  expect_close(download<float>(loss2, N), ref_loss, 1e-5, 1e-5, "losses (forward only)");
  auto grad = widen(download<std::uint16_t>(dl, N * Vp));
  expect_within(grad, ref_grad, bounds(ref_grad, k_u_bf16, 1e-9), "dlogits");
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) ASSERT_EQ(grad[i * Vp + j], 0.0f) << "padded column";
}

TEST(CudaBf16Ops, AdamWMixedAndSumOfSquares) {
  REQUIRE_GPU();
  const int n = 5000;
  Rng rng(24);
  auto p = randn(rng, n), g = randn(rng, n, 0.1f), m = randn(rng, n, 0.01f);
  std::vector<float> v(n);
  for (auto& x : v) x = 0.001f * std::abs(rng.normal());
  tessera::optim::AdamWConfig cfg{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  std::vector<float> rp = p, rm = m, rv = v;
  tessera::optim::adamw_update_range(rp.data(), g.data(), rm.data(), rv.data(), n, cfg, 2e-3f, true,
                                     7, 0.5f);
  auto dp = upload(p), dg = upload(g), dm = upload(m), dv = upload(v);
  gpu::DeviceBuffer p16(n * 2);
  gpu::adamw_update_mixed(dp.as<float>(), p16.as<std::uint16_t>(), dg.as<float>(), dm.as<float>(),
                          dv.as<float>(), n, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f, nullptr);
  auto gp = download<float>(dp, n);
  // the same fp32 formula: sqrt and division may round differently (a few ulp of the update)
  expect_close(gp, rp, 1e-7, 1e-6, "params");
  expect_close(download<float>(dm, n), rm, 0, 1e-6, "m");
  expect_close(download<float>(dv, n), rv, 0, 1e-6, "v");
  auto copy = download<std::uint16_t>(p16, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(copy[i], to_bf16(gp[i])) << i;

  double ss = 0;
  for (float x : g) ss += double(x) * x;
  gpu::DeviceBuffer out(4), ws(gpu::sum_of_squares_workspace_bytes());
  gpu::sum_of_squares(out.as<float>(), dg.as<float>(), n, ws.as<float>(), nullptr);
  EXPECT_NEAR(download<float>(out, 1)[0], ss, 2.0 * n * k_u * ss);  // n-term fp32 sum
}

// Row-major (M,K) x (N,K)^T, the shape of a linear layer, with the epilogues of gemm.cu.
struct EpilogueCase {
  int M = 33, N = 40, K = 65;
  std::vector<float> A, B, bias, R;
};

// pre = A B^T + bias, its magnitude sum per element (for the fp32 bound), with rounded inputs.
void reference_pre(const EpilogueCase& e, std::vector<float>& pre, std::vector<double>& mag) {
  pre.assign(std::size_t(e.M) * e.N, 0.0f);
  mag.assign(pre.size(), 0.0);
  tessera::kernels::gemm(GemmLibrary::OneDnn, false, true, e.M, e.N, e.K, 1.0f, e.A.data(), e.K,
                         e.B.data(), e.K, 0.0f, pre.data(), e.N);
  for (int i = 0; i < e.M; ++i)
    for (int j = 0; j < e.N; ++j) {
      double s = std::abs(e.bias[j]);
      for (int k = 0; k < e.K; ++k) s += std::abs(double(e.A[i * e.K + k]) * e.B[j * e.K + k]);
      pre[i * e.N + j] += e.bias[j];
      mag[i * e.N + j] = s;
    }
}

// fp32: cuBLASLt's GELU epilogue is the tanh approximation of the CPU kernel (an erf GELU would
// differ by up to ~2e-4 here, far above the bound), its DGELU the CPU's gelu', and c_in adds a
// residual read from another buffer.
TEST(CudaBf16Ops, GemmEpiloguesFp32) {
  REQUIRE_GPU();
  Rng rng(25);
  EpilogueCase e;
  e.A = randn(rng, e.M * e.K, 0.3f);
  e.B = randn(rng, e.N * e.K, 0.3f);
  e.bias = randn(rng, e.N, 0.5f);
  e.R = randn(rng, e.M * e.N);
  std::vector<float> pre;
  std::vector<double> mag;
  reference_pre(e, pre, mag);
  std::vector<float> gl(pre.size()), dg(pre.size());
  cpu::gelu_forward(gl.data(), pre.data(), pre.size());
  std::vector<double> bnd(pre.size());
  for (std::size_t i = 0; i < pre.size(); ++i) bnd[i] = 2.0 * (e.K + 3) * k_u * mag[i] + 1e-6;
  auto dA = upload(e.A), dB = upload(e.B), dbias = upload(e.bias), dR = upload(e.R);
  gpu::DeviceBuffer out(pre.size() * 4), aux(pre.size() * 4);
  gpu::GemmEpilogue ep;
  ep.bias = dbias.data();
  ep.act = gpu::GemmEpilogue::Act::Gelu;
  ep.aux = aux.data();
  gpu::gemm_ex(false, true, e.M, e.N, e.K, 1.0f, dA.as<float>(), e.K, dB.as<float>(), e.K, 0.0f,
               out.as<float>(), e.N, ep, nullptr);
  expect_within(download<float>(aux, pre.size()), pre, bnd, "gelu epilogue: pre-activation");
  std::vector<double> bnd_g(bnd);
  for (auto& b : bnd_g) b *= 1.2;  // |gelu'| <= 1.13
  expect_within(download<float>(out, pre.size()), gl, bnd_g, "gelu epilogue: output");

  // DGELU: out = (A B^T) * gelu'(aux), here with aux = pre and the same product
  std::vector<float> prod(pre.size());
  tessera::kernels::gemm(GemmLibrary::OneDnn, false, true, e.M, e.N, e.K, 1.0f, e.A.data(), e.K,
                         e.B.data(), e.K, 0.0f, prod.data(), e.N);
  cpu::gelu_backward(dg.data(), pre.data(), prod.data(), pre.size());
  gpu::GemmEpilogue ed;
  ed.act = gpu::GemmEpilogue::Act::DGelu;
  ed.aux = aux.data();
  gpu::gemm_ex(false, true, e.M, e.N, e.K, 1.0f, dA.as<float>(), e.K, dB.as<float>(), e.K, 0.0f,
               out.as<float>(), e.N, ed, nullptr);
  // plus the product times gelu'' (|gelu''| < 0.8) times aux's own error (bnd)
  std::vector<double> bnd_d(bnd);
  for (std::size_t i = 0; i < bnd.size(); ++i) bnd_d[i] = bnd[i] * (1.2 + std::abs(prod[i]));
  expect_within(download<float>(out, pre.size()), dg, bnd_d, "dgelu epilogue");

  // residual through c_in: out = A B^T + bias + R, R untouched, out's old contents ignored
  std::vector<float> res = pre;
  for (std::size_t i = 0; i < res.size(); ++i) res[i] += e.R[i];
  for (std::size_t i = 0; i < bnd.size(); ++i) bnd[i] += 2 * k_u * std::abs(e.R[i]);
  auto poisoned = upload(std::vector<float>(pre.size(), NAN));
  gpu::GemmEpilogue er;
  er.bias = dbias.data();
  er.c_in = dR.data();
  gpu::gemm_ex(false, true, e.M, e.N, e.K, 1.0f, dA.as<float>(), e.K, dB.as<float>(), e.K, 1.0f,
               poisoned.as<float>(), e.N, er, nullptr);
  expect_within(download<float>(poisoned, pre.size()), res, bnd, "c_in residual");
  EXPECT_EQ(download<float>(dR, pre.size()), e.R);
}

// bf16: the same epilogues on bf16 operands (exact products, fp32 sums). cuBLASLt rounds the
// product to the output type before its epilogue adds the bias (measured: where A B and the
// bias nearly cancel, the error is u16 |A B|, not u16 |A B + bias|), so the bound carries u16
// times the magnitude sum (>= |A B| + |bias|) besides the output rounding u16 |pre|.
TEST(CudaBf16Ops, GemmEpiloguesBf16) {
  REQUIRE_GPU();
  Rng rng(26);
  EpilogueCase e;
  std::vector<float> bias_r;
  auto A16 = bf16_of(randn(rng, e.M * e.K, 0.3f), e.A);
  auto B16 = bf16_of(randn(rng, e.N * e.K, 0.3f), e.B);
  auto bias16 = bf16_of(randn(rng, e.N, 0.5f), e.bias);
  std::vector<float> pre, gl;
  std::vector<double> mag;
  reference_pre(e, pre, mag);
  gl.resize(pre.size());
  cpu::gelu_forward(gl.data(), pre.data(), pre.size());
  auto dA = upload(A16), dB = upload(B16), db = upload(bias16);
  gpu::DeviceBuffer out(pre.size() * 2), aux(pre.size() * 2);
  gpu::GemmEpilogue ep;
  ep.bias = db.data();
  ep.act = gpu::GemmEpilogue::Act::Gelu;
  ep.aux = aux.data();
  gpu::gemm_bf16_ex(false, true, e.M, e.N, e.K, 1.0f, dA.as<std::uint16_t>(), e.K,
                    dB.as<std::uint16_t>(), e.K, 0.0f, out.as<std::uint16_t>(), e.N, ep, nullptr);
  std::vector<double> b1(pre.size()), b2(pre.size());
  for (std::size_t i = 0; i < pre.size(); ++i) {
    const double acc = 2.0 * (e.K + 3) * k_u * mag[i] + 1e-6;
    const double epi = k_u_bf16 * mag[i];
    b1[i] = k_u_bf16 * std::abs(pre[i]) + epi + acc;
    b2[i] = k_u_bf16 * std::abs(gl[i]) + 1.2 * (k_u_bf16 * std::abs(pre[i]) + epi + acc);
  }
  expect_within(widen(download<std::uint16_t>(aux, pre.size())), pre, b1, "bf16 pre-activation");
  expect_within(widen(download<std::uint16_t>(out, pre.size())), gl, b2, "bf16 gelu output");
}

}  // namespace
