// tessera eval --model DIR --data SHARD [--batch B] [--seq T] [--batches N]
// tessera eval memorization --model DIR --docs FILE.jsonl [--suffix 50] [--out DIR]
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "eval_protocols.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/corpus.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/eval/memorization.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/model/gpt_device.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::app {

namespace {

// tessera eval memorization: greedy continuation of each document's prefix vs its true suffix.
CLI::App* add_memorization_command(CLI::App& eval) {
  auto* cmd = eval.add_subcommand(
      "memorization", "how much of each document's ending a model reproduces (greedy decoding)");
  struct Args {
    std::string model;
    std::string docs;
    std::string out = "memorization";
    std::string tokenizer;  // "": the model's own, else GPT-2's
    int suffix = 50;
    int max_docs = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "run directory, checkpoint directory, model.safetensors, a llama .gguf file, "
                  "or a pretrained model's short name (smollm2-135m)")
      ->required();
  cmd->add_option("--docs", a->docs, "JSONL file, one document per line (field \"text\")")
      ->required();
  cmd->add_option("--suffix", a->suffix, "tokens to reproduce at the end of each document")
      ->capture_default_str();
  cmd->add_option("--out,-o", a->out, "folder for memorization.csv and memorization_summary.json")
      ->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "the tokenizer (default: the model's own, from its .gguf file or a "
                  "tokenizer.json or tokenizer.gguf beside it, else GPT-2's in data/gpt2)");
  cmd->add_option("--max-docs", a->max_docs, "score only the first N documents (0 = all)")
      ->capture_default_str();
  cmd->callback([a] {
    namespace fs = std::filesystem;
    if (a->suffix <= 0) throw Error(fmt::format("--suffix must be positive (got {})", a->suffix));
    if (a->max_docs < 0) throw Error("--max-docs must be >= 0");
    if (input_kind(a->docs, "documents file") == InputKind::Missing)
      throw Error(fmt::format("documents file not found: {}", a->docs),
                  "give a JSONL file with one {\"text\": ...} object per line");
    auto texts = data::jsonl_documents(a->docs);
    if (a->max_docs > 0 && texts.size() > static_cast<std::size_t>(a->max_docs))
      texts.resize(static_cast<std::size_t>(a->max_docs));
    auto loaded = io::load_model(resolve_model_path(a->model));
    model::ParamLayout layout(loaded.config);
    auto tok = io::load_tokenizer(resolve_tokenizer_path(a->tokenizer, a->model));
    io::require_tokenizer_fits(tok, loaded.config.vocab_size);
    std::vector<std::vector<std::int32_t>> docs;
    docs.reserve(texts.size());
    for (const auto& t : texts) {
      auto& ids = docs.emplace_back();
      if (tok.add_bos()) ids.push_back(static_cast<std::int32_t>(*tok.bos_id()));
      for (auto id : tok.encode(t)) ids.push_back(static_cast<std::int32_t>(id));
    }
    auto r = eval::score_documents(layout, loaded.params.data(), docs, a->suffix,
                                   kernels::GemmLibrary::OneDnn, &tok);
    if (r.rows.empty())
      throw Error(fmt::format("none of the {} documents has more than --suffix {} tokens: "
                              "nothing to score",
                              docs.size(), a->suffix),
                  "lower --suffix, or give longer documents");

    fs::path out(a->out);
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) throw Error(fmt::format("cannot create {}: {}", out.string(), ec.message()));
    {
      std::ofstream csv(out / "memorization.csv");
      if (!csv) throw Error(fmt::format("cannot write {}", (out / "memorization.csv").string()));
      csv << "index,prompt_tokens,exact,token_match,rouge_l,rouge_l_words\n";
      for (const auto& row : r.rows)
        csv << fmt::format("{},{},{},{:.6f},{:.6f},{:.6f}\n", row.index, row.prompt_tokens,
                           row.exact ? 1 : 0, row.token_match, row.rouge_l, row.rouge_l_words);
    }
    nlohmann::json summary{
        {"documents", texts.size()},
        {"scored", r.rows.size()},
        {"skipped", r.skipped},
        {"suffix", a->suffix},
        {"max_prompt_tokens", r.max_prompt},
        {"truncated_prompts", r.truncated},
        {"exact_match_rate", r.exact_rate},
        {"mean_token_match", r.mean_token_match},
        {"mean_rouge_l", r.mean_rouge_l},
        {"mean_rouge_l_words", r.mean_rouge_l_words},
        {"protocol", fmt::format("greedy decoding of the last {} tokens; the prompt is the "
                                 "last {} tokens before them (block_size {} - suffix)",
                                 a->suffix, r.max_prompt, loaded.config.block_size)}};
    {
      std::ofstream js(out / "memorization_summary.json");
      if (!js)
        throw Error(fmt::format("cannot write {}", (out / "memorization_summary.json").string()));
      js << summary.dump(2) << "\n";
    }
    std::printf("documents scored %zu, skipped %zu (fewer than %d tokens)\n", r.rows.size(),
                r.skipped, a->suffix + 1);
    std::printf("exact match %.4f  mean token match %.4f  mean ROUGE-L %.4f (words %.4f)\n",
                r.exact_rate, r.mean_token_match, r.mean_rouge_l, r.mean_rouge_l_words);
    std::printf(
        "protocol: greedy decoding of %d tokens; prompt capped at the last %d tokens (block_size "
        "%d "
        "- suffix), %zu prompts truncated\n",
        a->suffix, r.max_prompt, loaded.config.block_size, r.truncated);
    std::printf("wrote %s and %s\n", (out / "memorization.csv").string().c_str(),
                (out / "memorization_summary.json").string().c_str());
  });
  return cmd;
}

}  // namespace

namespace {
// The mean loss of a window from a function of its logits (the packed model's).
eval::ScoreFn window_loss(eval::LogitsFn fn, const model::ModelConfig& cfg) {
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab();
  return [fn = std::move(fn), V, Vp](const std::int32_t* x, const std::int32_t* y, int B, int T) {
    const std::int64_t N = static_cast<std::int64_t>(B) * T;
    std::vector<float> logits(static_cast<std::size_t>(N) * Vp), losses(N);
    fn(x, B, T, logits.data());
    kernels::cpu::cross_entropy_forward(losses.data(), logits.data(), y, N, V, Vp);
    double sum = 0;
    for (float l : losses) sum += l;
    return static_cast<float>(sum / static_cast<double>(N));
  };
}
}  // namespace

void add_eval_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("eval", "loss and perplexity of a model on a token shard");
  struct Args {
    std::string model;
    std::string data = "data/brown/val.bin";
    int batch = 4;
    int seq = 0;
    int batches = 0;
    bool json = false;
    std::string protocol, reference;
    std::string device = "cpu", precision = "fp32", kernels = "packed";
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "run directory, checkpoint directory, model.safetensors, a llama .gguf file, "
                  "or a pretrained model's short name (smollm2-135m)");
  cmd->add_option("--kernels", a->kernels,
                  "quantized files: packed (every linear through the packed prefill kernel) or "
                  "fp32 (the dequantized weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"packed", "fp32"}));
  cmd->add_option("--protocol", a->protocol,
                  "windows (non-overlapping, every token), llama (chunks, second half) or both");
  cmd->add_option("--reference", a->reference,
                  "KL divergence of the model's predictions against this (unquantized) model");
  cmd->add_option("--data,-d", a->data, "token shard (from tessera prepare)")
      ->capture_default_str();
  cmd->add_option("--batch,-b", a->batch, "sequences per forward pass")->capture_default_str();
  cmd->add_option("--seq", a->seq, "tokens per sequence (0 = the model's block_size, at most 1024)")
      ->capture_default_str();
  cmd->add_option(
         "--batches", a->batches,
         "batches of --batch sequences to score (with --protocol: windows; 0 = the whole shard)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print the result as JSON");
  cmd->add_option("--device", a->device, "cpu, or cuda (the current NVIDIA GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--precision", a->precision, "with --device cuda: fp32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  auto* mem = add_memorization_command(*cmd);
  cmd->callback([a, mem] {
    if (mem->parsed()) return;
    if (a->model.empty()) throw Error("eval needs --model");
    if (a->batch <= 0) throw Error("--batch must be positive");
    if (a->seq < 0 || a->batches < 0) throw Error("--seq and --batches must be >= 0");
    if (a->precision == "bf16" && a->device != "cuda")
      throw Error("--precision bf16 is implemented on the GPU only", "add --device cuda");
    const EvaluatedModel em =
        load_evaluated(resolve_model_path(a->model), a->kernels, a->device == "cpu");
    const quant::AnyModel& any = em.any;
    const bool quantized = any.act.mode != quant::ActMode::None;
    if (a->device == "cuda" && (!a->protocol.empty() || !a->reference.empty() || quantized))
      throw Error("--device cuda evaluates unquantized models with the plain windows protocol only",
                  "drop --protocol / --reference, or evaluate on the CPU");
    if (!a->protocol.empty() || !a->reference.empty() || quantized) {
      eval_protocols(em,
                     {a->data, a->protocol, a->reference, a->seq, a->batch, a->batches, a->json});
      return;
    }
    auto& loaded = any.model;
    model::ParamLayout layout(loaded.config);
    int T = a->seq > 0 ? a->seq : default_eval_window(loaded.config);
    if (T > loaded.config.block_size)
      throw Error(
          fmt::format("--seq {} exceeds the model's block_size {}", T, loaded.config.block_size));
    eval::EvalResult r;
    if (a->device == "cuda") {
      model::DeviceGpt dev(
          loaded.config,
          a->precision == "bf16" ? model::DevicePrecision::Bf16 : model::DevicePrecision::Fp32,
          a->batch, T);
      dev.upload_params(loaded.params.data());
      r = eval::evaluate_shard(
          loaded.config.vocab_size, a->data, a->batch, T, a->batches,
          [&](const std::int32_t* x, const std::int32_t* y, int B, int t) {
            return dev.forward(x, y, B, t, false, 0.0f);
          },
          true);
    } else if (any.quantized && a->kernels == "packed") {  // weight-only: the packed kernels
      r = eval::evaluate_shard(loaded.config.vocab_size, a->data, a->batch, T, a->batches,
                               window_loss(model_logits(em, layout), loaded.config), true);
    } else {
      model::Activations acts;
      r = eval::evaluate_shard(layout, loaded.params.data(), acts, a->data, a->batch, T, a->batches,
                               kernels::GemmLibrary::OneDnn, true);
    }
    if (a->json)
      std::printf(
          "{\"loss\": %.6f, \"perplexity\": %.4f, \"tokens\": %lld, \"protocol\": "
          "\"non-overlapping windows of %d, every token scored\"}\n",
          r.loss, r.perplexity, static_cast<long long>(r.tokens), T);
    else
      std::printf(
          "loss %.4f  perplexity %.2f  (%lld tokens; non-overlapping windows of %d, every token "
          "scored)\n",
          r.loss, r.perplexity, static_cast<long long>(r.tokens), T);
  });
}

}  // namespace tessera::app
