// The CPU kernels of the llama family (kernels/cpu/ops.hpp): RMSNorm, rotary positions and
// SwiGLU, forward against double-precision references and backward against central finite
// differences (the error budget of test_ops.cpp: L = sum(out * R), noise ~ k u sum|out R| / 2h).
// Grouped-query attention is tested with the other attention cases in test_ops.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "grad_check.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/cpu/vec_math.hpp"
#include "tessera/model/config.hpp"

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

// The unscaled rotary inverse frequencies theta^(-2i/hs), as the kernels take them.
std::vector<double> inv_freq_of(double theta, int hs) {
  std::vector<double> inv(hs / 2);
  for (int i = 0; i < hs / 2; ++i) inv[i] = std::pow(theta, -2.0 * i / hs);
  return inv;
}

// The rotation of Hugging Face's rotate-half layout, in double, by angles (pos0 + t) inv[i].
std::vector<double> rope_ref(const std::vector<float>& qkv, int B, int T, int NH, int KV, int hs,
                             const std::vector<double>& inv, int pos0) {
  const int W = (NH + 2 * KV) * hs, half = hs / 2;
  std::vector<double> out(qkv.begin(), qkv.end());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH + KV; ++h)
        for (int i = 0; i < half; ++i) {
          const double a = (pos0 + t) * inv[i];
          const std::size_t o = (std::size_t(b) * T + t) * W + std::size_t(h) * hs + i;
          const double x1 = qkv[o], x2 = qkv[o + half];
          out[o] = x1 * std::cos(a) - x2 * std::sin(a);
          out[o + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
  return out;
}

TEST(LlamaOps, RopeRotatesQAndKAndItsBackwardIsTheTranspose) {
  const int B = 2, T = 9, NH = 4, KV = 2, hs = 8;
  const auto inv = inv_freq_of(10000.0, hs);
  const int W = (NH + 2 * KV) * hs;
  Rng rng(12);
  const auto x0 = randn(rng, B * T * W);
  auto x = x0;
  cpu::rope_forward(x.data(), B, T, NH, KV, hs, inv.data());
  // cos and sin are rounded to fp32 once each: two roundings on two products, a few u relative.
  const auto ref = rope_ref(x0, B, T, NH, KV, hs, inv, 0);
  expect_close("rope", x.data(), ref.data(), x.size(), {1e-6, 1e-6});
  // v (the last KV heads of each row) is not touched.
  for (int r = 0; r < B * T; ++r)
    for (int c = (NH + KV) * hs; c < W; ++c) ASSERT_EQ(x[r * W + c], x0[r * W + c]);

  // A position offset (decoding with a cache): row t of a one-row call at pos0 = t equals row t
  // of the whole sequence, bit for bit (the same fp32 cos and sin).
  for (int t = 0; t < T; ++t) {
    std::vector<float> row(x0.begin() + t * W, x0.begin() + (t + 1) * W);
    cpu::rope_forward(row.data(), 1, 1, NH, KV, hs, inv.data(), t);
    for (int c = 0; c < W; ++c) ASSERT_EQ(row[c], x[t * W + c]) << "t=" << t;
  }

  // The backward is the adjoint of a linear map: <R, rope(x)> = <rope_backward(R), x>, up to the
  // rounding of two dot products of B*T*W terms (~1e3 terms of size ~1: 1e-4 absolute).
  const auto R = randn(rng, x.size());
  auto g = R;
  cpu::rope_backward(g.data(), B, T, NH, KV, hs, inv.data());
  const double lhs = dot(R.data(), x.data(), x.size());
  const double rhs = dot(g.data(), x0.data(), x0.size());
  EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(lhs)));
  // Rotating back undoes the rotation (cos^2 + sin^2 = 1 up to fp32 rounding).
  auto back = x;
  cpu::rope_backward(back.data(), B, T, NH, KV, hs, inv.data());
  std::vector<double> x0d(x0.begin(), x0.end());
  expect_close("rope inverse", back.data(), x0d.data(), back.size(), {1e-6, 1e-6});
}

// The table of model::rope_inv_freq without scaling gives the rotation the kernel computed from
// theta alone before it took a table: the angle (pos0 + t) theta^(-2i/hs) in double, cos and sin
// rounded to fp32. The angles are the same doubles (the table's entries equal
// std::pow(theta, -2.0 * i / hs) exactly: RopeInvFreqLlama3), so the kernel's output is that of
// the theta path bit for bit; compared here with the rotation written out in fp32 (whose products
// the compiler may fuse differently from the kernel's vector loop: a few u).
TEST(LlamaOps, RopeWithTheUnscaledTableIsTheThetaRotation) {
  const int B = 2, T = 7, NH = 4, KV = 2, hs = 16, pos0 = 3;
  const double theta = 500000.0;
  const int W = (NH + 2 * KV) * hs, half = hs / 2;
  tessera::model::ModelConfig cfg;
  cfg.family = tessera::model::Family::Llama;
  cfg.n_head = NH;
  cfg.n_kv_head = KV;
  cfg.n_embd = NH * hs;
  cfg.rope_theta = theta;
  Rng rng(14);
  const auto x0 = randn(rng, B * T * W);
  auto x = x0, expect = x0;
  cpu::rope_forward(x.data(), B, T, NH, KV, hs, tessera::model::rope_inv_freq(cfg).data(), pos0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH + KV; ++h)
        for (int i = 0; i < half; ++i) {
          const double a = (pos0 + t) * std::pow(theta, -2.0 * i / hs);
          const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
          float* e = expect.data() + (std::size_t(b) * T + t) * W + std::size_t(h) * hs;
          const float x1 = e[i], x2 = e[i + half];
          e[i] = x1 * c - x2 * s;
          e[i + half] = x2 * c + x1 * s;
        }
  for (std::size_t k = 0; k < x.size(); ++k)
    ASSERT_NEAR(x[k], expect[k], 1e-6 * (1 + std::abs(expect[k]))) << "element " << k;
}

// A scaled table (llama3 scaling of Llama 3.1 8B's shape) rotates by its own angles.
TEST(LlamaOps, RopeFollowsAScaledTable) {
  const int B = 1, T = 5, NH = 2, KV = 1, hs = 128, pos0 = 9000;
  const int W = (NH + 2 * KV) * hs;
  tessera::model::ModelConfig cfg;
  cfg.family = tessera::model::Family::Llama;
  cfg.n_head = NH;
  cfg.n_kv_head = KV;
  cfg.n_embd = NH * hs;
  cfg.rope_theta = 500000.0;
  cfg.rope_scaling.kind = tessera::model::RopeScalingKind::Llama3;
  cfg.rope_scaling.factor = 8;
  const auto inv = tessera::model::rope_inv_freq(cfg);
  Rng rng(15);
  const auto x0 = randn(rng, B * T * W);
  auto x = x0;
  cpu::rope_forward(x.data(), B, T, NH, KV, hs, inv.data(), pos0);
  const auto ref = rope_ref(x0, B, T, NH, KV, hs, inv, pos0);
  expect_close("scaled rope", x.data(), ref.data(), x.size(), {1e-6, 1e-6});
}

// Llama 3.1 8B's rotary frequencies (theta 500000, head size 128, llama3 scaling: factor 8, low 1,
// high 4, original context 8192), computed here from the definition: wavelengths below
// 8192 / 4 = 2048 (pairs 0..28) keep theta^(-2i/128); above 8192 (pairs 35..63) are divided
// by 8; between, a blend with s = (8192 / wavelength - 1) / 3.
TEST(LlamaOps, RopeInvFreqLlama3) {
  tessera::model::ModelConfig cfg;
  cfg.family = tessera::model::Family::Llama;
  cfg.n_head = 32;
  cfg.n_kv_head = 8;
  cfg.n_embd = 4096;
  cfg.rope_theta = 500000.0;
  const auto plain = tessera::model::rope_inv_freq(cfg);
  cfg.rope_scaling.kind = tessera::model::RopeScalingKind::Llama3;
  cfg.rope_scaling.factor = 8;
  cfg.rope_scaling.low_freq_factor = 1;
  cfg.rope_scaling.high_freq_factor = 4;
  cfg.rope_scaling.original_max_position_embeddings = 8192;
  const auto inv = tessera::model::rope_inv_freq(cfg);
  ASSERT_EQ(inv.size(), 64u);
  ASSERT_EQ(plain.size(), 64u);
  for (int i : {0, 1, 17, 28, 29, 31, 34, 35, 50, 63}) {
    SCOPED_TRACE(i);
    const double base = 1.0 / std::pow(500000.0, i / 64.0);
    EXPECT_NEAR(plain[i], base, 1e-15 * base);
    const double wavelen = 2 * std::numbers::pi / base;
    double want = base / 8;
    if (i <= 28) {
      EXPECT_LT(wavelen, 2048);
      want = base;
    } else if (i <= 34) {
      EXPECT_GT(wavelen, 2048);
      EXPECT_LT(wavelen, 8192);
      const double s = (8192 / wavelen - 1) / 3;
      want = base * (s + (1 - s) / 8);
      EXPECT_GT(want, base / 8);
      EXPECT_LT(want, base);
    } else {
      EXPECT_GT(wavelen, 8192);
    }
    EXPECT_NEAR(inv[i], want, 1e-14 * want);
  }
  // Linear scaling divides every frequency.
  cfg.rope_scaling.kind = tessera::model::RopeScalingKind::Linear;
  cfg.rope_scaling.factor = 4;
  const auto lin = tessera::model::rope_inv_freq(cfg);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(lin[i], plain[i] / 4);
  // Unscaled, the table is exactly what the kernels computed from theta.
  for (int i = 0; i < 64; ++i) EXPECT_EQ(plain[i], std::pow(500000.0, -2.0 * i / 128));
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

// SwiGLU's rows are computed 8 values to a vector with the tail padded into one more, so a value's
// result must not depend on where a slice of the row starts or ends (the decoder's threads take
// slices of the rows that the forward takes whole): every slice gives the whole row's values bit
// for bit, and the whole row is within the forward's bound of double (a row of 8k + 3 values,
// the gates from -100 to 100: exp's clamps, SiLU's flat tail and values near 0).
TEST(LlamaOps, SwigluSlicesEqualTheWholeRow) {
  const int F = 8 * 5 + 3;
  Rng rng(17);
  auto gate = randn(rng, F, 3.0f);
  const auto up = randn(rng, F);
  gate[0] = -100.0f;
  gate[1] = 100.0f;
  gate[2] = -88.5f;
  gate[3] = 1e-30f;
  std::vector<float> whole(F);
  cpu::swiglu_slice(whole.data(), gate.data(), up.data(), F);
  for (int c = 0; c < F; ++c) {
    const double g = gate[c], ref = g / (1 + std::exp(-g)) * up[c];
    EXPECT_NEAR(whole[c], ref, 1e-6 + 1e-6 * std::fabs(ref)) << "value " << c;
  }
  for (int begin = 0; begin < F; ++begin)
    for (int end = begin + 1; end <= F; end += 3) {
      std::vector<float> part(end - begin, -7.0f);
      cpu::swiglu_slice(part.data(), gate.data() + begin, up.data() + begin, end - begin);
      for (int c = begin; c < end; ++c)
        ASSERT_EQ(part[c - begin], whole[c]) << "slice " << begin << ".." << end << ", value " << c;
    }
}

#if defined(__AVX2__) && defined(__FMA__)
// exp_approx8 is exp_approx's steps on vectors: within 2e-7 relative of exp over the unclamped
// range (exp_approx's own error), and the same saturation at both clamps.
TEST(LlamaOps, ExpApprox8FollowsExpApprox) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.37f) x.push_back(v);
  for (const float v : {0.0f, -0.0f, 88.37f, 88.38f, -87.33f, -87.34f, -1e30f, 1e30f})
    x.push_back(v);
  while (x.size() % 8) x.push_back(1.0f);
  for (std::size_t i = 0; i < x.size(); i += 8) {
    alignas(32) float out[8];
    _mm256_store_ps(out, cpu::exp_approx8(_mm256_loadu_ps(x.data() + i)));
    for (int j = 0; j < 8; ++j) {
      const float v = x[i + j], scalar = cpu::exp_approx(v);
      if (v > -87.0f && v < 88.0f)
        EXPECT_NEAR(out[j], std::exp(double(v)), 2e-7 * std::exp(double(v))) << "x = " << v;
      else
        EXPECT_FLOAT_EQ(out[j], scalar) << "x = " << v;  // the clamps: the same saturated value
    }
  }
}
#endif

}  // namespace
