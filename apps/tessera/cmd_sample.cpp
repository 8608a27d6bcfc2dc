// tessera sample --model DIR [--prompt TEXT] [--tokens N] [--temperature X] [--top-k K] [--seed S]
//                [--device cpu|cuda] [--precision fp32|bf16] [--kernels packed|packed-a16|fp32]
//                [--kv-cache f32|f16]
#include <algorithm>
#include <chrono>
#include <cmath>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cstdio>
#include <functional>

#include "commands.hpp"
#include "model_paths.hpp"
#include "option_checks.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/model/gpt_device.hpp"
#include "tessera/quant/generate.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::app {

namespace fs = std::filesystem;

namespace {

// Hands the allocator's free memory back to the system (glibc keeps freed blocks of its heap
// otherwise: the unpacked codes, freed after packing, would stay resident).
void release_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// The block linears' formats, each with its count where they differ: "W4 g128 asym fp16", or
// "W5 g32 sym fp16 x106, W8 g32 sym fp16 x14, ...".
std::string describe_linears(const quant::PackedModel& pm) {
  std::vector<std::pair<std::string, int>> kinds;
  for (const auto& l : pm.linears) {
    const std::string d = l.describe();
    const auto it = std::find_if(kinds.begin(), kinds.end(), [&](auto& k) { return k.first == d; });
    if (it == kinds.end())
      kinds.emplace_back(d, 1);
    else
      ++it->second;
  }
  if (kinds.size() == 1) return kinds.front().first;
  std::string s;
  for (const auto& [d, n] : kinds) s += fmt::format("{}{} x{}", s.empty() ? "" : ", ", d, n);
  return s;
}

std::string describe_packed(const quant::PackedModel& pm) {
  std::string s = fmt::format(
      "packed {} ({:.2f} bits per weight), {}", describe_linears(pm), pm.bits_per_weight(),
      pm.int8_activations ? fmt::format("int8 activations{} ({})",
                                        pm.act_scale == quant::ActScale::PerRow ? " per token" : "",
                                        quant::q8_dot_name(pm.isa))
                          : fmt::format("fp32 activations ({})", quant::isa_name(pm.isa)));
  if (pm.embed.rows) s += fmt::format(", embedding {}", pm.embed.describe());
  return s;
}

// One line on stderr after the text, as llama.cpp prints its timings: the prompt's tokens (through
// the KV-cache decoder in one pass, the first generated token's sampling included), the
// generated tokens' rate after the first, and this process's resident memory at the last token
// (while decoding) and at its peak (loading included).
void print_timings(int prompt_tokens, int generated, std::chrono::steady_clock::time_point t0,
                   std::chrono::steady_clock::time_point t_first,
                   std::chrono::steady_clock::time_point t_end, std::size_t resident,
                   const std::string& kernels) {
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::string line = fmt::format("prompt {} tokens in {:.2f} s", prompt_tokens, secs(t0, t_first));
  if (generated > 1) {
    const double d = secs(t_first, t_end) / (generated - 1);
    line += fmt::format("; generated {} tokens, {:.1f} tokens/s ({:.1f} ms/token)", generated,
                        1.0 / d, 1e3 * d);
  }
  std::fprintf(stderr, "%s; resident %.0f MB (peak %.0f MB); %s\n", line.c_str(), resident / 1e6,
               peak_resident_bytes() / 1e6, kernels.c_str());
}

struct SampleArgs {
  std::string model;
  std::string prompt;
  std::string tokenizer;  // "": the model's own, else GPT-2's
  int tokens = 128;
  double temperature = 1.0;
  int top_k = 40;
  std::uint64_t seed = 42;
  bool ids = false;
  bool stop_at_eot = false;
  std::string device = "cpu", precision = "fp32", kernels = "packed", kv_cache = "f32";
};

void check_args(const SampleArgs& a) {
  if (a.tokens < 1)
    throw Error(fmt::format("--tokens must be >= 1, got {}", a.tokens),
                "the number of tokens to generate after the prompt");
  if (!std::isfinite(a.temperature) || a.temperature < 0)
    throw Error(fmt::format("--temperature must be a number >= 0, got {}", a.temperature),
                "0 means greedy; 1 samples from the model's distribution");
  if (a.top_k < 0) throw Error("--top-k must be >= 0");
  if (a.precision == "bf16" && a.device != "cuda")
    throw Error("--precision bf16 is implemented on the GPU only", "add --device cuda");
  if (a.kv_cache != "f32" && a.device != "cpu")
    throw Error("--kv-cache is the CPU decoder's (the GPU's cache is in --precision)",
                "leave it out with --device cuda");
}

// The model to sample from. With the packed kernels on the CPU a quantized file is packed as it
// loads, never resident unpacked; one that they do not take loads again, dequantized.
struct SampleModel {
  quant::AnyModel any;
  quant::PackedModel packed;  // empty unless packed
};

SampleModel load_for_sampling(const SampleArgs& a) {
  const auto path = resolve_model_path(a.model);
  SampleModel m;
  std::string not_packed;
  if (a.device == "cpu" && a.kernels != "fp32")
    m.any = quant::load_packed_or_dequantized(path, m.packed, not_packed);
  else
    m.any = quant::load_any_model(path);
  if (!not_packed.empty())
    std::fprintf(stderr, "note: sampling with the dequantized weights: %s\n", not_packed.c_str());
  if (a.device == "cuda" && m.any.act.mode != quant::ActMode::None)
    throw Error("--device cuda samples from unquantized (or weight-only quantized) models only",
                "sample this model on the CPU");
  return m;
}

eval::SampleOptions sample_options(const SampleArgs& a, const data::Tokenizer& tok) {
  eval::SampleOptions so;
  so.max_new_tokens = a.tokens;
  so.temperature = static_cast<float>(a.temperature);
  so.top_k = a.top_k;
  so.kv_cache = model::parse_kv_cache(a.kv_cache);
  if (a.stop_at_eot) so.stop_token = static_cast<std::int32_t>(tok.eot_id());
  return so;
}

using Emit = std::function<void(std::int32_t)>;

// On the current NVIDIA GPU: the device's KV-cache decoder, the model sized for the context the
// call reaches. `start` is set once the weights are on the device (the prompt's time counts from
// there).
void generate_on_gpu(const model::ModelConfig& cfg, const float* params, bool bf16,
                     const std::vector<std::int32_t>& prompt, const eval::SampleOptions& so,
                     Rng& rng, const Emit& emit, std::chrono::steady_clock::time_point& start) {
  model::DeviceGpt dev(cfg, bf16 ? model::DevicePrecision::Bf16 : model::DevicePrecision::Fp32, 1,
                       eval::decode_capacity(cfg.block_size, prompt.size(), so));
  dev.upload_params(params);
  start = std::chrono::steady_clock::now();
  eval::generate(dev, prompt, so, rng, emit);
}

// Whether the CPU samples without the KV cache: the files the packed kernels do not take and that
// quantize their activations in a way the decoder cannot reproduce one token at a time
// (per-tensor W8A8, LLM.int8()) simulate that rounding, recomputing the context per token.
bool recomputes_context(const eval::SampleOptions& so, const quant::ActQuant& act) {
  return !so.kernels.linear && act.mode != quant::ActMode::None;
}

// On the CPU: the KV-cache decoder over the fp32 (or dequantized) weights, or the packed kernels
// where `so` carries them; else (recomputes_context) the simulated activation rounding.
void generate_on_cpu(const model::ParamLayout& layout, const float* params,
                     const quant::ActQuant& act, const std::vector<std::int32_t>& prompt,
                     const eval::SampleOptions& so, Rng& rng, const Emit& emit) {
  if (recomputes_context(so, act)) {
    if (so.kv_cache != model::KvCache::F32)
      std::fprintf(stderr, "note: --kv-cache: this model recomputes its context per token\n");
    quant::generate(layout, params, act, prompt, so, rng, emit);
  } else {
    eval::generate(layout, params, prompt, so, rng, emit);
  }
}

}  // namespace

void add_sample_command(CLI::App& root) {
  auto* cmd =
      root.add_subcommand("sample", "generate text from a trained model (KV-cache decoding)");
  auto a = std::make_shared<SampleArgs>();
  cmd->add_option(
         "--model,-m", a->model,
         "run directory, checkpoint directory, model.safetensors (Hugging Face GPT-2 and "
         "Llama work too), a llama .gguf file, or a pretrained model's short name (smollm2-135m)")
      ->required();
  cmd->add_option("--prompt,-p", a->prompt, "text to continue (default: start of a document)");
  cmd->add_option("--tokens", a->tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature,-t", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k,-k", a->top_k, "sample among the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "random seed")
      ->check(k_unsigned_number)
      ->capture_default_str();
  cmd->add_option(
      "--tokenizer", a->tokenizer,
      "the tokenizer (default: the model's own, from its .gguf file or a "
      "tokenizer.json or tokenizer.gguf beside it, else GPT-2's in data/gpt2): a .gguf file, a "
      "tokenizer.json, a directory holding one, or a pretrained model's short name");
  cmd->add_flag("--ids", a->ids, "print token ids instead of text");
  cmd->add_flag("--stop-at-eot", a->stop_at_eot,
                "stop at the end-of-text token (<|endoftext|>, or the model's end of sequence)");
  cmd->add_option("--device", a->device,
                  "cpu or cuda (the current NVIDIA GPU); both decode with a KV cache")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--precision", a->precision, "with --device cuda: fp32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--kernels", a->kernels,
                  "weight-only quantized files on the CPU: packed (int4/int8 weights with fp16 "
                  "scales, activations rounded to int8 per 32 values for integer dot products), "
                  "packed-a16 (the packed weights with fp32 activations) or fp32 (the "
                  "dequantized weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"packed", "packed-a16", "fp32"}));
  cmd->add_option("--kv-cache", a->kv_cache,
                  "the CPU decoder's cache of keys and values: f32, or f16 (half its memory and "
                  "of what each token reads from it; keys and values rounded to fp16)")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {model::kv_cache_name(model::KvCache::F32), model::kv_cache_name(model::KvCache::F16)}));
  cmd->callback([a] {
    check_args(*a);
    SampleModel m = load_for_sampling(*a);
    quant::AnyModel& any = m.any;
    quant::PackedModel& packed = m.packed;
    auto& loaded = any.model;
    model::ParamLayout layout(loaded.config);
    auto tok = io::load_tokenizer(resolve_tokenizer_path(a->tokenizer, a->model));
    io::require_tokenizer_fits(tok, loaded.config.vocab_size);
    const std::vector<std::int32_t> prompt = tok.prompt(a->prompt);
    eval::SampleOptions so = sample_options(*a, tok);
    Rng rng(a->seed);
    if (!a->ids) std::fputs(a->prompt.c_str(), stdout);
    std::fflush(stdout);
    using clock = std::chrono::steady_clock;
    auto t_start = clock::now(), t_first = t_start;  // set again when decoding starts
    int generated = 0;
    std::size_t resident = 0;
    auto print = [&](std::int32_t t) {
      if (generated++ == 0) t_first = clock::now();
      resident = resident_bytes();  // while decoding: the cache and the weights in use
      if (a->ids) {
        std::printf("%d ", t);
      } else if (t < static_cast<std::int32_t>(tok.vocab_size())) {
        std::uint32_t id = static_cast<std::uint32_t>(t);
        std::fputs(tok.decode({&id, 1}).c_str(), stdout);
      }
      std::fflush(stdout);
    };
    std::string kernels_used = any.quantized ? any.description + ", dequantized to fp32" : "fp32";
    if (a->device == "cpu" && !packed.linears.empty()) {  // decode from the packed form
      packed.int8_activations = a->kernels == "packed";
      so.kernels = packed.decoder_kernels();
      packed.release_packed_weights(layout, loaded.params.data());
      release_free_heap();
      kernels_used = describe_packed(packed);
      if (any.description.starts_with("GGUF")) kernels_used += " from " + any.description;
    }
    if (a->device == "cpu" && so.kv_cache != model::KvCache::F32 &&
        !recomputes_context(so, any.act))
      kernels_used += ", KV cache f16";
    t_start = clock::now();
    if (a->device == "cuda")
      generate_on_gpu(loaded.config, loaded.params.data(), a->precision == "bf16", prompt, so, rng,
                      print, t_start);
    else
      generate_on_cpu(layout, loaded.params.data(), any.act, prompt, so, rng, print);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    print_timings(static_cast<int>(prompt.size()), generated, t_start, t_first, clock::now(),
                  resident, kernels_used);
  });
}

}  // namespace tessera::app
