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
#include "tessera/plot/plot.hpp"
#include "tessera/quant/calibration.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::quant {

// A LogitsFn over a parameter buffer with simulated activation quantization (the layout and
// params must outlive it).
eval::LogitsFn logits_fn(const model::ParamLayout& layout, const float* params, ActQuant act);

// Up to max_tokens (0 = all) tokens of a shard, checked against the vocabulary.
std::vector<std::int32_t> read_tokens(const std::filesystem::path& shard, std::size_t max_tokens,
                                      int vocab_size);

// A method of the study with its weight format: "gptq" (the base format), "gptq:w3", "rtn:w4g32",
// "awq:w4g128sym" (bits after w, the group size after g, "sym" for the symmetric quantizer,
// "min" for the asymmetric one with a float minimum: llama.cpp's Q4_1 form, rtn:w4g32min).
struct MethodSpec {
  std::string label;  // as given
  Method method = Method::Rtn;
  WeightQuant wq;
};
// Throws tessera::Error naming the problem for an unknown method or a malformed format.
MethodSpec parse_method_spec(const std::string& spec, const WeightQuant& base);

struct StudyOptions {
  std::vector<std::string> methods{"gptq", "awq", "smoothquant", "w8a8"};
  std::vector<std::string> calibs{"corpus", "random", "punct", "lang2"};
  int seeds = 3;
  int nsamples = 32;
  int seqlen = 0;        // 0 = min(block_size, 512)
  QuantizeOptions base;  // bits, group, alpha, ... (method is set per row)
  CalibSources sources;
  std::filesystem::path eval_shard = "data/brown/val.bin";
  int eval_windows = 32;  // windows of ctx tokens per protocol
  int ctx = 0;            // evaluation context; 0 = min(block_size, 1024)
  bool verbose = false;
};

struct StudyRow {
  std::string method, calib;
  std::uint64_t seed = 0;
  double ppl_windows = 0, ppl_second_half = 0, kl_mean = 0, top1 = 0, seconds = 0;
  // 95% intervals, bootstrap over the evaluation windows: the perplexity ratio to fp32 (paired:
  // both models on the same resampled windows), the mean KL and the top-1 agreement.
  eval::Interval ppl_ratio_ci, kl_ci, top1_ci;
};
// The activation outliers the model shows on one calibration set (its seed-0 draw).
struct SetOutliers {
  std::string calib;
  std::string summary;              // OutlierReport::summary_line()
  std::vector<std::string> top;     // the largest channels: "linear ch C: max|x| M (R x median)"
  std::vector<float> residual_max;  // (L) largest |x| of each block's output
};

struct StudyResult {
  double fp_ppl_windows = 0, fp_ppl_second_half = 0;
  eval::Interval fp_ppl_ci;  // of fp_ppl_windows
  std::string windows_label, second_half_label;
  std::vector<StudyRow> rows;
  std::vector<SetOutliers> outliers_by_set;  // one per calibration set, in --calib order
  nlohmann::json outliers;                   // {calibration set: outliers report}
  double seconds = 0;
  std::string markdown(const std::string& model_name) const;
  std::string csv() const;
};

StudyResult run_study(const model::ParamLayout& layout, const float* params,
                      const StudyOptions& opt);

// The study's figure, for plot::draw: KL divergence and perplexity ratio to the unquantized model
// per method and calibration set (each seed a point with its 95% interval), then the largest
// activation of each block's output per calibration set.
std::vector<plot::Chart> study_charts(const StudyResult& r);

}  // namespace tessera::quant
