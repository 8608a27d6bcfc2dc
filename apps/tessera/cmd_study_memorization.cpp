// tessera study memorization [--model smollm2-135m] [--docs 8 --doc-tokens 64 --epochs 20 ...]
// Trains a model (from scratch, or fine-tunes a pretrained one) on D documents for E epochs with
// the standard loss and with the Goldfish loss, and a control on other documents; reports how
// much of the documents each reproduces and the held-out perplexity (docs/memorization.md).
#include <cstdio>

#include "commands.hpp"
#include "model_paths.hpp"
#include "option_checks.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/study/memorization.hpp"

namespace tessera::app {

namespace {

struct StudyFlags {
  study::MemorizationStudyOptions o;
  std::string model, tokenizer, corpus, val, out;
};

// With --model, every flag the user did not give takes the pretrained mode's default.
void apply_pretrained_defaults(CLI::App& cmd, StudyFlags& f) {
  const auto d = study::pretrained_study_defaults(f.model);
  auto unless_given = [&](const char* flag, auto& value, const auto& default_value) {
    if (cmd.get_option(flag)->count() == 0) value = default_value;
  };
  unless_given("--corpus", f.corpus, d.corpus.string());
  unless_given("--val", f.val, d.val.string());
  unless_given("--docs", f.o.docs, d.docs);
  unless_given("--doc-tokens", f.o.doc_tokens, d.doc_tokens);
  unless_given("--suffix", f.o.suffix, d.suffix);
  unless_given("--epochs", f.o.epochs, d.epochs);
  unless_given("--batch", f.o.batch, d.batch);
  unless_given("--lr", f.o.lr, d.lr);
  unless_given("--warmup", f.o.warmup, d.warmup);
  unless_given("--val-batches", f.o.val_batches, d.val_batches);
}

void add_flags(CLI::App* cmd, StudyFlags& f) {
  auto& o = f.o;
  cmd->add_option("--model", f.model,
                  "pretrained model to fine-tune (short name such as smollm2-135m, .gguf, "
                  "checkpoint); none = a small model from scratch");
  cmd->add_option("--tokenizer", f.tokenizer,
                  "tokenizer for the word ROUGE-L (default: the model's own, else GPT-2's)");
  cmd->add_option("--corpus", f.corpus,
                  "token shard the documents are cut from (with --model smollm2-135m: "
                  "data/brown-smollm2/train.bin)")
      ->capture_default_str();
  cmd->add_option("--val", f.val, "held-out token shard (perplexity)")->capture_default_str();
  cmd->add_option("--out", f.out, "output folder (runs, per-document CSVs, summary)")
      ->capture_default_str();
  cmd->add_option("--docs", o.docs, "documents D, a multiple of --batch (--model: 8)")
      ->capture_default_str();
  cmd->add_option("--doc-tokens", o.doc_tokens,
                  "tokens per document = sequence length (--model: 64)")
      ->capture_default_str();
  cmd->add_option("--epochs", o.epochs, "passes over the documents E (--model: 20)")
      ->capture_default_str();
  cmd->add_option("--suffix", o.suffix, "last tokens of each document to reproduce (--model: 32)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "documents' offset in the corpus and model initialisation")
      ->check(k_unsigned_number)
      ->capture_default_str();
  cmd->add_option("--family", o.family, "from scratch: gpt2 or llama")->capture_default_str();
  cmd->add_option("--n-layer", o.n_layer, "from scratch: layers")->capture_default_str();
  cmd->add_option("--n-head", o.n_head, "from scratch: attention heads")->capture_default_str();
  cmd->add_option("--n-kv-head", o.n_kv_head, "from scratch, llama: key-value heads (0 = heads)")
      ->capture_default_str();
  cmd->add_option("--n-embd", o.n_embd, "from scratch: hidden size")->capture_default_str();
  cmd->add_option("--batch", o.batch, "documents per step (--model: 8)")->capture_default_str();
  cmd->add_option("--lr", o.lr, "peak learning rate, warmup then cosine decay (--model: 1e-4)")
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "warmup steps (--model: 2)")->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--goldfish-k", o.goldfish_k, "Goldfish: drop about 1 in k targets")
      ->capture_default_str();
  cmd->add_option("--goldfish-h", o.goldfish_h, "Goldfish: hashed context width")
      ->capture_default_str();
  cmd->add_flag("--all-masks", o.all_masks, "also the static and random Goldfish masks");
  cmd->add_flag("--control", o.control,
                "from scratch: also the control arm (always there with --model)");
  cmd->add_option("--val-batches", o.val_batches,
                  "held-out windows, batch x doc-tokens (--model: 4)")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--quiet,-q", o.quiet, "no progress lines");
}

}  // namespace

void add_study_memorization_command(CLI::App& study) {
  auto* cmd = study.add_subcommand(
      "memorization",
      "fine-tune a pretrained model (--model) or train a small one on D documents for E epochs "
      "with the standard and the Goldfish loss, and a control on other documents; report exact "
      "match, token match and ROUGE-L of each document's last tokens, and held-out perplexity "
      "before and after (Markdown, CSV, SVG)");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last wins
  auto f = std::make_shared<StudyFlags>();
  f->corpus = f->o.corpus.string();
  f->val = f->o.val.string();
  f->out = f->o.out.string();
  add_flags(cmd, *f);
  cmd->callback([cmd, f] {
    if (!f->model.empty()) apply_pretrained_defaults(*cmd, *f);
    f->o.model = f->model;
    f->o.corpus = f->corpus;
    f->o.val = f->val;
    f->o.out = f->out;
    f->o.tokenizer = resolve_tokenizer_path(f->tokenizer, f->model);
    auto rt = comm::Runtime::create();
    auto r = study::run_memorization_study(f->o, *rt);
    std::printf("%s\nwritten: %s/summary.md, %s/summary.csv, %s/summary.svg, one folder per arm\n",
                study::memorization_summary_markdown(r).c_str(), f->out.c_str(), f->out.c_str(),
                f->out.c_str());
  });
}

}  // namespace tessera::app
