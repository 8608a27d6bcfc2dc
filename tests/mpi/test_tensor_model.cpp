// The whole GPT-2 model on the tensor grid (src/tessera/parallel/tensor_model.hpp) against the
// single-process model (model::forward / model::backward), under mpirun with 2, 4 and 8 ranks, for
// every factorization tx*ty*tz of the world size:
//  - the local -> global map covers every global parameter exactly once among the owners;
//  - the loss of a training forward equals the single-process loss (relative 1e-5);
//  - the gradients assembled from the owners equal the single-process gradients, tensor by
//    tensor, within 1e-4 of the tensor's largest entry (both are fp32 evaluations of the same
//    sums in different orders; see test_tensor_attention.cpp for the per-layer bound), and every
//    replica of a replicated gradient equals its owner's copy;
//  - with recomputation the gradients are bitwise those without it;
//  - the same holds in sequence-parallel mode (1D grids: tx only);
//  - all of it for a llama model (RMSNorm, RoPE, SwiGLU, 4 query heads on 2 kv heads, untied head)
//    on every factorization whose ty divides the kv heads: the fused q|k|v and gate|up rows are
//    permuted whole (exact), RoPE and SwiGLU are per element, so the bounds are GPT-2's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "mpi_env.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/tensor_model.hpp"

namespace {

using tessera::comm::GridShape;
using tessera::comm::Topology;
namespace model = tessera::model;
namespace par = tessera::parallel;
using tessera::test::factorizations;

class TensorModelTest : public tessera::test::MpiTest {};

model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.n_layer = 3;
  c.n_head = 8;
  c.n_embd = 32;
  c.block_size = 8;
  c.vocab_size = 100;  // padded to 128: the last vocabulary ranges hold padding
  return c;
}

struct Batch {
  int B = 8, T = 8;
  std::vector<std::int32_t> x, y;
};

Batch make_batch(const model::ModelConfig& c) {
  Batch b;
  tessera::Rng rng(11);
  const int N = b.B * b.T;
  b.x.resize(N);
  b.y.resize(N);
  for (int i = 0; i < N; ++i) {
    b.x[i] = static_cast<std::int32_t>(rng.uniform() * c.vocab_size) % c.vocab_size;
    b.y[i] = i % 7 == 3 ? -1
                        : static_cast<std::int32_t>(rng.uniform() * c.vocab_size) %
                              c.vocab_size;  // some ignored targets
  }
  return b;
}

// The single-process loss and gradients of a training forward + backward, computed on every rank.
struct Reference {
  std::vector<float> params, grads;
  float loss = 0;
  model::ForwardOptions fo;
};

Reference make_reference(const model::ParamLayout& layout, const Batch& batch) {
  Reference r;
  r.params.resize(layout.total());
  r.grads.assign(layout.total(), 0.0f);
  model::init_params(layout, r.params.data(), 1234);
  // Larger than GPT-2's 0.02 so that every path carries a visible gradient.
  for (float& p : r.params) p *= 5.0f;
  model::Activations acts;
  r.fo.training = true;
  r.fo.dloss = 1.0f / static_cast<float>(batch.B * batch.T);
  r.loss = model::forward(layout, r.params.data(), acts, batch.x.data(), batch.y.data(), batch.B,
                          batch.T, r.fo);
  model::backward(layout, r.params.data(), r.grads.data(), acts, batch.x.data(), batch.B, batch.T,
                  r.fo.gemm);
  return r;
}

// Each tensor of `full` within 1e-4 of the reference tensor's largest entry.
void expect_grads_close(const model::ParamLayout& layout, const std::vector<float>& full,
                        const std::vector<float>& ref) {
  for (const auto& t : layout.tensors()) {
    double scale = 0.0, err = 0.0;
    for (std::size_t j = 0; j < t.numel; ++j) {
      scale = std::max(scale, static_cast<double>(std::fabs(ref[t.offset + j])));
      err = std::max(err, static_cast<double>(std::fabs(full[t.offset + j] - ref[t.offset + j])));
    }
    EXPECT_GT(scale, 0.0) << t.name << ": the reference gradient is zero";
    EXPECT_LE(err, 1e-4 * scale) << t.name;
  }
}

model::ModelConfig tiny_llama_config() {
  model::ModelConfig c = tiny_config();
  c.family = model::Family::Llama;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 48;
  c.tie_embeddings = false;
  return c;
}

void check_every_factorization(tessera::comm::Runtime& rt, const model::ModelConfig& cfg);

TEST_F(TensorModelTest, MatchesSingleProcessForEveryFactorization) {
  check_every_factorization(runtime(), tiny_config());
}

TEST_F(TensorModelTest, LlamaMatchesSingleProcessForEveryFactorizationTheHeadsAllow) {
  check_every_factorization(runtime(), tiny_llama_config());
}

void check_every_factorization(tessera::comm::Runtime& rt, const model::ModelConfig& cfg) {
  const int world = rt.world_size();
  const model::ParamLayout layout(cfg);
  const Batch batch = make_batch(cfg);
  const Reference ref = make_reference(layout, batch);
  const auto& params = ref.params;
  const auto& fo = ref.fo;
  const float ref_loss = ref.loss;

  for (auto [tx, ty, tz] : factorizations(world)) {
    if (cfg.n_head % ty != 0 || cfg.kv_heads() % ty != 0) continue;  // heads split over ty
    SCOPED_TRACE(fmt::format("tx={} ty={} tz={}", tx, ty, tz));
    Topology topo(GridShape{1, 1, tx, ty, tz}, rt.world_rank());
    std::vector<float> first_grads;
    for (int variant = 0; variant < 4; ++variant) {
      const bool recompute = variant % 2 == 1, sp = variant >= 2;
      if (sp && (ty != 1 || tz != 1)) continue;  // sequence parallelism: 1D mode only
      SCOPED_TRACE(fmt::format("recompute={} sequence_parallel={}", recompute, sp));
      par::TensorModelOptions opt;
      opt.recompute = recompute;
      opt.sequence_parallel = sp;
      // overlap on for the first pass of each mode, off for the recompute pass: both must give
      // the same gradients bitwise (overlap only moves when communication happens)
      opt.overlap_dx = opt.defer_dw = opt.prefetch = !recompute;
      par::TensorModel tm(cfg, topo, rt, opt);
      const auto& local = tm.local_layout();

      // Coverage: among the owners, every element of every global tensor exactly once.
      std::vector<float> count(layout.total(), 0.0f);
      const auto index = tm.global_index();
      for (std::size_t i = 0; i < index.size(); ++i) {
        const std::int64_t g = index[i];
        if (tm.owner_mask()[i]) {
          ASSERT_GE(g, 0);
          count[g] += 1.0f;
        }
      }
      rt.world().all_reduce_sum(count.data(), count.size());
      for (const auto& t : layout.tensors())
        for (std::size_t j = 0; j < t.numel; ++j)
          ASSERT_EQ(count[t.offset + j], 1.0f) << t.name << " element " << j;

      std::vector<float> lp(local.total()), lg(local.total(), 0.0f);
      tm.extract(params.data(), lp.data());
      model::FlatStore store(local, lp.data(), lg.data());
      const float loss = tm.forward(store, batch.x.data(), batch.y.data(), batch.B, batch.T, fo);
      tm.backward(store, batch.x.data(), batch.B, batch.T, fo.gemm);
      EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));

      std::vector<float> full(layout.total());
      tm.gather_full(lg.data(), full.data());
      expect_grads_close(layout, full, ref.grads);
      // Replicas hold the owner's value.
      std::vector<float> back(local.total());
      tm.extract(full.data(), back.data());
      for (std::size_t i = 0; i < back.size(); ++i)
        ASSERT_EQ(back[i], lg[i]) << "local element " << i << " (global " << index[i] << ")";
      if (variant == 0 || variant == 2)
        first_grads = lg;
      else
        EXPECT_TRUE(first_grads == lg) << "recomputation changed the gradients";
    }
  }
}

}  // namespace

namespace {

// With GEMM layout tuning the linears may compute their products in another form (another order
// of fp32 additions): the loss and gradients stay within the same bounds, and the tuner has a
// choice for every linear GEMM shape it met.
TEST_F(TensorModelTest, GemmTuningKeepsTheNumbers) {
  const int world = runtime().world_size();
  const auto cfg = tiny_config();
  const model::ParamLayout layout(cfg);
  const Batch batch = make_batch(cfg);
  const Reference ref = make_reference(layout, batch);
  const auto& params = ref.params;
  const auto& fo = ref.fo;
  const float ref_loss = ref.loss;
  const int tx = world >= 4 ? 2 : 1, ty = world / tx;  // a 2D grid where the world allows it
  Topology topo(GridShape{1, 1, tx, ty, 1}, runtime().world_rank());
  par::TensorModelOptions opt;
  opt.tune_gemm = true;
  par::TensorModel tm(cfg, topo, runtime(), opt);
  std::vector<float> lp(tm.local_layout().total()), lg(lp.size(), 0.0f);
  tm.extract(params.data(), lp.data());
  model::FlatStore store(tm.local_layout(), lp.data(), lg.data());
  const float loss = tm.forward(store, batch.x.data(), batch.y.data(), batch.B, batch.T, fo);
  tm.backward(store, batch.x.data(), batch.B, batch.T, fo.gemm);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
  std::vector<float> full(layout.total());
  tm.gather_full(lg.data(), full.data());
  expect_grads_close(layout, full, ref.grads);
  ASSERT_NE(tm.gemm_tuner(), nullptr);
  // qkv, proj, fc, fcproj x (forward, dX, dW); shapes may coincide, at least 3 distinct
  EXPECT_GE(tm.gemm_tuner()->cache_size(), 3u);
}

}  // namespace

namespace {

// bf16 mixed precision on the grid (TensorModelOptions::bf16) against the single-process bf16
// model (model::forward with the bf16 copy: model/cpu_ops.hpp's CpuBf16Ops), llama (no biases:
// both round exactly the same GEMM operands, elementwise). A rank's operands are slices of the
// single process's; only the order of fp32 sums differs (~1e-7 relative), which moves the few
// operands within 1e-7 of a rounding boundary by one bf16 ulp (a fraction ~3e-5 of them). The
// loss moves by far less than 1e-5 relative; bf16 itself moves it by ~1e-3 relative from fp32
// (the fp32 model is printed beside it: the bound tells the two precisions apart). Gradients:
// within 2^-8 (one bf16 rounding) of each tensor's largest entry.
TEST_F(TensorModelTest, Bf16MatchesSingleProcessBf16ForEveryFactorization) {
  auto& rt = runtime();
  const auto cfg = tiny_llama_config();
  const model::ParamLayout layout(cfg);
  const Batch batch = make_batch(cfg);
  Reference ref = make_reference(layout, batch);  // fp32: the parameters and the distance
  std::vector<std::uint16_t> p16(layout.total());
  tessera::kernels::cpu::to_bf16(p16.data(), ref.params.data(),
                                 static_cast<std::int64_t>(p16.size()));
  model::ForwardOptions fo = ref.fo;
  fo.bf16_params = p16.data();
  std::vector<float> g16(layout.total(), 0.0f);
  model::Activations acts;
  const float loss16 = model::forward(layout, ref.params.data(), acts, batch.x.data(),
                                      batch.y.data(), batch.B, batch.T, fo);
  model::backward(layout, ref.params.data(), g16.data(), acts, batch.x.data(), batch.B, batch.T,
                  fo.gemm, nullptr, nullptr, p16.data());
  for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
    if (cfg.n_head % ty != 0 || cfg.kv_heads() % ty != 0) continue;
    for (const bool sp : {false, true}) {
      if (sp && (ty != 1 || tz != 1)) continue;
      SCOPED_TRACE(fmt::format("tx={} ty={} tz={} sequence_parallel={}", tx, ty, tz, sp));
      par::TensorModelOptions opt;
      opt.bf16 = true;
      opt.sequence_parallel = sp;
      par::TensorModel tm(cfg, Topology(GridShape{1, 1, tx, ty, tz}, rt.world_rank()), rt, opt);
      std::vector<float> lp(tm.local_layout().total()), lg(lp.size(), 0.0f);
      tm.extract(ref.params.data(), lp.data());
      model::FlatStore store(tm.local_layout(), lp.data(), lg.data());
      const float loss =
          tm.forward(store, batch.x.data(), batch.y.data(), batch.B, batch.T, ref.fo);
      tm.backward(store, batch.x.data(), batch.B, batch.T, ref.fo.gemm);
      EXPECT_NEAR(loss, loss16, 1e-5 * std::fabs(loss16));
      if (rt.world_rank() == 0)
        std::printf(
            "[ tx=%d ty=%d tz=%d sp=%d ] bf16 loss %.7f, single-process bf16 %.7f, fp32 %.7f\n", tx,
            ty, tz, sp, loss, loss16, ref.loss);
      std::vector<float> full(layout.total());
      tm.gather_full(lg.data(), full.data());
      for (const auto& t : layout.tensors()) {
        double scale = 0, err = 0;
        for (std::size_t j = 0; j < t.numel; ++j) {
          scale = std::max(scale, static_cast<double>(std::fabs(g16[t.offset + j])));
          err =
              std::max(err, static_cast<double>(std::fabs(full[t.offset + j] - g16[t.offset + j])));
        }
        EXPECT_LE(err, 0x1p-8 * scale) << t.name;
      }
    }
  }
}

}  // namespace

namespace {

// The logits of an evaluation forward read back from the grid (TensorModel::logits_row, what the
// trainer samples from) equal the single-process logits, both families, every factorization (and
// sequence parallelism): the same sums in another order, 1e-5 of the row's largest logit.
TEST_F(TensorModelTest, LogitsRowsEqualSingleProcessLogits) {
  auto& rt = runtime();
  for (const auto& cfg : {tiny_config(), tiny_llama_config()}) {
    const model::ParamLayout layout(cfg);
    const Batch batch = make_batch(cfg);
    const Reference ref = make_reference(layout, batch);
    model::Activations acts;
    model::ForwardOptions eval_opt;
    model::forward(layout, ref.params.data(), acts, batch.x.data(), nullptr, batch.B, batch.T,
                   eval_opt);
    const int Vp = cfg.padded_vocab(), V = cfg.vocab_size;
    for (auto [tx, ty, tz] : factorizations(rt.world_size())) {
      if (cfg.n_head % ty != 0 || cfg.kv_heads() % ty != 0) continue;
      for (const bool sp : {false, true}) {
        if (sp && (ty != 1 || tz != 1)) continue;
        SCOPED_TRACE(fmt::format("{} tx={} ty={} tz={} sp={}", cfg.llama() ? "llama" : "gpt2", tx,
                                 ty, tz, sp));
        par::TensorModelOptions opt;
        opt.sequence_parallel = sp;
        par::TensorModel tm(cfg, Topology(GridShape{1, 1, tx, ty, tz}, rt.world_rank()), rt, opt);
        EXPECT_EQ(batch.B % tm.min_batch(), 0);
        std::vector<float> lp(tm.local_layout().total()), lg(lp.size(), 0.0f);
        tm.extract(ref.params.data(), lp.data());
        model::FlatStore store(tm.local_layout(), lp.data(), lg.data());
        tm.forward(store, batch.x.data(), nullptr, batch.B, batch.T, eval_opt);
        tm.end_forward(0, 0);
        std::vector<float> row(V);
        for (const std::int64_t r :
             {std::int64_t{0}, std::int64_t{batch.T - 1}, std::int64_t{batch.B} * batch.T - 1}) {
          tm.logits_row(r, row.data());
          const float* want = acts.at(acts.logits) + r * Vp;
          double scale = 0, err = 0;
          for (int j = 0; j < V; ++j) {
            scale = std::max(scale, static_cast<double>(std::fabs(want[j])));
            err = std::max(err, static_cast<double>(std::fabs(row[j] - want[j])));
          }
          EXPECT_LE(err, 1e-5 * scale) << "row " << r;
        }
      }
    }
  }
}

}  // namespace
