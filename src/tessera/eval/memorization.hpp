// Memorization metrics: greedy continuation of a document's prefix compared with its true suffix
// (exact match, position-wise token match, ROUGE-L F1 over token sequences).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::eval {

// ROUGE-L F1 between two token sequences: LCS length l, precision l/|a|, recall l/|b|,
// F1 = 2PR/(P+R). Two empty sequences give 1; one empty sequence gives 0.
double rouge_l_f1(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b);

// Fraction of positions i < max(|a|, |b|) where a[i] == b[i] (missing positions count as
// mismatches). Two empty sequences give 1.
double token_match(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b);

struct MemorizationRow {
  std::size_t index = 0;                // the document's index in the input
  int prompt_tokens = 0;                // prompt tokens given to the model (after the cap)
  int prompt_tokens_dropped = 0;        // oldest prompt tokens left out by the context cap
  bool exact = false;                   // every suffix token reproduced
  double token_match = 0;               // position-wise fraction of matching suffix tokens
  double rouge_l = 0;                   // ROUGE-L F1 of generated vs true suffix
  std::vector<std::int32_t> generated;  // (suffix,) greedy continuation
};

struct MemorizationResult {
  std::vector<MemorizationRow> rows;  // scored documents, in input order
  std::size_t skipped = 0;            // documents with fewer than suffix + 1 tokens
  std::size_t truncated = 0;          // documents whose prompt was cut to block_size - suffix
  int max_prompt = 0;                 // block_size - suffix
  double exact_rate = 0, mean_token_match = 0, mean_rouge_l = 0;  // over rows (0 when none)
};

// For each document (token ids): the prompt is every token but the last `suffix`, of which only
// the last block_size - suffix are kept so prompt and continuation fit the context; `suffix`
// tokens are decoded greedily (eval::generate, temperature 0) and compared with the true suffix.
// Throws tessera::Error when suffix <= 0 or suffix >= block_size.
MemorizationResult score_documents(const model::ParamLayout& layout, const float* params,
                                   const std::vector<std::vector<std::int32_t>>& docs, int suffix,
                                   kernels::GemmLibrary gemm = kernels::GemmLibrary::OneDnn);

}  // namespace tessera::eval
