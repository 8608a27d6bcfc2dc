// The calibration study's figure: each method's KL divergence and perplexity ratio to the
// unquantized model per calibration set (every seed a point, with its 95% interval), and the
// largest activation of each block's output per calibration set (the outlier profile).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/quant/study.hpp"

namespace tessera::quant {

namespace {

constexpr const char* k_palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                     "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// The calibration sets in the order the rows first name them ("-": a method without one).
std::vector<std::string> calib_categories(const StudyResult& r) {
  std::vector<std::string> cats;
  for (const auto& row : r.rows)
    if (std::find(cats.begin(), cats.end(), row.calib) == cats.end()) cats.push_back(row.calib);
  return cats;
}

std::vector<std::string> methods_of(const StudyResult& r) {
  std::vector<std::string> methods;
  for (const auto& row : r.rows)
    if (std::find(methods.begin(), methods.end(), row.method) == methods.end())
      methods.push_back(row.method);
  return methods;
}

struct Measure {
  double (*value)(const Measures&, const Measures& fp);
  eval::Interval (*interval)(const Measures&);
};

// A chart of one measure: a point per row at its calibration set, each method offset a little
// within the set and drawn as its points plus a vertical bar per interval.
plot::Chart method_chart(const StudyResult& r, const std::string& title, const std::string& y_label,
                         const Measure& m) {
  const auto cats = calib_categories(r);
  const auto methods = methods_of(r);
  const auto fp = r.measures(r.fp, false);
  plot::Chart chart{title, "calibration set", y_label, false, true, {}, cats};
  for (auto& c : chart.x_categories)
    if (c == "-") c = "(none)";
  // two empty places on the right, where the legend goes
  chart.x_categories.insert(chart.x_categories.end(), {"", ""});
  const double width = 0.7 / static_cast<double>(methods.size());
  for (std::size_t k = 0; k < methods.size(); ++k) {
    const std::string color = k_palette[k % std::size(k_palette)];
    plot::Series pts{methods[k], {}, {}, plot::Style::Points, color};
    plot::Series bars{"", {}, {}, plot::Style::Line, color};
    for (const auto& row : r.rows) {
      if (row.method != methods[k]) continue;
      const auto at = std::find(cats.begin(), cats.end(), row.calib) - cats.begin();
      const double x = static_cast<double>(at) - 0.35 + width * (static_cast<double>(k) + 0.5) +
                       0.03 * static_cast<double>(row.seed);
      const auto ms = r.measures(row.scores, false);
      pts.x.push_back(x);
      pts.y.push_back(m.value(ms, fp));
      const auto ci = m.interval(ms);
      bars.x.insert(bars.x.end(), {x, x, x});
      bars.y.insert(bars.y.end(), {ci.lo, ci.hi, std::nan("")});
    }
    chart.series.push_back(std::move(pts));
    chart.series.push_back(std::move(bars));
  }
  return chart;
}

// A per-layer profile of every calibration set (seed 0 of each).
template <class V>
plot::Chart outlier_profile(const StudyResult& r, const std::string& title, const std::string& y,
                            V SetOutliers::*values) {
  plot::Chart chart{title, "layer", y, false, true, {}, {}};
  for (std::size_t k = 0; k < r.outliers_by_set.size(); ++k) {
    const auto& set = r.outliers_by_set[k];
    plot::Series s{set.calib, {}, {}, plot::Style::Line, k_palette[k % std::size(k_palette)]};
    const auto& v = set.*values;
    for (std::size_t l = 0; l < v.size(); ++l) {
      s.x.push_back(static_cast<double>(l));
      s.y.push_back(static_cast<double>(v[l]));
    }
    chart.series.push_back(std::move(s));
  }
  // room on the right for the legend: the axis runs on past the last layer (a one-point line
  // draws nothing)
  if (!r.outliers_by_set.empty()) {
    const auto& v = r.outliers_by_set[0].*values;
    if (!v.empty())
      chart.series.push_back({"",
                              {static_cast<double>(v.size()) * 1.35},
                              {static_cast<double>(v[0])},
                              plot::Style::Line,
                              k_palette[0]});
  }
  return chart;
}

}  // namespace

std::vector<plot::Chart> study_charts(const StudyResult& r) {
  std::vector<plot::Chart> charts;
  if (!r.rows.empty()) {
    charts.push_back(method_chart(r, "KL divergence to the unquantized model (95% intervals)",
                                  "mean KL (nats/token)",
                                  {[](const Measures& m, const Measures&) { return m.kl; },
                                   [](const Measures& m) { return m.kl_ci; }}));
    charts.push_back(
        method_chart(r,
                     fmt::format("Perplexity A / unquantized ({:.2f}); paired 95% intervals",
                                 r.measures(r.fp, false).ppl_a),
                     "perplexity ratio",
                     {[](const Measures& m, const Measures& fp) { return m.ppl_a / fp.ppl_a; },
                      [](const Measures& m) { return m.ratio_a_ci; }}));
  }
  if (!r.outliers_by_set.empty()) {
    charts.push_back(outlier_profile(r,
                                     "Largest |x| of a linear input per layer (seed 0 of each set)",
                                     "max |x|", &SetOutliers::input_max));
    charts.push_back(outlier_profile(r, "Largest |x| of each block's output (seed 0 of each set)",
                                     "max |x|", &SetOutliers::residual_max));
  }
  return charts;
}

}  // namespace tessera::quant
