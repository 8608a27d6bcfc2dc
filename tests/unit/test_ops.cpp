// Tests of the CPU fp32 kernels (kernels/cpu/ops.hpp): forward against double-precision
// references, backward against central finite differences, the += / = contract of every
// gradient output, and bit-reproducibility of the reductions.
//
// Gradient checks use L = sum(out * R) with a fixed random R (so dout = R), evaluated in double
// from the fp32 outputs, and compare with (L(x+h) - L(x-h)) / (2h). Error budget of that
// quotient, which every tolerance below instantiates:
//  - rounding: each fp32 output carries a relative error of a few u (u = 2^-24 ~ 6e-8; the
//    exp/tanh polynomials add ~2e-7 relative). Outputs that do not depend on x are bit-identical
//    in both evaluations and cancel exactly, so the noise in L(x+h) - L(x-h) is about
//    u * k * sum over the touched outputs of |out * R|, and it is divided by 2h.
//  - truncation: h^2/6 * |L'''| (zero for ops that are linear in the checked input).
// The analytic fp32 gradients themselves are accurate to a few u relative, negligible here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "grad_check.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/gemm.hpp"

namespace {

using tessera::Rng;
using tessera::kernels::gemm_library_name;
using tessera::kernels::GemmLibrary;
using tessera::test::check_gradient;
using tessera::test::dot;
using tessera::test::expect_close;
using tessera::test::randn;
using tessera::test::Tolerance;
namespace cpu = tessera::kernels::cpu;

constexpr GemmLibrary k_libs[] = {GemmLibrary::OneDnn, GemmLibrary::OpenBlas};

// Written into outputs documented as "overwrite" before the call: any trace of it afterwards
// means the kernel accumulated instead of overwriting.
constexpr float k_sentinel = 777.0f;

std::string lib_name(GemmLibrary lib) {
  return std::string(gemm_library_name(lib));
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr double k_u = 0x1p-24;  // fp32 unit roundoff

// Checks the += contract: a gradient output pre-filled with `prefill` ends up as prefill +
// `fresh` (the same call on a zero-filled buffer). The kernel adds the K terms of each element
// onto the prefill in some order (possibly fused multiply-adds), the fresh run onto 0, so the two
// sides differ only by the rounding of a (K+1)-term sum taken in two orders:
// |got - (prefill + fresh)| <= 2 (K+1) u (|prefill| + abs_sum), abs_sum = sum of |terms|.
// Overwriting (=) instead of accumulating misses by |prefill| ~ 1, far outside.
void expect_accumulates(const std::string& name, const std::vector<float>& got,
                        const std::vector<float>& prefill, const std::vector<float>& fresh,
                        const std::vector<double>& abs_sum, int K) {
  int failed = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = static_cast<double>(prefill[i]) + fresh[i];
    const double bound = 2.0 * (K + 1) * k_u * (std::abs(prefill[i]) + abs_sum[i]);
    const double err = std::abs(got[i] - want);
    if (!(err <= bound) && ++failed <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: " << got[i] << " != prefill " << prefill[i]
                    << " + gradient " << fresh[i] << " (|diff| " << err << " > " << bound << ")";
    }
  }
}

// ================================================================= embedding

TEST(Ops, EmbeddingForwardBackward) {
  constexpr int B = 2, T = 4, C = 6, V = 5, maxT = 6;
  Rng rng(101);
  // Token 3 occurs four times (twice in each sequence), token 2 never.
  const std::vector<std::int32_t> inp = {3, 1, 3, 0, 4, 3, 1, 3};
  auto wte = randn(rng, V * C), wpe = randn(rng, maxT * C);
  std::vector<float> out(B * T * C, k_sentinel);
  cpu::embedding_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)  // one fp32 add: exact
        ASSERT_EQ(out[(b * T + t) * C + c], wte[inp[b * T + t] * C + c] + wpe[t * C + c]);

  const auto R = randn(rng, B * T * C);
  // Accumulation into pre-filled buffers. The kernel adds the positions in (b, t) order per
  // channel; replaying that order in fp32 gives the expected result bit for bit, including the
  // repeated token, the unused token 2 and the unused positions T..maxT-1 (left untouched).
  const auto dwte0 = randn(rng, V * C), dwpe0 = randn(rng, maxT * C);
  auto dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_backward(dwte.data(), dwpe.data(), R.data(), inp.data(), B, T, C);
  auto want_te = dwte0, want_pe = dwpe0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        want_te[inp[b * T + t] * C + c] += R[(b * T + t) * C + c];
        want_pe[t * C + c] += R[(b * T + t) * C + c];
      }
  EXPECT_TRUE(bit_equal(dwte, want_te)) << "dwte is not dwte0 + sum of dout rows";
  EXPECT_TRUE(bit_equal(dwpe, want_pe)) << "dwpe is not dwpe0 + sum of dout rows";

  // Finite differences, all elements, from zero-initialised gradients. L is linear in wte and
  // wpe (no truncation error); a perturbed element touches at most 4 outputs (token 3) of size
  // <~ 3 with |R| <~ 2, each rounded once: noise <= 4 * 6 * 2u / (2h) ~ 7e-5 at h = 1e-2
  // (typically far less). atol 1e-4 + rtol 1e-4; a missed or doubled row is an O(1) error.
  std::vector<float> gte(V * C, 0.0f), gpe(maxT * C, 0.0f);
  cpu::embedding_backward(gte.data(), gpe.data(), R.data(), inp.data(), B, T, C);
  auto loss = [&] {
    cpu::embedding_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out.data(), R.data(), out.size());
  };
  const Tolerance tol{1e-4, 1e-4};
  check_gradient("embedding dwte", wte.data(), wte.size(), gte.data(), loss, 1e-2, tol, rng, 1000);
  check_gradient("embedding dwpe", wpe.data(), wpe.size(), gpe.data(), loss, 1e-2, tol, rng, 1000);
}

// ================================================================= layernorm

struct LayerNormRef {
  std::vector<double> out, mean, rstd;
};

LayerNormRef layernorm_ref(const std::vector<float>& x, const std::vector<float>& w,
                           const std::vector<float>& b, int N, int C) {
  LayerNormRef r{std::vector<double>(N * C), std::vector<double>(N), std::vector<double>(N)};
  for (int i = 0; i < N; ++i) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + static_cast<double>(cpu::k_layernorm_eps));
    for (int c = 0; c < C; ++c) r.out[i * C + c] = (x[i * C + c] - m) * rs * w[c] + b[c];
    r.mean[i] = m;
    r.rstd[i] = rs;
  }
  return r;
}

TEST(Ops, LayerNormForwardMatchesDoubleReference) {
  constexpr int N = 6, C = 16;
  Rng rng(202);
  const auto x = randn(rng, N * C, 1.5f, 0.3f), w = randn(rng, C, 0.2f, 1.0f),
             b = randn(rng, C, 0.2f);
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  const auto ref = layernorm_ref(x, w, b, N, C);
  // Sums of C = 16 terms in fp32 and a sqrt: a few u relative on mean (of |x| ~ 2), rstd and
  // the output (|out| <~ 4): 1e-6 absolute + 1e-6 relative is ~4x above that.
  const Tolerance tol{1e-6, 1e-6};
  expect_close("layernorm out", out.data(), ref.out.data(), out.size(), tol);
  expect_close("layernorm mean", mean.data(), ref.mean.data(), N, tol);
  expect_close("layernorm rstd", rstd.data(), ref.rstd.data(), N, tol);
}

TEST(Ops, LayerNormBackwardMatchesFiniteDifferences) {
  constexpr int N = 6, C = 16;
  Rng rng(203);
  auto x = randn(rng, N * C, 1.5f, 0.3f), w = randn(rng, C, 0.2f, 1.0f), b = randn(rng, C, 0.2f);
  const auto R = randn(rng, N * C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);

  // Analytic gradients from zero-initialised buffers.
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);

  // All three outputs accumulate (+=). dinp: one term per element (K = 1); dweight, dbias: the
  // N row terms n*g and g, added through per-thread partial sums.
  {
    const auto dx0 = randn(rng, N * C), dw0 = randn(rng, C), db0 = randn(rng, C);
    auto dxa = dx0, dwa = dw0, dba = db0;
    cpu::layernorm_backward(dxa.data(), dwa.data(), dba.data(), R.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
    std::vector<double> sx(N * C), sw(C, 0.0), sb(C, 0.0);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) {
        sx[i * C + c] = std::abs(dx[i * C + c]);
        sw[c] += std::abs((x[i * C + c] - mean[i]) * rstd[i] * R[i * C + c]);
        sb[c] += std::abs(R[i * C + c]);
      }
    expect_accumulates("layernorm dinp +=", dxa, dx0, dx, sx, 1);
    expect_accumulates("layernorm dweight +=", dwa, dw0, dw, sw, N);
    expect_accumulates("layernorm dbias +=", dba, db0, db, sb, N);
  }

  auto loss = [&] {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                           C);
    return dot(out.data(), R.data(), out.size());
  };
  // dinp: x[i,c] touches the C = 16 outputs of its row (|out*R| ~ 1 each): rounding noise
  // ~ 16 * 4u / (2h) ~ 2e-5 at h = 1e-2 worst case; truncation h^2/6 * |L'''| with rstd ~ 0.7
  // and |L'''| = O(1..10) gives <~ 2e-4 relative to O(1) gradients. atol 1e-4 + rtol 1e-3.
  // dweight/dbias: L is linear in them (no truncation); w[c], b[c] touch N = 6 outputs: noise
  // ~ 6 * 4u * 3 / (2h) ~ 2e-5. atol 1e-4 + rtol 1e-4.
  check_gradient("layernorm dinp", x.data(), x.size(), dx.data(), loss, 1e-2, {1e-4, 1e-3}, rng,
                 1000);
  check_gradient("layernorm dweight", w.data(), w.size(), dw.data(), loss, 1e-2, {1e-4, 1e-4}, rng,
                 1000);
  check_gradient("layernorm dbias", b.data(), b.size(), db.data(), loss, 1e-2, {1e-4, 1e-4}, rng,
                 1000);
}

// ================================================================= linear

struct LinearShape {
  int N, IC, OC;
};

void check_linear(GemmLibrary lib, LinearShape s, bool with_bias, bool accumulate_out,
                  std::uint64_t seed) {
  SCOPED_TRACE(lib_name(lib) + " N=" + std::to_string(s.N) + " IC=" + std::to_string(s.IC) +
               " OC=" + std::to_string(s.OC) + (with_bias ? " bias" : " no-bias") +
               (accumulate_out ? " accumulate_out" : ""));
  const int N = s.N, IC = s.IC, OC = s.OC;
  Rng rng(seed);
  auto x = randn(rng, N * IC), w = randn(rng, OC * IC, 0.5f), b = randn(rng, OC);
  // accumulate_out: out += x W^T (+ b), so out starts from a random residual; otherwise out is
  // overwritten and starts from the sentinel.
  const auto out0 = accumulate_out ? randn(rng, N * OC) : std::vector<float>(N * OC, k_sentinel);
  const auto R = randn(rng, N * OC);
  float* bias = with_bias ? b.data() : nullptr;
  std::vector<float> out = out0;

  // Forward against double. Each output is a K = IC term dot product (|terms| ~ 0.5) plus the
  // residual and bias: fp32 error <= ~IC * u * sum|terms| ~ 2e-6 worst case for IC = 40, far
  // less typically. atol 2e-6 + rtol 1e-6.
  cpu::linear_forward(lib, out.data(), x.data(), w.data(), bias, N, IC, OC, accumulate_out);
  {
    std::vector<double> ref(N * OC);
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) {
        double acc = accumulate_out ? out0[i * OC + o] : 0.0;
        for (int k = 0; k < IC; ++k) acc += static_cast<double>(x[i * IC + k]) * w[o * IC + k];
        if (with_bias) acc += b[o];
        ref[i * OC + o] = acc;
      }
    expect_close("linear out", out.data(), ref.data(), ref.size(), {2e-6, 1e-6});
  }

  // Backward from zero-initialised parameter gradients; dinp starts from the sentinel and must
  // be overwritten.
  std::vector<float> dx(N * IC, k_sentinel), dw(OC * IC, 0.0f), db(OC, 0.0f);
  cpu::linear_backward(lib, dx.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(),
                       x.data(), w.data(), N, IC, OC);
  {
    // dinp = R W exactly as a double reference (overwrite, not +=), atol as for the forward.
    std::vector<double> ref(N * IC, 0.0);
    for (int i = 0; i < N; ++i)
      for (int k = 0; k < IC; ++k)
        for (int o = 0; o < OC; ++o)
          ref[i * IC + k] += static_cast<double>(R[i * OC + o]) * w[o * IC + k];
    expect_close("linear dinp (overwrite)", dx.data(), ref.data(), ref.size(), {2e-6, 1e-6});
  }

  // Parameter gradients accumulate (+=): dweight[o,k] and dbias[o] are sums of N row terms.
  {
    const auto dw0 = randn(rng, OC * IC), db0 = randn(rng, OC);
    auto dwa = dw0, dba = db0;
    std::vector<float> dxa(N * IC, k_sentinel);
    cpu::linear_backward(lib, dxa.data(), dwa.data(), with_bias ? dba.data() : nullptr, R.data(),
                         x.data(), w.data(), N, IC, OC);
    std::vector<double> sw(OC * IC, 0.0), sb(OC, 0.0);
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) {
        sb[o] += std::abs(R[i * OC + o]);
        for (int k = 0; k < IC; ++k) sw[o * IC + k] += std::abs(R[i * OC + o] * x[i * IC + k]);
      }
    expect_accumulates("linear dweight +=", dwa, dw0, dw, sw, N);
    if (with_bias) {
      expect_accumulates("linear dbias +=", dba, db0, db, sb, N);
    } else {
      EXPECT_TRUE(bit_equal(dba, db0)) << "dbias touched although null was passed for it";
    }
    EXPECT_TRUE(bit_equal(dxa, dx)) << "dinp differs between two identical calls";
  }
  // dinp = null skips the input gradient and leaves dweight/dbias unchanged.
  {
    std::vector<float> dw2(OC * IC, 0.0f), db2(OC, 0.0f);
    cpu::linear_backward(lib, nullptr, dw2.data(), with_bias ? db2.data() : nullptr, R.data(),
                         x.data(), w.data(), N, IC, OC);
    EXPECT_TRUE(bit_equal(dw2, dw));
    if (with_bias) {
      EXPECT_TRUE(bit_equal(db2, db));
    }
  }

  // Finite differences. L is linear in x, W and b: no truncation error, only rounding noise. A
  // perturbed x[i,k] touches the OC outputs of row i, W[o,k] and b[o] the N outputs of column o;
  // each output (|out| <~ 4, |R| ~ 1) is rounded after a K-term sum: noise <~ 40 * 4 * 4u /
  // (2h) ~ 2e-4 worst case at h = 1e-2, typically 1e-5. atol 2e-4 + rtol 1e-4.
  auto loss = [&] {
    out = out0;
    cpu::linear_forward(lib, out.data(), x.data(), w.data(), bias, N, IC, OC, accumulate_out);
    return dot(out.data(), R.data(), out.size());
  };
  const Tolerance tol{2e-4, 1e-4};
  check_gradient("linear dinp", x.data(), x.size(), dx.data(), loss, 1e-2, tol, rng, 50);
  check_gradient("linear dweight", w.data(), w.size(), dw.data(), loss, 1e-2, tol, rng, 50);
  if (with_bias) {
    check_gradient("linear dbias", b.data(), b.size(), db.data(), loss, 1e-2, tol, rng, 50);
  }
}

TEST(Ops, LinearForwardBackward) {
  std::uint64_t seed = 300;
  for (GemmLibrary lib : k_libs)
    for (LinearShape s : {LinearShape{5, 7, 6}, LinearShape{33, 40, 24}})
      for (bool with_bias : {false, true})
        for (bool accumulate_out : {false, true})
          check_linear(lib, s, with_bias, accumulate_out, ++seed);
}

// ================================================================= gelu

double gelu_exact(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_exact_grad(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

TEST(Ops, GeluForwardMatchesExactFormula) {
  std::vector<float> x;
  for (int i = -400; i <= 400; ++i) x.push_back(i * 0.02f);  // [-8, 8], includes 0
  for (float v : {1e-6f, -1e-6f, 1e-3f, -1e-3f, 12.0f, -12.0f, 30.0f, -30.0f, 100.0f, -100.0f})
    x.push_back(v);
  Rng rng(401);
  for (float v : randn(rng, 200, 3.0f)) x.push_back(v);
  std::vector<float> out(x.size(), k_sentinel);
  cpu::gelu_forward(out.data(), x.data(), static_cast<std::int64_t>(x.size()));
  std::vector<double> ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ref[i] = gelu_exact(x[i]);
  // tanh_approx is 1 - 2/(exp_approx(2u) + 1): absolute error ~2e-7 in tanh (the subtraction
  // from 1 loses the relative accuracy near 0), times 0.5|x|, plus a few u of |out| from the
  // fp32 products (1 ulp of 8 is 9.5e-7). atol 1e-6 + rtol 1e-6 (the "~1e-6" of the formula).
  expect_close("gelu out", out.data(), ref.data(), ref.size(), {1e-6, 1e-6});
}

TEST(Ops, GeluBackwardMatchesFiniteDifferences) {
  Rng rng(402);
  auto x = randn(rng, 96, 2.0f);
  for (float v : {0.0f, 1e-3f, -1e-3f, -4.0f, 4.0f, -6.0f}) x.push_back(v);
  const auto n = static_cast<std::int64_t>(x.size());
  const auto R = randn(rng, x.size());
  std::vector<float> dx(x.size(), k_sentinel);
  cpu::gelu_backward(dx.data(), x.data(), R.data(), n);

  // Against the exact derivative in double: the same tanh error as the forward (~2e-7) enters
  // both 0.5(1+th) and x*sech^2*du (|x du| <~ 10 for |x| <= 6): atol 2e-6 + rtol 1e-6 on |R g'|.
  {
    std::vector<double> ref(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) ref[i] = R[i] * gelu_exact_grad(x[i]);
    expect_close("gelu dinp vs exact", dx.data(), ref.data(), ref.size(), {2e-6, 1e-6});
  }
  // dinp may alias dout: same result bit for bit.
  {
    auto d = R;
    cpu::gelu_backward(d.data(), x.data(), d.data(), n);
    EXPECT_TRUE(bit_equal(d, dx));
  }
  // Finite differences through gelu_forward. Elementwise: x[i] touches out[i] only. Rounding
  // and tanh_approx error of out[i] (|out| <~ 6, ~2e-7 * 6 absolute) times |R| <~ 3, divided
  // by 2h: <~ 2e-4 worst case at h = 1e-2; truncation h^2/6 * |gelu'''| * |R| <~ 2e-5 * 3.
  // atol 2e-4 + rtol 1e-4.
  std::vector<float> out(x.size());
  auto loss = [&] {
    cpu::gelu_forward(out.data(), x.data(), n);
    return dot(out.data(), R.data(), out.size());
  };
  check_gradient("gelu dinp", x.data(), x.size(), dx.data(), loss, 1e-2, {2e-4, 1e-4}, rng, 1000);
}

// ================================================================= attention

struct AttentionRef {
  std::vector<double> out, lse;
};

// Causal grouped-query attention in double: rows of qkv hold q (NH heads), k and v (KV heads
// each), hs per head; query head h reads key-value head h / (NH / KV).
AttentionRef attention_ref(const std::vector<float>& qkv, int B, int T, int NH, int KV, int hs) {
  const int W = (NH + 2 * KV) * hs, OC = NH * hs, group = NH / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttentionRef r{std::vector<double>(B * T * OC, 0.0), std::vector<double>(B * NH * T)};
  std::vector<double> s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const int g = h / group;
        const float* q = qkv.data() + (b * T + i) * W + h * hs;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          const float* k = qkv.data() + (b * T + j) * W + (NH + g) * hs;
          double d = 0.0;
          for (int c = 0; c < hs; ++c) d += static_cast<double>(q[c]) * k[c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * NH + h) * T + i] = lse;
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - lse);
          const float* v = qkv.data() + (b * T + j) * W + (NH + KV + g) * hs;
          for (int c = 0; c < hs; ++c) r.out[(b * T + i) * OC + h * hs + c] += p * v[c];
        }
      }
  return r;
}

void check_attention(GemmLibrary lib, int B, int T, int NH, int KV, int hs, std::uint64_t seed) {
  SCOPED_TRACE(lib_name(lib) + " B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
               std::to_string(NH) + " KV=" + std::to_string(KV) + " hs=" + std::to_string(hs));
  const int W = (NH + 2 * KV) * hs, OC = NH * hs, group = NH / KV;
  Rng rng(seed);
  auto qkv = randn(rng, B * T * W);
  const auto R = randn(rng, B * T * OC);
  std::vector<float> out(B * T * OC, k_sentinel), lse(B * NH * T, k_sentinel);
  cpu::attention_forward(lib, out.data(), lse.data(), qkv.data(), B, T, NH, KV, hs);

  // Forward against double. Scores are hs-term dot products (|s| <~ 3), the softmax uses
  // exp_approx (~2e-7 relative) and fp32 sums of <= T terms; out is a convex combination of
  // |v| <~ 3: error ~ a few u * 3. lse ~ O(1..3): a few ulp. atol 2e-6 + rtol 1e-6 for both.
  const auto ref = attention_ref(qkv, B, T, NH, KV, hs);
  expect_close("attention out", out.data(), ref.out.data(), out.size(), {2e-6, 1e-6});
  expect_close("attention lse", lse.data(), ref.lse.data(), lse.size(), {2e-6, 1e-6});

  // Backward overwrites dqkv: start it from the sentinel.
  std::vector<float> dqkv(qkv.size(), k_sentinel);
  cpu::attention_backward(lib, dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), B, T, NH,
                          KV, hs);
  if (T == 1 && KV == NH) {
    // One key per query: P = 1 exactly (exp_approx(0) = 1), so out = v and dv = P^T dout = dout
    // bit for bit; the scores do not matter, so dq = dk = 0 up to the rounding of dO.v - dO.o
    // (two fp32 dot products of hs = 4 terms of size ~1: < 1e-6).
    const int C = OC;
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < C; ++c) {
        EXPECT_NEAR(dqkv[b * 3 * C + c], 0.0f, 1e-6) << "dq";
        EXPECT_NEAR(dqkv[b * 3 * C + C + c], 0.0f, 1e-6) << "dk";
        EXPECT_EQ(dqkv[b * 3 * C + 2 * C + c], R[b * C + c]) << "dv";
      }
  }

  // Finite differences through attention_forward, all elements. A perturbed qkv element touches
  // the hs outputs of its head for the <= T queries of its sequence (<= 20 outputs of |out*R|
  // <~ 3): rounding noise <~ 20 * 3 * 4u / (2h) ~ 7e-4 worst case at h = 1e-2 (RMS ~1e-5);
  // truncation h^2/6 * |L'''| with softmax third derivatives O(1..10) gives <~ 2e-4.
  // A key or value element of a shared head touches the outputs of the `group` query heads
  // that read it: the noise grows with them, so atol is 5e-4 per head of the group; rtol 1e-3.
  auto loss = [&] {
    cpu::attention_forward(lib, out.data(), lse.data(), qkv.data(), B, T, NH, KV, hs);
    return dot(out.data(), R.data(), out.size());
  };
  check_gradient("attention dqkv", qkv.data(), qkv.size(), dqkv.data(), loss, 1e-2,
                 {5e-4 * group, 1e-3}, rng, 1000);
}

TEST(Ops, AttentionForwardBackward) {
  std::uint64_t seed = 500;
  for (GemmLibrary lib : k_libs) {
    check_attention(lib, 2, 5, 2, 2, 4, ++seed);
    check_attention(lib, 2, 1, 2, 2, 4, ++seed);
    check_attention(lib, 1, 7, 3, 3, 4, ++seed);
  }
}

// Grouped-query attention (llama): 2 and 4 query heads per key-value head; the backward sums the
// key and value gradients of a group's heads.
TEST(Ops, GroupedQueryAttentionForwardBackward) {
  std::uint64_t seed = 600;
  for (GemmLibrary lib : k_libs) {
    check_attention(lib, 2, 5, 4, 2, 4, ++seed);
    check_attention(lib, 1, 6, 4, 1, 6, ++seed);
  }
}

// ================================================================= cross-entropy

TEST(Ops, CrossEntropyForwardBackward) {
  constexpr int N = 6, V = 7, Vp = 8;
  constexpr float dloss = 0.37f;
  Rng rng(601);
  auto logits = randn(rng, N * Vp, 2.0f);
  for (int i = 0; i < N; ++i) logits[i * Vp + V] = 100.0f;  // padding: must be ignored
  // Edge targets 0 and V-1, and an ignored row.
  const std::vector<std::int32_t> targets = {0, 3, -1, V - 1, 2, 5};

  // Forward against a naive double log-softmax over the first V columns.
  std::vector<double> ref_loss(N), ref_grad(N * Vp, 0.0);
  for (int i = 0; i < N; ++i) {
    if (targets[i] < 0) {
      ref_loss[i] = 0.0;
      continue;
    }
    double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[i * Vp + j]));
    for (int j = 0; j < V; ++j) sum += std::exp(logits[i * Vp + j] - mx);
    const double lse = mx + std::log(sum);
    ref_loss[i] = lse - logits[i * Vp + targets[i]];
    for (int j = 0; j < V; ++j)
      ref_grad[i * Vp + j] = dloss * (std::exp(logits[i * Vp + j] - lse) - (j == targets[i]));
  }
  std::vector<float> losses(N, k_sentinel);
  cpu::cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
  // lse of |logits| <~ 6 in fp32 with exp_approx: a few ulp of ~6 (4e-7 each): atol 2e-6 + rtol
  // 1e-6.
  const Tolerance tol{2e-6, 1e-6};
  expect_close("cross_entropy losses", losses.data(), ref_loss.data(), N, tol);
  EXPECT_EQ(losses[2], 0.0f) << "ignored target must give loss 0";

  // Shift invariance: logits + 500 give the same losses (max subtraction; no overflow).
  {
    auto shifted = logits;
    for (auto& v : shifted) v += 500.0f;
    std::vector<float> ls(N);
    cpu::cross_entropy_forward(ls.data(), shifted.data(), targets.data(), N, V, Vp);
    // The shifted logits and the lse (~500) are each rounded to half an ulp of 500 (1.5e-5), and
    // lse - logit[target] cancels: |diff| <~ 3 * 1.5e-5 = 4.5e-5; bound 1.5e-4.
    for (int i = 0; i < N; ++i) EXPECT_NEAR(ls[i], losses[i], 1.5e-4) << i;
  }

  // forward_backward: same losses, logits overwritten with dloss*(softmax - onehot) on the first
  // V columns, exact zeros on the padded ones and on ignored rows.
  auto g = logits;
  std::vector<float> losses2(N, k_sentinel);
  cpu::cross_entropy_forward_backward(losses2.data(), g.data(), targets.data(), N, V, Vp, dloss);
  expect_close("cross_entropy_forward_backward losses", losses2.data(), ref_loss.data(), N, tol);
  // Gradient entries are dloss * p (p in [0,1]) from exp_approx and one division: a few u of
  // dloss: atol 1e-7 + rtol 1e-6.
  expect_close("cross_entropy dlogits", g.data(), ref_grad.data(), g.size(), {1e-7, 1e-6});
  for (int i = 0; i < N; ++i) {
    for (int j = V; j < Vp; ++j)
      EXPECT_EQ(g[i * Vp + j], 0.0f) << "padded column " << i << "," << j;
    if (targets[i] < 0) {
      for (int j = 0; j < Vp; ++j)
        EXPECT_EQ(g[i * Vp + j], 0.0f) << "ignored row " << i << "," << j;
    }
  }

  // Finite differences of dloss * sum(losses) w.r.t. every logit, padded columns included
  // (their derivative is exactly 0). A logit touches its row's loss only (|loss| <~ 8 in fp32,
  // a few ulp = 2e-6 absolute), scaled by dloss and divided by 2h: <~ 4e-5 at h = 1e-2;
  // truncation h^2/6 * dloss * |p'''| <~ 1e-5. atol 1e-4 + rtol 1e-3.
  auto loss = [&] {
    cpu::cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
    double s = 0.0;
    for (float l : losses) s += l;
    return dloss * s;
  };
  check_gradient("cross_entropy dlogits", logits.data(), logits.size(), g.data(), loss, 1e-2,
                 {1e-4, 1e-3}, rng, 1000);
}

// ================================================================= elementwise

TEST(Ops, ElementwiseAddCopy) {
  constexpr int n = 1003;  // odd: exercises the vector-loop tails
  Rng rng(701);
  const auto a = randn(rng, n), b = randn(rng, n);
  std::vector<float> out(n, k_sentinel);
  cpu::add(out.data(), a.data(), b.data(), n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;  // one fp32 add: exact
  auto acc = b;
  cpu::add_inplace(acc.data(), a.data(), n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(acc[i], b[i] + a[i]) << i;
  std::vector<float> c(n, k_sentinel);
  cpu::copy(c.data(), a.data(), n);
  EXPECT_TRUE(bit_equal(c, a));
}

// ================================================================= determinism

TEST(Ops, BackwardIsBitReproducible) {
  constexpr int N = 64, C = 48, OC = 40;
  Rng rng(801);
  const auto x = randn(rng, N * C), w = randn(rng, C, 0.2f, 1.0f), b = randn(rng, C, 0.2f);
  const auto R = randn(rng, N * C), R2 = randn(rng, N * OC), W = randn(rng, OC * C, 0.5f);
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  auto ln = [&] {
    std::vector<float> r(N * C + 2 * C, 0.0f);
    cpu::layernorm_backward(r.data(), r.data() + N * C, r.data() + N * C + C, R.data(), x.data(),
                            w.data(), mean.data(), rstd.data(), N, C);
    return r;
  };
  EXPECT_TRUE(bit_equal(ln(), ln())) << "layernorm_backward";
  for (GemmLibrary lib : k_libs) {
    auto lin = [&] {
      std::vector<float> r(N * C + OC * C + OC, 0.0f);
      cpu::linear_backward(lib, r.data(), r.data() + N * C, r.data() + N * C + OC * C, R2.data(),
                           x.data(), W.data(), N, C, OC);
      return r;
    };
    EXPECT_TRUE(bit_equal(lin(), lin())) << "linear_backward " << lib_name(lib);
  }
}

}  // namespace
