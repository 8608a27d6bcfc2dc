#include "tessera/eval/memorization.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/eval/generate.hpp"

namespace tessera::eval {

namespace {

// ROUGE-L F1 of two sequences of comparable items (token ids, words).
template <class Item>
double lcs_f1(const std::vector<Item>& a, const std::vector<Item>& b) {
  if (a.empty() && b.empty()) return 1.0;
  if (a.empty() || b.empty()) return 0.0;
  // LCS length by dynamic programming, one row at a time.
  std::vector<int> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  double lcs = prev[b.size()];
  if (lcs == 0) return 0.0;
  double p = lcs / a.size(), r = lcs / b.size();
  return 2 * p * r / (p + r);
}

std::string decode_ids(const data::Tokenizer& tok, const std::vector<std::int32_t>& ids) {
  std::vector<std::uint32_t> u(ids.begin(), ids.end());
  return tok.decode(u);
}

}  // namespace

double rouge_l_f1(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  return lcs_f1(a, b);
}

std::vector<std::string> rouge_words(std::string_view text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= '0' && u <= '9')) {
      word += c;
    } else if (u >= 'A' && u <= 'Z') {
      word += static_cast<char>(u - 'A' + 'a');
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

double rouge_l_words(std::string_view a, std::string_view b) {
  const auto wa = rouge_words(a), wb = rouge_words(b);
  if (wa.empty() || wb.empty()) return 0.0;  // as rouge_score: no words, no match
  return lcs_f1(wa, wb);
}

double token_match(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::size_t n = std::max(a.size(), b.size());
  if (n == 0) return 1.0;
  std::size_t m = std::min(a.size(), b.size()), same = 0;
  for (std::size_t i = 0; i < m; ++i) same += a[i] == b[i];
  return static_cast<double>(same) / n;
}

namespace {

// One document: its last `suffix` tokens generated greedily from up to `max_prompt` tokens before
// them, and compared with them.
MemorizationRow score_document(const model::ParamLayout& layout, const float* params,
                               const std::vector<std::int32_t>& doc, int suffix, int max_prompt,
                               const SampleOptions& opt, const data::Tokenizer* words) {
  const auto split = doc.end() - suffix;
  const std::ptrdiff_t plen = split - doc.begin();
  const std::ptrdiff_t keep = std::min<std::ptrdiff_t>(plen, max_prompt);
  const std::vector<std::int32_t> prompt(split - keep, split), truth(split, doc.end());
  MemorizationRow row;
  row.prompt_tokens = static_cast<int>(keep);
  row.prompt_tokens_dropped = static_cast<int>(plen - keep);
  Rng rng(0);  // unused by greedy decoding
  row.generated = generate(layout, params, prompt, opt, rng);
  row.exact = row.generated == truth;
  row.token_match = token_match(row.generated, truth);
  row.rouge_l = rouge_l_f1(row.generated, truth);
  if (words)
    row.rouge_l_words = rouge_l_words(decode_ids(*words, row.generated), decode_ids(*words, truth));
  return row;
}

}  // namespace

MemorizationResult score_documents(const model::ParamLayout& layout, const float* params,
                                   const std::vector<std::vector<std::int32_t>>& docs, int suffix,
                                   kernels::GemmLibrary gemm, const data::Tokenizer* words) {
  const int block = layout.config().block_size;
  if (suffix <= 0) throw Error(fmt::format("--suffix must be positive (got {})", suffix));
  if (suffix >= block)
    throw Error(fmt::format("--suffix {} leaves no room for a prompt in the model's block_size {}",
                            suffix, block));
  MemorizationResult res;
  res.max_prompt = block - suffix;
  SampleOptions opt;
  opt.max_new_tokens = suffix;
  opt.temperature = 0.0f;
  opt.top_k = 0;
  opt.gemm = gemm;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].size() < static_cast<std::size_t>(suffix) + 1) {
      ++res.skipped;
      continue;
    }
    MemorizationRow row =
        score_document(layout, params, docs[d], suffix, res.max_prompt, opt, words);
    row.index = d;
    if (row.prompt_tokens_dropped > 0) ++res.truncated;
    res.exact_rate += row.exact;
    res.mean_token_match += row.token_match;
    res.mean_rouge_l += row.rouge_l;
    res.mean_rouge_l_words += row.rouge_l_words;
    res.rows.push_back(std::move(row));
  }
  if (!res.rows.empty()) {
    double n = static_cast<double>(res.rows.size());
    res.exact_rate /= n;
    res.mean_token_match /= n;
    res.mean_rouge_l /= n;
    res.mean_rouge_l_words /= n;
  }
  return res;
}

}  // namespace tessera::eval
