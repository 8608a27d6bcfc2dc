// Activation outlier analysis from a calibration capture (reference section 1.6): per linear
// input and channel max |x|, excess kurtosis, max/median; LLM.int8() outlier features
// (|x| >= 6 in the same dimension in >= 25% of layers and >= 6% of positions, on the inputs of
// c_attn, attn.c_proj and c_fc); massive activations (Sun et al.) in the residual stream.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/plot/plot.hpp"
#include "tessera/quant/calibration.hpp"

namespace tessera::quant {

struct ChannelOutlier {
  std::string linear;  // "h.2.attn.c_attn"
  int layer = 0, channel = 0;
  float maxabs = 0;
  double ratio = 0;  // channel max |x| / median over channels of max |x|
  double kurtosis = 0;
};

struct LinearOutlierSummary {
  std::string linear;
  int layer = 0;
  Lin kind = Lin::Qkv;
  float maxabs = 0;
  int max_channel = 0;
  double max_over_median = 0;  // max over channels of max|x| / median over channels of max|x|
  double mean_kurtosis = 0, max_kurtosis = 0;
  int kurtosis_channel = 0;
};

struct OutlierReport {
  std::vector<LinearOutlierSummary> linears;
  std::vector<ChannelOutlier> channels;  // ratio >= ratio_threshold, largest ratio first
  struct Feature {
    int dim = 0;
    double layer_fraction = 0, position_fraction = 0;
    float maxabs = 0;
  };
  std::vector<Feature> dettmers;  // LLM.int8() outlier features
  ResidualStats residual;
  std::int64_t tokens = 0;
  double ratio_threshold = 20;
  nlohmann::json to_json() const;
  std::string summary_line() const;  // one line for tables
};

OutlierReport analyze_outliers(const Capture& cap, double ratio_threshold = 20.0);
// The picture of a capture, for plot::draw: a chart per layer and linear (layers in rows, the
// linears in k_num_lin columns) of each input channel's max |x| on a log scale, outlier channels
// (>= ratio_threshold x the median) in red.
std::vector<plot::Chart> outlier_charts(const OutlierReport& r, const Capture& cap);

}  // namespace tessera::quant
