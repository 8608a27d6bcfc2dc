// SmolLM2-135M end to end on the CPU: decode tokens/s (the KV-cache decoder, one token at a time)
// and prefill tokens/s (every linear of the model over --prefill tokens at once) at fp32, W8 (per
// channel, symmetric) and W4 (g128, asymmetric), the quantized ones with an 8-bit embedding and
// head (quantize --vocab-bits 8), all RTN, in one run, each beside its roofline measured in the
// same run:
//  - decode against memory: the time one streaming read of the bytes of weights a token reads
//    takes (block linears and head; fp32: 4 bytes per weight; packed: codes, scales, zeros),
//    measured on those very bytes just before each decode round (on shared VMs a separate test
//    buffer reads at rates that differ by up to 2x from one allocation or minute to the next),
//    over the round's step time: the median over the rounds and their range. The old reference,
//    the bytes at the read bandwidth of a 2 GiB buffer measured at start over the best round, is
//    printed beside it ("at start");
//  - prefill against compute: the linears' FLOPs / oneDNN's fp32 GEMM rate on the model's largest
//    shape (the packed prefill decodes tiles of the weight to fp32 and multiplies them with it).
//    Below each format, a prompt of --prefill tokens fed to the decoder whole (Decoder::prefill:
//    the linears, norms and causal attention over all of them, the head on the last) beside the
//    same prompt fed step by step, as sampling fed it before the decoder had prefill.
// Decode time is split into the block linears, the head (thread 0's share of each) and the rest
// (norms, rotary, attention over the cache, the waits for the other thread; sampling excluded:
// the bench feeds fixed tokens). ms/tok is the best of
// --rounds, the median round printed beside it; the GEMM rate is the best of 3. The default
// context is short so that the weights are what a token reads: the fp32 KV cache adds 46 KB per
// position of context per token (30 layers x 2 x 192 values), 14 MB at 300 positions, which
// --context shows; --kv_cache f16 halves it (f32,f16: both, their rounds taking turns).
// --formats picks some of fp32, W8, W4 and file: the model file's own quantized blocks (a GGUF of
// Q4_0, Q4_1 or Q8_0 matrices, such as SmolLM2's published Q4_1, packed as `tessera sample` reads
// it: the bytes llama.cpp decodes). Beside the rate the weights were read at, each format
// prints the clock of a core after its rounds (bench::core_clock_ghz): on shared VMs both move
// from one minute to the next, and the step's arithmetic follows the clock.
//
//   bench_decode [--model PATH] [--threads 2] [--tokens 64] [--context 16] [--prefill 128]
//                [--stream_mib 2048] [--rounds 5] [--kv_cache f32|f16|f32,f16]
//                [--formats fp32,W8,W4,file]
//
// Without the model file (scripts/setup --with-models) it says so and exits 0.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "bench_memory.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/runner.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct Format {
  const char* key;  // as --formats names it
  const char* name;
  quant::WeightQuant wq;  // bits 0: fp32 (or, for "file", the file's own blocks)
};

// One format's model: its parameters (fp32, or the packed model's norms and embeddings), the
// decoder's kernels and the bytes of weight a token reads.
struct FormatModel {
  quant::AnyModel q;
  quant::PackedModel pm;
  const float* params = nullptr;
  model::DecoderKernels kernels;
  double bytes = 0;
  bool packed() const { return !pm.linears.empty(); }
};

// Decode seconds per token and their split (the best round), the median round's seconds, and
// every round's seconds per token with the seconds one streaming read of the weights took just
// before it.
struct Decode {
  double step_s = 0, linear_s = 0, head_s = 0, median_s = 0;
  std::vector<double> round_s, round_read_s;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The kernels of one format with timers around the block linears and the head, read on the
// team's thread 0: its own share of each product (the waits for the other threads at the
// decoder's barriers fall in the rest). fp32: the decoder's own fp32 products
// (model::team_linear and model::fp32_share), written out here so that they can be timed too.
model::DecoderKernels timed(model::DecoderKernels k, const model::ParamLayout& layout,
                            const float* params, double& linear_s, double& head_s) {
  const auto& cfg = layout.config();
  if (!k.linear)
    k.linear = [&layout, params](int l, int which, float* out, const float* in, const float* bias,
                                 bool acc) {
      const auto kind = static_cast<quant::Lin>(which);
      const int rows = quant::lin_rows(layout.config(), kind);
      model::team_linear(kernels::GemmLibrary::OneDnn, out, in,
                         params + quant::lin_weight_offset(layout, l, kind), bias,
                         quant::lin_cols(layout.config(), kind), acc,
                         model::linear_rows(layout.config(), which, rows));
    };
  if (!k.share)
    k.share = [&layout, params](int l, int which, model::ByteSpan* out) {
      return model::fp32_share(layout, params, l, which, out);
    };
  if (!k.head)
    k.head = [&layout, params, &cfg](float* logits, const float* x) {
      model::team_linear(kernels::GemmLibrary::OneDnn, logits, x, params + layout.head, nullptr,
                         cfg.n_embd, false, model::team_rows(cfg.padded_vocab()));
    };
  auto lin = k.linear;
  k.linear = [lin, &linear_s](int l, int which, float* out, const float* in, const float* bias,
                              bool acc) {
    const auto t0 = clock_type::now();
    lin(l, which, out, in, bias, acc);
    if (omp_get_thread_num() == 0) linear_s += since(t0);
  };
  auto head = k.head;
  k.head = [head, &head_s](float* logits, const float* x) {
    const auto t0 = clock_type::now();
    head(logits, x);
    if (omp_get_thread_num() == 0) head_s += since(t0);
  };
  return k;
}

// Feeds `context` tokens, then times `tokens` more steps (positions context .. context+tokens)
// with each cache type of `kvs`; `rounds` times, the cache types taking turns within a round
// (their ratio is then measured in the same minutes), each decode with a fresh cache and
// preceded by a streaming read of the bytes a step reads (`weights`, best of 3), so that each
// has the memory's rate of its own moment beside it. One Decode per cache type.
std::vector<Decode> time_decode(const model::ParamLayout& layout, const float* params,
                                const model::DecoderKernels& packed, int context, int tokens,
                                int rounds, const std::vector<bench::Span>& weights,
                                const std::vector<model::KvCache>& kvs) {
  std::vector<Decode> out(kvs.size());
  for (int round = 0; round < rounds; ++round)
    for (std::size_t i = 0; i < kvs.size(); ++i) {
      Decode& best = out[i];
      const double read_s = bench::read_spans_seconds(weights);
      double linear_s = 0, head_s = 0;
      model::Decoder dec(layout, params, context + tokens, kernels::GemmLibrary::OneDnn,
                         timed(packed, layout, params, linear_s, head_s), kvs[i]);
      const int V = layout.config().vocab_size;
      for (int t = 0; t < context; ++t) dec.step((t * 7919) % V, false);
      linear_s = head_s = 0;
      const auto t0 = clock_type::now();
      for (int t = 0; t < tokens; ++t) dec.step((t * 104729) % V, true);
      const double step_s = since(t0) / tokens;
      if (round == 0 || step_s < best.step_s) {
        best.step_s = step_s;
        best.linear_s = linear_s / tokens;
        best.head_s = head_s / tokens;
      }
      best.round_s.push_back(step_s);
      best.round_read_s.push_back(read_s);
    }
  for (Decode& d : out) d.median_s = median(d.round_s);
  return out;
}

// Seconds for N tokens through every linear and the head (fp32: oneDNN; packed: packed_matmul),
// the best of `rounds`.
double time_prefill(const model::ParamLayout& layout, const float* params,
                    const quant::PackedModel* pm, int N, int rounds) {
  const auto& cfg = layout.config();
  std::vector<float> X(static_cast<std::size_t>(N) * cfg.ffn(), 0.01f),
      Y(static_cast<std::size_t>(N) * cfg.padded_vocab());
  auto pass = [&] {
    for (int l = 0; l < cfg.n_layer; ++l)
      for (int k = 0; k < quant::k_num_lin; ++k) {
        const auto kind = static_cast<quant::Lin>(k);
        if (pm)
          quant::packed_matmul(pm->linears[std::size_t(l) * quant::k_num_lin + k], Y.data(),
                               X.data(), nullptr, N, pm->isa);
        else
          kernels::cpu::linear_forward(kernels::GemmLibrary::OneDnn, Y.data(), X.data(),
                                       params + quant::lin_weight_offset(layout, l, kind), nullptr,
                                       N, quant::lin_cols(cfg, kind), quant::lin_rows(cfg, kind));
      }
    const quant::PackedLinear* h = pm ? pm->head_matrix() : nullptr;
    if (h)
      quant::packed_matmul(*h, Y.data(), X.data(), nullptr, N, pm->isa);
    else
      kernels::cpu::linear_forward(kernels::GemmLibrary::OneDnn, Y.data(), X.data(),
                                   params + layout.head, nullptr, N, cfg.n_embd,
                                   cfg.padded_vocab());
  };
  pass();  // warm-up
  double best = 0;
  for (int round = 0; round < rounds; ++round) {
    const auto t0 = clock_type::now();
    pass();
    const double s = since(t0);
    best = round == 0 ? s : std::min(best, s);
  }
  return best;
}

// A prompt of N tokens into the decoder, the last one's logits: Decoder::prefill (all at once)
// and N steps, the best of `rounds` each (the steps: at most 2, they are the slow ones).
struct Prompt {
  double prefill_s = 0, steps_s = 0;
};
Prompt time_prompt(const model::ParamLayout& layout, const float* params,
                   const model::DecoderKernels& kernels, model::KvCache kv, int N, int rounds) {
  const auto& cfg = layout.config();
  std::vector<std::int32_t> toks(N);
  for (int t = 0; t < N; ++t) toks[t] = (t * 7919 + 11) % cfg.vocab_size;
  model::Decoder dec(layout, params, N, kernels::GemmLibrary::OneDnn, kernels, kv);
  Prompt best{1e30, 1e30};
  for (int round = 0; round < rounds; ++round) {
    dec.reset();
    auto t0 = clock_type::now();
    dec.prefill(toks.data(), N);
    best.prefill_s = std::min(best.prefill_s, since(t0));
    if (round >= 2) continue;
    dec.reset();
    t0 = clock_type::now();
    for (int t = 0; t < N; ++t) dec.step(toks[t], t + 1 == N);
    best.steps_s = std::min(best.steps_s, since(t0));
  }
  return best;
}

double linear_flops_per_token(const model::ModelConfig& cfg) {
  double f = 2.0 * cfg.n_embd * cfg.padded_vocab();
  for (int k = 0; k < quant::k_num_lin; ++k)
    f += 2.0 * cfg.n_layer * quant::lin_rows(cfg, static_cast<quant::Lin>(k)) *
         quant::lin_cols(cfg, static_cast<quant::Lin>(k));
  return f;
}

// oneDNN's fp32 GEMM rate (FLOP/s) on (N, K) x (K, M)^T, the best of 3.
double gemm_rate(int N, int M, int K) {
  std::vector<float> A(std::size_t(N) * K, 0.01f), B(std::size_t(M) * K, 0.01f),
      C(std::size_t(N) * M);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = clock_type::now();
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, N, M, K, 1.0f, A.data(), K, B.data(),
                  K, 0.0f, C.data(), M);
    if (rep > 0) best = std::max(best, 2.0 * N * M * K / since(t0));
  }
  return best;
}

// What one decode step reads of the weights: the block linears and the head (fp32: `params`;
// packed: their codes, scales and zeros).
std::vector<bench::Span> step_weights(const model::ParamLayout& layout, const float* params,
                                      const quant::PackedModel* pm) {
  const auto& cfg = layout.config();
  std::vector<bench::Span> out;
  auto add_packed = [&out](const quant::PackedLinear& p) {
    out.push_back({p.codes.data(), p.codes.size()});
    out.push_back({p.scales.data(), p.scales.size() * sizeof(p.scales[0])});
    if (!p.zeros.empty()) out.push_back({p.zeros.data(), p.zeros.size()});
    if (!p.real_zeros.empty())
      out.push_back({p.real_zeros.data(), p.real_zeros.size() * sizeof(p.real_zeros[0])});
  };
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < quant::k_num_lin; ++k) {
      const auto kind = static_cast<quant::Lin>(k);
      if (pm)
        add_packed(pm->linears[std::size_t(l) * quant::k_num_lin + k]);
      else
        out.push_back({params + quant::lin_weight_offset(layout, l, kind),
                       sizeof(float) * quant::lin_rows(cfg, kind) * quant::lin_cols(cfg, kind)});
    }
  if (pm && pm->head_matrix())
    add_packed(*pm->head_matrix());
  else
    out.push_back({params + layout.head, sizeof(float) * cfg.padded_vocab() * cfg.n_embd});
  return out;
}

// The model of format f: fp32 (fp's weights), RTN-quantized from them (saved to tmp and packed as
// sample packs a file, the embedding and head in 8 bits), or the model file's own blocks packed.
// `why` says why a file's format cannot run (and params is then null).
FormatModel format_model(const Format& f, const quant::AnyModel& fp, const std::string& file,
                         const fs::path& tmp, std::string& why) {
  const model::ParamLayout layout(fp.model.config);
  FormatModel m;
  if (std::string(f.key) == "file") {
    m.q = quant::load_packed_model(file, m.pm, why);
    if (!m.packed()) {
      if (why.empty()) why = m.q.description;
      return m;
    }
  } else if (f.wq.bits > 0) {
    quant::QuantizeOptions o;
    o.wq = f.wq;
    o.vocab_bits = 8;
    quant::save_quantized(tmp, quant::quantize_model(layout, fp.model.params.data(), o, nullptr));
    m.q = quant::load_any_model(tmp);
    m.pm = quant::pack_model(m.q);
  } else {
    m.params = fp.model.params.data();
    m.bytes = 4.0 * linear_flops_per_token(fp.model.config) / 2.0;  // a weight per multiply-add
    return m;
  }
  m.kernels = m.pm.decoder_kernels();
  m.params = m.q.model.params.data();
  m.bytes = static_cast<double>(m.pm.bytes() + m.pm.vocab_bytes());
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "data/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2, tokens = 64, context = 16, prefill = 128, stream_mib = 2048, rounds = 5;
  std::string kv_cache = "f32", formats_arg = "fp32,W8,W4,file";
  bench::Options()
      .add("model", model)
      .add("threads", threads)
      .add("tokens", tokens)
      .add("context", context)
      .add("prefill", prefill)
      .add("stream_mib", stream_mib)
      .add("rounds", rounds)
      .add("kv_cache", kv_cache)
      .add("formats", formats_arg)
      .parse(argc, argv);
  rounds = std::max(1, rounds);
  std::vector<model::KvCache> kvs;  // --kv_cache f32,f16: both, rounds alternating
  for (const auto& k : bench::split_list(kv_cache)) kvs.push_back(model::parse_kv_cache(k));
  if (!fs::exists(model)) {
    std::printf("(skipped: %s not found; scripts/setup --with-models fetches it)\n", model.c_str());
    return 0;
  }
  omp_set_num_threads(threads);
  const quant::AnyModel fp = quant::load_any_model(model);
  const model::ParamLayout layout(fp.model.config);
  const auto& cfg = fp.model.config;
  const double bw = bench::stream_read_gbs(stream_mib);
  const double rate = gemm_rate(prefill, cfg.ffn() * 2, cfg.n_embd);
  std::printf(
      "%s\n%d threads; memory read bandwidth %.1f GB/s; oneDNN fp32 GEMM %.0f GFLOP/s (%d x %d x "
      "%d); decode: %d tokens after a context of %d, KV cache %s (fp32: %.0f KB per position per "
      "token); prefill: %d tokens; best of %d rounds; int8 activations: %s; prompt kernel %s\n\n",
      model::describe(cfg).c_str(), threads, bw, rate / 1e9, prefill, cfg.ffn() * 2, cfg.n_embd,
      tokens, context, kv_cache.c_str(),
      2.0 * cfg.n_layer * cfg.kv_heads() * cfg.head_dim() * 4 / 1e3, prefill, rounds,
      quant::q8_dot_name(quant::best_isa()),
      quant::best_isa() == quant::Isa::Avx512 ? quant::describe_prompt_width().c_str() : "256-bit");
  std::printf("%-8s %8s %9s %8s %9s %8s %7s %9s %8s %8s %9s | %10s %9s\n", "format", "MB/tok",
              "ms/tok", "median", "tok/s", "vs fp32", "of bw", "(range)", "at start", "linears",
              "head", "prefill/s", "of GEMM");
  const auto formats = bench::split_list(formats_arg);
  const Format all_formats[] = {{"fp32", "fp32", {0, 0, false}},
                                {"W8", "W8 pc", {8, -1, true}},
                                {"W4", "W4 g128", {4, 128, false}},
                                {"file", "file", {0, 0, false}}};
  const fs::path tmp = fs::temp_directory_path() / ("bench_decode_" + std::to_string(::getpid()));
  double fp32_step = 0;
  for (const Format& f : all_formats) {
    if (std::find(formats.begin(), formats.end(), f.key) == formats.end()) continue;
    std::string why;
    const FormatModel m = format_model(f, fp, model, tmp, why);
    if (!m.params) {
      std::printf("%-8s (not run: %s)\n", f.name, why.c_str());
      continue;
    }
    const float* params = m.params;
    const quant::PackedModel* pm = m.packed() ? &m.pm : nullptr;
    const double bytes = m.bytes;
    const auto weights = step_weights(layout, params, pm);
    double read_bytes = 0;
    for (const auto& w : weights) read_bytes += static_cast<double>(w.bytes);
    const auto ds = time_decode(layout, params, m.kernels, context, tokens, rounds, weights, kvs);
    const double pre = time_prefill(layout, params, pm, prefill, rounds);
    const Prompt prompt =
        prefill > 0 ? time_prompt(layout, params, m.kernels, kvs[0], prefill, rounds) : Prompt{};
    const double clock_ghz = bench::core_clock_ghz();
    if (!pm) fp32_step = ds[0].step_s;
    for (std::size_t i = 0; i < kvs.size(); ++i) {
      const Decode& d = ds[i];
      // Each round against the read of the weights just before it; the median and range of those.
      std::vector<double> of_bw;
      for (std::size_t r = 0; r < d.round_s.size(); ++r)
        of_bw.push_back(100.0 * d.round_read_s[r] / d.round_s[r]);
      const auto [lo, hi] = std::minmax_element(of_bw.begin(), of_bw.end());
      char vs_fp32[16] = "       -";  // (fp32 not run)
      if (fp32_step > 0) std::snprintf(vs_fp32, sizeof vs_fp32, "%7.2fx", fp32_step / d.step_s);
      // "file": the file's type, from its description ("GGUF Q4_1 linears, ...": "Q4_1 gguf")
      const std::string& desc = m.q.description;
      const std::string label = std::string(f.key) == "file" && desc.starts_with("GGUF ")
                                    ? desc.substr(5, desc.find(' ', 5) - 5) + " gguf"
                                    : f.name;
      const std::string name =
          kvs.size() > 1 ? std::string(f.key) + " kv" + model::kv_cache_name(kvs[i]) : label;
      std::printf(
          "%-8s %8.1f %9.2f %8.2f %9.1f %s %6.0f%% %4.0f-%3.0f%% %7.0f%% %7.2fms %7.2fms | %10.0f "
          "%8.0f%%\n",
          name.c_str(), bytes / 1e6, d.step_s * 1e3, d.median_s * 1e3, 1.0 / d.step_s, vs_fp32,
          median(of_bw), *lo, *hi, 100.0 * bytes / bw / 1e9 / d.step_s, d.linear_s * 1e3,
          d.head_s * 1e3, prefill / pre,
          100.0 * linear_flops_per_token(cfg) * prefill / pre / rate);
      const auto [rlo, rhi] = std::minmax_element(d.round_read_s.begin(), d.round_read_s.end());
      std::printf(
          "%-8s (its weights, %.1f MB, read at %.1f-%.1f GB/s before its rounds; a core at %.2f "
          "GHz after them)\n",
          "", read_bytes / 1e6, read_bytes / *rhi / 1e9, read_bytes / *rlo / 1e9, clock_ghz);
    }
    if (prefill > 0)
      std::printf(
          "%-8s (a prompt of %d tokens into the decoder: prefill %.0f ms, %.0f tokens/s; step by "
          "step %.0f ms, %.0f tokens/s; %.1fx)\n",
          "", prefill, prompt.prefill_s * 1e3, prefill / prompt.prefill_s, prompt.steps_s * 1e3,
          prefill / prompt.steps_s, prompt.steps_s / prompt.prefill_s);
  }
  fs::remove_all(tmp);
  std::printf(
      "\nms/tok: the best round (median: the median round); of bw: the time the weights take to "
      "read (one streaming read of those very bytes, timed just before a round) / that round's "
      "step, the median over the rounds (range: lowest and highest round);\nat start: the weights' "
      "bytes at the bandwidth of a separate buffer measured at start / the best round; linears, "
      "head: thread 0's share of them in the best round's "
      "step (the rest: norms, rotary, attention, embedding, the waits for the team)\n");
  return 0;
}
