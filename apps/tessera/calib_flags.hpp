// The calibration-set flags that `tessera quantize` and `tessera outliers` share, and the set
// they describe for a given model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "tessera/core/error.hpp"
#include "tessera/model/config.hpp"
#include "tessera/quant/calibration.hpp"

namespace tessera::app {

struct CalibFlags {
  std::string set = "corpus", data = "data/brown/train.bin", text, tokenizer = "data/gpt2";
  int nsamples = 32, seqlen = 0;
  std::uint64_t seed = 0;
};

inline void add_calibration_options(CLI::App* cmd, CalibFlags& f) {
  cmd->add_option("--calib", f.set,
                  "calibration set: corpus, corpus-concat, random, punct, domain, lang2")
      ->capture_default_str();
  cmd->add_option("--nsamples", f.nsamples, "calibration samples")->capture_default_str();
  cmd->add_option("--seqlen", f.seqlen, "tokens per sample (0 = min(block_size, 512))")
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "calibration sampling seed")->capture_default_str();
  cmd->add_option("--calib-data", f.data, "token shard for corpus calibration sets")
      ->capture_default_str();
  cmd->add_option("--calib-text", f.text, "text file for the domain / lang2 sets");
  cmd->add_option("--tokenizer", f.tokenizer, "folder with encoder.json and vocab.bpe")
      ->capture_default_str();
}

inline quant::CalibSet calibration_from_flags(const CalibFlags& f, const model::ModelConfig& cfg) {
  quant::CalibSources src;
  src.train_shard = f.data;
  src.tokenizer = f.tokenizer;
  if (!f.text.empty()) src.domain_text = src.lang2_text = f.text;
  const int T = f.seqlen > 0 ? f.seqlen : std::min(cfg.block_size, 512);
  if (T > cfg.block_size)
    throw Error(fmt::format("--seqlen {} exceeds the model's block_size {}", T, cfg.block_size));
  return quant::make_calibration(f.set, f.nsamples, T, f.seed, cfg.vocab_size, src);
}

}  // namespace tessera::app
