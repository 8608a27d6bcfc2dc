// Memorization metrics: greedy continuation of a document's prefix compared with its true suffix
// (exact match, position-wise token match, ROUGE-L F1 over token sequences and over the words of
// the decoded text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::data {
class Tokenizer;
}

namespace tessera::eval {

// ROUGE-L F1 between two token sequences: LCS length l, precision l/|a|, recall l/|b|,
// F1 = 2PR/(P+R). Two empty sequences give 1; one empty sequence gives 0.
double rouge_l_f1(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b);

// The words of a text as the ROUGE scorer of the Goldfish paper's evaluation (Google's
// rouge_score, default tokenizer, no stemming) finds them: the text lower-cased (ASCII), every
// run of bytes other than ASCII letters and digits a separator. "Don't stop!" -> don, t, stop.
std::vector<std::string> rouge_words(std::string_view text);

// ROUGE-L F1 (as rouge_l_f1) over the words of two texts: rouge_words(a) against rouge_words(b);
// 0 when either has no word (as rouge_score).
double rouge_l_words(std::string_view a, std::string_view b);

// Fraction of positions i < max(|a|, |b|) where a[i] == b[i] (missing positions count as
// mismatches). Two empty sequences give 1.
double token_match(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b);

struct MemorizationRow {
  std::size_t index = 0;                // the document's index in the input
  int prompt_tokens = 0;                // prompt tokens given to the model (after the cap)
  int prompt_tokens_dropped = 0;        // oldest prompt tokens left out by the context cap
  bool exact = false;                   // every suffix token reproduced
  double token_match = 0;               // position-wise fraction of matching suffix tokens
  double rouge_l = 0;                   // ROUGE-L F1 of generated vs true suffix (tokens)
  double rouge_l_words = 0;             // the same over the words of the decoded texts (or 0)
  std::vector<std::int32_t> generated;  // (suffix,) greedy continuation
};

struct MemorizationResult {
  std::vector<MemorizationRow> rows;  // scored documents, in input order
  std::size_t skipped = 0;            // documents with fewer than suffix + 1 tokens
  std::size_t truncated = 0;          // documents whose prompt was cut to block_size - suffix
  int max_prompt = 0;                 // block_size - suffix
  double exact_rate = 0, mean_token_match = 0, mean_rouge_l = 0;  // over rows (0 when none)
  double mean_rouge_l_words = 0;  // over rows; 0 when no tokenizer was given
};

// For each document (token ids): the prompt is every token but the last `suffix`, of which only
// the last block_size - suffix are kept so prompt and continuation fit the context; `suffix`
// tokens are decoded greedily (eval::generate, temperature 0: the KV-cache decoder, both
// families) and compared with the true suffix. With a tokenizer (`words`, the model's own), both
// suffixes are also decoded to text and scored by rouge_l_words. Throws tessera::Error when
// suffix <= 0 or suffix >= block_size.
MemorizationResult score_documents(const model::ParamLayout& layout, const float* params,
                                   const std::vector<std::vector<std::int32_t>>& docs, int suffix,
                                   kernels::GemmLibrary gemm = kernels::GemmLibrary::OneDnn,
                                   const data::Tokenizer* words = nullptr);

}  // namespace tessera::eval
