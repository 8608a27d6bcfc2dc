// The calibration study's measures and its Markdown and CSV reports.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/quant/study.hpp"

namespace tessera::quant {

namespace {

// Sums of KL and top-1 agreement of windows, each weighted by counts (null: once each).
double kl_of(const std::vector<eval::WindowSums>& w, const std::vector<int>* c) {
  double kl = 0, pos = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double k = c ? (*c)[i] : 1;
    kl += k * w[i].kl;
    pos += k * static_cast<double>(w[i].positions);
  }
  return pos > 0 ? kl / pos : 0.0;
}
double top1_of(const std::vector<eval::WindowSums>& w, const std::vector<int>* c) {
  double agree = 0, pos = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double k = c ? (*c)[i] : 1;
    agree += k * static_cast<double>(w[i].top1);
    pos += k * static_cast<double>(w[i].positions);
  }
  return pos > 0 ? agree / pos : 0.0;
}

struct Agg {
  double mean = 0, sd = 0, min = 0, max = 0;
};
Agg agg(const std::vector<double>& v) {
  Agg a;
  if (v.empty()) return a;
  a.min = *std::min_element(v.begin(), v.end());
  a.max = *std::max_element(v.begin(), v.end());
  for (double x : v) a.mean += x;
  a.mean /= static_cast<double>(v.size());
  for (double x : v) a.sd += (x - a.mean) * (x - a.mean);
  a.sd = v.size() > 1 ? std::sqrt(a.sd / static_cast<double>(v.size() - 1)) : 0.0;
  return a;
}

template <class T>
std::vector<std::string> distinct(const std::vector<StudyRow>& rows, T key) {
  std::vector<std::string> out;
  for (const auto& r : rows)
    if (std::find(out.begin(), out.end(), key(r)) == out.end()) out.push_back(key(r));
  return out;
}

// A table cell's text: '|' would end the cell.
std::string escape_bars(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string ci(const eval::Interval& i, const char* f) {
  return fmt::format(fmt::runtime(std::string("[") + f + ", " + f + "]"), i.lo, i.hi);
}

}  // namespace

Measures StudyResult::measures(const std::vector<WindowScore>& scores, bool long_set,
                               int text) const {
  std::vector<eval::WindowSums> a, b, fa, fb;
  for (std::size_t w = 0; w < scores.size() && w < windows.size(); ++w) {
    if (text >= 0 && windows[w].text != text) continue;
    if (scores[w].a.positions == 0 || !(long_set || windows[w].short_)) continue;
    a.push_back(scores[w].a);
    b.push_back(scores[w].b);
    fa.push_back(fp[w].a);
    fb.push_back(fp[w].b);
  }
  Measures m;
  m.windows = static_cast<int>(a.size());
  if (a.empty()) return m;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m.scored_a += a[i].scored;
    m.scored_b += b[i].scored;
  }
  m.ppl_a = eval::perplexity_of(a);
  m.ppl_b = eval::perplexity_of(b);
  m.kl = kl_of(a, nullptr);
  m.top1 = top1_of(a, nullptr);
  m.ppl_a_ci = eval::perplexity_interval(a);
  m.ppl_b_ci = eval::perplexity_interval(b);
  m.ratio_a_ci = eval::perplexity_ratio_interval(fa, a);
  m.ratio_b_ci = eval::perplexity_ratio_interval(fb, b);
  const int n = static_cast<int>(a.size());
  m.kl_ci = eval::bootstrap95(n, [&](const std::vector<int>& c) { return kl_of(a, &c); });
  m.top1_ci = eval::bootstrap95(n, [&](const std::vector<int>& c) { return top1_of(a, &c); });
  return m;
}

namespace {

std::string texts_section(const StudyResult& r) {
  std::string s =
      "| text | windows (short / all) | tokens scored A (all windows) | fp32 ppl A "
      "[95%] | fp32 ppl B [95%] |\n|---|---|---|---|---|\n";
  for (int t = -1; t < static_cast<int>(r.texts.size()); ++t) {
    const auto all = r.measures(r.fp, true, t), sh = r.measures(r.fp, false, t);
    const std::string name = t < 0 ? "**all**" : r.texts[t].name;
    s += fmt::format("| {} | {} / {} | {} | {:.3f} {} | {:.3f} {} |\n", name, sh.windows,
                     all.windows, all.scored_a, all.ppl_a, ci(all.ppl_a_ci, "{:.3f}"), all.ppl_b,
                     ci(all.ppl_b_ci, "{:.3f}"));
  }
  return s;
}

std::string long_section(const StudyResult& r) {
  std::string s =
      "## The long evaluation\n\nEvery window of every text; each method's first row (first "
      "calibration set, seed 0). Ratios are to the unquantized model on the same windows "
      "(paired intervals).\n\n| method | calibration | text | tokens A | ppl A / fp32 [95%] | "
      "ppl B / fp32 [95%] | KL [95%] | top-1 agree [95%] |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& row : r.rows) {
    if (!row.long_row) continue;
    for (int t = -1; t < static_cast<int>(r.texts.size()); ++t) {
      const auto m = r.measures(row.scores, true, t), f = r.measures(r.fp, true, t);
      s += fmt::format("| {} | {} | {} | {} | {:.4f} {} | {:.4f} {} | {:.3g} {} | {:.4f} {} |\n",
                       row.method, row.calib, t < 0 ? "**all**" : r.texts[t].name, m.scored_a,
                       m.ppl_a / f.ppl_a, ci(m.ratio_a_ci, "{:.4f}"), m.ppl_b / f.ppl_b,
                       ci(m.ratio_b_ci, "{:.4f}"), m.kl, ci(m.kl_ci, "{:.3g}"), m.top1,
                       ci(m.top1_ci, "{:.4f}"));
    }
  }
  return s + "\n";
}

// method x calibration set: the mean +- sd over seeds of a measure on the short windows.
std::string grid_table(const StudyResult& r, const std::string& title,
                       double (*value)(const Measures&, const Measures&), const char* f) {
  const auto methods = distinct(r.rows, [](const StudyRow& x) { return x.method; });
  const auto calibs = distinct(r.rows, [](const StudyRow& x) { return x.calib; });
  const auto fp = r.measures(r.fp, false);
  std::string s = "### " + title + "\n\n| method |";
  for (const auto& c : calibs) s += " " + c + " |";
  s += " spread (max - min over all rows) |\n|---|";
  for (std::size_t i = 0; i <= calibs.size(); ++i) s += "---|";
  s += "\n";
  for (const auto& m : methods) {
    s += "| " + m + " |";
    std::vector<double> all;
    for (const auto& c : calibs) {
      std::vector<double> v;
      for (const auto& row : r.rows)
        if (row.method == m && row.calib == c)
          v.push_back(value(r.measures(row.scores, false), fp));
      all.insert(all.end(), v.begin(), v.end());
      const auto a = agg(v);
      s += v.empty() ? " |"
           : v.size() > 1
               ? fmt::format(fmt::runtime(std::string(" ") + f + " +- " + f + " |"), a.mean, a.sd)
               : fmt::format(fmt::runtime(std::string(" ") + f + " |"), a.mean);
    }
    const auto a = agg(all);
    s += fmt::format(fmt::runtime(std::string(" ") + f + " |\n"), a.max - a.min);
  }
  return s + "\n";
}

std::string runs_section(const StudyResult& r) {
  const auto fp = r.measures(r.fp, false);
  std::string s =
      "## Every run (short windows)\n\n| method | calibration | seed | ppl A | ppl A / fp32 "
      "[95%] | ppl B / fp32 [95%] | KL [95%] | top-1 agree [95%] | quantize s | s |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& row : r.rows) {
    const auto m = r.measures(row.scores, false);
    s += fmt::format(
        "| {} | {} | {} | {:.3f} | {:.4f} {} | {:.4f} {} | {:.3g} {} | {:.4f} {} | "
        "{:.0f} | {:.0f} |\n",
        row.method, row.calib, row.seed, m.ppl_a, m.ppl_a / fp.ppl_a, ci(m.ratio_a_ci, "{:.4f}"),
        m.ppl_b / fp.ppl_b, ci(m.ratio_b_ci, "{:.4f}"), m.kl, ci(m.kl_ci, "{:.3g}"), m.top1,
        ci(m.top1_ci, "{:.4f}"), row.quantize_seconds, row.seconds);
  }
  return s + "\n";
}

std::string outliers_section(const StudyResult& r) {
  std::string s =
      "## Activation outliers per calibration set\n\n| calibration set | summary | largest "
      "channels (input of a linear) | largest block-output activations |\n"
      "|---|---|---|---|\n";
  for (const auto& o : r.outliers_by_set)
    s += fmt::format("| {} | {} | {} | {} |\n", o.calib, escape_bars(o.summary),
                     fmt::join(o.top, "; "), fmt::join(o.massive, "; "));
  if (r.outliers_by_set.empty()) return s;
  s += "\nPer layer: the largest |x| of any linear input (its ratio to the median channel's max), "
       "the largest block output and where it is (position in the sample, channel), and "
       "SmoothQuant's largest migration scale.\n\n| layer |";
  for (const auto& o : r.outliers_by_set) s += " " + o.calib + " |";
  s += "\n|---|";
  for (std::size_t i = 0; i < r.outliers_by_set.size(); ++i) s += "---|";
  s += "\n";
  for (std::size_t l = 0; l < r.outliers_by_set[0].input_max.size(); ++l) {
    s += fmt::format("| {} |", l);
    for (const auto& o : r.outliers_by_set)
      s += fmt::format(" in {:.1f} ({:.0f}x); out {:.0f} at {}; s {:.1f} |", o.input_max[l],
                       o.input_ratio[l], o.residual_max[l], o.residual_where[l], o.smooth_max[l]);
    s += "\n";
  }
  return s + "\n";
}

}  // namespace

std::string StudyResult::markdown() const {
  std::string s = fmt::format("# Calibration study: {}\n\n", model_name);
  s += fmt::format(
      "Windows of {} tokens, the first the BOS token and the rest consecutive text. Perplexity A "
      "scores every prediction of a window ({}), B only its second half ({}, llama.cpp's "
      "protocol). KL(fp32 || quantized) and top-1 agreement are over A's positions. Intervals are "
      "95% bootstrap intervals over the windows (1000 resamples); ratios to fp32 are paired.\n\n",
      ctx, ctx - 1, ctx - 1 - ctx / 2);
  s += packed_kernels
           ? "The quantized models ran through the packed kernels (their codes, not dequantized "
             "weights), except those that quantize activations per tensor or keep outlier "
             "columns, which the kernels cannot reproduce and which ran simulated.\n\n"
           : "The quantized models ran as their dequantized weights through the fp32 forward "
             "(the packed kernels compute the same up to summation order and the fp16 rounding of "
             "the "
             "scales: --kernels packed).\n\n";
  s += texts_section(*this) + "\n";
  if (std::any_of(rows.begin(), rows.end(), [](const StudyRow& x) { return x.long_row; }))
    s += long_section(*this);
  s += "## Method x calibration set (short windows)\n\n";
  s += grid_table(
      *this, "KL divergence to fp32 (mean +- sd over seeds)",
      [](const Measures& m, const Measures&) { return m.kl; }, "{:.3g}");
  s += grid_table(
      *this, "Perplexity A / fp32 (mean +- sd over seeds)",
      [](const Measures& m, const Measures& f) { return m.ppl_a / f.ppl_a; }, "{:.4f}");
  s += runs_section(*this) + outliers_section(*this);
  s += fmt::format("Total time {:.0f} s.\n", seconds);
  return s;
}

std::string StudyResult::csv() const {
  std::string s =
      "method,calibration,seed,windows,tokens_a,ppl_a,ppl_b,kl,top1,ratio_a_lo,ratio_a_hi,"
      "ratio_b_lo,ratio_b_hi,kl_lo,kl_hi,top1_lo,top1_hi,long_tokens_a,long_ppl_a,long_ppl_b,"
      "long_kl,long_top1,long_ratio_a_lo,long_ratio_a_hi,long_kl_lo,long_kl_hi,quantize_seconds,"
      "seconds\n";
  auto line = [&](const std::string& m, const std::string& c, const std::string& seed,
                  const std::vector<WindowScore>& sc, bool has_long, double qs, double sec) {
    const auto a = measures(sc, false);
    const auto l = has_long ? measures(sc, true) : Measures{};
    return fmt::format(
        "{},{},{},{},{},{:.6f},{:.6f},{:.6g},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6g},{:.6g},"
        "{:.6f},{:.6f},{},{:.6f},{:.6f},{:.6g},{:.6f},{:.6f},{:.6f},{:.6g},{:.6g},{:.1f},{:.1f}\n",
        m, c, seed, a.windows, a.scored_a, a.ppl_a, a.ppl_b, a.kl, a.top1, a.ratio_a_ci.lo,
        a.ratio_a_ci.hi, a.ratio_b_ci.lo, a.ratio_b_ci.hi, a.kl_ci.lo, a.kl_ci.hi, a.top1_ci.lo,
        a.top1_ci.hi, l.scored_a, l.ppl_a, l.ppl_b, l.kl, l.top1, l.ratio_a_ci.lo, l.ratio_a_ci.hi,
        l.kl_ci.lo, l.kl_ci.hi, qs, sec);
  };
  s += line("fp32", "-", "-", fp, true, 0, 0);
  for (const auto& r : rows)
    s += line(r.method, r.calib, std::to_string(r.seed), r.scores, r.long_row, r.quantize_seconds,
              r.seconds);
  return s;
}

}  // namespace tessera::quant
