// Communication volume of the tensor-parallel model: the bytes each rank sends per
// axis in one forward + backward, read from the collective log (comm::CollectiveLog::volumes()),
// equal the analytic volumes, for every factorization tx*ty*tz of the world size, with and
// without recomputation, and in sequence-parallel mode on 1D grids.
//
// The analytic model is AxoNN's (docs/performance-model.md), per rank, ring
// algorithms: an all-reduce of m bytes over p ranks sends 2(p-1)/p m, an all-gather or
// reduce-scatter of a full buffer of m bytes sends (p-1)/p m. With Gc = tx, Gr = ty, Gd = tz,
// n = B*T/Gd local rows, H = n_embd, R = 1 with recomputation (else 0), per block of 4 linears
// (K = 3 normal: QKV; K = 1 transposed: attention out; K = 4 normal: MLP up; K = 4 transposed:
// MLP down):
//   normal K:      tx: (1+R) AR of n*K*H/Gr    (the partial outputs; again in the recompute)
//                  ty: AR of n*H/Gc            (the input gradient)
//   transposed K:  ty: (1+R) AR of n*H/Gc,  tx: AR of n*K*H/Gr   (roles swapped)
//   every linear:  tz: per layer, AG of the block K*H*H/(Gc*Gr) in the forward and RS of its
//                  gradient, and the bias-gradient AR (K*H/Gr normal, H/Gc transposed); then the
//                  gather again before the backward (and the recompute) of all but the S layers
//                  whose blocks are still in a workspace (S = 2 with overlap, 1 without;
//                  tensor_model.hpp): (L - min(L, S)) more AGs. §2.4 counts 3 per layer, i.e.
//                  no cache (the recompute gather serves the backward here, so R adds none).
// plus what the §2.4 model leaves out and this implementation adds (documented in
// tensor_layernorm.hpp and vocab_parallel.hpp):
//   LayerNorm (2 per block, run 1+R times in forward, and ln_f): tx: two ARs of n floats per
//   forward, one AR of 2n per backward; tz: AR of the 2*H/Gc parameter gradients per backward.
//   embedding / LM head (Vr = Vp/(Gc*Gr)): tz: 4 AG/RS of the Vr*H block (two gathers, two
//   gradient reduce-scatters), AR of T*H/Gc (wpe), AR of 2 doubles (the mean loss);
//   tx: 4 AG/RS of n*H (lookups, their gradient, h, dh); ty: 2 AR of n*H/Gc;
//   {tx,ty}: AR of n doubles (row max) and of 2n floats (sum of exp, target logit).
// Sequence parallelism (1D: Gr = Gd = 1; tensor_model.hpp) replaces the linears' all-reduces by
// reduce-scatters and all-gathers of full (n, K*H) buffers: forward, per block, RS of the qkv and
// fc outputs (3nH, 4nH) and AG of the attention and GELU outputs (nH, 4nH), 12nH in all (again in
// the recompute); backward, AG of the GELU output again (4nH), RS of its gradient (4nH), AG of the
// fc output gradient (4nH), AG of the attention output again (nH), RS of its gradient (nH), AG of
// the qkv gradient (3nH): 17nH. Each moves (Gc-1)/Gc of its buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mpi_env.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/tensor_model.hpp"

namespace {

using tessera::comm::GridShape;
using tessera::comm::Topology;
namespace model = tessera::model;
namespace par = tessera::parallel;
using tessera::test::factorizations;

class TensorVolumeTest : public tessera::test::MpiTest {};

std::map<std::string, double> analytic(const model::ModelConfig& c, int tx, int ty, int tz, int B,
                                       int T, bool recompute, bool sp, int S) {
  const double Gc = tx, Gr = ty, Gd = tz, H = c.n_embd, L = c.n_layer, R = recompute ? 1 : 0;
  const double n = static_cast<double>(B) * T / Gd;
  const double Vr = static_cast<double>(c.padded_vocab()) / (Gc * Gr);
  auto ar = [](double p) { return 2.0 * (p - 1) / p; };
  auto ag = [](double p) { return (p - 1) / p; };
  const double f = 4.0;  // bytes per float
  std::map<std::string, double> v;
  for (int l = 0; l < c.n_layer && sp; ++l) v["tx"] += ((1 + R) * 12 + 17) * n * H * ag(Gc) * f;
  for (int l = 0; l < c.n_layer && !sp; ++l) {
    for (auto [K, transposed] : {std::pair{3.0, false}, {1.0, true}, {4.0, false}, {4.0, true}}) {
      if (!transposed) {
        v["tx"] += (1 + R) * ar(Gc) * n * K * H / Gr * f;
        v["ty"] += ar(Gr) * n * H / Gc * f;
        v["tz"] += ar(Gd) * K * H / Gr * f;
      } else {
        v["ty"] += (1 + R) * ar(Gr) * n * H / Gc * f;
        v["tx"] += ar(Gc) * n * K * H / Gr * f;
        v["tz"] += ar(Gd) * H / Gc * f;
      }
      v["tz"] += 2 * ag(Gd) * K * H * H / (Gc * Gr) * f;
      if (l == 0) v["tz"] += (L - std::min(L, double(S))) * ag(Gd) * K * H * H / (Gc * Gr) * f;
    }
  }
  const double ln_forward = 2 * L * (1 + R) + 1, ln_backward = 2 * L + 1;
  v["tx"] += ln_forward * 2 * ar(Gc) * n * f + ln_backward * ar(Gc) * 2 * n * f;
  v["tz"] += ln_backward * ar(Gd) * 2 * H / Gc * f;
  v["tz"] += 4 * ag(Gd) * Vr * H * f + ar(Gd) * T * H / Gc * f + ar(Gd) * 2 * 8;
  v["tx"] += 4 * ag(Gc) * n * H * f;
  v["ty"] += 2 * ar(Gr) * n * H / Gc * f;
  v["tx+ty"] += ar(Gc * Gr) * (n * 8 + 2 * n * f);
  return v;
}

TEST_F(TensorVolumeTest, BytesPerAxisEqualTheAnalyticModel) {
  const int world = runtime().world_size();
  model::ModelConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head = 8;
  cfg.n_embd = 32;
  cfg.block_size = 8;
  cfg.vocab_size = 100;
  const model::ParamLayout layout(cfg);
  const int B = 8, T = 8;
  std::vector<std::int32_t> x(B * T), y(B * T);
  for (int i = 0; i < B * T; ++i)
    x[i] = (i * 37) % cfg.vocab_size, y[i] = (i * 11) % cfg.vocab_size;
  std::vector<float> params(layout.total());
  model::init_params(layout, params.data(), 5);
  model::ForwardOptions fo;
  fo.training = true;
  fo.dloss = 1.0f / (B * T);

  for (auto [tx, ty, tz] : factorizations(world))
    for (int variant = 0; variant < 6; ++variant) {
      const bool recompute = variant % 2 == 1, sp = variant >= 4, overlap = variant < 2;
      if (sp && (ty != 1 || tz != 1)) continue;
      SCOPED_TRACE(fmt::format("tx={} ty={} tz={} recompute={} sp={} overlap={}", tx, ty, tz,
                               recompute, sp, overlap));
      Topology topo(GridShape{1, 1, tx, ty, tz}, runtime().world_rank());
      par::TensorModelOptions opt;
      opt.recompute = recompute;
      opt.sequence_parallel = sp;
      opt.overlap_dx = opt.defer_dw = opt.prefetch = overlap;
      par::TensorModel tm(cfg, topo, runtime(), opt);
      std::vector<float> lp(tm.local_layout().total()), lg(lp.size(), 0.0f);
      tm.extract(params.data(), lp.data());
      model::FlatStore store(tm.local_layout(), lp.data(), lg.data());
      runtime().world().barrier();
      runtime().log().reset_volumes();
      tm.forward(store, x.data(), y.data(), B, T, fo);
      tm.backward(store, x.data(), B, T, fo.gemm);
      std::map<std::string, double> got;
      for (const auto& [key, vol] : runtime().log().volumes()) got[key.first] += vol.wire_bytes;
      const auto want = analytic(cfg, tx, ty, tz, B, T, recompute, sp, overlap ? 2 : 1);
      for (const auto& [group, bytes] : got) {
        if (bytes == 0) continue;
        ASSERT_TRUE(want.count(group)) << "unexpected traffic on " << group << ": " << bytes;
      }
      for (const auto& [group, bytes] : want)
        EXPECT_NEAR(got[group], bytes, 1e-9 * bytes + 1e-9) << "group " << group;
    }
}

}  // namespace
