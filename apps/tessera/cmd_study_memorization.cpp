// tessera study memorization [--docs 64 --doc-tokens 128 --epochs 60 --suffix 50 ...]
// Trains a small model on D documents for E epochs with the standard loss and with the Goldfish
// loss, and reports how much of the documents each reproduces (docs/memorization.md).
#include <cstdio>

#include "commands.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/study/memorization.hpp"

namespace tessera::app {

void add_study_memorization_command(CLI::App& study) {
  auto* cmd = study.add_subcommand(
      "memorization",
      "train a small model on D documents for E epochs with the standard and the Goldfish loss; "
      "report exact match, token match and ROUGE-L of each document's last tokens, and the "
      "held-out loss (Markdown + CSV)");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last wins
  auto o = std::make_shared<study::MemorizationStudyOptions>();
  std::string corpus = o->corpus.string(), val = o->val.string(), out = o->out.string();
  auto paths =
      std::make_shared<std::array<std::string, 3>>(std::array<std::string, 3>{corpus, val, out});
  cmd->add_option("--corpus", (*paths)[0], "token shard the documents are cut from")
      ->capture_default_str();
  cmd->add_option("--val", (*paths)[1], "held-out token shard (validation loss)")
      ->capture_default_str();
  cmd->add_option("--out", (*paths)[2], "output folder (runs, per-document CSVs, summary)")
      ->capture_default_str();
  cmd->add_option("--docs", o->docs, "documents D (a multiple of --batch)")->capture_default_str();
  cmd->add_option("--doc-tokens", o->doc_tokens, "tokens per document (= sequence length)")
      ->capture_default_str();
  cmd->add_option("--epochs", o->epochs, "passes over the documents E")->capture_default_str();
  cmd->add_option("--suffix", o->suffix, "last tokens of each document to reproduce")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "documents' offset in the corpus and model initialisation")
      ->capture_default_str();
  cmd->add_option("--n-layer", o->n_layer, "model layers")->capture_default_str();
  cmd->add_option("--n-head", o->n_head, "attention heads")->capture_default_str();
  cmd->add_option("--n-embd", o->n_embd, "hidden size")->capture_default_str();
  cmd->add_option("--batch", o->batch, "documents per step")->capture_default_str();
  cmd->add_option("--lr", o->lr, "peak learning rate (warmup, cosine decay)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--goldfish-k", o->goldfish_k, "Goldfish: drop about 1 in k targets")
      ->capture_default_str();
  cmd->add_option("--goldfish-h", o->goldfish_h, "Goldfish: hashed context width")
      ->capture_default_str();
  cmd->add_option("--val-batches", o->val_batches, "held-out windows (batch x doc-tokens)")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--quiet,-q", o->quiet, "no progress lines");
  cmd->callback([o, paths] {
    o->corpus = (*paths)[0];
    o->val = (*paths)[1];
    o->out = (*paths)[2];
    auto rt = comm::Runtime::create();
    auto r = study::run_memorization_study(*o, *rt);
    std::printf("%s\nwritten: %s/summary.md, %s/summary.csv, %s/{standard,goldfish}/\n",
                study::memorization_summary_markdown(r).c_str(), o->out.string().c_str(),
                o->out.string().c_str(), o->out.string().c_str());
  });
}

}  // namespace tessera::app
