// The memorization experiment of the Goldfish loss paper (Hans et al., NeurIPS 2024): train the
// same small model on D documents for E epochs twice, with the standard loss and with the Goldfish
// loss, then measure how much of each document's last `suffix` tokens each model reproduces
// greedily from the rest of the document (exact match, token match, ROUGE-L;
// eval/memorization.hpp), and the validation loss on held-out text (the price of the Goldfish
// loss).
//
// Documents: D consecutive windows of doc_tokens tokens of a token shard, starting at an offset
// drawn from the seed. They are written as the training shard (each window is exactly one
// training sequence: seq_len = doc_tokens, and D divisible by the batch so that every epoch sees
// every document once, in the same order).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/eval/memorization.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::study {

struct MemorizationStudyOptions {
  std::filesystem::path corpus = "data/brown/train.bin";  // the documents are windows of it
  std::filesystem::path val = "data/brown/val.bin";       // held-out text: validation loss
  std::filesystem::path out = "runs/study_memorization";
  int docs = 32;           // D
  int doc_tokens = 100;    // tokens per document (= seq_len = block_size)
  int epochs = 80;         // E
  int suffix = 50;         // tokens to reproduce at the end of each document
  std::uint64_t seed = 1;  // the documents' offset in the corpus and the model's initialisation
  int n_layer = 4, n_head = 4, n_embd = 256;
  int batch = 8;
  double lr = 1e-3;
  double weight_decay = 0.0;
  int warmup = 20;
  int goldfish_k = 4, goldfish_h = 13;
  int val_batches = 16;  // (batch, doc_tokens) windows of the held-out text
  int threads = 0;
  bool quiet = false;
};

struct MemorizationArm {
  std::string name;    // "standard" or "goldfish"
  int goldfish_k = 0;  // 0 = standard loss
  double final_train_loss = 0;
  double val_loss = 0;  // mean cross-entropy on the held-out windows
  double train_seconds = 0;
  eval::MemorizationResult memorization;
  std::filesystem::path checkpoint;
};

struct MemorizationStudyResult {
  MemorizationStudyOptions options;
  std::int64_t steps = 0;          // per arm
  std::int64_t corpus_offset = 0;  // first token of the first document
  std::vector<MemorizationArm> arms;
  double seconds = 0;
};

// Checks the options (tessera::Error naming the flag), then runs both arms in `out`:
// out/docs.bin, out/standard/, out/goldfish/ (each a training run with its metrics and final
// checkpoint, and memorization.csv per document), out/summary.md, out/summary.csv.
MemorizationStudyResult run_memorization_study(const MemorizationStudyOptions& opt,
                                               comm::Runtime& rt);

// The summary table (Markdown) and its CSV.
std::string memorization_summary_markdown(const MemorizationStudyResult& r);
std::string memorization_summary_csv(const MemorizationStudyResult& r);

}  // namespace tessera::study
