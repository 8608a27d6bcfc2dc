// tessera quantize --model M --out DIR --method gptq|awq|rtn|smoothquant|w8a8|llm-int8
//                  [--bits 4] [--group 128] [--sym] [--calib corpus] [--nsamples 128] ...
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "calib_flags.hpp"
#include "commands.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/study.hpp"

namespace tessera::app {

namespace {
// The quantized file's size, in bits per parameter and against the fp32 model's size.
void print_file_size(const std::filesystem::path& file, const model::ParamLayout& layout) {
  const double bytes = static_cast<double>(std::filesystem::file_size(file)),
               n = static_cast<double>(layout.count_unpadded());
  std::printf("file %.1f MB: %.2f bits per parameter, %.2fx the fp32 model's %.1f MB\n",
              bytes / 1e6, 8.0 * bytes / n, bytes / (4.0 * n), 4.0 * n / 1e6);
}

// Where the fp32 embedding and head are a quarter of the file or more (a small model's
// vocabulary), says so: they are then much of what decoding reads per token.
void hint_vocab_bits(const model::ParamLayout& layout, const quant::QuantizeOptions& qo,
                     const std::filesystem::path& file) {
  if (qo.vocab_bits != 0) return;
  double vocab = 0;
  for (const auto& t : layout.tensors())
    if (t.vocab_rows) vocab += 4.0 * layout.config().vocab_size * layout.config().n_embd;
  const double bytes = static_cast<double>(std::filesystem::file_size(file));
  if (vocab < 0.25 * bytes) return;
  std::printf(
      "note: the fp32 embedding%s %.1f MB of it (%.0f%%), read in full for every token decoded; "
      "--vocab-bits 8 rounds %s to 8 bits per row\n",
      layout.config().tie_embeddings ? " (the tied head) is" : " and head are", vocab / 1e6,
      100.0 * vocab / bytes, layout.config().tie_embeddings ? "it" : "them");
}
}  // namespace

void add_quantize_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "quantize", "post-training quantization (RTN, GPTQ, AWQ, SmoothQuant, W8A8, LLM.int8())");
  struct Args {
    std::string model, out, method = "gptq", act = "per-token";
    CalibFlags cf = [] {
      CalibFlags f;
      f.nsamples = 128;
      return f;
    }();
    std::string eval_data;
    int bits = 4, group = 128, blocksize = 128, eval_windows = 32, vocab_bits = 0;
    bool sym = false, act_order = false, static_groups = false, no_clip = false, verbose = false;
    bool recon = false, min_offset = false, overwrite = false;
    double damp = 0.01, alpha = 0.5, threshold = 6.0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "run directory, checkpoint directory, model.safetensors (Hugging Face GPT-2 "
                  "and Llama too), a .gguf file, or a pretrained model's short name")
      ->required();
  cmd->add_option("--out,-o", a->out, "directory for the quantized model.safetensors")->required();
  cmd->add_flag("--overwrite", a->overwrite, "replace a model already in --out");
  cmd->add_option("--method", a->method, "rtn, gptq, awq, smoothquant, w8a8 or llm-int8")
      ->capture_default_str();
  cmd->add_option("--bits", a->bits, "weight bits for rtn/gptq/awq (2..8)")->capture_default_str();
  cmd->add_option("--group", a->group, "columns per quantization group (-1 = per channel)")
      ->capture_default_str();
  cmd->add_flag("--sym", a->sym, "symmetric weight quantizer (default asymmetric)");
  cmd->add_flag("--min-offset", a->min_offset,
                "asymmetric with each group's minimum as a float offset (llama.cpp's Q4_1 form) "
                "instead of a zero point on the grid");
  cmd->add_option("--vocab-bits", a->vocab_bits,
                  "the token embedding and an untied LM head: 0 keeps them fp32, 8 rounds them "
                  "to 8 bits per row (symmetric); the packed decoder reads them quantized")
      ->check(CLI::IsMember({0, 8}))
      ->capture_default_str();
  add_calibration_options(cmd, a->cf);
  cmd->add_option("--damp", a->damp, "GPTQ relative damping")->capture_default_str();
  cmd->add_option("--blocksize", a->blocksize, "GPTQ lazy batch width")->capture_default_str();
  cmd->add_flag("--act-order", a->act_order,
                "GPTQ: quantize columns by descending Hessian diagonal");
  cmd->add_flag("--static-groups", a->static_groups, "GPTQ: groups fitted before any update");
  cmd->add_flag("--no-clip", a->no_clip, "AWQ: skip the clipping search");
  cmd->add_option("--alpha", a->alpha, "SmoothQuant migration strength")->capture_default_str();
  cmd->add_option("--act", a->act,
                  "activation quantization of smoothquant/w8a8: per-token or "
                  "per-tensor")
      ->capture_default_str();
  cmd->add_option("--threshold", a->threshold, "LLM.int8() outlier threshold")
      ->capture_default_str();
  cmd->add_option("--eval", a->eval_data,
                  "after quantizing, compare with the original on this "
                  "token shard (perplexity by both protocols, KL)");
  cmd->add_option("--eval-windows", a->eval_windows, "windows of block_size for --eval")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_flag("--verbose,-v", a->verbose, "per-layer progress");
  cmd->add_flag("--recon", a->recon,
                "print each linear's relative reconstruction error ||WX - W'X||^2 / ||WX||^2 on "
                "the calibration inputs of the original model, beside RTN's");
  cmd->callback([a] {
    using clock = std::chrono::steady_clock;
    refuse_existing_model(a->out, false, a->overwrite);
    quant::QuantizeOptions qo;
    qo.method = quant::parse_method(a->method);
    qo.wq = quant::WeightQuant{a->bits, a->group, a->sym, a->min_offset};
    if (a->sym && a->min_offset)
      throw Error("--sym and --min-offset exclude each other",
                  "the minimum offset is a form of the asymmetric quantizer");
    quant::validate(qo.wq);
    qo.damp = a->damp;
    if (!(a->damp > 0 && a->damp < 1))  // NaN fails too
      throw Error(fmt::format("--damp must be in (0, 1), got {}", a->damp), "the default is 0.01");
    if (a->blocksize < 1) throw Error("--blocksize must be >= 1");
    qo.blocksize = a->blocksize;
    qo.act_order = a->act_order;
    qo.static_groups = a->static_groups;
    qo.awq_clip = !a->no_clip;
    if (!(a->alpha >= 0 && a->alpha <= 1))  // NaN fails too
      throw Error(fmt::format("--alpha must be in [0, 1], got {}", a->alpha));
    qo.alpha = static_cast<float>(a->alpha);
    qo.act = quant::parse_act_mode(a->act);
    if (qo.act != quant::ActMode::PerToken && qo.act != quant::ActMode::PerTensor)
      throw Error("--act must be per-token or per-tensor");
    if (!std::isfinite(a->threshold) || a->threshold <= 0)
      throw Error(fmt::format("--threshold must be a positive number, got {}", a->threshold),
                  "LLM.int8() uses 6.0");
    qo.int8_threshold = static_cast<float>(a->threshold);
    qo.verbose = a->verbose;
    qo.vocab_bits = a->vocab_bits;
    auto path = resolve_model_path(a->model);
    auto any = quant::load_any_model(path);
    if (any.quantized)
      throw Error(fmt::format("{} is already quantized ({})", path.string(), any.description),
                  "quantize the original fp32 model");
    const auto& cfg = any.model.config;
    model::ParamLayout layout(cfg);
    quant::CalibSet calib;
    const bool needs = quant::needs_calibration(qo.method);
    if (needs) {
      calib = calibration_from_flags(a->cf, cfg, a->model);
    }
    auto t0 = clock::now();
    auto qm = quant::quantize_model(layout, any.model.params.data(), qo, needs ? &calib : nullptr);
    double secs = std::chrono::duration<double>(clock::now() - t0).count();
    qm.info["source"] = path.string();
    quant::save_quantized(a->out, qm);
    write_own_tokenizer(a->out, a->cf.tokenizer, a->model, cfg.vocab_size);
    std::printf("quantized %s (%s) with %s%s in %.1f s -> %s/model.safetensors\n",
                path.string().c_str(), model::describe(cfg).c_str(), a->method.c_str(),
                needs ? (" on " + calib.describe()).c_str() : "", secs, a->out.c_str());
    print_file_size(std::filesystem::path(a->out) / "model.safetensors", layout);
    hint_vocab_bits(layout, qo, std::filesystem::path(a->out) / "model.safetensors");
    if (a->recon) {
      if (!needs) throw Error("--recon needs a method with calibration (gptq, awq, smoothquant)");
      auto cap = quant::capture(layout, any.model.params.data(), calib, true);
      quant::QuantizeOptions ro = qo;
      ro.method =
          qo.method == quant::Method::SmoothQuant ? quant::Method::W8A8 : quant::Method::Rtn;
      auto ref = quant::quantize_model(layout, any.model.params.data(), ro, nullptr);
      auto e = quant::relative_reconstruction_error(layout, any.model.params.data(), qm, cap);
      auto er = quant::relative_reconstruction_error(layout, any.model.params.data(), ref, cap);
      std::printf("%-20s %14s %14s %8s\n", "linear", a->method.c_str(),
                  quant::method_name(ro.method), "ratio");
      for (std::size_t i = 0; i < e.size(); ++i)
        std::printf("%-20s %14.6e %14.6e %8.3f\n", qm.linears[i].name.c_str(), e[i], er[i],
                    er[i] > 0 ? e[i] / er[i] : 0.0);
    }
    if (!a->eval_data.empty()) {
      const int ctx = cfg.block_size, V = cfg.vocab_size, Vp = cfg.padded_vocab();
      auto toks =
          quant::read_tokens(a->eval_data, static_cast<std::size_t>(a->eval_windows) * ctx, V);
      auto fp = quant::logits_fn(layout, any.model.params.data(), {});
      auto qf = quant::logits_fn(layout, qm.params.data(), qm.act);
      for (auto proto : {eval::PplProtocol::Windows, eval::PplProtocol::SecondHalf}) {
        auto rf = eval::perplexity(fp, toks, ctx, V, Vp, proto, a->eval_windows);
        auto rq = eval::perplexity(qf, toks, ctx, V, Vp, proto, a->eval_windows);
        std::printf("perplexity fp32 %.3f  quantized %.3f  (%+.2f%%; %s; %lld tokens)\n",
                    rf.perplexity, rq.perplexity, 100 * (rq.perplexity / rf.perplexity - 1),
                    rf.label.c_str(), static_cast<long long>(rq.scored));
      }
      auto kl = eval::kl_divergence(fp, qf, toks, ctx, V, Vp, a->eval_windows);
      std::printf(
          "KL(fp32 || quantized) mean %.5f  median %.5f  p99 %.5f  max %.4f  top-1 "
          "agreement %.4f  (%lld positions)\n",
          kl.mean, kl.median, kl.p99, kl.max, kl.top1_agreement,
          static_cast<long long>(kl.positions));
    }
  });
}

}  // namespace tessera::app
