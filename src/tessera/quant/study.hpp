// Evaluation helpers for quantized models and the calibration study: perplexity per method x
// calibration set x seed, with the spread per method and the model's outlier summary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/eval/perplexity.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/quant/calibration.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::quant {

// A LogitsFn over a parameter buffer with simulated activation quantization (the layout and
// params must outlive it).
eval::LogitsFn logits_fn(const model::ParamLayout& layout, const float* params, ActQuant act);

// Up to max_tokens (0 = all) tokens of a shard, checked against the vocabulary.
std::vector<std::int32_t> read_tokens(const std::filesystem::path& shard, std::size_t max_tokens,
                                      int vocab_size);

struct StudyOptions {
  std::vector<std::string> methods{"gptq", "awq", "smoothquant", "w8a8"};
  std::vector<std::string> calibs{"corpus", "random", "punct", "lang2"};
  int seeds = 3;
  int nsamples = 32;
  int seqlen = 0;        // 0 = min(block_size, 512)
  QuantizeOptions base;  // bits, group, alpha, ... (method is set per row)
  CalibSources sources;
  std::filesystem::path eval_shard = "data/brown/val.bin";
  int eval_windows = 32;  // windows of block_size per protocol
  bool verbose = false;
};

struct StudyRow {
  std::string method, calib;
  std::uint64_t seed = 0;
  double ppl_windows = 0, ppl_second_half = 0, kl_mean = 0, top1 = 0, seconds = 0;
};
struct StudyResult {
  double fp_ppl_windows = 0, fp_ppl_second_half = 0;
  std::string windows_label, second_half_label;
  std::vector<StudyRow> rows;
  std::string outlier_summary;
  nlohmann::json outliers;
  double seconds = 0;
  std::string markdown(const std::string& model_name) const;
  std::string csv() const;
};

StudyResult run_study(const model::ParamLayout& layout, const float* params,
                      const StudyOptions& opt);

}  // namespace tessera::quant
