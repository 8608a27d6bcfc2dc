// The GPT-2 model on the GPU (model/gpt_device.hpp) against PyTorch and against the CPU model.
//
// fp32 (no TF32): the same arithmetic as the CPU path up to the order of sums and the atomics of
// the embedding and LayerNorm parameter gradients, so the CPU fixture test's bounds apply
// (tests/unit/test_model_fixture.cpp), with the loss bound doubled for the atomics.
//
// bf16 (mixed precision): every tensor a GEMM or attention reads is rounded to bf16 (relative
// error u = 2^-8 per element), products and sums stay fp32. A dot product of k terms whose
// inputs each carry a relative error u is off by at most 2u times the sum of the magnitudes of
// its terms; with random-signed terms the result is then off by ~2u relative to its own size,
// and two layers and the head compound a handful of such roundings. The bounds below are
// normwise relative errors of 8u (3.1e-2) for logits and loss, 16u (6.3e-2) for gradients
// (products of two rounded tensors), far under what a wrong kernel gives (O(1)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "gpu_test_util.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/kernels/cuda/cudnn_attention.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"
#include "tessera/optim/adamw.hpp"

#include "../unit/hf_fixture.hpp"

namespace {

using namespace gpu_test;
using namespace tessera;
using model::DeviceGpt;
using model::DevicePrecision;

constexpr double k_u16 = 0x1p-8;

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Fixture {
  io::LoadedModel model;
  std::optional<io::SafetensorsFile> expected;
  std::vector<std::int32_t> inputs, targets;
  static constexpr int B = 2, T = 8;
};

std::optional<Fixture> load_fixture(const std::string& name) {
  const auto dir = fixtures_dir() / name;
  if (!std::filesystem::exists(dir / "expected.safetensors")) return std::nullopt;
  Fixture f;
  f.model = io::load_model(dir);
  f.expected = io::SafetensorsFile::open(dir / "expected.safetensors");
  auto tok = f.expected->read_i64("tokens");  // (B, T+1)
  for (int b = 0; b < Fixture::B; ++b)
    for (int t = 0; t < Fixture::T; ++t) {
      f.inputs.push_back(static_cast<std::int32_t>(tok[b * (Fixture::T + 1) + t]));
      f.targets.push_back(static_cast<std::int32_t>(tok[b * (Fixture::T + 1) + t + 1]));
    }
  return f;
}

// Logits (B*T, V) without the padded columns.
std::vector<float> unpadded_logits(const std::vector<float>& logits, const model::ModelConfig& c,
                                   int rows) {
  std::vector<float> out;
  for (int i = 0; i < rows; ++i)
    for (int v = 0; v < c.vocab_size; ++v)
      out.push_back(logits[std::size_t(i) * c.padded_vocab() + v]);
  return out;
}

void check_against_fixture(const std::string& name, DevicePrecision prec,
                           model::DeviceAttention attention = model::DeviceAttention::Flash) {
  auto f = load_fixture(name);
  if (!f) GTEST_SKIP() << "fixture " << name << " missing";
  const auto& cfg = f->model.config;
  const int B = Fixture::B, T = Fixture::T;
  const bool fp32 = prec == DevicePrecision::Fp32;
  DeviceGpt dev(cfg, prec, B, T, attention);
  dev.upload_params(f->model.params.data());
  const auto& layout = dev.layout();
  std::printf("[ %s %s ] attention: %s\n", name.c_str(), model::precision_name(prec),
              dev.attention_backend().c_str());

  // logits and loss (evaluation forward)
  const float loss = dev.forward(f->inputs.data(), f->targets.data(), B, T, false, 0.0f);
  const float want_loss = f->expected->read_f32("loss")[0];
  auto logits = unpadded_logits(dev.download_logits(), cfg, B * T);
  auto want_logits = f->expected->read_f32("logits");
  if (fp32) {
    EXPECT_NEAR(loss, want_loss, 4e-6 * std::fabs(want_loss));
    EXPECT_LT(rel_error(logits, want_logits), 1e-5);
  } else {
    EXPECT_NEAR(loss, want_loss, 8 * k_u16 * std::fabs(want_loss));
    EXPECT_LT(rel_error(logits, want_logits), 8 * k_u16);
  }
  std::printf("[ %s %s ] loss %.7f (torch %.7f), logits rel err %.3g\n", name.c_str(),
              model::precision_name(prec), loss, want_loss, rel_error(logits, want_logits));

  // every gradient
  dev.zero_grads();
  dev.forward(f->inputs.data(), f->targets.data(), B, T, true, 1.0f / (B * T));
  dev.backward();
  std::vector<float> grads(layout.total());
  dev.download_grads(grads.data());
  double worst = 0;
  for (const auto& t : layout.tensors()) {
    auto got = to_hf(t, cfg, grads.data());
    auto want = f->expected->read_f32("grad." + t.name);
    const double e = rel_error(got, want);
    worst = std::max(worst, e);
    EXPECT_LT(e, fp32 ? 1e-4 : 16 * k_u16) << "grad." << t.name;
  }
  std::printf("[ %s %s ] worst gradient rel err %.3g\n", name.c_str(), model::precision_name(prec),
              worst);
  for (std::size_t i = std::size_t(cfg.vocab_size) * cfg.n_embd;
       i < std::size_t(cfg.padded_vocab()) * cfg.n_embd; ++i)
    ASSERT_EQ(grads[layout.wte + i], 0.0f) << "padded vocabulary rows get no gradient";

  // 10 AdamW steps on the same batch, as the fixture did them
  optim::AdamWConfig ac{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  auto want_losses = f->expected->read_f32("adamw_losses");
  DeviceGpt fresh(cfg, prec, B, T);  // zero moments
  fresh.upload_params(f->model.params.data());
  double worst_loss = 0;
  for (int step = 1; step <= 10; ++step) {
    fresh.zero_grads();
    const float l = fresh.forward(f->inputs.data(), f->targets.data(), B, T, true, 1.0f / (B * T));
    const double e = std::fabs(l - want_losses[step - 1]) / want_losses[step - 1];
    worst_loss = std::max(worst_loss, e);
    EXPECT_LT(e, fp32 ? 1e-5 : 8 * k_u16) << "step " << step;
    fresh.backward();
    fresh.adamw_step(ac, ac.lr, step, 1.0f);
  }
  std::printf("[ %s %s ] 10 AdamW steps: worst loss rel err %.3g\n", name.c_str(),
              model::precision_name(prec), worst_loss);
  if (fp32 && name == "gpt2_tiny") {  // the CPU fixture test's bounds (its key-bias noise)
    std::vector<float> final_params(layout.total());
    fresh.download_params(final_params.data());
    for (const auto& t : layout.tensors()) {
      auto got = to_hf(t, cfg, final_params.data());
      auto want = f->expected->read_f32("final." + t.name);
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(double(got[i]) - want[i]), 3e-5 + 1e-4 * std::fabs(want[i]))
            << "final." << t.name << "[" << i << "]";
    }
  }
}

TEST(GpuModel, Fp32MatchesPyTorchFixture) {
  REQUIRE_GPU();
  check_against_fixture("gpt2_tiny", DevicePrecision::Fp32);
}

TEST(GpuModel, Fp32MatchesPyTorchFixtureHeadSize32) {
  REQUIRE_GPU();
  check_against_fixture("gpt2_tiny_hs32", DevicePrecision::Fp32);
}

TEST(GpuModel, Bf16MatchesPyTorchFixtureWithinBf16Bounds) {
  REQUIRE_GPU();
  check_against_fixture("gpt2_tiny_hs32", DevicePrecision::Bf16);
}

// The llama fixtures (transformers' LlamaForCausalLM: 4 heads over 2 kv heads, SwiGLU, untied and
// tied heads) under the same bounds: fp32 with the reference kernels, bf16 with cuDNN's
// grouped-query attention.
TEST(GpuModel, LlamaFp32MatchesPyTorchFixtures) {
  REQUIRE_GPU();
  check_against_fixture("llama_tiny", DevicePrecision::Fp32);
  check_against_fixture("llama_tiny_tied", DevicePrecision::Fp32);
}

TEST(GpuModel, LlamaBf16WithCudnnMatchesPyTorchFixtures) {
  REQUIRE_GPU();
  std::string why;
  if (!tessera::kernels::cuda::CudnnAttention::create(4, 2, 8, &why)) GTEST_SKIP() << why;
  check_against_fixture("llama_tiny", DevicePrecision::Bf16, model::DeviceAttention::Cudnn);
  check_against_fixture("llama_tiny_tied", DevicePrecision::Bf16, model::DeviceAttention::Cudnn);
}

TEST(GpuModel, Bf16WithCudnnAttentionMatchesPyTorchFixture) {
  REQUIRE_GPU();
  std::string why;
  if (!tessera::kernels::cuda::CudnnAttention::create(1, 1, 64, &why)) GTEST_SKIP() << why;
  check_against_fixture("gpt2_tiny_hs32", DevicePrecision::Bf16, model::DeviceAttention::Cudnn);
}

// 20 training steps (AdamW, warmup + cosine schedule, clipping at 1.0) on random batches, from the
// same initial parameters, on the CPU (the reference) and on the GPU in fp32 and bf16. fp32: the
// losses agree to 1e-5 relative (reordered sums over 20 steps). bf16: within 8u relative per
// step (the forward's bound above; the weights' drift between the runs over 20 steps of lr 1e-3
// is itself of order u and is measured by the printout).
TEST(GpuModel, TwentyTrainingStepsMatchCpu) {
  REQUIRE_GPU();
  model::ModelConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.block_size = 64;
  cfg.vocab_size = 1000;
  const int B = 4, T = 64, steps = 20;
  model::ParamLayout layout(cfg);
  Buffer<float> init(layout.total());
  model::init_params(layout, init.data(), 42);
  Rng rng(3);
  std::vector<std::vector<std::int32_t>> xs(steps), ys(steps);
  for (int s = 0; s < steps; ++s)
    for (int i = 0; i < B * T; ++i) {
      // a learnable stream: each token is a function of the previous one, half the time
      const std::int32_t prev = i ? xs[s].back() : std::int32_t(rng.next_u64() % 1000);
      const std::int32_t tok =
          rng.next_u64() % 2 ? (prev * 7 + 3) % 1000 : std::int32_t(rng.next_u64() % 1000);
      xs[s].push_back(tok);
    }
  for (int s = 0; s < steps; ++s) {
    ys[s].assign(xs[s].begin() + 1, xs[s].end());
    ys[s].push_back(xs[s][0]);
  }
  optim::AdamWConfig ac{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const float dloss = 1.0f / (B * T);

  // CPU reference
  std::vector<float> cpu_losses;
  {
    Buffer<float> p(layout.total()), g(layout.total()), m(layout.total()), v(layout.total());
    std::copy(init.data(), init.data() + layout.total(), p.data());
    m.zero();
    v.zero();
    model::Activations acts;
    model::ForwardOptions opt;
    opt.training = true;
    opt.dloss = dloss;
    for (int s = 0; s < steps; ++s) {
      g.zero();
      cpu_losses.push_back(
          model::forward(layout, p.data(), acts, xs[s].data(), ys[s].data(), B, T, opt));
      model::backward(layout, p.data(), g.data(), acts, xs[s].data(), B, T, opt.gemm);
      const double norm = optim::global_norm(g.data(), layout.total());
      const float lr = optim::lr_at(s, steps, 5, ac.lr, 0.1f);
      optim::adamw_step(layout, p.data(), g.data(), m.data(), v.data(), ac, lr, s + 1,
                        optim::clip_scale(norm, 1.0));
    }
  }
  for (DevicePrecision prec : {DevicePrecision::Fp32, DevicePrecision::Bf16}) {
    DeviceGpt dev(cfg, prec, B, T);
    dev.upload_params(init.data());
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      dev.zero_grads();
      const float loss = dev.forward(xs[s].data(), ys[s].data(), B, T, true, dloss);
      dev.backward();
      const double norm = dev.grad_norm();
      const float lr = optim::lr_at(s, steps, 5, ac.lr, 0.1f);
      dev.adamw_step(ac, lr, s + 1, optim::clip_scale(norm, 1.0));
      const double e = std::fabs(loss - cpu_losses[s]) / cpu_losses[s];
      worst = std::max(worst, e);
      EXPECT_LT(e, prec == DevicePrecision::Fp32 ? 1e-5 : 8 * k_u16)
          << model::precision_name(prec) << " step " << s << ": gpu " << loss << " cpu "
          << cpu_losses[s];
    }
    std::printf("[ 20 steps %s ] cpu loss %.5f -> %.5f, worst rel diff to cpu %.3g\n",
                model::precision_name(prec), cpu_losses.front(), cpu_losses.back(), worst);
  }
}

TEST(GpuModel, RefusesWhatItCannotRun) {
  REQUIRE_GPU();
  model::ModelConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = 4;
  cfg.n_embd = 32;  // head size 8: no flash kernel
  cfg.block_size = 16;
  cfg.vocab_size = 100;
  EXPECT_THROW(DeviceGpt(cfg, DevicePrecision::Bf16, 1, 16), tessera::Error);
  EXPECT_THROW(DeviceGpt(cfg, DevicePrecision::Fp32, 1, 17), tessera::Error);  // T > block_size
  DeviceGpt dev(cfg, DevicePrecision::Fp32, 1, 16);
  std::vector<std::int32_t> bad(16, 100);  // out of vocabulary
  EXPECT_THROW(dev.forward(bad.data(), bad.data(), 1, 16, false, 0.0f), tessera::Error);
  EXPECT_THROW(dev.backward(), tessera::InternalError);  // no training forward before
}

}  // namespace
