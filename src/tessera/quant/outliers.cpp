#include "tessera/quant/outliers.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace tessera::quant {

using nlohmann::json;

namespace {

// One linear's input channels summarized (s.layer, s.kind, s.linear set); the channels whose max
// |x| is at least ratio_threshold times the median channel's go to `channels`.
void summarize_linear(LinearOutlierSummary& s, const ChannelStats& st, double ratio_threshold,
                      std::vector<ChannelOutlier>& channels) {
  std::vector<float> m = st.maxabs;
  std::nth_element(m.begin(), m.begin() + m.size() / 2, m.end());
  const double med = std::max(1e-12, static_cast<double>(m[m.size() / 2]));
  double ksum = 0;
  s.max_kurtosis = -1e30;
  for (int j = 0; j < st.cols; ++j) {
    if (st.maxabs[j] > s.maxabs) {
      s.maxabs = st.maxabs[j];
      s.max_channel = j;
    }
    const double ku = st.excess_kurtosis(j);
    ksum += ku;
    if (ku > s.max_kurtosis) {
      s.max_kurtosis = ku;
      s.kurtosis_channel = j;
    }
    const double ratio = st.maxabs[j] / med;
    if (ratio >= ratio_threshold)
      channels.push_back({s.linear, s.layer, j, st.maxabs[j], ratio, ku});
  }
  s.mean_kurtosis = st.cols ? ksum / st.cols : 0;
  s.max_over_median = s.maxabs / med;
}

// LLM.int8()'s outlier features: hidden dimensions (inputs of qkv, the attention's projection
// and fc) with a value beyond 6 in at least a quarter of the layers, and at 6% of the positions
// or more in one of them.
std::vector<OutlierReport::Feature> dettmers_features(const Capture& cap) {
  std::vector<OutlierReport::Feature> out;
  const int L = static_cast<int>(cap.layers.size());
  if (L == 0) return out;
  const int C = cap.layers[0][0].stats.cols;
  for (int h = 0; h < C; ++h) {
    int layers_hit = 0;
    double pos = 0;
    float mx = 0;
    for (int l = 0; l < L; ++l) {
      bool hit = false;
      for (Lin kind : {Lin::Qkv, Lin::AttnProj, Lin::Fc}) {
        const auto& st = cap.layers[l][static_cast<int>(kind)].stats;
        if (st.over6[h] > 0) {
          hit = true;
          pos =
              std::max(pos, static_cast<double>(st.over6[h]) / std::max<std::int64_t>(1, st.count));
          mx = std::max(mx, st.maxabs[h]);
        }
      }
      layers_hit += hit;
    }
    const double lf = static_cast<double>(layers_hit) / L;
    if (lf >= 0.25 && pos >= 0.06) out.push_back({h, lf, pos, mx});
  }
  return out;
}

}  // namespace

OutlierReport analyze_outliers(const Capture& cap, double ratio_threshold) {
  OutlierReport r;
  r.tokens = cap.tokens;
  r.ratio_threshold = ratio_threshold;
  r.residual = cap.residual;
  const int L = static_cast<int>(cap.layers.size());
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      LinearOutlierSummary s;
      s.layer = l;
      s.kind = static_cast<Lin>(k);
      s.linear = linear_name(cap.config, l, s.kind);
      summarize_linear(s, cap.layers[l][k].stats, ratio_threshold, r.channels);
      r.linears.push_back(s);
    }
  std::sort(r.channels.begin(), r.channels.end(),
            [](const auto& a, const auto& b) { return a.ratio > b.ratio; });
  r.dettmers = dettmers_features(cap);
  return r;
}

json OutlierReport::to_json() const {
  json lin = json::array();
  for (const auto& s : linears)
    lin.push_back({{"linear", s.linear},
                   {"layer", s.layer},
                   {"max_abs", s.maxabs},
                   {"max_abs_channel", s.max_channel},
                   {"max_over_median", s.max_over_median},
                   {"mean_excess_kurtosis", s.mean_kurtosis},
                   {"max_excess_kurtosis", s.max_kurtosis},
                   {"max_kurtosis_channel", s.kurtosis_channel}});
  json ch = json::array();
  for (const auto& c : channels)
    ch.push_back({{"linear", c.linear},
                  {"layer", c.layer},
                  {"channel", c.channel},
                  {"max_abs", c.maxabs},
                  {"max_over_median", c.ratio},
                  {"excess_kurtosis", c.kurtosis}});
  json dt = json::array();
  for (const auto& f : dettmers)
    dt.push_back({{"dim", f.dim},
                  {"layer_fraction", f.layer_fraction},
                  {"position_fraction", f.position_fraction},
                  {"max_abs", f.maxabs}});
  json ms = json::array();
  for (const auto& m : residual.massive)
    ms.push_back({{"layer", m.layer},
                  {"sample", m.sample},
                  {"position", m.position},
                  {"dim", m.dim},
                  {"value", m.value},
                  {"median_abs", m.median}});
  return json{{"tokens", tokens},
              {"definitions",
               {{"outlier_channels", fmt::format("channel max|x| >= {} x the median over channels "
                                                 "of max|x| (per linear input)",
                                                 ratio_threshold)},
                {"llm_int8_features",
                 "|x| >= 6 in the same hidden dim in >= 25% of layers and "
                 ">= 6% of positions (inputs of c_attn, attn.c_proj, c_fc)"},
                {"massive_activations",
                 "|x| > 100 and >= 1000 x the median |x| of its hidden "
                 "state (block outputs)"}}},
              {"linears", lin},
              {"outlier_channels", ch},
              {"llm_int8_outlier_features", dt},
              {"massive_activations", ms},
              {"residual_max_abs", residual.maxabs},
              {"residual_max_over_median", residual.max_ratio}};
}

std::string OutlierReport::summary_line() const {
  float mx = 0;
  std::string where = "-";
  double kmean = 0;
  for (const auto& s : linears) {
    kmean += s.mean_kurtosis;
    if (s.maxabs > mx) {
      mx = s.maxabs;
      where = fmt::format("{} ch {}", s.linear, s.max_channel);
    }
  }
  if (!linears.empty()) kmean /= linears.size();
  return fmt::format(
      "max |x| {:.2f} at {}; {} outlier channels (>= {:.0f}x median); {} LLM.int8() outlier "
      "features; {} massive activations; mean excess kurtosis {:.2f}",
      mx, where, channels.size(), ratio_threshold, dettmers.size(), residual.massive.size(), kmean);
}

std::vector<plot::Chart> outlier_charts(const OutlierReport& r, const Capture& cap) {
  std::vector<plot::Chart> charts;
  for (std::size_t l = 0; l < cap.layers.size(); ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const auto& st = cap.layers[l][k].stats;
      const auto& sum = r.linears[l * k_num_lin + k];
      std::vector<float> m = st.maxabs;
      std::nth_element(m.begin(), m.begin() + m.size() / 2, m.end());
      const double med = std::max(1e-12f, m[m.size() / 2]);
      plot::Series normal{"channels", {}, {}, plot::Style::Impulses, "#1f77b4"};
      plot::Series outlier{fmt::format(">= {:.0f}x median", r.ratio_threshold),
                           {},
                           {},
                           plot::Style::Impulses,
                           "#d62728"};
      for (int j = 0; j < st.cols; ++j) {
        auto& series = st.maxabs[j] / med >= r.ratio_threshold ? outlier : normal;
        series.x.push_back(j);
        series.y.push_back(st.maxabs[j]);
      }
      if (!charts.empty()) normal.label.clear(), outlier.label.clear();  // one legend
      charts.push_back(
          {fmt::format("{}: max {:.1f} (channel {})", sum.linear, sum.maxabs, sum.max_channel),
           "input channel",
           "max |x|",
           false,
           true,
           {normal, outlier}});
    }
  return charts;
}

}  // namespace tessera::quant
