// The memorization study's summary: the Markdown table, its CSV and the SVG figure.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "tessera/study/memorization.hpp"

namespace tessera::study {

namespace {

std::string pct(double x) {
  return fmt::format("{:.1f}%", 100 * x);
}

std::string label(const MemorizationArm& a, const MemorizationStudyOptions& o) {
  if (a.name == "before") return "before (pretrained)";
  if (a.name == "control") return "control (standard loss, other documents)";
  if (a.goldfish_k == 0) return "standard";
  if (a.strategy == "hash") return fmt::format("Goldfish k={} h={}", a.goldfish_k, o.goldfish_h);
  return fmt::format("Goldfish {} k={}", a.strategy, a.goldfish_k);
}

// The exact matches of a model: count, documents and the 95% interval of the rate.
struct ExactMatches {
  std::int64_t count = 0, documents = 0;
  RateInterval ci;
};

ExactMatches exact_matches(const MemorizationArm& a) {
  ExactMatches e;
  e.documents = static_cast<std::int64_t>(a.memorization.rows.size());
  e.count = std::llround(a.memorization.exact_rate * static_cast<double>(e.documents));
  if (e.documents > 0) e.ci = wilson_interval(e.count, e.documents);
  return e;
}

std::string svg_escape(const std::string& s) {
  std::string r;
  for (char c : s)
    r += c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : std::string(1, c);
  return r;
}

// One panel of horizontal bars: a row per model, `series` bars per row (value in [0, vmax]).
struct Series {
  const char* name;
  const char* color;
  double (*value)(const MemorizationArm&);
  const char* format;  // of the value written after the bar
};

std::string bar_panel(const MemorizationStudyResult& r, int x0, int y0, const std::string& title,
                      const std::vector<Series>& series, double vmax) {
  const int label_w = 250, bar_w = 260, bar_h = 12,
            row_h = 8 + bar_h * static_cast<int>(series.size());
  std::string s = fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n", x0, y0,
                              svg_escape(title));
  for (std::size_t i = 0; i < series.size(); ++i)
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">"
        "{}</text>\n",
        x0 + label_w + 120 * static_cast<int>(i), y0 + 8, series[i].color,
        x0 + label_w + 14 + 120 * static_cast<int>(i), y0 + 17, series[i].name);
  int y = y0 + 28;
  for (const auto& a : r.arms) {
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", x0, y + row_h / 2 + 2,
                     svg_escape(label(a, r.options)));
    for (std::size_t i = 0; i < series.size(); ++i) {
      const double v = series[i].value(a);
      const double w = vmax > 0 ? std::clamp(v / vmax, 0.0, 1.0) * bar_w : 0;
      const int yb = y + static_cast<int>(i) * bar_h;
      s += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/><text x=\"{:.1f}\" "
          "y=\"{}\" fill=\"#333\">{}</text>\n",
          x0 + label_w, yb, w, bar_h - 2, series[i].color, x0 + label_w + w + 4, yb + bar_h - 3,
          fmt::format(fmt::runtime(series[i].format), v));
    }
    y += row_h;
  }
  return s;
}

}  // namespace

RateInterval wilson_interval(std::int64_t successes, std::int64_t n) {
  const double z = 1.959963984540054, nn = static_cast<double>(n);
  const double p = static_cast<double>(successes) / nn, z2 = z * z / nn;
  const double centre = (p + z2 / 2) / (1 + z2);
  const double half = z * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn)) / (1 + z2);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

std::string memorization_summary_markdown(const MemorizationStudyResult& r) {
  const auto& o = r.options;
  std::string s = fmt::format(
      "Memorization: model {}; {} documents x {} tokens (offset {} of {}{}), {} epochs ({} steps "
      "of {}), lr {}, suffix {} tokens greedy; held-out: the first {} windows of {} x {} tokens of "
      "{}; {:.0f} s in all.\n\n",
      r.model_description, o.docs, o.doc_tokens, r.corpus_offset, o.corpus.string(),
      r.control_offset >= 0
          ? fmt::format("; the control's documents at offset {}", r.control_offset)
          : std::string(),
      o.epochs, r.steps, o.batch, o.lr, o.suffix, o.val_batches, o.batch, o.doc_tokens,
      o.val.string(), r.seconds);
  s +=
      "| loss | trained on | exact match (95% CI) | token match | ROUGE-L tokens | ROUGE-L words | "
      "held-out loss | held-out ppl | final train loss | train time |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& a : r.arms) {
    const auto e = exact_matches(a);
    s += fmt::format(
        "| {} | {} | {} ({}/{}; {:.0f}-{:.0f}%) | {} | {:.3f} | {:.3f} | {:.4f} | {:.2f} | {} | {} "
        "|\n",
        label(a, o), a.trained_on, pct(a.memorization.exact_rate), e.count, e.documents,
        100 * e.ci.low, 100 * e.ci.high, pct(a.memorization.mean_token_match),
        a.memorization.mean_rouge_l, a.memorization.mean_rouge_l_words, a.val_loss,
        std::exp(a.val_loss), a.steps ? fmt::format("{:.4f}", a.final_train_loss) : "-",
        a.steps ? fmt::format("{:.0f} s", a.train_seconds) : "-");
  }
  return s;
}

std::string memorization_summary_csv(const MemorizationStudyResult& r) {
  std::string s =
      "arm,goldfish_k,documents,exact_rate,token_match,rouge_l,val_loss,train_loss,"
      "train_seconds,strategy,trained_on,exact,exact_low,exact_high,rouge_l_words,val_ppl,"
      "tokens_per_s\n";
  for (const auto& a : r.arms) {
    const auto e = exact_matches(a);
    s += fmt::format(
        "{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.1f},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},"
        "{:.1f}\n",
        a.name, a.goldfish_k, e.documents, a.memorization.exact_rate,
        a.memorization.mean_token_match, a.memorization.mean_rouge_l, a.val_loss,
        a.final_train_loss, a.train_seconds, a.strategy.empty() ? "none" : a.strategy, a.trained_on,
        e.count, e.ci.low, e.ci.high, a.memorization.mean_rouge_l_words, std::exp(a.val_loss),
        a.tokens_per_s);
  }
  return s;
}

std::string memorization_summary_svg(const MemorizationStudyResult& r) {
  const int rows = static_cast<int>(r.arms.size());
  const int top_h = 40 + rows * 32, bottom_h = 40 + rows * 20;
  const int W = 640, H = 50 + top_h + bottom_h;
  double ppl_max = 0;
  for (const auto& a : r.arms) ppl_max = std::max(ppl_max, std::exp(a.val_loss));
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\">Memorization of {} documents "
      "({} epochs, suffix {} tokens)</text>\n",
      W, H, r.options.docs, r.options.epochs, r.options.suffix);
  s += bar_panel(
      r, 10, 45, "Reproduction of the target documents' suffixes",
      {{"exact match", "#1f77b4",
        [](const MemorizationArm& a) { return 100 * a.memorization.exact_rate; }, "{:.1f}%"},
       {"ROUGE-L words x100", "#ff7f0e",
        [](const MemorizationArm& a) { return 100 * a.memorization.mean_rouge_l_words; },
        "{:.1f}"}},
      100);
  s += bar_panel(r, 10, 45 + top_h + 20, "Held-out perplexity (lower is better)",
                 {{"perplexity", "#2ca02c",
                   [](const MemorizationArm& a) { return std::exp(a.val_loss); }, "{:.2f}"}},
                 ppl_max);
  return s + "</svg>\n";
}

}  // namespace tessera::study
