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
  double (*value)(const StudyRow&, const StudyResult&);
  eval::Interval (*interval)(const StudyRow&, const StudyResult&);
};

// A chart of one measure: a point per row at its calibration set, each method offset a little
// within the set and drawn as its points plus a vertical bar per interval.
plot::Chart method_chart(const StudyResult& r, const std::string& title, const std::string& y_label,
                         const Measure& m) {
  const auto cats = calib_categories(r);
  const auto methods = methods_of(r);
  plot::Chart chart{title, "calibration set", y_label, false, true, {}, cats};
  for (auto& c : chart.x_categories)
    if (c == "-") c = "(none)";
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
      pts.x.push_back(x);
      pts.y.push_back(m.value(row, r));
      const auto ci = m.interval(row, r);
      bars.x.insert(bars.x.end(), {x, x, x});
      bars.y.insert(bars.y.end(), {ci.lo, ci.hi, std::nan("")});
    }
    chart.series.push_back(std::move(pts));
    chart.series.push_back(std::move(bars));
  }
  return chart;
}

plot::Chart outlier_profile(const StudyResult& r) {
  plot::Chart chart{"Largest |activation| of each block's output (seed 0 of each set)",
                    "layer",
                    "max |x|",
                    false,
                    true,
                    {},
                    {}};
  for (std::size_t k = 0; k < r.outliers_by_set.size(); ++k) {
    const auto& set = r.outliers_by_set[k];
    plot::Series s{set.calib, {}, {}, plot::Style::Line, k_palette[k % std::size(k_palette)]};
    for (std::size_t l = 0; l < set.residual_max.size(); ++l) {
      s.x.push_back(static_cast<double>(l));
      s.y.push_back(set.residual_max[l]);
    }
    chart.series.push_back(std::move(s));
  }
  return chart;
}

}  // namespace

std::vector<plot::Chart> study_charts(const StudyResult& r) {
  std::vector<plot::Chart> charts;
  if (!r.rows.empty()) {
    charts.push_back(method_chart(
        r, "KL divergence to the unquantized model (95% intervals)", "mean KL (nats/token)",
        {[](const StudyRow& row, const StudyResult&) { return row.kl_mean; },
         [](const StudyRow& row, const StudyResult&) { return row.kl_ci; }}));
    charts.push_back(method_chart(
        r, fmt::format("Perplexity / unquantized ({:.2f}); paired 95% intervals", r.fp_ppl_windows),
        "perplexity ratio",
        {[](const StudyRow& row, const StudyResult& s) {
           return row.ppl_windows / s.fp_ppl_windows;
         },
         [](const StudyRow& row, const StudyResult&) { return row.ppl_ratio_ci; }}));
  }
  if (!r.outliers_by_set.empty()) charts.push_back(outlier_profile(r));
  return charts;
}

}  // namespace tessera::quant
