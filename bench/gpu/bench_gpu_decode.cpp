// Sampling speed on one GPU: the device's KV-cache decoder (model::DeviceDecoder) against
// recomputing the whole context for every token (a DeviceGpt forward per token, what `tessera
// sample --device cuda` did before it had a cache), at batch 1 on random weights and tokens. Per
// model shape and precision: the prompt's time, the decoder's milliseconds per token (median of
// the steps; each step one CUDA graph), the weights it reads per token as a rate (the parameters
// the GEMMs read, fp32 or their bf16 copy, once per token: the roofline of decoding at batch 1),
// the same steps with their kernels launched one by one, and the recomputing forward's
// milliseconds per token at the same context; and, alone, the attention kernel at the full context
// and the products of a token (a CUDA graph of its GEMMs at one row). Not a test.
//   bench_gpu_decode [--models smollm2-135m,llama-1b] [--precisions fp32,bf16] [--prompt 128]
//                    [--tokens 256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../bench_args.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_device.hpp"

using namespace tessera;

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

model::ModelConfig shape(const std::string& name) {
  model::ModelConfig c;
  c.family = model::Family::Llama;
  c.rope_theta = 10000.0, c.norm_eps = 1e-5, c.block_size = 2048;
  if (name == "smollm2-135m") {  // SmolLM2-135M's shape
    c.n_layer = 30, c.n_head = 9, c.n_kv_head = 3, c.n_embd = 576, c.intermediate_size = 1536;
    c.vocab_size = 49152, c.tie_embeddings = true;
  } else if (name == "llama-1b") {  // Llama 3.2 1B's shape
    c.n_layer = 16, c.n_head = 32, c.n_kv_head = 8, c.n_embd = 2048, c.intermediate_size = 8192;
    c.vocab_size = 128256, c.tie_embeddings = true;
  } else if (name == "gpt2-124m") {
    c = model::ModelConfig{};
    c.vocab_size = 50257, c.block_size = 1024, c.n_layer = 12, c.n_head = 12, c.n_embd = 768;
  } else {
    throw Error("unknown model shape " + name, "smollm2-135m, llama-1b or gpt2-124m");
  }
  return c;
}

namespace cu = kernels::cuda;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Decoding {
  double prompt_ms = 0, step_ms = 0, kv_mib = 0;
};

// The decoder over seq: a prompt, then tokens one at a time (the median step), each step's
// kernels launched one by one or (graphs) as the replayed graph of a step.
Decoding time_decoding(model::DeviceGpt& dev, const std::vector<std::int32_t>& seq, int prompt_len,
                       int tokens, bool graphs) {
  model::DeviceDecoder dec(dev, static_cast<int>(seq.size()), graphs);
  dec.prefill(seq.data(), prompt_len);  // warm-up: cuBLASLt's and cuDNN's plans, the graph
  dec.step(seq[prompt_len]);
  dec.step(seq[prompt_len + 1]);
  dec.reset();
  Decoding r;
  auto t0 = clock_type::now();
  dec.prefill(seq.data(), prompt_len);
  r.prompt_ms = ms_since(t0);
  std::vector<double> step_ms;
  for (int i = 0; i < tokens; ++i) {
    t0 = clock_type::now();
    dec.step(seq[prompt_len + i]);  // returns with the logits on the host
    step_ms.push_back(ms_since(t0));
  }
  r.step_ms = median(step_ms);
  r.kv_mib = dec.kv_cache_bytes() / double(1 << 20);
  return r;
}

// The recomputing path at the whole context of seq: a forward over it per token.
double time_recompute(model::DeviceGpt& dev, const std::vector<std::int32_t>& seq) {
  const int T = static_cast<int>(seq.size());
  std::vector<float> row(dev.layout().config().padded_vocab());
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = clock_type::now();
    dev.forward(seq.data(), nullptr, 1, T, false, 0.0f);
    dev.download_logits_row(T - 1, row.data());
    ms.push_back(ms_since(t0));
  }
  return median(ms);
}

// decode_attention alone at the full context (a layer's share of a token), in us per call.
double time_attention(const model::ModelConfig& cfg, bool bf16, int cap) {
  const int NH = cfg.n_head, KV = cfg.kv_heads(), hs = cfg.head_dim();
  const std::size_t a = bf16 ? 2 : 4, layer = std::size_t(cap) * KV * hs;
  cu::DeviceBuffer q(std::size_t(cfg.qkv_rows()) * a), kv(2 * layer * a),
      out(std::size_t(NH) * hs * a), scratch(cu::decode_attention_scratch_bytes(NH, hs, cap)),
      pos(sizeof(int));
  cu::memset_zero(q.data(), q.bytes());
  cu::memset_zero(kv.data(), kv.bytes());
  const int last = cap - 1;
  cu::to_device(pos.data(), &last, sizeof(int));
  auto call = [&] {
    if (bf16) {
      auto* k = kv.as<std::uint16_t>();
      cu::decode_attention_bf16(out.as<std::uint16_t>(), q.as<std::uint16_t>(), k, k + layer,
                                pos.as<int>(), cap, NH, KV, hs, scratch.as<float>(), nullptr);
    } else {
      auto* k = kv.as<float>();
      cu::decode_attention(out.as<float>(), q.as<float>(), k, k + layer, pos.as<int>(), cap, NH, KV,
                           hs, scratch.as<float>(), nullptr);
    }
  };
  call();
  cu::synchronize();
  const auto t0 = clock_type::now();
  for (int i = 0; i < 200; ++i) call();
  cu::synchronize();
  return ms_since(t0) * 1e3 / 200;
}

// The products of one token alone, in ms: each linear of a layer (qkv, o, fc / gate-up, down) at
// one row, n_layer of each, and the LM head, replayed as one CUDA graph (no launch overhead); what
// the step takes beyond them is its other kernels and the gaps between them.
double time_products(const model::ModelConfig& cfg, bool bf16) {
  const int C = cfg.n_embd, F = cfg.ffn();
  const std::size_t a = bf16 ? 2 : 4;
  const int shapes[5][2] = {
      {cfg.qkv_rows(), C}, {C, C}, {cfg.fc_rows(), C}, {C, F}, {cfg.padded_vocab(), C}};
  std::size_t most = 0;
  for (auto& sh : shapes) most = std::max(most, std::size_t(sh[0]) * sh[1]);
  cu::DeviceBuffer w(most * a), x(std::size_t(std::max(C, F)) * a),
      y(std::size_t(cfg.padded_vocab()) * a);
  cu::memset_zero(w.data(), w.bytes());
  cu::memset_zero(x.data(), x.bytes());
  cu::Stream stream;
  auto product = [&](int OC, int IC) {
    if (bf16)
      cu::gemm_bf16(false, true, 1, OC, IC, 1.0f, x.as<std::uint16_t>(), IC, w.as<std::uint16_t>(),
                    IC, 0.0f, y.as<std::uint16_t>(), OC, stream.get());
    else
      cu::gemm(false, true, 1, OC, IC, 1.0f, x.as<float>(), IC, w.as<float>(), IC, 0.0f,
               y.as<float>(), OC, stream.get());
  };
  auto token = [&] {
    for (int l = 0; l < cfg.n_layer; ++l)
      for (int i = 0; i < 4; ++i) product(shapes[i][0], shapes[i][1]);
    product(shapes[4][0], shapes[4][1]);
  };
  token();  // the plans and the stream's workspace, before the capture
  cu::synchronize(stream.get());
  cu::Graph graph;
  graph.capture(stream.get(), token);
  graph.launch(stream.get());
  cu::synchronize(stream.get());
  const auto t0 = clock_type::now();
  for (int i = 0; i < 20; ++i) graph.launch(stream.get());
  cu::synchronize(stream.get());
  return ms_since(t0) / 20;
}

void run(const std::string& name, model::DevicePrecision prec, int prompt_len, int tokens) {
  const auto cfg = shape(name);
  const bool bf16 = prec == model::DevicePrecision::Bf16;
  const int cap = prompt_len + tokens;
  model::DeviceGpt dev(cfg, prec, 1, cap);
  {
    Buffer<float> init(dev.layout().total());
    model::init_params(dev.layout(), init.data(), 1);
    dev.upload_params(init.data());
  }
  Rng rng(7);
  std::vector<std::int32_t> seq(cap);
  for (auto& t : seq) t = static_cast<std::int32_t>(rng.next_u64() % cfg.vocab_size);
  const double eager = time_decoding(dev, seq, prompt_len, tokens, false).step_ms;
  const Decoding d = time_decoding(dev, seq, prompt_len, tokens, true);
  const double recompute = time_recompute(dev, seq), attn_us = time_attention(cfg, bf16, cap);
  const double products = time_products(cfg, bf16);
  const double weight_bytes = static_cast<double>(model::ParamLayout(cfg).total()) * (bf16 ? 2 : 4);
  std::printf(
      "%-13s %-5s prompt %4d: %7.2f ms (%6.0f tok/s) | decode %6.3f ms/token (%5.0f tok/s, "
      "weights at %5.0f GB/s) | kernels one by one %6.3f (%.2fx) | recompute at %d: "
      "%7.3f (%.1fx) | KV %.1f MiB | attention %.1f us x %d layers | products alone %.3f ms "
      "(%.0f GB/s)\n",
      name.c_str(), model::precision_name(prec), prompt_len, d.prompt_ms,
      prompt_len / (d.prompt_ms * 1e-3), d.step_ms, 1e3 / d.step_ms,
      weight_bytes / (d.step_ms * 1e6), eager, eager / d.step_ms, cap, recompute,
      recompute / d.step_ms, d.kv_mib, attn_us, cfg.n_layer, products,
      weight_bytes / (products * 1e6));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "smollm2-135m,llama-1b", precisions = "fp32,bf16";
  int prompt_len = 128, tokens = 256;
  bench::Options()
      .add("models", models)
      .add("precisions", precisions)
      .add("prompt", prompt_len)
      .add("tokens", tokens)
      .parse(argc, argv);
  if (prompt_len < 1 || tokens < 2) {
    std::fprintf(stderr, "--prompt needs 1 token or more, --tokens 2 or more\n");
    return 2;
  }
  if (kernels::cuda::device_count() == 0) {
    std::printf("no CUDA device: %s\n", kernels::cuda::describe_devices().c_str());
    return 0;
  }
  std::printf("%s\n", kernels::cuda::describe_devices().c_str());
  try {
    const auto wanted = bench::split_list(precisions);
    for (const auto& m : bench::split_list(models))
      for (auto p : {model::DevicePrecision::Fp32, model::DevicePrecision::Bf16})
        if (std::find(wanted.begin(), wanted.end(), model::precision_name(p)) != wanted.end())
          run(m, p, prompt_len, tokens);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
