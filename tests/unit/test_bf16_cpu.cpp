// bf16 mixed precision on the CPU (model/cpu_ops.hpp's CpuBf16Ops, train.precision = "bf16"):
// the bf16 GEMM against a double reference, the model fixtures against PyTorch's fp32 logits and
// gradients, a short training run against the fp32 run, and resume.
//
// Bounds. bf16 keeps 8 significant bits (7 stored): rounding to nearest has a relative error of
// at most u = 2^-8 per element (half an ulp of 2^-7). Only GEMM operands are rounded here (the
// activations and output gradients a linear reads, and the weights' bf16 copy); products and sums
// are fp32, and norms, attention, GELU/SwiGLU, the loss and every gradient outside the GEMMs stay
// fp32.
//  - One GEMM: each product a_k b_k of two rounded factors carries a relative error of at most
//    2u, so an output element is off by at most 2u sum_k |a_k b_k| (the fp32 sum's own error,
//    ~sqrt(K) 2^-24, is far smaller). The rounding errors are independent, uniform over half an
//    ulp (RMS ~0.4u per factor, ~0.6u per product), so normwise over an output tensor whose sums
//    do not cancel the relative error is ~0.6u: the sqrt(K) of the random terms against the
//    sqrt(K) growth of the sum.
//  - The forward: two layers of four GEMMs and the head, in sequence, 9 GEMMs. The fp32 residual
//    stream and the normalisations keep their errors additive (in quadrature if independent:
//    ~sqrt(9) 0.6u ~ 2u), not multiplicative; the worst case of every rounding aligned is
//    9 * 2u = 18u. The bound is 8u = 2^-5 = 3.1e-2 normwise relative for the logits and relative
//    for the loss (the GPU's bf16 bound, tests/gpu/test_gpu_model.cpp, whose path rounds more
//    tensors than this one): 4x the expected error.
//  - Gradients: the backward has two GEMMs per forward GEMM, each of two rounded operands that
//    carry the forward's error already (the output gradient through the softmax and the head):
//    twice the forward bound, 16u = 6.3e-2 normwise relative per tensor.
//  - Training: each step's loss is the forward's loss at slightly different parameters; over 20
//    AdamW steps at lr 1e-2 the fp32 and bf16 trajectories stay close (Adam's update is bounded
//    by ~lr per element whatever the gradient's scale), and each step's loss is held to the
//    forward's bound, 8u = 3.1e-2 relative.
// A wrong kernel (a transposed operand, a lost bias, a missing accumulation) gives O(1) errors.
// The measured errors are printed. None of the bounds depends on the thread count or the ISA
// (native AVX-512 BF16/AMX, or the emulation under ONEDNN_MAX_CPU_ISA=AVX2): those change only
// the order of the fp32 sums (and, in training, which values fall on the other side of a bf16
// rounding boundary, one ulp each).
#include <gtest/gtest.h>

#include <array>

#include <unistd.h>
#include <array>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/trainer.hpp"

#include "hf_fixture.hpp"
#include "token_shards.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

constexpr double k_u = 0x1p-8;  // bf16's unit roundoff (round to nearest)

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

// Round to nearest even, NaN kept, and the widening exact.
TEST(Bf16Cpu, RoundingToNearestEven) {
  using kernels::cpu::bf16_to_fp32;
  using kernels::cpu::fp32_to_bf16;
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: to even
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: to even
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(-2.5f)), -2.5f);
  Rng rng(3);
  for (int i = 0; i < 1000; ++i) {
    const float x = rng.normal() * 100.0f;
    EXPECT_LE(std::fabs(bf16_to_fp32(fp32_to_bf16(x)) - x), k_u * std::fabs(x));
  }
}

// Every transpose combination, alpha and beta, against a double reference on the rounded
// operands: only the fp32 accumulation differs (K 2^-24 relative to sum |a b|, bounded by 1e-5).
// The second shape spans several of the emulation's 1024 x 1024 blocks of C, the third several
// blocks of K, the last ones partial (on CPUs without native bf16; natively each is one oneDNN
// call).
class Bf16Gemm : public ::testing::TestWithParam<std::array<std::int64_t, 3>> {};
TEST_P(Bf16Gemm, MatchesDoubleReferenceOnRoundedOperands) {
  // not a structured binding: the lambdas below capture the sizes (clang 14 cannot capture one)
  const std::int64_t M = GetParam()[0], N = GetParam()[1], K = GetParam()[2];
  Rng rng(11);
  std::vector<std::uint16_t> a(M * K), b(K * N);
  std::vector<float> c0(M * N);
  for (auto& x : a) x = kernels::cpu::fp32_to_bf16(rng.normal());
  for (auto& x : b) x = kernels::cpu::fp32_to_bf16(rng.normal());
  for (auto& x : c0) x = rng.normal();
  auto A = [&](bool t, std::int64_t i, std::int64_t k) {
    return double(kernels::cpu::bf16_to_fp32(t ? a[k * M + i] : a[i * K + k]));
  };
  auto B = [&](bool t, std::int64_t k, std::int64_t j) {
    return double(kernels::cpu::bf16_to_fp32(t ? b[j * K + k] : b[k * N + j]));
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> c = c0;
        const float alpha = 0.5f;
        kernels::gemm_bf16(ta, tb, M, N, K, alpha, a.data(), ta ? M : K, b.data(), tb ? K : N, beta,
                           c.data(), N);
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double s = 0, mag = 0;
            for (std::int64_t k = 0; k < K; ++k) {
              s += A(ta, i, k) * B(tb, k, j);
              mag += std::fabs(A(ta, i, k) * B(tb, k, j));
            }
            const double want = alpha * s + beta * double(c0[i * N + j]);
            ASSERT_NEAR(c[i * N + j], want, 1e-5 * (mag + std::fabs(c0[i * N + j])))
                << "trans_a " << ta << " trans_b " << tb << " beta " << beta << " at " << i << ","
                << j;
          }
      }
}
INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Gemm,
                         ::testing::Values(std::array<std::int64_t, 3>{37, 29, 70},
                                           std::array<std::int64_t, 3>{1100, 2100, 9},
                                           std::array<std::int64_t, 3>{5, 7, 2500}));

// The fixtures in bf16 against PyTorch's fp32 logits, loss and every gradient.
class Bf16Fixture : public ::testing::TestWithParam<const char*> {};

TEST_P(Bf16Fixture, LogitsLossAndGradientsWithinBf16Bounds) {
  const fs::path dir = fs::path(TESSERA_FIXTURES) / GetParam();
  if (!fs::exists(dir / "expected.safetensors")) GTEST_SKIP() << "fixture missing";
  auto loaded = io::load_model(dir);
  const auto expected = io::SafetensorsFile::open(dir / "expected.safetensors");
  constexpr int B = 2, T = 8;
  const auto tok = expected.read_i64("tokens");  // (B, T+1)
  std::vector<std::int32_t> inputs, targets;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      inputs.push_back(static_cast<std::int32_t>(tok[b * (T + 1) + t]));
      targets.push_back(static_cast<std::int32_t>(tok[b * (T + 1) + t + 1]));
    }
  const auto& cfg = loaded.config;
  model::ParamLayout layout(cfg);
  Buffer<std::uint16_t> p16(layout.total());  // the bf16 copy of the fp32 masters
  kernels::cpu::to_bf16(p16.data(), loaded.params.data(),
                        static_cast<std::int64_t>(layout.total()));
  model::Activations acts;
  model::ForwardOptions opt;
  opt.bf16_params = p16.data();

  const float loss =
      model::forward(layout, loaded.params.data(), acts, inputs.data(), targets.data(), B, T, opt);
  const float want_loss = expected.read_f32("loss")[0];
  EXPECT_NEAR(loss, want_loss, 8 * k_u * std::fabs(want_loss));
  const auto want_logits = expected.read_f32("logits");  // (B,T,V)
  std::vector<float> logits;
  for (int i = 0; i < B * T; ++i)
    for (int v = 0; v < cfg.vocab_size; ++v)
      logits.push_back(acts.at(acts.logits)[i * cfg.padded_vocab() + v]);
  const double logit_err = rel_error(logits, want_logits);
  EXPECT_LT(logit_err, 8 * k_u);

  Buffer<float> grads(layout.total());
  opt.training = true;
  opt.dloss = 1.0f / (B * T);
  model::forward(layout, loaded.params.data(), acts, inputs.data(), targets.data(), B, T, opt);
  model::backward(layout, loaded.params.data(), grads.data(), acts, inputs.data(), B, T, opt.gemm,
                  nullptr, nullptr, p16.data());
  double worst = 0;
  for (const auto& t : layout.tensors()) {
    const double e = rel_error(to_hf(t, cfg, grads.data()), expected.read_f32("grad." + t.name));
    worst = std::max(worst, e);
    EXPECT_LT(e, 16 * k_u) << "grad." << t.name;
  }
  for (std::size_t i = std::size_t(cfg.vocab_size) * cfg.n_embd;
       i < std::size_t(cfg.padded_vocab()) * cfg.n_embd; ++i)
    ASSERT_EQ(grads[layout.head + i], 0.0f) << "padded vocabulary rows get no gradient";
  std::printf(
      "[ %s bf16 ] loss %.6f (torch %.6f), logits rel err %.3g (bound %.3g), worst "
      "gradient rel err %.3g (bound %.3g)\n",
      GetParam(), loss, want_loss, logit_err, 8 * k_u, worst, 16 * k_u);
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16Fixture,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "llama_tiny_tied"),
                         [](const auto& info) { return std::string(info.param); });

namespace {

fs::path make_data(const std::string& name) {
  return tessera::test_data::write_structured_shards(
      fs::temp_directory_path() /
      ("tessera_bf16_train_" + name + "_" + std::to_string(::getpid())));
}

train::RunConfig config(const fs::path& data, const std::string& family,
                        const std::string& precision, const fs::path& out) {
  const std::string toml =
      "[model]\nfamily = \"" + family +
      "\"\nn_layer = 2\nn_head = 2\nn_embd = 64\nblock_size = 64\nvocab_size = 500\n"
      "[data]\ntrain = \"" +
      (data / "train.bin").string() + "\"\nval = \"" + (data / "val.bin").string() +
      "\"\n"
      "[train]\nbatch_size = 4\nseq_len = 32\ngrad_accum = 2\nsteps = 20\n"
      "lr = 1e-2\nwarmup_steps = 5\nval_every = 0\nckpt_every = 10\n"
      "log_every = 100\nout_dir = \"" +
      out.string() + "\"\nprecision = \"" + precision +
      "\"\n[sample]\ntokens = 0\n[hardware]\npeak_tflops = 1\n";
  return train::parse_run_config(toml, "test", {});
}

train::TrainSummary train_run(const train::RunConfig& cfg, bool resume = false,
                              std::int64_t stop_at = 0) {
  auto rt = comm::Runtime::create();
  train::TrainOptions opt;
  opt.quiet = true;
  opt.overwrite = !resume;
  opt.resume = resume;
  opt.stop_at = stop_at;
  return train::run_training(cfg, opt, *rt);
}

}  // namespace

// 20 steps (2 micro-batches each) in bf16 against the same run in fp32, both families.
TEST(Bf16Cpu, TrainingLossesFollowFp32WithinBf16Bound) {
  const fs::path data = make_data("vs_fp32");
  for (const std::string family : {"gpt2", "llama"}) {
    const auto f32 = train_run(config(data, family, "fp32", data / (family + "_fp32")));
    const auto b16 = train_run(config(data, family, "bf16", data / (family + "_bf16")));
    ASSERT_EQ(f32.losses.size(), 20u);
    ASSERT_EQ(b16.losses.size(), 20u);
    double worst = 0;
    for (std::size_t i = 0; i < f32.losses.size(); ++i) {
      const double e = std::fabs(b16.losses[i] - f32.losses[i]) / f32.losses[i];
      worst = std::max(worst, e);
      EXPECT_LT(e, 8 * k_u) << family << " step " << i + 1;
    }
    EXPECT_LT(b16.losses.back(), b16.losses.front()) << family << ": bf16 learns";
    std::printf(
        "[ %s trainer bf16 ] loss %.4f -> %.4f (fp32 %.4f -> %.4f), worst rel diff %.3g "
        "(bound %.3g)\n",
        family.c_str(), b16.losses.front(), b16.losses.back(), f32.losses.front(),
        f32.losses.back(), worst, 8 * k_u);
  }
  fs::remove_all(data);
}

// A bf16 run stopped at step 10 and resumed continues bit-exactly: the checkpoint holds the fp32
// masters and moments, and the bf16 copy is rebuilt from them as after every step.
TEST(Bf16Cpu, ResumeIsBitExact) {
  const fs::path data = make_data("resume");
  const auto whole = train_run(config(data, "gpt2", "bf16", data / "whole"));
  const auto cfg = config(data, "gpt2", "bf16", data / "split");
  train_run(cfg, false, 10);
  const auto rest = train_run(cfg, true);
  ASSERT_EQ(whole.losses.size(), 20u);
  ASSERT_EQ(rest.losses.size(), 10u);
  for (std::size_t i = 0; i < 10; ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(rest.losses[i]),
              std::bit_cast<std::uint32_t>(whole.losses[10 + i]))
        << "step " << 11 + i;
  const model::ParamLayout layout(train::model_config(cfg));
  Buffer<float> pa(layout.total()), ma(layout.total()), va(layout.total());
  Buffer<float> pb(layout.total()), mb(layout.total()), vb(layout.total());
  io::load_checkpoint(data / "whole/checkpoints/step_00000020", layout, pa.data(), ma.data(),
                      va.data());
  io::load_checkpoint(data / "split/checkpoints/step_00000020", layout, pb.data(), mb.data(),
                      vb.data());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.bytes()), 0);
  EXPECT_EQ(std::memcmp(ma.data(), mb.data(), ma.bytes()), 0);
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.bytes()), 0);
  fs::remove_all(data);
}
