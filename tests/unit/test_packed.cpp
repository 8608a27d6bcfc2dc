// Packed quantized linears: the kernels (matrix-vector and matrix-matrix, every ISA this CPU
// has) against the dequantized-fp32 path, for every packed format.
//
// The reference is QuantizedLinear::dequantize of the same linear with its scales rounded to the
// packed scale type (the rounding changes the weights themselves; with_rounded_scales makes both
// sides use the same weights), then a plain fp32 product. Both compute, in exact arithmetic, the
// same sum: s (q - z) / in_scale * x == s (q x' - z x') with x' = x / in_scale. They differ by
// rounding only. With u = 2^-24 and gamma(n) = n u / (1 - n u) (Higham, any summation order):
//  - the reference rounds s (q - z) (q - z is exact), the division, the product and at most
//    IC - 1 additions: |err| <= gamma(IC + 2) * sum_c |w_c x_c|;
//  - the kernels round x' = x / in_scale, q x' (or, in the tile path, s z, then s q - s z in one
//    fused multiply-add, and its product with x'), at most IC additions inside and across
//    groups, s times each group's sum, the zero term and the final subtraction:
//    |err| <= gamma(IC + 6) * (sum_c |s q x'_c| + sum_g |s z| sum_{c in g} |x'_c|), a sum of the
//    absolute values of every term it adds.
// The test bound is gamma(IC + 8) times the sum of both sums, per output element. Nothing here
// depends on the thread count: every output element is computed by one thread in a fixed order.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "expect_error.hpp"
#include "tessera/quant/packed.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {
namespace {

struct Case {
  int rows, cols, bits, group;
  bool sym, in_scale, act_order;
  ScaleType st;
  bool min_offset = false;  // real zero points (llama.cpp's Q4_1 grid)
};

QuantizedLinear make_linear(const Case& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> W(static_cast<std::size_t>(k.rows) * k.cols);
  for (float& v : W) v = nd(rng);
  QuantizedLinear ql =
      rtn(W.data(), k.rows, k.cols, WeightQuant{k.bits, k.group, k.sym, k.min_offset});
  if (k.act_order) {  // move column c to P[c], its group with it (as GPTQ's act-order records)
    std::vector<int> P(k.cols);
    for (int c = 0; c < k.cols; ++c) P[c] = c;
    std::shuffle(P.begin(), P.end(), rng);
    QuantizedLinear o = ql;
    for (int r = 0; r < k.rows; ++r)
      for (int c = 0; c < k.cols; ++c)
        o.q[std::size_t(r) * k.cols + P[c]] = ql.q[std::size_t(r) * k.cols + c];
    for (int c = 0; c < k.cols; ++c) o.g_idx[P[c]] = ql.g_idx[c];
    ql = o;
  }
  if (k.in_scale) {
    std::uniform_real_distribution<float> ud(0.5f, 2.0f);
    ql.in_scale.resize(k.cols);
    for (float& s : ql.in_scale) s = ud(rng);
  }
  return ql;
}

// Per output element of X (N, IC) W^T: the reference value and the bound argued above.
void reference(const QuantizedLinear& ql, const float* X, std::int64_t N, std::vector<float>& y,
               std::vector<double>& bound) {
  const int R = ql.rows, C = ql.cols, ng = ql.ngroups();
  std::vector<float> W(static_cast<std::size_t>(R) * C);
  ql.dequantize(W.data());
  const double u = std::ldexp(1.0, -24), n = C + 8, gamma = n * u / (1 - n * u);
  y.assign(std::size_t(N) * R, 0.0f);
  bound.assign(std::size_t(N) * R, 0.0);
  for (std::int64_t m = 0; m < N; ++m)
    for (int r = 0; r < R; ++r) {
      float acc = 0.0f;
      double abs_ref = 0, abs_pack = 0;
      std::vector<double> gabs(ng, 0.0);
      for (int c = 0; c < C; ++c) {
        const float x = X[m * C + c], w = W[std::size_t(r) * C + c];
        acc += w * x;
        const double xs = ql.in_scale.empty() ? x : double(x) / ql.in_scale[c];
        const int g = ql.g_idx[c];
        abs_ref += std::fabs(double(w) * x);
        abs_pack += std::fabs(ql.scales[std::size_t(r) * ng + g] *
                              double(ql.q[std::size_t(r) * C + c]) * xs);
        gabs[g] += std::fabs(xs);
      }
      for (int g = 0; g < ng; ++g)
        abs_pack += std::fabs(double(ql.scales[std::size_t(r) * ng + g]) *
                              ql.zeros[std::size_t(r) * ng + g]) *
                    gabs[g];
      y[m * R + r] = acc;
      bound[m * R + r] = gamma * (abs_ref + abs_pack);
    }
}

// The int8-activation product packed_matvec_q8 computes, exactly, W' x^ with x^ the input (in
// packed order, after in_scale) quantized per block of 32 to d * xq (quantize_q8_input gives both),
// and |x^ - x'| <= d / 2 (d rounded in fp32 and the division by it: d / 2 (1 + 1e-5)).
// Its own rounding: the fp32 products d * (integer dot), their sums and the zero term, at most
// gamma(IC + 8) times the sum of every term's absolute value, each at most
// |s| (|q - shift| + |z - shift|) max|x^| per column (shift: 128 for 8-bit storage).
// Two checks per output: against W' x^ computed in double (the rounding bound only: a tight check
// of the integer dot products), and against the fp32 reference W x (plus sum_c |s (q - z)| d / 2
// and the reference's own rounding).
struct Q8Ref {
  double exact = 0, quant = 0, round = 0;  // W' x^, the quantization bound, the rounding bound
};
Q8Ref q8_reference(const PackedLinear& p, const QuantizedLinear& ref, int r, const float* x) {
  std::vector<std::int8_t> xq(p.colsp);
  std::vector<float> d(p.colsp / 32);
  quantize_q8_input(p, x, xq.data(), d.data());
  const int shift = p.storage_bits == 8 ? 128 : 0, ng = ref.ngroups();
  const double u = std::ldexp(1.0, -24), n = p.cols + 8, gamma = n * u / (1 - n * u);
  Q8Ref o;
  for (int j = 0; j < p.cols; ++j) {
    const int c = p.perm.empty() ? j : p.perm[j];  // packed column j holds original column c
    const int g = ref.g_idx[c];
    const double s = ref.scales[std::size_t(r) * ng + g];
    const double q = ref.q[std::size_t(r) * p.cols + c], z = ref.zeros[std::size_t(r) * ng + g];
    o.exact += s * (q - z) * double(d[j / 32]) * xq[j];
    o.quant += std::fabs(s * (q - z)) * d[j / 32] / 2 * (1 + 1e-5);
    o.round += std::fabs(s) * (std::fabs(q - shift) + std::fabs(z - shift)) * 127.0 * d[j / 32];
  }
  o.round *= gamma;
  return o;
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::Portable, Isa::Avx2, Isa::Avx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

void check_case(const Case& k) {
  std::mt19937 rng(1234 + k.rows * 7 + k.cols * 13 + k.bits + k.group);
  const QuantizedLinear ql = make_linear(k, rng);
  const PackedLinear p = pack(ql, k.st);
  const QuantizedLinear ref = with_rounded_scales(ql, k.st);
  const std::int64_t N = 5;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> X(std::size_t(N) * k.cols);
  for (float& v : X) v = nd(rng);
  std::vector<float> yref;
  std::vector<double> bound;
  reference(ref, X.data(), N, yref, bound);
  // The packed dequantization is the reference's weight, exactly up to the in_scale division.
  std::vector<float> Wp(std::size_t(k.rows) * k.cols), Wr(Wp.size());
  p.dequantize(Wp.data());
  ref.dequantize(Wr.data());
  EXPECT_EQ(Wp, Wr) << p.describe();
  for (Isa isa : isas()) {
    SCOPED_TRACE(fmt::format("{} cols {} act_order {} in_scale {} isa {}", p.describe(), k.cols,
                             k.act_order, k.in_scale, isa_name(isa)));
    std::vector<float> y(k.rows), Y(std::size_t(N) * k.rows), Y8(Y.size()), Y8t(Y.size());
    packed_matmul(p, Y.data(), X.data(), nullptr, N, isa);
    // The int8 matrix-matrix product is the int8 matvec row by row, bit for bit (over runs of
    // tiles, rows 0-3 through the four-token kernel and row 4 through the one-token one), with
    // the input rounded per block or per row.
    packed_matmul_q8(p, Y8.data(), X.data(), nullptr, N, isa);
    packed_matmul_q8(p, Y8t.data(), X.data(), nullptr, N, isa, ActScale::PerRow);
    // Both widths of the VNNI prompt kernel give those rows (without VNNI both run as 256-bit).
    for (PromptWidth width : {PromptWidth::W256, PromptWidth::W512}) {
      std::vector<float> Yw(Y.size());
      packed_matmul_q8(p, Yw.data(), X.data(), nullptr, N, isa, ActScale::PerBlock, width);
      ASSERT_EQ(Yw, Y8) << prompt_width_name(width) << " prompt kernel";
    }
    for (std::int64_t m = 0; m < N; ++m) {
      packed_matvec(p, y.data(), X.data() + m * k.cols, nullptr, isa);
      for (int r = 0; r < k.rows; ++r) {
        const std::size_t i = m * k.rows + r;
        ASSERT_NEAR(y[r], yref[i], bound[i]) << "matvec row " << m << " out " << r;
        ASSERT_NEAR(Y[i], yref[i], bound[i]) << "matmul row " << m << " out " << r;
      }
      packed_matvec_q8(p, y.data(), X.data() + m * k.cols, nullptr, isa, ActScale::PerRow);
      for (int r = 0; r < k.rows; ++r)
        ASSERT_EQ(Y8t[m * k.rows + r], y[r]) << "int8 matmul, per row, row " << m << " out " << r;
      packed_matvec_q8(p, y.data(), X.data() + m * k.cols, nullptr, isa);
      for (int r = 0; r < k.rows; ++r) {
        const std::size_t i = m * k.rows + r;
        ASSERT_EQ(Y8[i], y[r]) << "int8 matmul row " << m << " out " << r;
        const Q8Ref q8 = q8_reference(p, ref, r, X.data() + m * k.cols);
        ASSERT_NEAR(y[r], q8.exact, q8.round) << "int8 matvec row " << m << " out " << r;
        ASSERT_NEAR(y[r], yref[i], bound[i] + q8.quant + q8.round) << "int8 matvec, to fp32";
      }
    }
  }
}

// 39 rows: four tiles of 8 and a last one of 7 (its eighth row padding), which every kernel
// must read without writing past the output; with input scales 31 rows, whose last tile of 7
// the prompt kernel takes in a pair with the one before it (VNNI: two tiles at a time).
TEST(Packed, KernelsMatchDequantizedFp32EveryFormat) {
  for (int bits : {4, 8, 3, 2, 5, 6})
    for (int group : {32, 128, -1, 16})
      for (int cols : {576, 100, 256})
        for (bool sym : {false, true})
          for (bool in_scale : {false, true}) {
            if (group == 128 && cols == 100) continue;  // one group: per channel, covered
            if (group == 16 && cols == 100) continue;   // refused: RefusesWhatItCannotHold
            const bool act = (cols == 576 && in_scale && group > 0);
            const ScaleType st = sym ? ScaleType::BF16 : ScaleType::F16;
            check_case(Case{in_scale ? 31 : 39, cols, bits, group, sym, in_scale, act, st});
          }
}

// The min_offset grid (llama.cpp's Q4_1: w = d q + min, zero points that are not codes) packed
// with its real zero points: every kernel against the same fp32 reference and bounds (which
// take the zero points as they are).
TEST(Packed, KernelsMatchDequantizedFp32RealZeroPoints) {
  for (int bits : {4, 8, 3, 5})
    for (int group : {32, 128, -1, 16})
      for (int cols : {576, 100})
        for (bool in_scale : {false, true}) {
          if (group == 128 && cols == 100) continue;
          if (group == 16 && cols == 100) continue;
          const bool act = (cols == 576 && in_scale && group > 0);
          check_case(Case{in_scale ? 31 : 39, cols, bits, group, false, in_scale, act,
                          ScaleType::F16, true});
        }
}

TEST(Packed, ScaleTypesAndBias) {
  std::mt19937 rng(7);
  for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
    const QuantizedLinear ql = make_linear(Case{20, 64, 4, 32, false, false, false, st}, rng);
    const PackedLinear p = pack(ql, st);
    std::vector<float> x(64, 0.5f), bias(20), y0(20), y1(20);
    for (int r = 0; r < 20; ++r) bias[r] = 0.25f * r;
    for (Isa isa : isas()) {
      packed_matvec(p, y0.data(), x.data(), nullptr, isa);
      packed_matvec(p, y1.data(), x.data(), bias.data(), isa);
      for (int r = 0; r < 20; ++r) EXPECT_FLOAT_EQ(y1[r], y0[r] + bias[r]);
      packed_matmul(p, y1.data(), x.data(), bias.data(), 1, isa);
      for (int r = 0; r < 20; ++r) EXPECT_NEAR(y1[r], y0[r] + bias[r], 1e-5f);
      // The int8 product's per-thread entry: accumulating with a bias adds exactly y + bias; a
      // run of tiles gives the rows that the whole product gives, and no others.
      packed_matvec_q8(p, y0.data(), x.data(), nullptr, isa);
      Q8Input in;
      quantize_q8(p, x.data(), ActScale::PerBlock, isa, in);
      std::vector<float> acc(20, 1.0f), part(20, -7.0f);
      packed_matvec_q8_tiles(p, in, acc.data(), bias.data(), true, 0, p.tiles(), isa);
      packed_matvec_q8_tiles(p, in, part.data(), nullptr, false, 1, p.tiles(), isa);
      std::vector<float> mm(20);
      packed_matmul_q8(p, mm.data(), x.data(), bias.data(), 1, isa);
      for (int r = 0; r < 20; ++r)
        EXPECT_EQ(mm[r], y0[r] + bias[r]) << isa_name(isa) << " row " << r;
      for (int r = 0; r < 20; ++r) {
        EXPECT_EQ(acc[r], 1.0f + (y0[r] + bias[r])) << isa_name(isa) << " row " << r;
        EXPECT_EQ(part[r], r < 8 ? -7.0f : y0[r]) << isa_name(isa) << " row " << r;
      }
    }
    EXPECT_EQ(round_scale(1.0f, st), 1.0f);
    EXPECT_NEAR(round_scale(0.0123f, st), 0.0123f, 0.0123f * (st == ScaleType::F16 ? 1e-3 : 4e-3));
  }
}

TEST(Packed, BitsPerWeight) {
  std::mt19937 rng(3);
  const auto bpw = [&](int bits, int group, bool sym) {
    return pack(make_linear(Case{64, 576, bits, group, sym, false, false, ScaleType::F16}, rng))
        .bits_per_weight();
  };
  // W4 g128 asym: 288 code bytes + 5 scales x 2 + 5 zeros per 576 columns.
  EXPECT_DOUBLE_EQ(bpw(4, 128, false), (288 + 10 + 5) * 8.0 / 576);
  EXPECT_DOUBLE_EQ(bpw(4, 128, true), (288 + 10) * 8.0 / 576);
  EXPECT_DOUBLE_EQ(bpw(8, -1, true), (576 + 2) * 8.0 / 576);
  EXPECT_DOUBLE_EQ(bpw(4, 32, false), (288 + 18 * 3) * 8.0 / 576);
  // Real zero points (min_offset) take 4 bytes a group: W4 g32, 18 groups.
  EXPECT_DOUBLE_EQ(
      pack(make_linear(Case{64, 576, 4, 32, false, false, false, ScaleType::F16, true}, rng))
          .bits_per_weight(),
      (288 + 18 * 2 + 18 * 4) * 8.0 / 576);
  // W3 g128 asym, densely packed: 18 blocks of 12 bytes; int2 takes the same 3-bit storage.
  EXPECT_DOUBLE_EQ(bpw(3, 128, false), (216 + 10 + 5) * 8.0 / 576);
  EXPECT_DOUBLE_EQ(bpw(2, 128, false), (216 + 10 + 5) * 8.0 / 576);
  // W5 g32 sym (llama.cpp's Q5_0), densely packed: 18 blocks of 20 bytes, 18 scales; 6 bits take
  // a byte each.
  EXPECT_DOUBLE_EQ(bpw(5, 32, true), (360 + 18 * 2) * 8.0 / 576);
  EXPECT_DOUBLE_EQ(bpw(6, 32, true), (576 + 18 * 2) * 8.0 / 576);
}

TEST(Packed, RefusesWhatItCannotHold) {
  std::mt19937 rng(5);
  QuantizedLinear a = make_linear(Case{8, 100, 4, 48, false, false, false, ScaleType::F16}, rng);
  test::expect_error([&] { pack(a); }, "group size 48 cannot be packed");
  // groups of 16 only where rows are whole blocks of 32 (each block two groups)
  QuantizedLinear a16 = make_linear(Case{8, 100, 4, 16, false, false, false, ScaleType::F16}, rng);
  test::expect_error([&] { pack(a16); }, "group size 16 cannot be packed");
  QuantizedLinear b = make_linear(Case{8, 64, 4, 32, false, false, false, ScaleType::F16}, rng);
  b.zeros[3] = 2.5f;
  test::expect_error([&] { pack(b); }, "is not an integer code");
  b.spec.min_offset = true;             // real zero points: any finite value
  EXPECT_EQ(pack(b).zero(1, 1), 2.5f);  // zeros[3]: row 1, group 1 of 2
  b.zeros[3] = std::nanf("");
  test::expect_error([&] { pack(b); }, "is not a finite number");
  QuantizedLinear c = make_linear(Case{8, 64, 4, 32, false, false, false, ScaleType::F16}, rng);
  c.g_idx[0] = 1;  // group 0 now holds 31 columns
  test::expect_error([&] { pack(c); }, "holds 31 columns");
  QuantizedLinear d = make_linear(Case{8, 64, 4, 32, false, false, false, ScaleType::F16}, rng);
  d.scales[0] = 1e6f;
  test::expect_error([&] { pack(d, ScaleType::F16); }, "does not fit fp16");
  d.scales.pop_back();
  test::expect_error([&] { pack(d); }, "inconsistent sizes");
}

// The SIMD kernels quantize their input as the plain loops do, bit for bit: the same fp32
// product x * (1 / d), rounded to nearest even, clamped to +-127; the same block maxima. Blocks
// here: random values, zeros only, exact ties after scaling (max 127: d = 1, x.5 rounds to even),
// and a padded tail (100 columns), per block and per row.
TEST(Packed, SimdInputQuantizationEqualsThePlainLoops) {
  if (!isa_supported(Isa::Avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  const int cols = 100;
  std::vector<float> W(4 * cols, 0.5f);
  const PackedLinear p = pack(rtn(W.data(), 4, cols, WeightQuant{4, 32, false}));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(cols);
  for (float& v : x) v = nd(rng);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
  const float ties[] = {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -126.5f};
  for (int i = 0; i < 32; ++i) x[64 + i] = ties[i % 8];
  for (ActScale scale : {ActScale::PerBlock, ActScale::PerRow}) {
    std::vector<std::int8_t> q0(p.colsp), q1(p.colsp);
    std::vector<float> d0(p.colsp / 32), d1(p.colsp / 32);
    quantize_q8_input(p, x.data(), q0.data(), d0.data(), scale, Isa::Portable);
    quantize_q8_input(p, x.data(), q1.data(), d1.data(), scale, Isa::Avx2);
    EXPECT_EQ(q0, q1);
    EXPECT_EQ(d0, d1);
    EXPECT_EQ(q0[64 + 1], 2);  // 2.5 to even
    EXPECT_EQ(q0[64 + 2], -4);
  }
}

TEST(Packed, IsaChoice) {
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_TRUE(isa_supported(Isa::Portable));
  if (const char* v = std::getenv("ONEDNN_MAX_CPU_ISA"); v && std::string(v) == "AVX2") {
    EXPECT_NE(best_isa(), Isa::Avx512);
  }
}

// The prompt kernel's width: timed only where VNNI gives a choice, 512-bit only where it ran
// at least 5% faster, the same answer on every call.
TEST(Packed, PromptWidthChoice) {
  const PromptWidthChoice c = prompt_width();
  if (std::string(q8_dot_name(Isa::Avx512)) != "avx512-vnni dpbusd") {
    EXPECT_EQ(c.width, PromptWidth::W256);
    EXPECT_EQ(c.speedup, 0.0);
  } else {
    EXPECT_GT(c.speedup, 0.0);
    EXPECT_EQ(c.width == PromptWidth::W512, c.speedup >= 1.05) << c.speedup;
  }
  EXPECT_EQ(prompt_width().width, c.width);
  EXPECT_STREQ(prompt_width_name(PromptWidth::Auto), prompt_width_name(c.width));
}

// What each thread of a decoding team fetches while it waits for the others before a product
// (the kernels' share) is what its rows of that product read: over the team, every byte of the
// product's codes, scales and zeros (codes or real zero points) once, and nothing else. Llama's
// gate_up is shared in pairs of runs, the head as one; teams of 1 to 5 threads.
TEST(Packed, DecoderSharesCoverEachProductOnce) {
  PackedModel pm;
  pm.config = model::ModelConfig{2, 4, 32, 24, 300};
  pm.config.family = model::Family::Llama;
  pm.config.n_kv_head = 2;
  pm.config.intermediate_size = 40;
  pm.config.tie_embeddings = false;
  std::mt19937 rng(7);
  for (int l = 0; l < pm.config.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const Case c{lin_rows(pm.config, static_cast<Lin>(k)),
                   lin_cols(pm.config, static_cast<Lin>(k)),
                   k == 1 ? 8 : 4,
                   32,
                   k == 3,
                   false,
                   false,
                   ScaleType::F16,
                   k == 2};  // gate_up with real zero points
      pm.linears.push_back(pack(make_linear(c, rng)));
    }
  pm.head = pack(make_linear({300, 32, 8, -1, true, false, false, ScaleType::F16}, rng));
  const model::ProductShare share = pm.decoder_kernels().share;
  ASSERT_TRUE(share);
  for (int team : {1, 2, 3, 5})
    for (int p = 0; p < pm.config.n_layer * k_num_lin + 1; ++p) {
      const bool head = p == pm.config.n_layer * k_num_lin;
      const PackedLinear& w = head ? pm.head : pm.linears[static_cast<std::size_t>(p)];
      std::vector<std::vector<model::ByteSpan>> got(team);
#pragma omp parallel num_threads(team)
      {
        std::vector<model::ByteSpan> mine(model::k_share_spans);
        const int n = head ? share(0, model::k_head_product, mine.data())
                           : share(p / k_num_lin, p % k_num_lin, mine.data());
        mine.resize(static_cast<std::size_t>(n));
        got[static_cast<std::size_t>(omp_get_thread_num())] = mine;
      }
      const auto* codes = reinterpret_cast<const char*>(w.codes.data());
      const auto* scales = reinterpret_cast<const char*>(w.scales.data());
      const auto* zeros = reinterpret_cast<const char*>(w.zeros.data());
      const auto* real_zeros = reinterpret_cast<const char*>(w.real_zeros.data());
      std::vector<int> c(w.codes.size()), s(w.scales.size() * 2), z(w.zeros.size()),
          rz(w.real_zeros.size() * 4);
      for (const auto& spans : got)
        for (const model::ByteSpan& b : spans) {
          const char* at = static_cast<const char*>(b.data);
          std::vector<int>* in = nullptr;
          std::size_t from = 0;
          using Array = std::pair<const char*, std::vector<int>*>;
          for (auto [base, count] :
               {Array{codes, &c}, Array{scales, &s}, Array{zeros, &z}, Array{real_zeros, &rz}})
            if (at >= base && at + b.bytes <= base + count->size()) {
              in = count;
              from = static_cast<std::size_t>(at - base);
            }
          ASSERT_NE(in, nullptr) << "a span outside the product's arrays";
          for (std::size_t i = 0; i < b.bytes; ++i) ++(*in)[from + i];
        }
      for (const auto* count : {&c, &s, &z, &rz})
        for (int n : *count) ASSERT_EQ(n, 1) << team << " threads, product " << p;
    }
}

}  // namespace
}  // namespace tessera::quant
