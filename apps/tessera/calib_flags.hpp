// The calibration-set flags that `tessera quantize` and `tessera outliers` share, and the set
// they describe for a given model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "model_paths.hpp"
#include "option_checks.hpp"
#include "tessera/core/error.hpp"
#include "tessera/model/config.hpp"
#include "tessera/quant/calibration.hpp"

namespace tessera::app {

inline constexpr const char* k_default_calib_data = "data/brown/train.bin";  // GPT-2's tokens

struct CalibFlags {
  std::string set = "corpus", data = k_default_calib_data, text, tokenizer;
  int nsamples = 32, seqlen = 0;
  std::uint64_t seed = 0;
};

inline void add_calibration_options(CLI::App* cmd, CalibFlags& f) {
  cmd->add_option("--calib", f.set,
                  "calibration set: corpus, corpus-concat, random, punct, domain, lang2, code")
      ->capture_default_str();
  cmd->add_option("--nsamples", f.nsamples, "calibration samples")->capture_default_str();
  cmd->add_option("--seqlen", f.seqlen, "tokens per sample (0 = min(block_size, 512))")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "calibration sampling seed")
      ->check(k_unsigned_number)
      ->capture_default_str();
  cmd->add_option("--calib-data", f.data, "token shard for corpus calibration sets")
      ->capture_default_str();
  cmd->add_option("--calib-text", f.text,
                  "text file for the domain / lang2 sets, source directory for code");
  cmd->add_option("--tokenizer", f.tokenizer,
                  "tokenizer of the calibration text: a .gguf, a tokenizer.json or a directory "
                  "(default: the model's own, else GPT-2's)");
}

// The calibration sources for a model given as `model_arg`: its own tokenizer unless --tokenizer
// names one. The default corpus shard holds GPT-2's tokens, so a model with another tokenizer
// needs a shard of its own for the corpus sets (said before any work).
inline quant::CalibSources calibration_sources(const CalibFlags& f, const std::string& model_arg) {
  quant::CalibSources src;
  src.train_shard = f.data;
  src.tokenizer = resolve_tokenizer_path(f.tokenizer, model_arg);
  if (!f.text.empty()) src.domain_text = src.lang2_text = src.code_dir = f.text;
  const bool corpus = f.set == "corpus" || f.set == "corpus-concat";
  if (corpus && f.data == k_default_calib_data && src.tokenizer != k_gpt2_tokenizer)
    throw Error(fmt::format("the default calibration corpus {} holds GPT-2's tokens, and the model "
                            "has its own tokenizer ({})",
                            f.data, src.tokenizer.string()),
                fmt::format("make a shard with it: tessera prepare --tokenizer {} --out "
                            "data/brown-own, then pass --calib-data data/brown-own/train.bin",
                            src.tokenizer.string()));
  return src;
}

inline quant::CalibSet calibration_from_flags(const CalibFlags& f, const model::ModelConfig& cfg,
                                              const std::string& model_arg) {
  const auto src = calibration_sources(f, model_arg);
  const int T = f.seqlen > 0 ? f.seqlen : std::min(cfg.block_size, 512);
  if (T > cfg.block_size)
    throw Error(fmt::format("--seqlen {} exceeds the model's block_size {}", T, cfg.block_size));
  return quant::make_calibration(f.set, f.nsamples, T, f.seed, cfg.vocab_size, src);
}

}  // namespace tessera::app
