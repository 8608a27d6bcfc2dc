// The calibration study: every quantization method x calibration set x seed, each quantized model
// scored against the unquantized one on evaluation windows of one or more texts (perplexity by two
// protocols, KL divergence, top-1 agreement, each with a 95% bootstrap interval), and the
// activation outliers of the model per calibration set.
//
// Cost is what shapes it: a forward pass costs the same for every model, so the unquantized
// model's logits of the "short" windows (the first --windows of each text) are computed once and
// kept, and every row is scored on them; the "long" windows (up to --long-windows of each text)
// are scored once, in one pass, by the unquantized model and the rows of the --long methods
// together (their models resident at once), so no logits of them are ever stored.
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

// An evaluation text: a token shard (.bin, from tessera prepare) or a UTF-8 text file that the
// study tokenizes with the calibration tokenizer.
struct EvalText {
  std::string name;
  std::filesystem::path path;
};
// "name=path" or "path" (the name is then the file's stem, or its folder's name for a shard
// called val.bin / train.bin).
EvalText parse_eval_text(const std::string& spec);

// The function-preserving transform that plants an activation outlier: channel `channel` of the
// norm in front of layer `layer`'s MLP is multiplied by `factor` and the matching input column of
// the MLP's first linear divided by it, so the model computes the same function (up to rounding)
// but that linear's input has one channel `factor` times its usual size.
void plant_outlier(const model::ParamLayout& layout, float* params, int layer, int channel,
                   float factor);

struct StudyOptions {
  std::vector<std::string> methods{"gptq", "awq", "smoothquant", "w8a8"};
  std::vector<std::string> calibs{"corpus", "random", "punct", "lang2"};
  // Methods scored with the first calibration set only (seed 0), e.g. the W3 variants whose
  // calibration sensitivity the table need not repeat.
  std::vector<std::string> first_calib_only;
  int seeds = 3;
  int nsamples = 16;
  int seqlen = 0;        // 0 = min(block_size, 256)
  QuantizeOptions base;  // bits, group, alpha, ... (method is set per row)
  CalibSources sources;
  std::vector<EvalText> texts{{"brown", "data/brown/val.bin"}};
  int windows = 4;       // short windows per text: every row
  int long_windows = 0;  // long windows per text: the unquantized model and the --long rows
  std::vector<std::string> long_methods;  // method labels whose first row is scored long
  int ctx = 0;                            // 0 = min(block_size, 512)
  std::int32_t bos = -1;                  // each window's first token; -1 = vocab_size - 1
  // Score the quantized models through the packed kernels (packed_matmul over the packed codes,
  // as tessera eval does) instead of their dequantized fp32 weights; models whose activation
  // quantization the kernels cannot reproduce (per tensor, LLM.int8()) stay simulated.
  bool packed_kernels = false;
  bool verbose = false;
};

// One window's sums by both protocols: A scores every prediction of the window (ctx - 1), B only
// its second half (llama.cpp); the KL and top-1 sums are over A's positions.
struct WindowScore {
  eval::WindowSums a, b;
};

// A model's measures on a set of windows, with 95% bootstrap intervals over the windows (the
// ratios paired: both models on the same resampled windows).
struct Measures {
  int windows = 0;
  std::int64_t scored_a = 0, scored_b = 0;
  double ppl_a = 0, ppl_b = 0, kl = 0, top1 = 0;
  eval::Interval ppl_a_ci, ppl_b_ci, ratio_a_ci, ratio_b_ci, kl_ci, top1_ci;
};

struct StudyRow {
  std::string method, calib;
  std::uint64_t seed = 0;
  double quantize_seconds = 0, seconds = 0;
  std::vector<WindowScore> scores;  // per window of StudyResult::windows (long rows: all)
  bool long_row = false;
};

// Where a window comes from.
struct WindowInfo {
  int text = 0;        // index into StudyResult::texts
  bool short_ = true;  // one of the first --windows of its text
};

// The activation outliers of one calibration set (its seed-0 draw through the unquantized model).
struct SetOutliers {
  std::string calib;
  std::string summary;           // OutlierReport::summary_line()
  std::vector<std::string> top;  // the largest channels: "linear ch C: M (R x median)"
  std::vector<std::string>
      massive;                      // the 4 largest block-output activations: layer, token, channel
  std::vector<float> residual_max;  // (L) largest |x| of each block's output
  std::vector<std::string> residual_where;  // (L) its position and channel
  std::vector<float> input_max;             // (L) largest |x| of any linear input of the block
  std::vector<double> input_ratio;          // (L) largest max/median over the block's linear inputs
  std::vector<double> smooth_max;           // (L) SmoothQuant's largest migration scale (Qkv, Fc)
};

struct StudyResult {
  std::vector<EvalText> texts;
  std::vector<WindowInfo> windows;
  std::vector<WindowScore> fp;  // the unquantized model, every window
  int ctx = 0;
  std::string model_name;
  std::vector<StudyRow> rows;
  std::vector<SetOutliers> outliers_by_set;  // one per calibration set, in --calib order
  nlohmann::json outliers;                   // {calibration set: outliers report}
  double seconds = 0;
  bool packed_kernels = false;  // as StudyOptions::packed_kernels

  // The measures of `scores` on the windows chosen by `use` (long = all windows the row has,
  // text = -1: every text); against the unquantized model for the ratios.
  Measures measures(const std::vector<WindowScore>& scores, bool long_set, int text = -1) const;
  std::string markdown() const;
  std::string csv() const;
};

StudyResult run_study(const model::ParamLayout& layout, const float* params,
                      const StudyOptions& opt);

// The study's figure, for plot::draw: KL divergence and perplexity ratio to the unquantized model
// per method and calibration set on the short windows (each seed a point with its 95% interval),
// then the outlier profile per calibration set (largest linear input and block output per layer).
std::vector<plot::Chart> study_charts(const StudyResult& r);

}  // namespace tessera::quant
