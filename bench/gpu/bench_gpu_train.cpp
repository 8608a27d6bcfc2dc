// Training throughput of the GPT-2 model on one GPU (model/gpt_device.hpp): full optimizer steps
// (forward, backward, gradient norm, AdamW) on random tokens at the GPT-2 124M and 350M shapes,
// the largest micro-batch of a list that fits, tokens/s and MFU against the GPU's dense bf16
// peak (FLOPs per token: 3x model::forward_flops_per_token, the trainer's count), and where the
// device time of a step goes by op family. Prints a table and, with --json, one JSON object per
// run. Not a test.
//   bench_gpu_train [--models gpt2-124m,gpt2-350m] [--precision bf16] [--T 1024]
//                   [--batches 32,16,8] [--steps 10] [--peak 989.4] [--json FILE]
//                   [--attention auto,flash,cudnn]   (bf16: each listed attention is a run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"

using namespace tessera;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

model::ModelConfig shape(const std::string& name, int T) {
  model::ModelConfig c;
  c.vocab_size = 50257;
  c.block_size = std::max(T, 1024);
  if (name == "gpt2-124m") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768;
  } else if (name == "gpt2-350m") {
    c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
  } else if (name == "gpt2-774m") {
    c.n_layer = 36, c.n_head = 20, c.n_embd = 1280;
  } else if (name == "llama-160m") {  // bench/gpu/torch_train_step.py's Llama of GPT-2 124M's width
    c.family = model::Family::Llama;
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.n_kv_head = 12;
    c.intermediate_size = 2048, c.vocab_size = 32000, c.tie_embeddings = false;
    c.rope_theta = 10000.0, c.norm_eps = 1e-5;
  } else {
    throw Error("unknown model shape " + name, "gpt2-124m, gpt2-350m, gpt2-774m or llama-160m");
  }
  return c;
}

struct Result {
  std::string model, precision, attention;
  int B = 0, T = 0;
  double step_ms = 0, tokens_per_s = 0, mfu = 0, loss = 0, gib = 0;
  kernels::Profile profile;
};

model::DeviceAttention attention_kind(const std::string& s) {
  if (s == "auto") return model::DeviceAttention::Auto;
  if (s == "flash") return model::DeviceAttention::Flash;
  if (s == "cudnn") return model::DeviceAttention::Cudnn;
  throw Error("unknown attention " + s, "auto, flash or cudnn");
}

Result run(const std::string& name, model::DevicePrecision prec, const std::string& attention,
           int B, int T, int steps, double peak) {
  const auto cfg = shape(name, T);
  model::DeviceGpt dev(cfg, prec, B, T, attention_kind(attention));
  {
    Buffer<float> init(dev.layout().total());
    model::init_params(dev.layout(), init.data(), 1);
    dev.upload_params(init.data());
  }
  Rng rng(7);
  std::vector<std::int32_t> x(std::size_t(B) * T), y(x.size());
  optim::AdamWConfig ac;
  const float dloss = 1.0f / (B * T);
  Result r;
  auto step = [&](std::int64_t s) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<std::int32_t>(rng.next_u64() % cfg.vocab_size);
      y[i] = static_cast<std::int32_t>(rng.next_u64() % cfg.vocab_size);
    }
    dev.zero_grads();
    r.loss = dev.forward(x.data(), y.data(), B, T, true, dloss);
    dev.backward();
    const double norm = dev.grad_norm();
    dev.adamw_step(ac, 1e-4f, s + 1, optim::clip_scale(norm, 1.0));
    dev.synchronize();
  };
  for (int s = 0; s < 3; ++s) step(s);
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    step(3 + s);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  dev.set_profile(&r.profile);
  step(3 + steps);
  dev.set_profile(nullptr);
  r.model = name;
  r.precision = model::precision_name(prec);
  r.attention = dev.attention_backend();
  r.B = B;
  r.T = T;
  r.step_ms = ms[ms.size() / 2];
  r.tokens_per_s = B * T / (r.step_ms * 1e-3);
  r.mfu = r.tokens_per_s * 3.0 * model::forward_flops_per_token(cfg, T) / (peak * 1e12);
  r.gib = dev.device_bytes() / double(1ull << 30);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string models = "gpt2-124m,gpt2-350m", precision = "bf16", batches = "32,16,8", json,
              attentions = "auto";
  int T = 1024, steps = 10;
  double peak = 989.4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--models")
      models = v;
    else if (k == "--precision")
      precision = v;
    else if (k == "--batches")
      batches = v;
    else if (k == "--json")
      json = v;
    else if (k == "--attention")
      attentions = v;
    else if (k == "--T")
      T = std::stoi(v);
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--peak")
      peak = std::stod(v);
    else
      throw Error("unknown option " + k);
  }
  if (kernels::cuda::device_count() == 0) {
    std::printf("bench_gpu_train: skipped (%s)\n", kernels::cuda::describe_devices().c_str());
    return 0;
  }
  std::printf("# %s; peak %.1f TFLOP/s\n", kernels::cuda::describe_devices().c_str(), peak);
  std::vector<Result> results;
  for (const auto& name : split(models))
    for (const auto& p : split(precision)) {
      const auto prec = p == "fp32" ? model::DevicePrecision::Fp32 : model::DevicePrecision::Bf16;
      for (const auto& a : split(prec == model::DevicePrecision::Fp32 ? "flash" : attentions))
        for (const auto& b : split(batches)) {
          try {
            results.push_back(run(name, prec, a, std::stoi(b), T, steps, peak));
            break;
          } catch (const Error& e) {
            std::printf("# %s %s %s B=%s: %s\n", name.c_str(), p.c_str(), a.c_str(), b.c_str(),
                        e.what());
          }
        }
    }
  std::printf("%-10s %-5s %-14s %3s %9s %10s %6s %6s  breakdown (share of device time)\n", "model",
              "prec", "attention", "B", "ms/step", "tok/s", "MFU", "GiB");
  std::ofstream js;
  if (!json.empty()) js.open(json);
  for (const auto& r : results) {
    std::printf("%-10s %-5s %-14s %3d %9.1f %10.0f %5.1f%% %6.1f ", r.model.c_str(),
                r.precision.c_str(), r.attention.c_str(), r.B, r.step_ms, r.tokens_per_s,
                100 * r.mfu, r.gib);
    const double tot = r.profile.total();
    for (int f = 0; f < static_cast<int>(kernels::OpFamily::Count); ++f)
      if (r.profile.seconds[f] > 0)
        std::printf(" %s %.0f%%", kernels::op_family_name(static_cast<kernels::OpFamily>(f)),
                    100 * r.profile.seconds[f] / tot);
    std::printf("\n");
    if (js) {
      js << "{\"impl\": \"tessera\", \"model\": \"" << r.model << "\", \"precision\": \""
         << r.precision << "\", \"attention\": \"" << r.attention << "\", \"B\": " << r.B
         << ", \"T\": " << r.T << ", \"step_ms\": " << r.step_ms
         << ", \"tokens_per_s\": " << r.tokens_per_s << ", \"mfu\": " << r.mfu
         << ", \"loss\": " << r.loss << ", \"device_gib\": " << r.gib << ", \"profile_ms\": {";
      bool first = true;
      for (int f = 0; f < static_cast<int>(kernels::OpFamily::Count); ++f) {
        if (r.profile.seconds[f] <= 0) continue;
        js << (first ? "" : ", ") << "\""
           << kernels::op_family_name(static_cast<kernels::OpFamily>(f))
           << "\": " << r.profile.seconds[f] * 1e3;
        first = false;
      }
      js << "}}\n";
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}
