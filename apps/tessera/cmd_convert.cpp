// tessera convert: a model in any form tessera reads (a checkpoint or run directory, a
// model.safetensors, a llama or gpt2 .gguf file, a short name) written as a Hugging Face
// checkpoint: config.json and model.safetensors (fp32, bf16 or fp16; sharded with
// model.safetensors.index.json beyond --max-shard-size), ready for transformers' from_pretrained;
// or, with --format gguf, as one llama.cpp GGUF file.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/quant/gguf_export.hpp"

namespace tessera::app {

void add_convert_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "convert",
      "write a model (checkpoint, .gguf, short name) as a Hugging Face checkpoint or a GGUF file");
  struct Args {
    std::string model, out, dtype = "fp32", format = "hf", tokenizer, max_shard_size = "5GB";
    bool overwrite = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "run directory, checkpoint directory, model.safetensors, a llama or gpt2 .gguf "
                  "file, or a pretrained model's short name (smollm2-135m)")
      ->required();
  cmd->add_option("--out,-o", a->out,
                  "hf: the folder to write config.json and model.safetensors to; gguf: the file")
      ->required();
  cmd->add_option(
         "--format", a->format,
         "hf (a Hugging Face checkpoint) or gguf (llama.cpp's file, llama and gpt2 models)")
      ->capture_default_str()
      ->check(CLI::IsMember({"hf", "gguf"}));
  cmd->add_option("--tokenizer", a->tokenizer,
                  "the tokenizer to write with the model (default: the model's own; hf: none "
                  "for GPT-2's)");
  cmd->add_option("--dtype", a->dtype,
                  "the weights' type in the file: fp32, bf16 or fp16 (gguf: also q8_0, q4_0, q4_1)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "q8_0", "q4_0", "q4_1"}));
  auto* shard_opt =
      cmd->add_option("--max-shard-size", a->max_shard_size,
                      "hf: the largest weight file (500MB, 2GB, 1.5GiB, bytes); larger models "
                      "are sharded with model.safetensors.index.json")
          ->capture_default_str();
  cmd->add_flag("--overwrite", a->overwrite, "replace a model already in --out");
  cmd->callback([a, shard_opt] {
    const std::filesystem::path out = a->out;
    const bool gguf = a->format == "gguf";
    refuse_existing_model(out, gguf, a->overwrite);
    const bool ggml_quant = a->dtype == "q8_0" || a->dtype == "q4_0" || a->dtype == "q4_1";
    if (ggml_quant && !gguf)
      throw Error(fmt::format("--dtype {} is a GGUF type", a->dtype), "add --format gguf");
    if (gguf && shard_opt->count() > 0)
      throw Error("--max-shard-size applies to Hugging Face output", "a GGUF model is one file");
    const std::uint64_t max_shard = io::parse_byte_size(a->max_shard_size);
    const auto any = quant::load_any_model(resolve_model_path(a->model));
    const io::LoadedModel& loaded = any.model;
    const model::ParamLayout layout(loaded.config);
    if (gguf) {
      const auto tok = io::load_tokenizer(resolve_tokenizer_path(a->tokenizer, a->model));
      io::require_tokenizer_fits(tok, loaded.config.vocab_size);
      const io::GgmlType type = a->dtype == "bf16"   ? io::GgmlType::BF16
                                : a->dtype == "fp16" ? io::GgmlType::F16
                                : a->dtype == "q8_0" ? io::GgmlType::Q8_0
                                : a->dtype == "q4_0" ? io::GgmlType::Q4_0
                                : a->dtype == "q4_1" ? io::GgmlType::Q4_1
                                                     : io::GgmlType::F32;
      if (any.quantized) {
        if (!ggml_quant)
          throw Error(fmt::format("{} is a quantized model ({})", a->model, any.description),
                      "write it as --dtype q4_0, q4_1 or q8_0 (or convert the original)");
        const auto report = quant::save_quantized_gguf(out, any, type, &tok.vocab());
        log_info("wrote {} ({}, {}): GGUF, linears {}\n{}", out.string(),
                 model::describe(loaded.config), any.description, a->dtype, report.summary());
        return;
      }
      io::save_gguf_model(out, layout, loaded.params.data(), type, &tok.vocab());
      log_info("wrote {} ({}): GGUF, {} matrices, with its tokenizer", out.string(),
               model::describe(loaded.config), a->dtype);
      return;
    }
    if (any.quantized)
      log_info("{} is a quantized model ({}): its dequantized weights are written", a->model,
               any.description);
    const io::DType dtype = a->dtype == "bf16"   ? io::DType::BF16
                            : a->dtype == "fp16" ? io::DType::F16
                                                 : io::DType::F32;
    // The tokenizer is read (and checked) before anything is written.
    const auto tok = own_tokenizer(a->tokenizer, a->model, loaded.config.vocab_size);
    prepare_output_dir(out, "--out");
    const auto files = io::save_model(out, layout, loaded.params.data(), dtype, max_shard);
    if (tok) io::write_hf_tokenizer(out, tok->vocab());
    const std::string weights =
        files.size() == 1 ? files[0]
                          : fmt::format("{} files {} ... {} with model.safetensors.index.json",
                                        files.size(), files.front(), files.back());
    log_info("wrote {} ({}): config.json, {} ({}){}", out.string(), model::describe(loaded.config),
             weights, a->dtype, tok ? ", tokenizer.json" : "");
  });
}

}  // namespace tessera::app
