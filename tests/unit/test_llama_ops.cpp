// The CPU kernels of the llama family (kernels/cpu/ops.hpp): RMSNorm, rotary positions and
// SwiGLU, forward against double-precision references and backward against central finite
// differences (the error budget of test_ops.cpp: L = sum(out * R), noise ~ k u sum|out R| / 2h).
// Grouped-query attention is tested with the other attention cases in test_ops.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "grad_check.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"

namespace {

using tessera::Rng;
using tessera::test::check_gradient;
using tessera::test::dot;
using tessera::test::expect_close;
using tessera::test::randn;
namespace cpu = tessera::kernels::cpu;

TEST(LlamaOps, RmsNormForwardBackward) {
  const int N = 6, C = 12;
  const float eps = 1e-5f;
  Rng rng(11);
  auto x = randn(rng, N * C, 1.0f, 0.3f);
  auto w = randn(rng, C, 0.2f, 1.0f);
  const auto R = randn(rng, N * C);
  std::vector<float> out(N * C), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  // Forward against double: a C-term sum of squares and a square root, a few u relative.
  std::vector<double> ref(N * C);
  for (int i = 0; i < N; ++i) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[i * C + c]) * x[i * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) ref[i * C + c] = x[i * C + c] * r * w[c];
  }
  expect_close("rmsnorm out", out.data(), ref.data(), out.size(), {1e-6, 1e-6});

  // Backward accumulates (+=) into dinp and dweight: start both from 1 and subtract it.
  std::vector<float> dx(N * C, 1.0f), dw(C, 1.0f);
  cpu::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (auto& v : dx) v -= 1.0f;
  for (auto& v : dw) v -= 1.0f;
  // A perturbed x touches the C outputs of its row (|out R| <~ 3): noise <~ 12 * 3 * 4u / 2h ~
  // 1e-4 at h = 1e-2; truncation h^2/6 |L'''| with O(1) third derivatives ~2e-5. The -1 shift
  // of the += check costs u relative to 1. atol 3e-4, rtol 1e-3.
  auto loss = [&] {
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(out.data(), R.data(), out.size());
  };
  check_gradient("rmsnorm dx", x.data(), x.size(), dx.data(), loss, 1e-2, {3e-4, 1e-3}, rng, 1000);
  // The output is linear in w (no truncation error); each w touches N outputs.
  check_gradient("rmsnorm dw", w.data(), w.size(), dw.data(), loss, 1e-2, {3e-4, 1e-3}, rng, 1000);
}

// The rotation of Hugging Face's rotate-half layout, in double.
std::vector<double> rope_ref(const std::vector<float>& qkv, int B, int T, int NH, int KV, int hs,
                             double theta, int pos0) {
  const int W = (NH + 2 * KV) * hs, half = hs / 2;
  std::vector<double> out(qkv.begin(), qkv.end());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH + KV; ++h)
        for (int i = 0; i < half; ++i) {
          const double a = (pos0 + t) * std::pow(theta, -2.0 * i / hs);
          const std::size_t o = (std::size_t(b) * T + t) * W + std::size_t(h) * hs + i;
          const double x1 = qkv[o], x2 = qkv[o + half];
          out[o] = x1 * std::cos(a) - x2 * std::sin(a);
          out[o + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
  return out;
}

TEST(LlamaOps, RopeRotatesQAndKAndItsBackwardIsTheTranspose) {
  const int B = 2, T = 9, NH = 4, KV = 2, hs = 8;
  const double theta = 10000.0;
  const int W = (NH + 2 * KV) * hs;
  Rng rng(12);
  const auto x0 = randn(rng, B * T * W);
  auto x = x0;
  cpu::rope_forward(x.data(), B, T, NH, KV, hs, theta);
  // cos and sin are rounded to fp32 once each: two roundings on two products, a few u relative.
  const auto ref = rope_ref(x0, B, T, NH, KV, hs, theta, 0);
  expect_close("rope", x.data(), ref.data(), x.size(), {1e-6, 1e-6});
  // v (the last KV heads of each row) is not touched.
  for (int r = 0; r < B * T; ++r)
    for (int c = (NH + KV) * hs; c < W; ++c) ASSERT_EQ(x[r * W + c], x0[r * W + c]);

  // A position offset (decoding with a cache): row t of a one-row call at pos0 = t equals row t
  // of the whole sequence, bit for bit (the same fp32 cos and sin).
  for (int t = 0; t < T; ++t) {
    std::vector<float> row(x0.begin() + t * W, x0.begin() + (t + 1) * W);
    cpu::rope_forward(row.data(), 1, 1, NH, KV, hs, theta, t);
    for (int c = 0; c < W; ++c) ASSERT_EQ(row[c], x[t * W + c]) << "t=" << t;
  }

  // The backward is the adjoint of a linear map: <R, rope(x)> = <rope_backward(R), x>, up to the
  // rounding of two dot products of B*T*W terms (~1e3 terms of size ~1: 1e-4 absolute).
  const auto R = randn(rng, x.size());
  auto g = R;
  cpu::rope_backward(g.data(), B, T, NH, KV, hs, theta);
  const double lhs = dot(R.data(), x.data(), x.size());
  const double rhs = dot(g.data(), x0.data(), x0.size());
  EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(lhs)));
  // Rotating back undoes the rotation (cos^2 + sin^2 = 1 up to fp32 rounding).
  auto back = x;
  cpu::rope_backward(back.data(), B, T, NH, KV, hs, theta);
  std::vector<double> x0d(x0.begin(), x0.end());
  expect_close("rope inverse", back.data(), x0d.data(), back.size(), {1e-6, 1e-6});
}

TEST(LlamaOps, SwigluForwardBackward) {
  const int N = 5, F = 7;
  Rng rng(13);
  auto in = randn(rng, N * 2 * F, 2.0f);
  const auto R = randn(rng, N * F);
  std::vector<float> out(N * F);
  cpu::swiglu_forward(out.data(), in.data(), N, F);
  std::vector<double> ref(N * F);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < F; ++c) {
      const double g = in[i * 2 * F + c], u = in[i * 2 * F + F + c];
      ref[i * F + c] = g / (1 + std::exp(-g)) * u;
    }
  // exp_approx (~2e-7 relative) and three roundings: atol 1e-6, rtol 1e-6.
  expect_close("swiglu out", out.data(), ref.data(), out.size(), {1e-6, 1e-6});
  // Backward overwrites dinp: start it from a sentinel.
  std::vector<float> din(in.size(), 777.0f);
  cpu::swiglu_backward(din.data(), R.data(), in.data(), N, F);
  // Each input touches one output (|out R| <~ 10 at |g| ~ 4): noise ~ 4u * 10 / 2h ~ 2e-6 at
  // h = 1e-2; truncation h^2/6 |silu'''| (<= 0.5) |u| <~ 3e-5. atol 1e-4, rtol 1e-3.
  auto loss = [&] {
    cpu::swiglu_forward(out.data(), in.data(), N, F);
    return dot(out.data(), R.data(), out.size());
  };
  check_gradient("swiglu din", in.data(), in.size(), din.data(), loss, 1e-2, {1e-4, 1e-3}, rng,
                 1000);
}

}  // namespace
