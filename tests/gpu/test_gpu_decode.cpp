// The device's KV-cache decoder (model::DeviceDecoder) against the CPU's (model::Decoder) on the
// committed fixture models: the logits after a prompt and after every token decoded one at a
// time, up to the full context, in fp32 and bf16, for both families.
//
// Bounds. fp32 runs the same arithmetic as the CPU decoder up to the order of its sums (GEMMs of
// other blockings, the attention's dot products and softmax sums in another order): relative
// errors of a few fp32 roundings per layer, ~1e-6 at these sizes; the bound is 1e-5, as for the
// device's training forward against the CPU. bf16 rounds every GEMM and attention input and the
// cached keys and values to bf16 (u = 2^-8); the normwise bound is the training forward's 8u (see
// test_gpu_model.cpp), far under what a wrong position, a stale cache row or a wrong head gives
// (order 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/kernels/cuda/cudnn_attention.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"

namespace {

using namespace tessera;
using model::DeviceDecoder;
using model::DeviceGpt;
using model::DevicePrecision;

std::filesystem::path fixture_dir(const std::string& name) {
  return gpu_test::fixtures_dir() / name;
}

double rel_error(const float* got, const float* want, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Decodes `tokens` (prompt, then one at a time) on the CPU and on the device, comparing the
// logits at every position; then once more after reset(), which must start afresh. Each step
// as kernels launched one by one, and (graphs) as the replayed CUDA graph of a step.
void decode_matches_cpu(const std::string& name, DevicePrecision prec,
                        model::DeviceAttention attention) {
  if (!std::filesystem::exists(fixture_dir(name) / "model.safetensors"))
    GTEST_SKIP() << "fixture " << name << " missing";
  const auto loaded = io::load_model(fixture_dir(name));
  const auto& cfg = loaded.config;
  const int ctx = cfg.block_size, V = cfg.vocab_size, prompt = 5;
  Rng rng(7);
  std::vector<std::int32_t> tokens(ctx);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng.uniform() * V) % V;

  const model::ParamLayout layout(cfg);
  model::Decoder cpu(layout, loaded.params.data(), ctx, kernels::GemmLibrary::OneDnn);
  std::vector<std::vector<float>> want;
  const float* l = cpu.prefill(tokens.data(), prompt);
  want.emplace_back(l, l + V);
  for (int t = prompt; t < ctx; ++t) {
    l = cpu.step(tokens[t]);
    want.emplace_back(l, l + V);
  }

  DeviceGpt dev(cfg, prec, 1, ctx, attention);
  dev.upload_params(loaded.params.data());
  const double bound = prec == DevicePrecision::Fp32 ? 1e-5 : 8 * gpu_test::k_u_bf16;
  for (const bool graphs : {false, true}) {
    DeviceDecoder gpu(dev, ctx, graphs);
    for (int round = 0; round < 2; ++round) {
      gpu.reset();
      double worst = 0;
      for (int t = prompt - 1; t < ctx; ++t) {
        const float* got =
            t == prompt - 1 ? gpu.prefill(tokens.data(), prompt) : gpu.step(tokens[t]);
        const double e = rel_error(got, want[t - (prompt - 1)].data(), V);
        worst = std::max(worst, e);
        EXPECT_LT(e, bound) << name << " position " << t << " round " << round
                            << (graphs ? " (graph)" : "");
      }
      EXPECT_EQ(gpu.position(), ctx);
      std::printf("[ %s %s, %s%s ] decode vs CPU decoder: worst logits rel err %.3g (bound %.3g)\n",
                  name.c_str(), model::precision_name(prec), dev.attention_backend().c_str(),
                  graphs ? ", graph" : "", worst, bound);
    }
  }
}

// The attention of one row over a cache (kernels::cuda::decode_attention, fp32 and bf16) against
// double precision on the same (rounded) inputs, with grouped kv heads, at lengths that end
// inside, at the edge of, and past the kernel's 64-key blocks, for a head size its 16-byte path
// takes (64) and one it does not (12). Bound per element, from the error analysis of a softmax-
// weighted mean: a score of hs fp32 products is off by at most hs u S (S: the sum of its terms'
// magnitudes), which moves each weight by a factor within 1 +- 2 hs u S; with the weights' and
// sums' own roundings the output moves by at most max|v| (4 hs u S + (2n + 8) u); bf16 adds the
// rounding of the output (2^-8 of it).
void attention_matches_double(int hs, int n, bool bf16) {
  constexpr int NH = 6, KV = 2, cap = 200;
  const std::int64_t W = std::int64_t(NH + 2 * KV) * hs, KVW = std::int64_t(KV) * hs;
  Rng rng(11 + hs + n);
  auto q = gpu_test::randn(rng, W), k = gpu_test::randn(rng, cap * KVW),
       v = gpu_test::randn(rng, cap * KVW);
  if (bf16)
    for (auto* x : {&q, &k, &v})
      for (auto& e : *x) e = gpu_test::from_bf16(gpu_test::to_bf16(e));
  const double scale = 1.0 / std::sqrt(double(hs)), u = gpu_test::k_u;
  std::vector<float> want(std::size_t(NH) * hs);
  std::vector<double> bound(want.size());
  for (int h = 0; h < NH; ++h) {
    const int g = h / (NH / KV);
    std::vector<double> sc(n);
    double mx = -1e300, sum = 0, S = 0, vmax = 0;
    for (int j = 0; j < n; ++j) {
      double d = 0, a = 0;
      for (int c = 0; c < hs; ++c) {
        d += double(q[h * hs + c]) * k[j * KVW + g * hs + c];
        a += std::fabs(double(q[h * hs + c]) * k[j * KVW + g * hs + c]);
      }
      sc[j] = d * scale;
      S = std::max(S, a * scale);
      mx = std::max(mx, sc[j]);
      for (int c = 0; c < hs; ++c)
        vmax = std::max(vmax, std::fabs(double(v[j * KVW + g * hs + c])));
    }
    for (int j = 0; j < n; ++j) sum += sc[j] = std::exp(sc[j] - mx);
    for (int c = 0; c < hs; ++c) {
      double o = 0;
      for (int j = 0; j < n; ++j) o += sc[j] * v[j * KVW + g * hs + c];
      want[h * hs + c] = float(o / sum);
      bound[h * hs + c] = vmax * (4 * hs * u * S + (2 * n + 8) * u) +
                          (bf16 ? gpu_test::k_u_bf16 * std::fabs(o / sum) : 0.0);
    }
  }
  namespace gpu = kernels::cuda;
  const std::vector<int> pos{n - 1};
  auto d_pos = gpu_test::upload(pos);
  gpu::DeviceBuffer scratch(gpu::decode_attention_scratch_bytes(NH, hs, cap));
  std::vector<float> got;
  if (bf16) {
    auto bits = [](const std::vector<float>& x) {
      std::vector<std::uint16_t> b(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) b[i] = gpu_test::to_bf16(x[i]);
      return gpu_test::upload(b);
    };
    auto dq = bits(q), dk = bits(k), dv = bits(v);
    gpu::DeviceBuffer out(want.size() * 2);
    gpu::decode_attention_bf16(out.as<std::uint16_t>(), dq.as<std::uint16_t>(),
                               dk.as<std::uint16_t>(), dv.as<std::uint16_t>(), d_pos.as<int>(), cap,
                               NH, KV, hs, scratch.as<float>(), nullptr);
    for (auto b : gpu_test::download<std::uint16_t>(out, want.size()))
      got.push_back(gpu_test::from_bf16(b));
  } else {
    auto dq = gpu_test::upload(q), dk = gpu_test::upload(k), dv = gpu_test::upload(v);
    gpu::DeviceBuffer out(want.size() * 4);
    gpu::decode_attention(out.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(),
                          d_pos.as<int>(), cap, NH, KV, hs, scratch.as<float>(), nullptr);
    got = gpu_test::download<float>(out, want.size());
  }
  gpu_test::expect_within(got, want, bound,
                          std::string(bf16 ? "bf16" : "fp32") + " hs=" + std::to_string(hs) +
                              " n=" + std::to_string(n));
}

TEST(GpuDecode, AttentionMatchesDoubleAcrossKeyBlocks) {
  REQUIRE_GPU();
  for (int hs : {64, 12})
    for (int n : {1, 63, 64, 65, 200})
      for (bool bf16 : {false, true}) attention_matches_double(hs, n, bf16);
}

TEST(GpuDecode, Fp32MatchesCpuDecoderBothFamilies) {
  REQUIRE_GPU();
  decode_matches_cpu("gpt2_tiny", DevicePrecision::Fp32, model::DeviceAttention::Auto);
  decode_matches_cpu("llama_tiny", DevicePrecision::Fp32, model::DeviceAttention::Auto);
}

TEST(GpuDecode, Bf16FlashMatchesCpuDecoder) {
  REQUIRE_GPU();
  decode_matches_cpu("gpt2_tiny_hs32", DevicePrecision::Bf16, model::DeviceAttention::Flash);
}

TEST(GpuDecode, Bf16CudnnMatchesCpuDecoderGroupedHeads) {
  REQUIRE_GPU();
  std::string why;
  if (!kernels::cuda::CudnnAttention::create(4, 2, 8, &why)) GTEST_SKIP() << why;
  decode_matches_cpu("llama_tiny", DevicePrecision::Bf16, model::DeviceAttention::Cudnn);
}

// generate() on the device through a full context (the cache restarts on the newest half window)
// to max_new_tokens; its first greedy token is the CPU decoder's wherever the CPU's top two
// logits are further apart than the fp32 bound.
TEST(GpuDecode, GenerateSlidesPastTheContext) {
  REQUIRE_GPU();
  const auto dir = fixture_dir("llama_tiny");
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << "fixture missing";
  const auto loaded = io::load_model(dir);
  const auto& cfg = loaded.config;
  const std::vector<std::int32_t> prompt{1, 2, 3, 4, 5, 6};
  eval::SampleOptions so;
  so.max_new_tokens = 3 * cfg.block_size;
  so.temperature = 0.0f;
  DeviceGpt dev(cfg, DevicePrecision::Fp32, 1,
                eval::decode_capacity(cfg.block_size, prompt.size(), so));
  dev.upload_params(loaded.params.data());
  Rng rng(1);
  const auto out = eval::generate(dev, prompt, so, rng);
  ASSERT_EQ(out.size(), static_cast<std::size_t>(so.max_new_tokens));
  for (auto t : out) EXPECT_TRUE(t >= 0 && t < cfg.vocab_size);

  const model::ParamLayout layout(cfg);
  model::Decoder cpu(layout, loaded.params.data(), cfg.block_size, kernels::GemmLibrary::OneDnn);
  const float* l = cpu.prefill(prompt.data(), static_cast<int>(prompt.size()));
  std::vector<float> sorted(l, l + cfg.vocab_size);
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
  if (sorted[0] - sorted[1] > 1e-4 * std::fabs(sorted[0])) {
    EXPECT_EQ(out[0], eval::pick_token(l, cfg.vocab_size, 0.0f, 0, rng));
  }
}

TEST(GpuDecode, RefusesWhatItCannotHold) {
  REQUIRE_GPU();
  const auto dir = fixture_dir("gpt2_tiny");
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << "fixture missing";
  const auto loaded = io::load_model(dir);
  DeviceGpt dev(loaded.config, DevicePrecision::Fp32, 1, 8);
  dev.upload_params(loaded.params.data());
  EXPECT_THROW(DeviceDecoder(dev, 9), Error);  // more than the model's T
  DeviceDecoder dec(dev, 4);
  const std::vector<std::int32_t> three{1, 2, 3}, five{1, 2, 3, 4, 5};
  EXPECT_THROW(dec.prefill(five.data(), 5), Error);  // longer than the cache
  const std::int32_t bad = loaded.config.vocab_size;
  EXPECT_THROW(dec.prefill(&bad, 1), Error);
  dec.prefill(three.data(), 3);
  EXPECT_THROW(dec.prefill(three.data(), 1), Error);  // a prompt after the first
  dec.step(4);
  EXPECT_THROW(dec.step(5), Error);  // full
  EXPECT_EQ(dec.position(), 4);
  dec.reset();
  EXPECT_EQ(dec.position(), 0);
  EXPECT_NO_THROW(dec.prefill(five.data(), 4));
}

}  // namespace
