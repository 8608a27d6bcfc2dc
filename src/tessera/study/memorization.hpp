// The memorization experiment of the Goldfish loss paper (Hans et al., NeurIPS 2024): train a
// model on D documents for E epochs with the standard loss and with the Goldfish loss, then
// measure how much of each document's last `suffix` tokens each model reproduces greedily from
// the rest of the document (exact match, token match, ROUGE-L on tokens and on the words of the
// decoded text; eval/memorization.hpp), and the perplexity of each on held-out text (the price of
// the Goldfish loss).
//
// Two modes:
//   from scratch (no model): a small model of the given family and shape is trained from random
//     weights; arms standard and goldfish (today's experiment), plus the control with --control.
//   pretrained (model): every arm fine-tunes the same pretrained model (train.init_from), and
//     the study adds the "before" row (the pretrained model itself, scored like the arms) and a
//     control arm: the standard loss, the same steps and settings, on D *other* documents of the
//     same corpus. The control has never seen the target documents, so its scores are what a
//     model reproduces of them without having memorized them; the Goldfish arm is compared with
//     it, not with zero.
//
// Documents: consecutive windows of doc_tokens tokens of a token shard, from an offset drawn from
// the seed: the D targets, then (with a control) the next D windows as the control's documents.
// Each set is written as a training shard (each window is exactly one training sequence:
// seq_len = doc_tokens, and D divisible by the batch so that every epoch sees every document
// once, in the same order).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/eval/memorization.hpp"
#include "tessera/plot/plot.hpp"

namespace tessera::comm {
class Runtime;
}

namespace tessera::study {

struct MemorizationStudyOptions {
  // A pretrained model to fine-tune (a short name, a .gguf or safetensors file, a checkpoint or
  // run directory, as io::resolve_model_path takes it); empty = from scratch.
  std::filesystem::path model;
  // The tokenizer that decodes suffixes for the word ROUGE-L (the model's own, or the corpus's
  // for a model from scratch); empty = no word ROUGE-L (reported as 0).
  std::filesystem::path tokenizer;
  std::filesystem::path corpus = "data/brown/train.bin";  // the documents are windows of it
  std::filesystem::path val = "data/brown/val.bin";       // held-out text: perplexity
  std::filesystem::path out = "runs/study_memorization";
  int docs = 32;           // D
  int doc_tokens = 100;    // tokens per document (= seq_len; <= the model's block_size)
  int epochs = 80;         // E
  int suffix = 50;         // tokens to reproduce at the end of each document
  std::uint64_t seed = 1;  // the documents' offset in the corpus and the model's initialisation
  // From scratch only: the model's family and shape (n_kv_head 0 = n_head; llama only).
  std::string family = "gpt2";
  int n_layer = 4, n_head = 4, n_embd = 256, n_kv_head = 0;
  int batch = 8;
  double lr = 1e-3;
  double weight_decay = 0.0;
  int warmup = 20;
  int goldfish_k = 4, goldfish_h = 13;
  bool all_masks = false;  // also the static and random Goldfish masks (same k)
  bool control = false;    // the control arm (always on with a pretrained model)
  int val_batches = 16;    // (batch, doc_tokens) windows of the held-out text
  int threads = 0;
  bool quiet = false;
};

// The defaults of the pretrained mode for `model` (docs/memorization.md says why): 8 documents
// of 64 tokens, suffix 32, 20 epochs of one step at lr 1e-4, and the Brown shards made with the
// model's tokenizer (io::pretrained_brown_shards; empty paths for a model without them: the
// study then asks for --corpus and --val). The other fields keep the from-scratch defaults.
MemorizationStudyOptions pretrained_study_defaults(const std::filesystem::path& model);

// What one model of the study is: an arm trained here, or the pretrained model ("before").
struct MemorizationArm {
  std::string name;        // "before", "standard", "goldfish", "goldfish-static", ..., "control"
  std::string trained_on;  // "targets", "other documents" (control), "-" (before)
  int goldfish_k = 0;      // 0 = standard loss
  std::string strategy;    // the Goldfish mask ("hash", "static", "random"); "" for none
  std::int64_t steps = 0;  // optimizer steps (0 for before)
  double final_train_loss = 0;
  double val_loss = 0;  // mean cross-entropy on the held-out windows (perplexity exp(val_loss))
  double train_seconds = 0;
  double tokens_per_s = 0;  // median training throughput
  eval::MemorizationResult memorization;
  std::filesystem::path checkpoint;
};

struct MemorizationStudyResult {
  MemorizationStudyOptions options;
  std::string model_description;      // "SmolLM2 ... llama L=30 ..." or the from-scratch shape
  std::int64_t steps = 0;             // per arm
  std::int64_t corpus_offset = 0;     // first token of the first target document
  std::int64_t control_offset = -1;   // first token of the control's documents (-1: no control)
  std::vector<MemorizationArm> arms;  // "before" first when there is one
  double seconds = 0;
};

// Checks the options (tessera::Error naming the flag), then runs every arm in `out`:
// out/docs.bin (the targets), out/control_docs.bin, out/<arm>/ (each a training run with its
// metrics and final checkpoint, and memorization.csv per document), out/summary.md,
// out/summary.csv and out/summary.svg.
MemorizationStudyResult run_memorization_study(const MemorizationStudyOptions& opt,
                                               comm::Runtime& rt);

// The summary table (Markdown), its CSV and the figure (SVG: exact match and word ROUGE-L per
// model, held-out perplexity per model).
std::string memorization_summary_markdown(const MemorizationStudyResult& r);
std::string memorization_summary_csv(const MemorizationStudyResult& r);
std::vector<plot::Chart> memorization_summary_charts(const MemorizationStudyResult& r);

// The 95% Wilson score interval of a binomial rate: `successes` of `n` (n > 0).
struct RateInterval {
  double low = 0, high = 0;
};
RateInterval wilson_interval(std::int64_t successes, std::int64_t n);

}  // namespace tessera::study
