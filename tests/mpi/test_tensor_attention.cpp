// Layer tests of the tensor-parallel attention sub-block
// (tensor_attention_block.hpp), y = x + proj(attention(qkv(ln1(x)))), run under
// mpirun with 2, 4 and 8 ranks: for every factorization tx*ty*tz of the world size that the sizes
// allow, each rank's y, dx and parameter gradients (its shards) equal its slices of the single-rank
// composition of kernels::cpu::layernorm / linear / attention forward and backward on the full
// tensors (computed on every rank, same seed).
//
// Sizes: B=8, T=4, C=32, NH=8 (hs=4) allow every factorization of 8 (tx | C, ty | NH, tz | B);
// B=2, T=4, C=16, NH=4 skips those with ty=8 (NH % ty) or tz > 2 (B % tz: attention needs whole
// sequences per rank); the skipped ones are printed by rank 0.
//
// Bound (normwise, per compared tensor t): |got_i - ref_i| <= 2 * A * L * K * u * max_j |ref_t[j]|
// with u = 2^-24. Both sides are fp32 evaluations of the same composition that differ only in the
// order of their reductions (LayerNorm row sums over C split over tx and all-reduced, GEMM inner
// sums split over tx / ty and all-reduced, weight / bias / LayerNorm-parameter gradient sums over
// rows split over tz and reduced), plus the grouping of the bias / residual adds; every elementwise
// op (exp, sqrt, products) runs the same operation sequence on its inputs. A sum of at most K terms
// in any order is within gamma_K ~= K*u of the exact sum times sum|terms| (Higham §3.1); with
// the data kept O(1) (x, dy ~ U(-1,1), weights ~ U(-1,1)/sqrt(fan_in), LayerNorm gain ~1), the
// terms' absolute sum at each stage is within a small factor of the stage's output scale. Each
// of the L reduction stages on the longest path from the inputs to a compared tensor adds its own
// K*u relative error and passes the earlier ones on with a gain of at most A relative to the
// tensor-wide scale (rstd ~ 1.7 for U(-1,1) rows, softmax is 1-Lipschitz in the max norm, the
// O(1)-scaled linears keep the scale). First order, both sides: the factor 2. K = 3C (the longest
// sum: dx of the qkv linear; the row sums are over N = B*T <= 3C), L = 16 (forward: LayerNorm
// mean and variance, qkv GEMM, q.k, softmax sum, P.v, proj GEMM, residual; backward: proj dx, D =
// dO.O, dP and dV, dQ / dK, qkv dx, two LayerNorm row sums, and the row sums of the parameter
// gradients), A = 4. The largest observed err / bound ratio is printed by rank 0 per size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "mpi_env.hpp"
#include "tensor_attention_block.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"

namespace {

using tessera::comm::GridShape;
using tessera::comm::Runtime;
using tessera::comm::Topology;
using tessera::kernels::GemmLibrary;
namespace cpu = tessera::kernels::cpu;
namespace par = tessera::parallel;
using tessera::test::factorizations;

constexpr GemmLibrary k_lib = GemmLibrary::OneDnn;
constexpr double k_gain = 4.0;  // A
constexpr int k_stages = 16;    // L

std::vector<float> random_vec(tessera::Rng& rng, std::size_t n, float scale = 1.0f,
                              float offset = 0.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = offset + scale * (2.0f * rng.uniform() - 1.0f);
  return v;
}

struct Sizes {
  int B, T, C, NH;
};

// Checks got against ref with the normwise bound; returns the largest err / bound.
double expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rel,
                    const std::string& what) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  if (got.size() != ref.size()) return 0.0;
  double scale = 0.0;
  for (float r : ref) scale = std::max(scale, static_cast<double>(std::fabs(r)));
  const double tol = rel * scale;
  double worst = 0.0;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    worst = std::max(worst, tol > 0 ? err / tol : (err > 0 ? INFINITY : 0.0));
    if (!(err <= tol) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", reference " << ref[i]
                    << ", |diff| " << err << " > bound " << tol;
  }
  return worst;
}

// The global problem (same on every rank) and the single-rank composition of the kernels.
struct Reference {
  Sizes s;
  int N;
  std::vector<float> x, dy, ln_w, ln_b, w_qkv, b_qkv, w_proj, b_proj;             // inputs
  std::vector<float> g0_ln_w, g0_ln_b, g0_w_qkv, g0_b_qkv, g0_w_proj, g0_b_proj;  // prior grads
  std::vector<float> qkv, att, y, dx;                                             // results
  std::vector<float> g_ln_w, g_ln_b, g_w_qkv, g_b_qkv, g_w_proj, g_b_proj;

  Reference(Sizes s_, std::uint64_t seed) : s(s_), N(s_.B * s_.T) {
    const int C = s.C;
    tessera::Rng rng(seed);
    const float wscale = 1.0f / std::sqrt(static_cast<float>(C));
    x = random_vec(rng, std::size_t(N) * C);
    dy = random_vec(rng, std::size_t(N) * C);
    ln_w = random_vec(rng, C, 0.1f, 1.0f);
    ln_b = random_vec(rng, C, 0.1f);
    w_qkv = random_vec(rng, std::size_t(3 * C) * C, wscale);
    b_qkv = random_vec(rng, 3 * C, 0.1f);
    w_proj = random_vec(rng, std::size_t(C) * C, wscale);
    b_proj = random_vec(rng, C, 0.1f);
    g0_ln_w = random_vec(rng, C);
    g0_ln_b = random_vec(rng, C);
    g0_w_qkv = random_vec(rng, w_qkv.size());
    g0_b_qkv = random_vec(rng, b_qkv.size());
    g0_w_proj = random_vec(rng, w_proj.size());
    g0_b_proj = random_vec(rng, b_proj.size());

    std::vector<float> ln(std::size_t(N) * C), mean(N), rstd(N), lse(std::size_t(s.B) * s.NH * s.T);
    qkv.assign(std::size_t(N) * 3 * C, 0.0f);
    att.assign(std::size_t(N) * C, 0.0f);
    cpu::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), ln_w.data(), ln_b.data(),
                           N, C);
    cpu::linear_forward(k_lib, qkv.data(), ln.data(), w_qkv.data(), b_qkv.data(), N, C, 3 * C);
    cpu::attention_forward(k_lib, att.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NH,
                           C / s.NH);
    y = x;
    cpu::linear_forward(k_lib, y.data(), att.data(), w_proj.data(), b_proj.data(), N, C, C, true);

    g_ln_w = g0_ln_w, g_ln_b = g0_ln_b, g_w_qkv = g0_w_qkv, g_b_qkv = g0_b_qkv;
    g_w_proj = g0_w_proj, g_b_proj = g0_b_proj;
    std::vector<float> d_att(att.size()), d_qkv(qkv.size()), d_ln(ln.size());
    cpu::linear_backward(k_lib, d_att.data(), g_w_proj.data(), g_b_proj.data(), dy.data(),
                         att.data(), w_proj.data(), N, C, C);
    cpu::attention_backward(k_lib, d_qkv.data(), d_att.data(), qkv.data(), att.data(), lse.data(),
                            s.B, s.T, s.NH, s.NH, C / s.NH);
    cpu::linear_backward(k_lib, d_ln.data(), g_w_qkv.data(), g_b_qkv.data(), d_qkv.data(),
                         ln.data(), w_qkv.data(), N, C, 3 * C);
    dx = dy;  // residual path; layernorm_backward accumulates the LayerNorm path
    cpu::layernorm_backward(dx.data(), g_ln_w.data(), g_ln_b.data(), d_ln.data(), x.data(),
                            ln_w.data(), mean.data(), rstd.data(), N, C);
  }
};

bool allowed(const Sizes& s, int tx, int ty, int tz) {
  return s.NH % ty == 0 && s.C % tx == 0 && s.B % tz == 0;
}

// Runs the parallel sub-block on this rank's slices; returns the largest err / bound.
double check_block(Runtime& rt, int tx, int ty, int tz, const Reference& ref) {
  SCOPED_TRACE(fmt::format("rank {} grid tx={} ty={} tz={} B={} C={} NH={}", rt.world_rank(), tx,
                           ty, tz, ref.s.B, ref.s.C, ref.s.NH));
  const Sizes& s = ref.s;
  const int C = s.C, N = ref.N;
  const Topology topo(GridShape{1, 1, tx, ty, tz}, rt.world_rank());
  const par::TensorAttentionComms comms = par::tensor_attention_comms(rt, topo);
  const par::TensorAttentionLayout l = par::make_tensor_attention_layout(topo, C, s.NH);
  const std::int64_t n = static_cast<std::int64_t>(l.local_batch(s.B)) * s.T;
  EXPECT_EQ(l.qkv.local_rows(N), n);

  // Slices of global tensors.
  auto head_grouped = [&](const std::vector<float>& v, std::int64_t row_len) {
    std::vector<float> o(v.size());
    par::qkv_rows_to_head_grouped(v.data(), o.data(), C, ty, row_len);
    return o;
  };
  auto shard = [](const par::TensorLinearLayout& ll, const std::vector<float>& w) {
    std::vector<float> v(ll.shard_numel);
    par::extract_weight_shard(ll, w.data(), v.data());
    return v;
  };
  auto bias = [](const par::TensorLinearLayout& ll, const std::vector<float>& b) {
    std::vector<float> v(ll.out_local);
    par::extract_bias(ll, b.data(), v.data());
    return v;
  };
  auto channels = [&](const std::vector<float>& v) {  // ln parameter slice
    return std::vector<float>(v.begin() + l.c_offset, v.begin() + l.c_offset + l.c_local);
  };
  auto stream = [&](const std::vector<float>& a) {  // residual-stream layout (n, c_local)
    std::vector<float> v(n * l.c_local);
    par::extract_input(l.qkv, a.data(), N, v.data());
    return v;
  };

  const auto x = stream(ref.x), dy = stream(ref.dy);
  const auto ln_w = channels(ref.ln_w), ln_b = channels(ref.ln_b);
  const auto w_qkv = shard(l.qkv, head_grouped(ref.w_qkv, C));
  const auto b_qkv = bias(l.qkv, head_grouped(ref.b_qkv, 1));
  const auto w_proj = shard(l.proj, ref.w_proj), b_proj = bias(l.proj, ref.b_proj);
  auto g_ln_w = channels(ref.g0_ln_w), g_ln_b = channels(ref.g0_ln_b);
  auto g_w_qkv = shard(l.qkv, head_grouped(ref.g0_w_qkv, C));
  auto g_b_qkv = bias(l.qkv, head_grouped(ref.g0_b_qkv, 1));
  auto g_w_proj = shard(l.proj, ref.g0_w_proj), g_b_proj = bias(l.proj, ref.g0_b_proj);

  const par::TensorAttentionParams p{ln_w.data(),  ln_b.data(),   w_qkv.data(),
                                     b_qkv.data(), w_proj.data(), b_proj.data()};
  const par::TensorAttentionGrads g{g_ln_w.data(),  g_ln_b.data(),   g_w_qkv.data(),
                                    g_b_qkv.data(), g_w_proj.data(), g_b_proj.data()};
  par::TensorAttentionActivations acts(l, s.B, s.T);
  par::TensorAttentionWorkspace ws(l, s.B, s.T);
  std::vector<float> y(n * l.c_local, NAN), dx(n * l.c_local, NAN);
  par::tensor_attention_forward(k_lib, l, comms, y.data(), x.data(), p, s.B, s.T, acts, ws);
  par::tensor_attention_backward(k_lib, l, comms, dx.data(), g, dy.data(), x.data(), p, s.B, s.T,
                                 acts, ws);

  // The intermediate layouts: the rank's qkv columns are q, k, v of its heads (head-grouped
  // columns of the global qkv activation), its attention output the channels of its heads.
  std::vector<float> qkv_ref(n * 3 * l.att_local), att_ref(n * l.att_local);
  const std::int64_t row0 = l.qkv.row_offset(N);
  for (std::int64_t r = 0; r < n; ++r) {
    for (int k = 0; k < 3 * l.att_local; ++k) {
      const int col = par::qkv_head_grouped_source_row(C, ty, l.qkv.out_offset + k);
      qkv_ref[r * 3 * l.att_local + k] = ref.qkv[(row0 + r) * 3 * C + col];
    }
  }
  par::extract_input(l.proj, ref.att.data(), N, att_ref.data());

  const double rel = 2.0 * k_gain * k_stages * (3.0 * C) * std::ldexp(1.0, -24);
  double worst = 0.0;
  worst = std::max(worst, expect_close(acts.qkv, qkv_ref, rel, "qkv activation"));
  worst = std::max(worst, expect_close(acts.att, att_ref, rel, "attention output"));
  worst = std::max(worst, expect_close(y, stream(ref.y), rel, "y"));
  worst = std::max(worst, expect_close(dx, stream(ref.dx), rel, "dx"));
  worst = std::max(worst, expect_close(g_ln_w, channels(ref.g_ln_w), rel, "d ln_w"));
  worst = std::max(worst, expect_close(g_ln_b, channels(ref.g_ln_b), rel, "d ln_b"));
  worst = std::max(worst, expect_close(g_w_qkv, shard(l.qkv, head_grouped(ref.g_w_qkv, C)), rel,
                                       "d w_qkv shard"));
  worst = std::max(
      worst, expect_close(g_b_qkv, bias(l.qkv, head_grouped(ref.g_b_qkv, 1)), rel, "d b_qkv"));
  worst =
      std::max(worst, expect_close(g_w_proj, shard(l.proj, ref.g_w_proj), rel, "d w_proj shard"));
  worst = std::max(worst, expect_close(g_b_proj, bias(l.proj, ref.g_b_proj), rel, "d b_proj"));
  return worst;
}

class TensorAttentionTest : public tessera::test::MpiTest {};

TEST_F(TensorAttentionTest, HeadGroupedOrderIsAPermutationOfWholeHeads) {
  for (auto [C, NH] : {std::pair{16, 4}, std::pair{32, 8}}) {
    const int hs = C / NH;
    for (int ty : {1, 2, 4, 8}) {
      if (NH % ty != 0) continue;
      SCOPED_TRACE(fmt::format("C={} NH={} ty={}", C, NH, ty));
      std::vector<int> hits(3 * C, 0);
      for (int r = 0; r < 3 * C; ++r) {
        const int src = par::qkv_head_grouped_source_row(C, ty, r);
        ASSERT_GE(src, 0);
        ASSERT_LT(src, 3 * C);
        ++hits[src];
        if (ty == 1) {
          EXPECT_EQ(src, r);
        }
        // Row r belongs to ty rank r / (3C/ty); its source row is a q, k or v row of a head of
        // that rank.
        const int j = r / (3 * C / ty);
        const int head = (src % C) / hs;
        EXPECT_EQ(head / (NH / ty), j) << "row " << r;
      }
      for (int h : hits) ASSERT_EQ(h, 1);
      std::vector<float> w(std::size_t(3 * C) * 5), perm(w.size()), back(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
      par::qkv_rows_to_head_grouped(w.data(), perm.data(), C, ty, 5);
      par::qkv_rows_from_head_grouped(perm.data(), back.data(), C, ty, 5);
      EXPECT_EQ(back, w);
    }
  }
}

// The general ty-grouped order: llama's fused q|k|v of 8 query heads on 2 or 4 kv heads gives ty
// rank j its query heads and exactly the kv heads they read (query head h reads kv head
// h / (NH/KV)); its fused gate|up gives rank j gate row i and up row i together.
TEST_F(TensorAttentionTest, GroupedOrderKeepsKvHeadsWithTheirQueryHeadsAndGateWithUp) {
  const int hs = 4, NH = 8, F = 12;
  for (int KV : {2, 4})
    for (int ty : {1, 2}) {
      SCOPED_TRACE(fmt::format("KV={} ty={}", KV, ty));
      const std::vector<int> seg = {NH * hs, KV * hs, KV * hs};
      const int rows = (NH + 2 * KV) * hs, per = rows / ty;
      std::vector<int> hits(rows, 0);
      for (int r = 0; r < rows; ++r) {
        const int src = par::grouped_source_row(seg, ty, r);
        ASSERT_GE(src, 0);
        ASSERT_LT(src, rows);
        ++hits[src];
        const int j = r / per;
        if (src < NH * hs) {
          EXPECT_EQ(src / hs / (NH / ty), j) << "q row " << r;
        } else {
          const int kv_head = ((src - NH * hs) % (KV * hs)) / hs;
          EXPECT_EQ(kv_head / (KV / ty), j) << "k/v row " << r;
          // the rank's query heads read exactly its kv heads
          EXPECT_EQ((kv_head * (NH / KV)) / (NH / ty), j);
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1);
      for (int r = 0; r < F / ty; ++r)
        for (int j = 0; j < ty; ++j) {
          const int gate = par::grouped_source_row({F, F}, ty, j * 2 * F / ty + r);
          const int up = par::grouped_source_row({F, F}, ty, j * 2 * F / ty + F / ty + r);
          EXPECT_EQ(up, gate + F);
          EXPECT_EQ(gate, j * F / ty + r);
        }
    }
}

TEST_F(TensorAttentionTest, RejectsIndivisibleHeadsAndBatch) {
  Runtime& rt = runtime();
  const int p = rt.world_size();
  if (p == 1) GTEST_SKIP() << "needs more than one rank";
  const Topology by_y(GridShape{1, 1, 1, p, 1}, rt.world_rank());
  EXPECT_THROW(par::make_tensor_attention_layout(by_y, 12, 3), tessera::Error);  // 3 % p != 0
  const Topology by_z(GridShape{1, 1, 1, 1, p}, rt.world_rank());
  const auto l = par::make_tensor_attention_layout(by_z, 16, 4);
  EXPECT_THROW(l.local_batch(p + 1), tessera::Error);
  EXPECT_EQ(l.local_batch(2 * p), 2);
}

TEST_F(TensorAttentionTest, MatchesSingleRankForEveryFactorization) {
  Runtime& rt = runtime();
  for (const Sizes& s : {Sizes{8, 4, 32, 8}, Sizes{2, 4, 16, 4}}) {
    const Reference ref(s, 20240602 + s.C);
    double worst = 0.0;
    std::string skipped;
    for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
      if (!allowed(s, tx, ty, tz)) {
        skipped += fmt::format(" ({},{},{})", tx, ty, tz);
        continue;
      }
      worst = std::max(worst, check_block(rt, tx, ty, tz, ref));
    }
    double all = worst;
    rt.world().all_reduce_max(&all, 1);
    if (rt.world_rank() == 0)
      std::cout << fmt::format(
          "[ attention ] {} ranks, B={} T={} C={} NH={}: largest err/bound {:.3g}; skipped "
          "(tx,ty,tz):{}\n",
          rt.world_size(), s.B, s.T, s.C, s.NH, all, skipped.empty() ? " none" : skipped);
  }
}

}  // namespace
