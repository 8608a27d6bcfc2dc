// Layer tests of the 3D-parallel linear (src/tessera/parallel/tensor_linear.hpp), run under mpirun
// with 2, 4 and 8 ranks: for every factorization tx*ty*tz of the world size, normal and
// transposed, each rank's output and gradients equal its slice of the single-rank linear
// (kernels::cpu::linear_forward/backward on the full tensors, computed on every rank).
//
// Bound: the parallel layer and the reference compute the same sums of products in a different
// order (partial GEMMs over an input range, then an all-reduce; partial column sums over batch
// shards, then a reduce-scatter / all-reduce), plus the bias add and the accumulation into the
// prior gradient. For any order of evaluation of a sum of K fp32 products (FMA or not),
// |computed - exact| <= gamma_K * S with S = sum |terms| and gamma_K = K*u/(1-K*u), u = 2^-24
// (Higham, Accuracy and Stability, §3.1). Both results obey it, so they differ by at most
// 2*gamma_K*S. The test computes S element by element with the same kernels on |inputs| (all
// terms non-negative, so S is itself exact to a factor 1 + gamma_K), and uses K = the largest
// summation length met + 2 (bias / accumulation). Nothing else (no approximation) may differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "mpi_env.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/parallel/tensor_linear.hpp"

namespace {

using tessera::comm::GridShape;
using tessera::comm::Runtime;
using tessera::comm::Topology;
using tessera::kernels::GemmLibrary;
namespace cpu = tessera::kernels::cpu;
namespace par = tessera::parallel;
using tessera::test::factorizations;
using tessera::test::random_vec;

constexpr GemmLibrary k_lib = GemmLibrary::OneDnn;
// Divisible by every factor of 8 (features by tx, ty; rows by tz).
constexpr int k_rows = 16, k_in = 16, k_out = 24;

std::vector<float> abs_vec(const std::vector<float>& v) {
  std::vector<float> a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

// 2 * gamma_K, the bound factor on S (see the top of the file).
double bound_factor(int k) {
  const double u = std::ldexp(1.0, -24);
  return 2.0 * (k * u) / (1.0 - k * u) * (1.0 + k * u / (1.0 - k * u));
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::vector<float>& sum_abs, double factor, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = factor * sum_abs[i];
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= tol) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", reference " << ref[i]
                    << ", |diff| " << err << " > bound " << tol;
  }
}

// The global problem, the same on every rank (fixed seed), and the single-rank results.
struct Reference {
  int n, in, out;
  std::vector<float> x, w, b, dy, dw0, db0;  // inputs; dw0, db0: prior gradients (accumulated)
  std::vector<float> y, dx, dw, db;          // single-rank results
  std::vector<float> y_s, dx_s, dw_s, db_s;  // S = the same computations on |inputs|

  Reference(int n_, int in_, int out_, std::uint64_t seed) : n(n_), in(in_), out(out_) {
    tessera::Rng rng(seed);
    x = random_vec(rng, std::size_t(n) * in);
    w = random_vec(rng, std::size_t(out) * in);
    b = random_vec(rng, out);
    dy = random_vec(rng, std::size_t(n) * out);
    dw0 = random_vec(rng, std::size_t(out) * in);
    db0 = random_vec(rng, out);
    run(x, w, b, dy, dw0, db0, y, dx, dw, db);
    run(abs_vec(x), abs_vec(w), abs_vec(b), abs_vec(dy), abs_vec(dw0), abs_vec(db0), y_s, dx_s,
        dw_s, db_s);
  }

  void run(const std::vector<float>& x_, const std::vector<float>& w_, const std::vector<float>& b_,
           const std::vector<float>& dy_, const std::vector<float>& dw0_,
           const std::vector<float>& db0_, std::vector<float>& y_, std::vector<float>& dx_,
           std::vector<float>& dw_, std::vector<float>& db_) const {
    y_.assign(std::size_t(n) * out, 0.0f);
    dx_.assign(std::size_t(n) * in, 0.0f);
    dw_ = dw0_;
    db_ = db0_;
    cpu::linear_forward(k_lib, y_.data(), x_.data(), w_.data(), b_.data(), n, in, out);
    cpu::linear_backward(k_lib, dx_.data(), dw_.data(), db_.data(), dy_.data(), x_.data(),
                         w_.data(), n, in, out);
  }
};

// Runs the parallel layer on this rank's slices and compares with the reference's slices.
void check_layer(Runtime& rt, int tx, int ty, int tz, bool transposed, const Reference& ref) {
  SCOPED_TRACE(fmt::format("rank {} grid tx={} ty={} tz={} transposed={}", rt.world_rank(), tx, ty,
                           tz, transposed));
  const Topology topo(GridShape{1, 1, tx, ty, tz}, rt.world_rank());
  const par::TensorLinearComms comms = par::tensor_linear_comms(rt, topo, transposed);
  const par::TensorLinearLayout l =
      par::make_tensor_linear_layout(topo, ref.in, ref.out, transposed);
  const std::int64_t n = l.local_rows(ref.n);
  ASSERT_EQ(l.in_local * l.in_parts, ref.in);
  ASSERT_EQ(l.out_local * l.out_parts, ref.out);

  auto block = [&](const std::vector<float>& w) {
    std::vector<float> s(l.shard_numel);
    par::extract_weight_shard(l, w.data(), s.data());
    return s;
  };
  auto bias = [&](const std::vector<float>& b) {
    std::vector<float> s(l.out_local);
    par::extract_bias(l, b.data(), s.data());
    return s;
  };
  auto input = [&](const std::vector<float>& x) {
    std::vector<float> s(n * l.in_local);
    par::extract_input(l, x.data(), ref.n, s.data());
    return s;
  };
  auto output = [&](const std::vector<float>& y) {
    std::vector<float> s(n * l.out_local);
    par::extract_output(l, y.data(), ref.n, s.data());
    return s;
  };

  const std::vector<float> x = input(ref.x), w_shard = block(ref.w), b = bias(ref.b);
  const std::vector<float> dy = output(ref.dy);
  std::vector<float> dw_shard = block(ref.dw0), db = bias(ref.db0);
  std::vector<float> y(n * l.out_local, NAN), dx(n * l.in_local, NAN);

  par::TensorLinearWorkspace ws(l);
  par::tensor_linear_forward(k_lib, l, comms, y.data(), x.data(), w_shard.data(), b.data(), n, ws);
  // The gathered block is the rank's block of W, exactly (a copy).
  std::vector<float> w_block(l.block_numel);
  par::extract_weight_block(l, ref.w.data(), w_block.data());
  EXPECT_EQ(std::vector<float>(ws.w_used, ws.w_used + l.block_numel), w_block)
      << "gathered weight block";
  par::tensor_linear_backward(k_lib, l, comms, dx.data(), dw_shard.data(), db.data(), dy.data(),
                              x.data(), ws.w_used, n, ws);

  const double f = bound_factor(std::max({ref.n, ref.in, ref.out}) + 2);
  expect_close(y, output(ref.y), output(ref.y_s), f, "y");
  expect_close(dx, input(ref.dx), input(ref.dx_s), f, "dx");
  expect_close(dw_shard, block(ref.dw), block(ref.dw_s), f, "dw shard");
  expect_close(db, bias(ref.db), bias(ref.db_s), f, "db");
}

class TensorLinearTest : public tessera::test::MpiTest {};

TEST_F(TensorLinearTest, ShardsPartitionTheWeight) {
  // Over the whole world, the shards of every rank with a given (in, out) block cover the block's
  // elements exactly once, for every factorization and both orientations.
  Runtime& rt = runtime();
  for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(fmt::format("tx={} ty={} tz={} transposed={}", tx, ty, tz, transposed));
      std::vector<int> hits(std::size_t(k_out) * k_in, 0);
      for (int r = 0; r < rt.world_size(); ++r) {
        const Topology topo(GridShape{1, 1, tx, ty, tz}, r);
        const auto l = par::make_tensor_linear_layout(topo, k_in, k_out, transposed);
        EXPECT_EQ(l.in_parts, transposed ? ty : tx);
        EXPECT_EQ(l.out_parts, transposed ? tx : ty);
        std::int64_t total = 0;
        for (auto c : l.shard_counts) total += static_cast<std::int64_t>(c);
        EXPECT_EQ(total, l.block_numel);
        for (std::int64_t e = l.shard_offset; e < l.shard_offset + l.shard_numel; ++e) {
          const int o = l.out_offset + static_cast<int>(e / l.in_local);
          const int i = l.in_offset + static_cast<int>(e % l.in_local);
          ++hits[std::size_t(o) * k_in + i];
        }
      }
      for (std::size_t e = 0; e < hits.size(); ++e) ASSERT_EQ(hits[e], 1) << "element " << e;
    }
  }
}

TEST_F(TensorLinearTest, RejectsIndivisibleFeatures) {
  Runtime& rt = runtime();
  if (rt.world_size() == 1) GTEST_SKIP() << "needs more than one rank";
  const Topology topo(GridShape{1, 1, rt.world_size(), 1, 1}, rt.world_rank());
  EXPECT_THROW(par::make_tensor_linear_layout(topo, rt.world_size() + 1, 8, false), tessera::Error);
  EXPECT_THROW(par::make_tensor_linear_layout(topo, 8, rt.world_size() + 1, true), tessera::Error);
}

TEST_F(TensorLinearTest, MatchesSingleRankForEveryFactorization) {
  Runtime& rt = runtime();
  const Reference ref(k_rows, k_in, k_out, 20240601);
  for (auto [tx, ty, tz] : factorizations(rt.world_size()))
    for (bool transposed : {false, true}) check_layer(rt, tx, ty, tz, transposed, ref);
}

TEST_F(TensorLinearTest, UnevenAndEmptyWeightShards) {
  // Blocks whose size is not a multiple of tz: the last shards are shorter, or empty (5 elements
  // over tz=4 are 2,2,1,0; over tz=8 1,1,1,1,1,0,0,0). Odd features allow tx = ty = 1 only.
  Runtime& rt = runtime();
  const int p = rt.world_size();
  for (auto [in, out] : {std::pair{5, 3}, std::pair{1, 5}, std::pair{5, 1}}) {
    const Reference ref(8, in, out, 7 + in * 10 + out);
    for (bool transposed : {false, true}) check_layer(rt, 1, 1, p, transposed, ref);
  }
}

TEST_F(TensorLinearTest, NormalThenTransposedNeedsNoRelayout) {
  // y = (x @ W1^T + b1) @ W2^T + b2 with layer 1 normal and layer 2 transposed: layer 1's local
  // output is passed as layer 2's local input as is, and layer 2's input gradient as layer 1's
  // output gradient.
  Runtime& rt = runtime();
  const int n = k_rows, c = k_in, h = k_out;
  tessera::Rng rng(99);
  const std::vector<float> x = random_vec(rng, std::size_t(n) * c);
  const std::vector<float> w1 = random_vec(rng, std::size_t(h) * c), b1 = random_vec(rng, h);
  const std::vector<float> w2 = random_vec(rng, std::size_t(c) * h), b2 = random_vec(rng, c);
  const std::vector<float> dy = random_vec(rng, std::size_t(n) * c);
  // Single rank, and the same on absolute values (the bound's S, compounded through the pair).
  auto run = [&](const std::vector<float>& x_, const std::vector<float>& w1_,
                 const std::vector<float>& b1_, const std::vector<float>& w2_,
                 const std::vector<float>& b2_, const std::vector<float>& dy_,
                 std::vector<std::vector<float>>& out) {
    std::vector<float> hid(std::size_t(n) * h), y(std::size_t(n) * c), dhid(hid.size()),
        dx(x_.size()), dw1(w1_.size(), 0.0f), db1(h, 0.0f), dw2(w2_.size(), 0.0f), db2(c, 0.0f);
    cpu::linear_forward(k_lib, hid.data(), x_.data(), w1_.data(), b1_.data(), n, c, h);
    cpu::linear_forward(k_lib, y.data(), hid.data(), w2_.data(), b2_.data(), n, h, c);
    cpu::linear_backward(k_lib, dhid.data(), dw2.data(), db2.data(), dy_.data(), hid.data(),
                         w2_.data(), n, h, c);
    cpu::linear_backward(k_lib, dx.data(), dw1.data(), db1.data(), dhid.data(), x_.data(),
                         w1_.data(), n, c, h);
    out = {y, dx, dw1, db1, dw2, db2};
  };
  std::vector<std::vector<float>> ref, s;
  run(x, w1, b1, w2, b2, dy, ref);
  run(abs_vec(x), abs_vec(w1), abs_vec(b1), abs_vec(w2), abs_vec(b2), abs_vec(dy), s);
  // Two chained sums: the first's error (gamma_K S1) is propagated by the second through |W2| and
  // the second's own error adds gamma_K S: in total <= 2 gamma_K S (S computed on |inputs| through
  // both layers bounds both), and twice that between two such computations.
  const double f = 2.0 * bound_factor(std::max({n, c, h}) + 2);

  for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
    SCOPED_TRACE(fmt::format("rank {} grid tx={} ty={} tz={}", rt.world_rank(), tx, ty, tz));
    const Topology topo(GridShape{1, 1, tx, ty, tz}, rt.world_rank());
    const auto c1 = par::tensor_linear_comms(rt, topo, false);
    const auto c2 = par::tensor_linear_comms(rt, topo, true);
    const auto l1 = par::make_tensor_linear_layout(topo, c, h, false);
    const auto l2 = par::make_tensor_linear_layout(topo, h, c, true);
    const std::int64_t nl = l1.local_rows(n);
    ASSERT_EQ(l1.out_local, l2.in_local);
    ASSERT_EQ(l1.out_offset, l2.in_offset);

    auto shard = [](const par::TensorLinearLayout& l, const std::vector<float>& w) {
      std::vector<float> v(l.shard_numel);
      par::extract_weight_shard(l, w.data(), v.data());
      return v;
    };
    auto bias = [](const par::TensorLinearLayout& l, const std::vector<float>& b) {
      std::vector<float> v(l.out_local);
      par::extract_bias(l, b.data(), v.data());
      return v;
    };
    auto input = [&](const par::TensorLinearLayout& l, const std::vector<float>& a) {
      std::vector<float> v(nl * l.in_local);
      par::extract_input(l, a.data(), n, v.data());
      return v;
    };
    auto output = [&](const par::TensorLinearLayout& l, const std::vector<float>& a) {
      std::vector<float> v(nl * l.out_local);
      par::extract_output(l, a.data(), n, v.data());
      return v;
    };
    const auto xl = input(l1, x), w1s = shard(l1, w1), b1l = bias(l1, b1);
    const auto w2s = shard(l2, w2), b2l = bias(l2, b2), dyl = output(l2, dy);
    std::vector<float> hid(nl * l1.out_local), y(nl * l2.out_local), dhid(hid.size()),
        dx(xl.size()), dw1(w1s.size(), 0.0f), db1(b1l.size(), 0.0f), dw2(w2s.size(), 0.0f),
        db2(b2l.size(), 0.0f);
    par::TensorLinearWorkspace ws1(l1), ws2(l2);
    par::tensor_linear_forward(k_lib, l1, c1, hid.data(), xl.data(), w1s.data(), b1l.data(), nl,
                               ws1);
    par::tensor_linear_forward(k_lib, l2, c2, y.data(), hid.data(), w2s.data(), b2l.data(), nl,
                               ws2);
    par::tensor_linear_backward(k_lib, l2, c2, dhid.data(), dw2.data(), db2.data(), dyl.data(),
                                hid.data(), ws2.w_used, nl, ws2);
    par::tensor_linear_backward(k_lib, l1, c1, dx.data(), dw1.data(), db1.data(), dhid.data(),
                                xl.data(), ws1.w_used, nl, ws1);
    expect_close(y, output(l2, ref[0]), output(l2, s[0]), f, "y");
    expect_close(dx, input(l1, ref[1]), input(l1, s[1]), f, "dx");
    expect_close(dw1, shard(l1, ref[2]), shard(l1, s[2]), f, "dw1 shard");
    expect_close(db1, bias(l1, ref[3]), bias(l1, s[3]), f, "db1");
    expect_close(dw2, shard(l2, ref[4]), shard(l2, s[4]), f, "dw2 shard");
    expect_close(db2, bias(l2, ref[5]), bias(l2, s[5]), f, "db2");
  }
}

}  // namespace
