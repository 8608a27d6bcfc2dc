// Tests of the GEMM layout tuner (kernels/gemm_tuner.hpp): every strategy computes the same C as
// the direct call (within fp32 reordering), honoring alpha, beta and padded leading dimensions;
// the cache, the records, the time cap and the file persistence.
//
// Error budget of the comparisons: each candidate sums the K products of an element in some
// order, possibly with fused multiply-adds, and adds beta * C. Against a double reference the
// error is at most about (K + 2) * u * (|alpha| * sum_k |a_ik b_kj| + |beta c_ij|), u = 2^-24;
// the bound below takes twice that.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_tuner.hpp"

namespace {

using tessera::Rng;
using tessera::kernels::GemmChoice;
using tessera::kernels::GemmLibrary;
using tessera::kernels::GemmShape;
using tessera::kernels::GemmTuner;
using tessera::kernels::GemmTunerOptions;
namespace k = tessera::kernels;

constexpr GemmLibrary k_libs[] = {GemmLibrary::OneDnn, GemmLibrary::OpenBlas};
constexpr double k_u = 0x1p-24;
const float k_nan = std::numeric_limits<float>::quiet_NaN();

struct Operands {
  GemmShape s;
  std::int64_t lda, ldb, ldc;
  std::vector<float> A, B, C0;  // C0: C before the call
};

// Operands with leading dimensions `pad` beyond the minimum; padding holds NaN so that any read
// of it poisons the result. With beta == 0, C0 is all NaN (C must not be read).
Operands make_operands(const GemmShape& s, std::int64_t pad, float beta, std::uint64_t seed) {
  Operands o{s, 0, 0, 0, {}, {}, {}};
  const std::int64_t ar = s.ta ? s.K : s.M, ac = s.ta ? s.M : s.K;
  const std::int64_t br = s.tb ? s.N : s.K, bc = s.tb ? s.K : s.N;
  o.lda = ac + pad;
  o.ldb = bc + pad + 1;
  o.ldc = s.N + pad + 2;
  Rng rng(seed);
  auto fill = [&](std::vector<float>& v, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    v.assign(static_cast<std::size_t>(rows * ld), k_nan);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) v[i * ld + j] = rng.normal();
  };
  fill(o.A, ar, ac, o.lda);
  fill(o.B, br, bc, o.ldb);
  fill(o.C0, s.M, s.N, o.ldc);
  if (beta == 0.0f)
    for (std::int64_t i = 0; i < s.M; ++i)
      for (std::int64_t j = 0; j < s.N; ++j) o.C0[i * o.ldc + j] = k_nan;
  return o;
}

float at(const std::vector<float>& X, bool t, std::int64_t ld, std::int64_t r, std::int64_t c) {
  return t ? X[c * ld + r] : X[r * ld + c];
}

// Checks C (after the call) against a double reference; padding of C must be untouched (NaN).
void expect_matches_reference(const Operands& o, float alpha, float beta,
                              const std::vector<float>& C, const std::string& what) {
  const GemmShape& s = o.s;
  int bad = 0;
  for (std::int64_t i = 0; i < s.M; ++i) {
    for (std::int64_t j = 0; j < s.N; ++j) {
      double acc = 0.0, mag = 0.0;
      for (std::int64_t p = 0; p < s.K; ++p) {
        const double prod = static_cast<double>(at(o.A, s.ta, o.lda, i, p)) *
                            static_cast<double>(at(o.B, s.tb, o.ldb, p, j));
        acc += prod;
        mag += std::abs(prod);
      }
      double ref = alpha * acc, bmag = 0.0;
      if (beta != 0.0f) {
        ref += static_cast<double>(beta) * o.C0[i * o.ldc + j];
        bmag = std::abs(static_cast<double>(beta) * o.C0[i * o.ldc + j]);
      }
      const double bound = 2.0 * (s.K + 2) * k_u * (std::abs(alpha) * mag + bmag) + 1e-30;
      const double got = C[i * o.ldc + j];
      if (!(std::abs(got - ref) <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " C[" << i << "," << j << "] = " << got << ", reference " << ref
                      << ", bound " << bound;
    }
    for (std::int64_t j = s.N; j < o.ldc; ++j) {
      if (!std::isnan(C[i * o.ldc + j]) && bad++ < 3)
        ADD_FAILURE() << what << " wrote C padding at row " << i << " col " << j;
    }
  }
}

TEST(GemmTuner, EveryCandidateMatchesTheDirectCall) {
  const std::int64_t dims[][3] = {{37, 53, 29}, {64, 17, 100}, {1, 33, 7}, {96, 128, 64}};
  GemmTuner tuner;
  for (GemmLibrary lib : k_libs) {
    for (int form = 0; form < 4; ++form) {
      for (const auto& d : dims) {
        for (float beta : {0.0f, 1.3f}) {
          const GemmShape s{(form & 1) != 0, (form & 2) != 0, d[0], d[1], d[2]};
          const float alpha = beta == 0.0f ? 1.0f : -0.7f;
          const Operands o = make_operands(s, 5, beta, 17 + form);
          const auto cands = tuner.candidates(s);
          ASSERT_EQ(cands.size(), 8u);
          ASSERT_TRUE(cands.front().is_direct());
          for (const GemmChoice& c : cands) {
            std::vector<float> C = o.C0;
            tuner.run_with(lib, s, c, alpha, o.A.data(), o.lda, o.B.data(), o.ldb, beta, C.data(),
                           o.ldc);
            const std::string what = std::string(k::gemm_library_name(lib)) + " " +
                                     k::to_string(s) + " beta=" + std::to_string(beta) + " " +
                                     k::describe(s, c);
            expect_matches_reference(o, alpha, beta, C, what);
          }
        }
      }
    }
  }
}

TEST(GemmTuner, RunTunesOnceCachesAndMatches) {
  GemmTuner tuner;
  const GemmShape s{false, true, 200, 150, 96};  // NT, as a linear forward
  const Operands o = make_operands(s, 3, 0.5f, 5);
  for (int call = 0; call < 3; ++call) {
    std::vector<float> C = o.C0;
    tuner.run(GemmLibrary::OneDnn, s, 2.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.5f, C.data(),
              o.ldc);
    expect_matches_reference(o, 2.0f, 0.5f, C, "run " + std::to_string(call));
  }
  ASSERT_EQ(tuner.records().size(), 1u);
  ASSERT_TRUE(tuner.has_choice(GemmLibrary::OneDnn, s));
  EXPECT_FALSE(tuner.has_choice(GemmLibrary::OpenBlas, s));  // cached per library
  const auto& r = tuner.records().front();
  EXPECT_EQ(r.shape, s);
  EXPECT_EQ(r.timed, s);  // small: timed as is
  ASSERT_EQ(r.candidates.size(), 8u);
  EXPECT_TRUE(r.direct().choice.is_direct());
  for (const auto& c : r.candidates) {
    EXPECT_GE(c.reps, 1) << c.name;
    EXPECT_GT(c.seconds, 0.0) << c.name;
    EXPECT_LT(c.seconds, 1.0) << c.name;
  }
  EXPECT_EQ(tuner.choose(GemmLibrary::OneDnn, s), r.best);
  // The chosen one is the fastest or the direct call (min_gain).
  const double best_t = r.fastest().seconds;
  for (const auto& c : r.candidates) EXPECT_LE(best_t * (1.0 - 0.031), c.seconds) << c.name;
  EXPECT_EQ(tuner.records().size(), 1u);
}

TEST(GemmTuner, LargeShapesAreTimedOnAProxyWithinTheBudget) {
  GemmTuner tuner;
  auto flops = [](const GemmShape& g) { return 2.0 * g.M * g.N * g.K; };
  // GPT-2 124M: the LM head forward (79 GFLOP at B*T = 1024) and a linear's weight gradient.
  for (const GemmShape& s :
       {GemmShape{false, true, 1024, 50304, 768}, GemmShape{true, false, 2304, 768, 1024}}) {
    tuner.choose(GemmLibrary::OneDnn, s);
    const auto& r = tuner.records().back();
    EXPECT_EQ(r.shape, s);
    EXPECT_EQ(r.timed.K, s.K);
    EXPECT_EQ(r.timed.ta, s.ta);
    EXPECT_EQ(r.timed.tb, s.tb);
    EXPECT_LE(flops(r.timed), tuner.options().max_tune_flops);
    if (r.confirmed) {  // on a shape between the screened one and the real one
      EXPECT_GT(flops(r.confirm_shape), flops(r.timed));
      EXPECT_LE(flops(r.confirm_shape), flops(s));
      EXPECT_EQ(r.confirm_shape.K, s.K);
      EXPECT_GT(r.confirm_direct_s, 0.0);
      EXPECT_GT(r.confirm_best_s, 0.0);
      if (!r.best.is_direct()) {
        EXPECT_LT(r.confirm_best_s, r.confirm_direct_s);
      }
    }
    // What keeps the tuning within its time budget is that it times the proxy (above), never
    // the full shape; its duration itself is not asserted (a loaded machine stretches any
    // bound), only that every candidate was timed.
    for (const auto& c : r.candidates) EXPECT_GE(c.reps, 1) << c.name;
  }
}

TEST(GemmTuner, OptionsLimitTheCandidates) {
  GemmTunerOptions opt;
  opt.try_layouts = false;
  EXPECT_EQ(GemmTuner(opt).candidates(GemmShape{true, false, 4, 4, 4}).size(), 2u);
  opt.try_transposed_problem = false;
  EXPECT_EQ(GemmTuner(opt).candidates(GemmShape{true, false, 4, 4, 4}).size(), 1u);
  opt = {};
  opt.try_transposed_problem = false;
  EXPECT_EQ(GemmTuner(opt).candidates(GemmShape{true, false, 4, 4, 4}).size(), 4u);
}

TEST(GemmTuner, NamesTheIssuedForms) {
  const GemmShape nt{false, true, 8, 9, 10};
  EXPECT_EQ(k::to_string(nt), "NT 8x9x10");
  EXPECT_EQ(k::describe(nt, GemmChoice{}), "C=NT");
  EXPECT_EQ(k::describe(nt, GemmChoice{false, false, true}), "C=NN packB");
  EXPECT_EQ(k::describe(nt, GemmChoice{false, true, false}), "C=TT packA");
  // C^T = B A^T: the call on (B, A) is NT again.
  EXPECT_EQ(k::describe(nt, GemmChoice{true, false, false}), "C^T=NT");
  EXPECT_EQ(k::describe(nt, GemmChoice{true, true, true}), "C^T=TN packA,packB");
  const GemmShape tn{true, false, 8, 9, 10};
  EXPECT_EQ(k::describe(tn, GemmChoice{true, false, false}), "C^T=TN");
  EXPECT_EQ(k::describe(tn, GemmChoice{false, true, false}), "C=NN packA");
}

TEST(GemmTuner, DegenerateShapesAreNotTuned) {
  GemmTuner tuner;
  std::vector<float> C(12, 3.0f), A(12, 1.0f), B(12, 1.0f);
  // M == 0: nothing to do, nothing tuned.
  tuner.run(GemmLibrary::OneDnn, GemmShape{false, false, 0, 4, 3}, 1.0f, A.data(), 3, B.data(), 4,
            0.0f, C.data(), 4);
  EXPECT_EQ(tuner.records().size(), 0u);
  EXPECT_EQ(tuner.cache_size(), 0u);
  for (float x : C) EXPECT_EQ(x, 3.0f);
}

TEST(GemmTuner, TransposeMatrixHonorsLeadingDimensions) {
  const std::int64_t rows = 45, cols = 70, lds = 75, ldd = 50;
  std::vector<float> src(rows * lds, k_nan), dst(cols * ldd, -1.0f);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) src[i * lds + j] = static_cast<float>(i * 1000 + j);
  k::transpose_matrix(rows, cols, src.data(), lds, dst.data(), ldd);
  for (std::int64_t j = 0; j < cols; ++j) {
    for (std::int64_t i = 0; i < rows; ++i) ASSERT_EQ(dst[j * ldd + i], src[i * lds + j]);
    for (std::int64_t i = rows; i < ldd; ++i) ASSERT_EQ(dst[j * ldd + i], -1.0f);
  }
}

class GemmTunerFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tessera::test::fresh_scratch(
        std::string("gemm_tuner_") +
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(GemmTunerFile, SaveLoadRoundTrip) {
  GemmTuner a;
  const GemmShape s1{false, true, 1024, 2304, 768}, s2{true, false, 768, 768, 1024};
  const GemmShape s3{false, false, 10, 20, 30};
  a.set_choice(GemmLibrary::OneDnn, s1, GemmChoice{true, false, true});
  a.set_choice(GemmLibrary::OpenBlas, s1, GemmChoice{false, true, false});
  a.set_choice(GemmLibrary::OneDnn, s2, GemmChoice{});
  a.choose(GemmLibrary::OneDnn, s3);  // a tuned entry
  const auto p = dir_ / "tune.json";
  a.save(p);
  GemmTuner b;
  EXPECT_EQ(b.load(p), 4u);
  EXPECT_EQ(b.cache_size(), 4u);
  EXPECT_EQ(b.choose(GemmLibrary::OneDnn, s1), (GemmChoice{true, false, true}));
  EXPECT_EQ(b.choose(GemmLibrary::OpenBlas, s1), (GemmChoice{false, true, false}));
  EXPECT_EQ(b.choose(GemmLibrary::OneDnn, s2), GemmChoice{});
  EXPECT_EQ(b.choose(GemmLibrary::OneDnn, s3), a.choose(GemmLibrary::OneDnn, s3));
  EXPECT_TRUE(b.records().empty());  // nothing was re-tuned
}

TEST_F(GemmTunerFile, BadFilesThrowWithThePath) {
  GemmTuner t;
  const auto missing = dir_ / "missing.json";
  const auto not_json = write("bad.json", "{ \"format\": ");
  const auto not_tuner = write("other.json", "{\"entries\": []}");
  const auto not_object = write("array.json", "[1, 2]");
  for (const auto& p : {missing, not_json, not_tuner, not_object}) {
    try {
      t.load(p);
      ADD_FAILURE() << "no error for " << p;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(t.cache_size(), 0u);
}

TEST_F(GemmTunerFile, UnknownAndMismatchedEntriesAreSkipped) {
  const int th = omp_get_max_threads();
  auto entry = [&](const std::string& lib, int threads, const std::string& m) {
    return "{\"lib\": \"" + lib + "\", \"threads\": " + std::to_string(threads) +
           ", \"ta\": false, \"tb\": true, \"M\": " + m +
           ", \"N\": 64, \"K\": 32, \"transpose_problem\": true, \"pack_a\": false, "
           "\"pack_b\": true}";
  };
  const std::string text = "{\"format\": \"tessera-gemm-tuner\", \"version\": 1, \"entries\": [" +
                           entry("onednn", th, "16") + ", " + entry("cublas", th, "16") + ", " +
                           entry("openblas", th + 1, "16") + ", " + entry("openblas", th, "-4") +
                           ", " + entry("openblas", th, "\"x\"") +
                           ", {\"lib\": \"onednn\"}, 42, null, " + entry("openblas", th, "24") +
                           "], \"extra\": {\"ignored\": true}}";
  GemmTuner t;
  EXPECT_EQ(t.load(write("mixed.json", text)), 2u);
  EXPECT_EQ(t.choose(GemmLibrary::OneDnn, GemmShape{false, true, 16, 64, 32}),
            (GemmChoice{true, false, true}));
  EXPECT_TRUE(t.has_choice(GemmLibrary::OpenBlas, GemmShape{false, true, 24, 64, 32}));
  EXPECT_FALSE(t.has_choice(GemmLibrary::OpenBlas, GemmShape{false, true, 16, 64, 32}));
  // Another format version: nothing taken, no error.
  GemmTuner u;
  EXPECT_EQ(u.load(write("v2.json",
                         "{\"format\": \"tessera-gemm-tuner\", \"version\": 2, "
                         "\"entries\": [" +
                             entry("onednn", th, "16") + "]}")),
            0u);
  EXPECT_EQ(u.cache_size(), 0u);
}

}  // namespace
