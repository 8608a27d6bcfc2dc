// The memorization study's summary: the Markdown table, its CSV and the charts of its figure.
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

namespace {

// A model's short name under the charts' x axis.
std::string short_label(const MemorizationArm& a) {
  if (a.name == "before" || a.name == "control" || a.goldfish_k == 0) return a.name;
  if (a.strategy == "hash") return fmt::format("Goldfish k={}", a.goldfish_k);
  return fmt::format("Goldfish {} k={}", a.strategy, a.goldfish_k);
}

// Each model's values at its category (x = its index), in one series.
plot::Series per_model(const MemorizationStudyResult& r, const std::string& label,
                       plot::Style style, const std::string& color,
                       double (*value)(const MemorizationArm&), double offset = 0) {
  plot::Series s{label, {}, {}, style, color};
  for (std::size_t i = 0; i < r.arms.size(); ++i) {
    s.x.push_back(static_cast<double>(i) + offset);
    s.y.push_back(value(r.arms[i]));
  }
  return s;
}

}  // namespace

std::vector<plot::Chart> memorization_summary_charts(const MemorizationStudyResult& r) {
  std::vector<std::string> names;
  for (const auto& a : r.arms) names.push_back(short_label(a));
  plot::Chart exact{fmt::format("Suffixes reproduced ({} documents, {} epochs, {} tokens greedy)",
                                r.options.docs, r.options.epochs, r.options.suffix),
                    "",
                    "percent",
                    false,
                    false,
                    {},
                    names};
  exact.series.push_back(
      per_model(r, "exact match", plot::Style::Points, "#1f77b4",
                [](const MemorizationArm& a) { return 100 * a.memorization.exact_rate; }));
  plot::Series ci{"95% interval (Wilson)", {}, {}, plot::Style::Line, "#1f77b4"};
  for (std::size_t i = 0; i < r.arms.size(); ++i) {  // a vertical bar per model, NaN between
    const auto e = exact_matches(r.arms[i]);
    const double x = static_cast<double>(i);
    ci.x.insert(ci.x.end(), {x, x, x});
    ci.y.insert(ci.y.end(), {100 * e.ci.low, 100 * e.ci.high, std::nan("")});
  }
  exact.series.push_back(ci);
  exact.series.push_back(per_model(
      r, "ROUGE-L words x100", plot::Style::Points, "#ff7f0e",
      [](const MemorizationArm& a) { return 100 * a.memorization.mean_rouge_l_words; }, 0.12));
  exact.series.push_back(per_model(
      r, "token match", plot::Style::Points, "#2ca02c",
      [](const MemorizationArm& a) { return 100 * a.memorization.mean_token_match; }, 0.24));
  plot::Chart ppl{
      "Held-out perplexity (lower is better)", "", "perplexity", false, false, {}, names};
  ppl.series.push_back(per_model(r, "", plot::Style::Points, "#2ca02c",
                                 [](const MemorizationArm& a) { return std::exp(a.val_loss); }));
  return {exact, ppl};
}

}  // namespace tessera::study
