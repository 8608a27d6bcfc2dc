// Layer tests of the vocabulary-parallel embedding, tied LM head and parallel cross-entropy
// (src/tessera/parallel/vocab_parallel.hpp), run under mpirun with 2, 4 and 8 ranks: for every
// factorization tx*ty*tz of the world size, each rank's embedding output, logits slice, per-row
// losses, mean loss, dlogits slice, dh, dwte shard and dwpe slice are compared with the matching
// slice of the single-rank kernels (kernels::cpu::embedding_*, linear_*, cross_entropy_*) on the
// full tensors, computed on every rank.
//
// Sizes: V = 300 real ids padded to Vp = 384 (so with 8 vocab ranks the last range [336, 384) is
// padding only), C = 16, B = 2, T = 4 (N = 8 rows). Input ids hit every real range, the last real
// id V-1 (twice: a repeated row of dwte); targets hit every real range and V-1.
//
// Bounds (u = 2^-24, gamma_k = k*u/(1-k*u); for any order of evaluation of a sum of k fp32 terms,
// |computed - exact| <= gamma_k * sum|terms|, Higham §3.1; two such results differ by twice that):
//  - embedding output: exact (each row is one wte row plus zeros from the other ranks, + wpe).
//  - logits z (K = C products): |dz_ij| <= delta_ij = 2 gamma_C S_ij, S = |h| @ |wte|^T.
//  - loss_i: each side computes m = max (exact), e_j = exp_approx(fl(z_j - m)), s = sum e_j,
//    fl(fl(m + log s) - z_t). exp_approx's relative error is <= eps_e = 2u (measured exhaustively
//    over every float in [-87, 0]: max 8.1e-8 = 1.36u; arguments here are <= 0 and far above the
//    clamp). Against the exact lse(z) - z_t at its own logits one side errs by at most
//    rho = eps_e + u R + gamma_V + 2u|log s| + u|lse| + u|loss| (R = max_j (m - z_j): the rounding
//    of z_j - m; 2u for a std::log within 1 ulp; the last two roundings). lse - z_t is 2-Lipschitz
//    in max-norm, so the two sides differ by at most 2 rho + 2 delta_i, delta_i = max_j delta_ij.
//  - dlogits_ij (j < V) = dloss (p_j - [j = t]): one side's p_j = e_j * fl(1/s) errs relatively by
//    pi = 2 eps_e + 2 u R + gamma_V + 3u against softmax(z) at its own logits, then the subtraction
//    of dloss rounds (u |d|); softmax moves by at most p_j (2 delta_i) between the two logits. So
//    |diff| <= dloss p_j (2 pi + 2 delta_i) + 2u |d_ij|, times 1.001 for the second-order terms
//    (all relative errors here are < 1e-5, their products < 1e-10). Padding columns: exactly 0.
//  - dh = dlogits @ wte (K = Vp): E @ |wte| + 2 gamma_Vp |d| @ |wte|, E the dlogits bound above.
//  - dwte (tied) = dwte0 + embedding rows + dlogits^T @ h: at most 2N+1 terms per element:
//    E^T @ |h| + 2 gamma_{2N+1} (|dwte0| + sum|dout rows| + |d|^T @ |h|).
//  - dwpe = dwpe0 + sum over the batch (B+1 terms): 2 gamma_{B+1} (|dwpe0| + sum|dout|).
//  - mean loss: the mean of the per-row bounds (+1e-12 for the double sums).
// All S-like sums are computed in double from the reference (exact enough: relative 1e-16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "mpi_env.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/parallel/vocab_parallel.hpp"

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
constexpr int k_v = 300, k_vp = 384, k_c = 16, k_b = 2, k_t = 4, k_n = k_b * k_t, k_max_t = 6;
const double k_u = std::ldexp(1.0, -24);
const double k_eps_exp = 2.0 * k_u;

double gamma(int k) {
  return k * k_u / (1.0 - k * k_u);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(tol.size(), ref.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= tol[i]) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", reference " << ref[i]
                    << ", |diff| " << err << " > bound " << tol[i];
  }
}

// Shuffled ids: one in each real range of 48 (the smallest range, Vp/8) plus V-1 twice (a
// repeated row); for targets one per range (the one in [288, 336) below V) plus V-1.
std::vector<std::int32_t> make_ids(tessera::Rng& rng, bool repeat_last) {
  std::vector<std::int32_t> ids;
  const int ranges = repeat_last ? 6 : 7;
  for (int k = 0; k < ranges; ++k) {
    const int hi = std::min(48, k_v - 1 - 48 * k);
    ids.push_back(48 * k + static_cast<int>(rng.next_u32() % hi));
  }
  while (static_cast<int>(ids.size()) < k_n) ids.push_back(k_v - 1);
  for (int i = k_n - 1; i > 0; --i) std::swap(ids[i], ids[rng.next_u32() % (i + 1)]);
  return ids;
}

struct Reference {
  std::vector<std::int32_t> ids, targets;
  std::vector<float> wte, wpe, h, dout, dwte0, dwpe0;  // inputs (dwte0, dwpe0: prior gradients)
  float dloss = 1.0f / k_n;
  std::vector<float> emb, logits, losses, dlogits, dh, dwte, dwpe;  // single-rank results
  double mean_loss = 0;
  std::vector<double> tol_logits, tol_loss, tol_dlogits, tol_dh, tol_dwte, tol_dwpe;
  double tol_mean = 0;

  explicit Reference(std::uint64_t seed, bool ignore_one) {
    tessera::Rng rng(seed);
    ids = make_ids(rng, true);
    targets = make_ids(rng, false);
    if (ignore_one) targets[3] = -1;
    wte = random_vec(rng, std::size_t(k_vp) * k_c);
    wpe = random_vec(rng, std::size_t(k_max_t) * k_c);
    h = random_vec(rng, std::size_t(k_n) * k_c);
    for (float& x : h) x *= 3.0f;  // logits of a few units: a non-trivial softmax
    dout = random_vec(rng, std::size_t(k_n) * k_c);
    dwte0 = random_vec(rng, wte.size());
    dwpe0 = random_vec(rng, wpe.size());

    emb.assign(std::size_t(k_n) * k_c, 0.0f);
    cpu::embedding_forward(emb.data(), ids.data(), wte.data(), wpe.data(), k_b, k_t, k_c);
    dwte = dwte0;
    dwpe = dwpe0;
    cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), ids.data(), k_b, k_t, k_c);
    logits.assign(std::size_t(k_n) * k_vp, 0.0f);
    cpu::linear_forward(k_lib, logits.data(), h.data(), wte.data(), nullptr, k_n, k_c, k_vp);
    dlogits = logits;
    losses.assign(k_n, 0.0f);
    cpu::cross_entropy_forward_backward(losses.data(), dlogits.data(), targets.data(), k_n, k_v,
                                        k_vp, dloss);
    dh.assign(std::size_t(k_n) * k_c, 0.0f);
    cpu::linear_backward(k_lib, dh.data(), dwte.data(), nullptr, dlogits.data(), h.data(),
                         wte.data(), k_n, k_c, k_vp);
    int count = 0;
    for (int i = 0; i < k_n; ++i)
      if (targets[i] >= 0) mean_loss += losses[i], ++count;
    mean_loss /= count;
    bounds(count);
  }

  void bounds(int count) {
    const std::size_t nv = std::size_t(k_n) * k_vp;
    tol_logits.assign(nv, 0.0);
    tol_dlogits.assign(nv, 0.0);
    tol_loss.assign(k_n, 0.0);
    for (int i = 0; i < k_n; ++i) {
      double delta = 0, m = -INFINITY;
      for (int j = 0; j < k_vp; ++j) {
        double s = 0;
        for (int c = 0; c < k_c; ++c) s += std::fabs(h[i * k_c + c]) * std::fabs(wte[j * k_c + c]);
        tol_logits[i * k_vp + j] = 2.0 * gamma(k_c) * s;
        if (j < k_v) {
          delta = std::max(delta, tol_logits[i * k_vp + j]);
          m = std::max(m, double(logits[i * k_vp + j]));
        }
      }
      double sum = 0, range = 0;
      for (int j = 0; j < k_v; ++j) {
        sum += std::exp(logits[i * k_vp + j] - m);
        range = std::max(range, m - logits[i * k_vp + j]);
      }
      if (targets[i] < 0) continue;  // loss 0 and dlogits 0 exactly on both sides
      const double lse = m + std::log(sum);
      const double rho = k_eps_exp + k_u * range + gamma(k_v) + 2 * k_u * std::fabs(std::log(sum)) +
                         k_u * std::fabs(lse) + k_u * std::fabs(losses[i]);
      tol_loss[i] = 2 * rho + 2 * delta;
      const double pi = 2 * k_eps_exp + 2 * k_u * range + gamma(k_v) + 3 * k_u;
      for (int j = 0; j < k_v; ++j) {
        const double p = std::exp(logits[i * k_vp + j] - lse);
        tol_dlogits[i * k_vp + j] =
            1.001 * (dloss * p * (2 * pi + 2 * delta) + 2 * k_u * std::fabs(dlogits[i * k_vp + j]));
      }
    }
    tol_mean = 1e-12;
    for (int i = 0; i < k_n; ++i) tol_mean += tol_loss[i] / count;
    // dh (N, C)
    tol_dh.assign(std::size_t(k_n) * k_c, 0.0);
    for (int i = 0; i < k_n; ++i)
      for (int c = 0; c < k_c; ++c) {
        double e = 0, s = 0;
        for (int j = 0; j < k_vp; ++j) {
          e += tol_dlogits[i * k_vp + j] * std::fabs(wte[j * k_c + c]);
          s += std::fabs(dlogits[i * k_vp + j]) * std::fabs(wte[j * k_c + c]);
        }
        tol_dh[i * k_c + c] = e + 2 * gamma(k_vp) * s;
      }
    // dwte (Vp, C)
    tol_dwte.assign(wte.size(), 0.0);
    for (int j = 0; j < k_vp; ++j)
      for (int c = 0; c < k_c; ++c) {
        double e = 0, s = std::fabs(dwte0[j * k_c + c]);
        for (int i = 0; i < k_n; ++i) {
          e += tol_dlogits[i * k_vp + j] * std::fabs(h[i * k_c + c]);
          s += std::fabs(dlogits[i * k_vp + j]) * std::fabs(h[i * k_c + c]);
          if (ids[i] == j) s += std::fabs(dout[i * k_c + c]);
        }
        tol_dwte[j * k_c + c] = e + 2 * gamma(2 * k_n + 1) * s;
      }
    // dwpe (max_t, C)
    tol_dwpe.assign(wpe.size(), 0.0);
    for (int t = 0; t < k_max_t; ++t)
      for (int c = 0; c < k_c; ++c) {
        double s = std::fabs(dwpe0[t * k_c + c]);
        for (int i = 0; i < k_n; ++i)
          if (i % k_t == t) s += std::fabs(dout[i * k_c + c]);
        tol_dwpe[t * k_c + c] = 2 * gamma(k_b + 1) * s;
      }
  }
};

void check_grid(Runtime& rt, int tx, int ty, int tz, const Reference& ref) {
  SCOPED_TRACE(fmt::format("rank {} grid tx={} ty={} tz={}", rt.world_rank(), tx, ty, tz));
  const Topology topo(GridShape{1, 1, tx, ty, tz}, rt.world_rank());
  const par::VocabParallelComms comms = par::vocab_parallel_comms(rt, topo);
  const par::VocabParallelLayout l = par::make_vocab_parallel_layout(topo, k_v, k_vp, k_c);
  const std::int64_t n = l.local_rows(k_n);
  ASSERT_EQ(l.vocab_local * tx * ty, k_vp);
  ASSERT_EQ(l.c_local * tx, k_c);

  // This rank's slices of the global tensors.
  auto shard = [&](const std::vector<float>& w) {
    std::vector<float> s(l.shard_numel);
    par::extract_vocab_weight_shard(l, w.data(), s.data());
    return s;
  };
  auto act = [&](const auto& x) {  // extract_vocab_activation, also for the double bounds
    std::vector<std::decay_t<decltype(x[0])>> s(n * l.c_local);
    for (std::int64_t i = 0; i < n; ++i)
      for (int c = 0; c < l.c_local; ++c)
        s[i * l.c_local + c] = x[(l.row_offset(k_n) + i) * k_c + l.c_offset + c];
    return s;
  };
  auto logits_slice = [&](const auto& x) {  // extract_vocab_logits, also for the bounds
    std::vector<std::decay_t<decltype(x[0])>> s(n * l.vocab_local);
    for (std::int64_t i = 0; i < n; ++i)
      for (int j = 0; j < l.vocab_local; ++j)
        s[i * l.vocab_local + j] = x[(l.row_offset(k_n) + i) * k_vp + l.vocab_offset + j];
    return s;
  };
  auto rows = [&](const auto& x) {
    using T = std::decay_t<decltype(x[0])>;
    const std::int64_t r0 = l.row_offset(k_n);
    return std::vector<T>(x.begin() + r0, x.begin() + r0 + n);
  };
  auto wpe_slice = [&](const auto& x) {
    std::vector<std::decay_t<decltype(x[0])>> s(std::size_t(k_max_t) * l.c_local);
    for (int t = 0; t < k_max_t; ++t)
      for (int c = 0; c < l.c_local; ++c) s[t * l.c_local + c] = x[t * k_c + l.c_offset + c];
    return s;
  };
  auto shard_of = [&](const std::vector<double>& x) {  // the bound's slice, like shard()
    std::vector<double> s(l.shard_numel);
    const std::int64_t base = std::int64_t(l.vocab_offset) * k_c + l.shard_offset;
    for (std::int64_t e = 0; e < l.shard_numel; ++e) s[e] = x[base + e];
    return s;
  };

  std::vector<std::int32_t> ids(n), targets(n);
  par::extract_vocab_rows(l, ref.ids.data(), k_n, ids.data());
  par::extract_vocab_rows(l, ref.targets.data(), k_n, targets.data());
  const std::vector<float> wte_shard = shard(ref.wte), wpe = wpe_slice(ref.wpe);
  std::vector<float> h(n * l.c_local), dout(n * l.c_local);
  par::extract_vocab_activation(l, ref.h.data(), k_n, h.data());
  par::extract_vocab_activation(l, ref.dout.data(), k_n, dout.data());
  EXPECT_EQ(h, act(ref.h));
  std::vector<float> dwte_shard = shard(ref.dwte0), dwpe = wpe_slice(ref.dwpe0);

  par::VocabParallelWorkspace ws(l, n, k_max_t);
  // Embedding forward: exact.
  std::vector<float> emb(n * l.c_local, NAN);
  par::vocab_embedding_forward(l, comms, emb.data(), ids.data(), wte_shard.data(), wpe.data(), k_n,
                               k_t, ws);
  EXPECT_EQ(emb, act(ref.emb)) << "embedding output";
  par::vocab_embedding_backward(l, comms, dwte_shard.data(), dwpe.data(), dout.data(), ids.data(),
                                k_n, k_t, ws);

  // LM head + cross-entropy.
  par::vocab_lm_head_forward(k_lib, l, comms, h.data(), wte_shard.data(), n, ws);
  std::vector<float> block(l.block_numel);
  par::extract_vocab_weight_block(l, ref.wte.data(), block.data());
  ASSERT_NE(ws.w_used, nullptr);
  EXPECT_EQ(std::vector<float>(ws.w_used, ws.w_used + l.block_numel), block)
      << "gathered weight block";
  std::vector<float> ref_logits(n * l.vocab_local);
  par::extract_vocab_logits(l, ref.logits.data(), k_n, ref_logits.data());
  EXPECT_EQ(ref_logits, logits_slice(ref.logits));
  expect_close(ws.logits, ref_logits, logits_slice(ref.tol_logits), "logits");
  std::vector<float> losses(n, NAN);
  par::vocab_cross_entropy(l, comms, losses.data(), targets.data(), n, true, ref.dloss, ws);
  expect_close(losses, rows(ref.losses), rows(ref.tol_loss), "losses");
  const double mean = par::vocab_mean_loss(comms, losses.data(), targets.data(), n);
  EXPECT_NEAR(mean, ref.mean_loss, ref.tol_mean) << "mean loss";
  expect_close(ws.logits, logits_slice(ref.dlogits), logits_slice(ref.tol_dlogits), "dlogits");
  std::vector<float> dh(n * l.c_local, NAN);
  par::vocab_lm_head_backward(k_lib, l, comms, dh.data(), dwte_shard.data(), n, ws);
  expect_close(dh, act(ref.dh), act(ref.tol_dh), "dh");
  expect_close(dwte_shard, shard(ref.dwte), shard_of(ref.tol_dwte), "dwte shard");
  expect_close(dwpe, wpe_slice(ref.dwpe), wpe_slice(ref.tol_dwpe), "dwpe");
}

class VocabParallelTest : public tessera::test::MpiTest {};

TEST_F(VocabParallelTest, RangesPartitionTheVocabulary) {
  // Over the whole world, for every factorization: the vocab ranges of the {tx, ty} group tile
  // [0, Vp) once per tz index, the shards of a block partition it over tz, real_local counts the
  // ids < V, and each (row, vocab column) of the logits is held by exactly one rank.
  Runtime& rt = runtime();
  for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
    SCOPED_TRACE(fmt::format("tx={} ty={} tz={}", tx, ty, tz));
    std::vector<int> wte_hits(std::size_t(k_vp) * k_c, 0), logit_hits(std::size_t(k_n) * k_vp, 0);
    int real = 0;
    for (int r = 0; r < rt.world_size(); ++r) {
      const Topology topo(GridShape{1, 1, tx, ty, tz}, r);
      const auto l = par::make_vocab_parallel_layout(topo, k_v, k_vp, k_c);
      EXPECT_EQ(l.vocab_parts, tx * ty);
      EXPECT_EQ(l.real_local, std::clamp(k_v - l.vocab_offset, 0, l.vocab_local));
      if (l.tz_index == 0) real += l.real_local;
      for (std::int64_t e = l.shard_offset; e < l.shard_offset + l.shard_numel; ++e)
        ++wte_hits[std::size_t(l.vocab_offset) * k_c + e];
      for (std::int64_t i = 0; i < l.local_rows(k_n); ++i)
        for (int j = 0; j < l.vocab_local; ++j)
          ++logit_hits[(l.row_offset(k_n) + i) * k_vp + l.vocab_offset + j];
    }
    EXPECT_EQ(real, k_v);
    for (std::size_t e = 0; e < wte_hits.size(); ++e) ASSERT_EQ(wte_hits[e], 1) << "wte " << e;
    for (std::size_t e = 0; e < logit_hits.size(); ++e)
      ASSERT_EQ(logit_hits[e], 1) << "logit " << e;
  }
}

TEST_F(VocabParallelTest, RejectsIndivisibleSizes) {
  Runtime& rt = runtime();
  if (rt.world_size() == 1) GTEST_SKIP() << "needs more than one rank";
  const int p = rt.world_size();
  const Topology topo(GridShape{1, 1, p, 1, 1}, rt.world_rank());
  EXPECT_THROW(par::make_vocab_parallel_layout(topo, 100, 128 * p + 1, 16 * p), tessera::Error);
  EXPECT_THROW(par::make_vocab_parallel_layout(topo, 100, 128, p + 1), tessera::Error);
  EXPECT_THROW(par::make_vocab_parallel_layout(topo, 129, 128, 16 * p), tessera::Error);
}

TEST_F(VocabParallelTest, MatchesSingleRankForEveryFactorization) {
  Runtime& rt = runtime();
  const Reference ref(20240611, false);
  for (auto [tx, ty, tz] : factorizations(rt.world_size())) check_grid(rt, tx, ty, tz, ref);
}

TEST_F(VocabParallelTest, IgnoredTargetsMatchSingleRank) {
  Runtime& rt = runtime();
  const Reference ref(77, true);
  for (auto [tx, ty, tz] : factorizations(rt.world_size())) check_grid(rt, tx, ty, tz, ref);
}

TEST_F(VocabParallelTest, NoRankHoldsMoreThanItsLogitsSlice) {
  // The workspace's logits buffer is exactly the rank's (rows x vocab range) slice, N*Vp/(tx*ty*tz)
  // floats, and every other buffer is O(n*C), O(Vr*C) or O(n): for more than one rank none is as
  // large as the full logits (N, Vp).
  Runtime& rt = runtime();
  const std::size_t full = std::size_t(k_n) * k_vp;
  for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
    SCOPED_TRACE(fmt::format("tx={} ty={} tz={}", tx, ty, tz));
    const Topology topo(GridShape{1, 1, tx, ty, tz}, rt.world_rank());
    const auto l = par::make_vocab_parallel_layout(topo, k_v, k_vp, k_c);
    const std::int64_t n = l.local_rows(k_n);
    const par::VocabParallelWorkspace ws(l, n, k_max_t);
    EXPECT_EQ(ws.logits.size(), full / rt.world_size());
    EXPECT_EQ(ws.logits.size(), std::size_t(n) * l.vocab_local);
    const std::size_t act = std::size_t(n) * k_c, blk = std::size_t(l.vocab_local) * k_c;
    EXPECT_EQ(ws.h_full.size(), act);
    EXPECT_EQ(ws.cols.size(), act);
    // without tz the shard is the block, used in place: no copies
    EXPECT_EQ(ws.w_block.size(), tz > 1 ? blk : 0);
    EXPECT_EQ(ws.dw_block.size(), tz > 1 ? blk : 0);
    EXPECT_EQ(ws.dw_shard.size(), tz > 1 ? std::size_t(l.shard_numel) : 0);
    EXPECT_EQ(ws.row_max.size(), std::size_t(n));
    EXPECT_EQ(ws.row_sums.size(), 2 * std::size_t(n));
    EXPECT_EQ(ws.dwpe.size(), std::size_t(k_max_t) * l.c_local);
    if (rt.world_size() > 1) {
      EXPECT_LT(ws.logits.size(), full);
    }
  }
}

}  // namespace
