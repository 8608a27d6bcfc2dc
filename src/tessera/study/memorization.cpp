#include "tessera/study/memorization.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::study {

namespace fs = std::filesystem;

namespace {

void check_options(const MemorizationStudyOptions& o) {
  auto positive = [](int v, const char* flag) {
    if (v < 1) throw Error(fmt::format("{} must be >= 1, got {}", flag, v));
  };
  positive(o.docs, "--docs");
  positive(o.doc_tokens, "--doc-tokens");
  positive(o.epochs, "--epochs");
  positive(o.suffix, "--suffix");
  positive(o.batch, "--batch");
  positive(o.val_batches, "--val-batches");
  if (o.suffix >= o.doc_tokens)
    throw Error(
        fmt::format("--suffix {} must be smaller than --doc-tokens {}", o.suffix, o.doc_tokens),
        "the prompt is the document but its last suffix tokens: it needs at least one");
  if (o.docs % o.batch != 0)
    throw Error(fmt::format("--docs {} is not divisible by --batch {}", o.docs, o.batch),
                "every epoch must see every document once: choose D a multiple of the batch");
  if (o.goldfish_k < 2) throw Error(fmt::format("--goldfish-k must be >= 2, got {}", o.goldfish_k));
  if (!(o.lr > 0) || !std::isfinite(o.lr))
    throw Error(fmt::format("--lr must be > 0, got {}", o.lr));
  for (const auto& [p, flag] : {std::pair{o.corpus, "--corpus"}, {o.val, "--val"}})
    if (!fs::exists(p))
      throw Error(fmt::format("{} {} does not exist", flag, p.string()),
                  "run 'tessera prepare' (or make demo) for the default Brown corpus shards");
}

std::string pct(double x) {
  return fmt::format("{:.1f}%", 100 * x);
}

}  // namespace

MemorizationStudyResult run_memorization_study(const MemorizationStudyOptions& opt,
                                               comm::Runtime& rt) {
  check_options(opt);
  Timer total;
  MemorizationStudyResult res;
  res.options = opt;

  // 1. The documents: D consecutive windows of the corpus at a seeded offset.
  data::ShardReader corpus(opt.corpus);
  const std::size_t need = static_cast<std::size_t>(opt.docs) * opt.doc_tokens;
  if (corpus.size() < need + 1)
    throw Error(fmt::format("{} has {} tokens; {} documents of {} tokens need {}",
                            opt.corpus.string(), corpus.size(), opt.docs, opt.doc_tokens, need + 1),
                "use fewer or shorter documents, or a larger corpus");
  Rng rng(opt.seed * 0x9E3779B97F4A7C15ull + 1);
  const std::size_t span = corpus.size() - need - 1;
  res.corpus_offset = static_cast<std::int64_t>(span ? rng.next_u64() % (span + 1) : 0);
  std::vector<std::uint32_t> stream(need + 1);
  corpus.read(static_cast<std::size_t>(res.corpus_offset), need + 1, stream.data());
  std::vector<std::vector<std::int32_t>> docs(opt.docs);
  for (int d = 0; d < opt.docs; ++d)
    for (int t = 0; t < opt.doc_tokens; ++t)
      docs[d].push_back(static_cast<std::int32_t>(stream[d * opt.doc_tokens + t]));
  fs::create_directories(opt.out);
  // The training shard: the documents back to back, plus the token that follows the last one
  // (a loader window needs one token beyond its last input).
  const fs::path docs_bin = opt.out / "docs.bin";
  data::write_shard(docs_bin, stream);

  res.steps = static_cast<std::int64_t>(opt.epochs) * opt.docs / opt.batch;
  if (!opt.quiet)
    log_info(
        "memorization study: {} documents of {} tokens (corpus offset {}), {} epochs = {} "
        "steps of {} documents, model L={} H={} C={}; standard loss vs Goldfish k={} h={}",
        opt.docs, opt.doc_tokens, res.corpus_offset, opt.epochs, res.steps, opt.batch, opt.n_layer,
        opt.n_head, opt.n_embd, opt.goldfish_k, opt.goldfish_h);

  for (int k : {0, opt.goldfish_k}) {
    MemorizationArm arm;
    arm.name = k == 0 ? "standard" : "goldfish";
    arm.goldfish_k = k;
    train::RunConfig cfg;
    cfg.source = "tessera study memorization";
    cfg.model.n_layer = opt.n_layer;
    cfg.model.n_head = opt.n_head;
    cfg.model.n_embd = opt.n_embd;
    cfg.model.block_size = opt.doc_tokens;
    cfg.data.train = docs_bin.string();
    cfg.data.val = opt.val.string();
    cfg.train.batch_size = opt.batch;
    cfg.train.seq_len = opt.doc_tokens;
    cfg.train.steps = static_cast<int>(res.steps);
    cfg.train.lr = opt.lr;
    cfg.train.weight_decay = opt.weight_decay;
    cfg.train.warmup_steps = std::min<int>(opt.warmup, static_cast<int>(res.steps));
    cfg.train.seed = opt.seed;
    cfg.train.val_every = 0;
    cfg.train.ckpt_every = 0;
    cfg.train.keep_checkpoints = 1;
    cfg.train.log_every = 1000000;
    cfg.train.threads = opt.threads;
    cfg.train.out_dir = (opt.out / arm.name).string();
    cfg.sample.tokens = 0;
    cfg.goldfish.k = k;
    cfg.goldfish.h = opt.goldfish_h;
    cfg.goldfish.strategy = "hash";
    train::validate(cfg);
    fs::remove_all(cfg.train.out_dir);  // a fresh run: no resume from an earlier study

    train::TrainOptions to;
    to.quiet = true;
    std::unique_ptr<Progress> bar;
    if (!opt.quiet) bar = std::make_unique<Progress>("train " + arm.name, res.steps);
    to.on_step = [&](std::int64_t step, std::int64_t, double loss) {
      arm.final_train_loss = loss;
      if (bar) bar->update(step, fmt::format("loss {:.3f}", loss));
    };
    Timer t;
    auto summary = train::run_training(cfg, to, rt);
    arm.train_seconds = t.seconds();
    if (bar)
      bar->finish(fmt::format("loss {:.3f}, {:.0f} s", arm.final_train_loss, arm.train_seconds));
    arm.checkpoint = summary.last_checkpoint;

    // 2. Memorization of the documents and the held-out loss of the final model.
    auto loaded = io::load_model(arm.checkpoint);
    model::ParamLayout layout(loaded.config);
    arm.memorization = eval::score_documents(layout, loaded.params.data(), docs, opt.suffix);
    model::Activations acts;
    auto v = eval::evaluate_shard(layout, loaded.params.data(), acts, opt.val, opt.batch,
                                  opt.doc_tokens, opt.val_batches, kernels::GemmLibrary::OneDnn);
    arm.val_loss = v.loss;
    std::string csv = "document,exact,token_match,rouge_l\n";
    for (const auto& row : arm.memorization.rows)
      csv += fmt::format("{},{},{:.4f},{:.4f}\n", row.index, row.exact ? 1 : 0, row.token_match,
                         row.rouge_l);
    write_file_atomic(opt.out / arm.name / "memorization.csv", csv);
    if (!opt.quiet)
      log_info("{}: exact match {}, token match {}, ROUGE-L {:.3f}, val loss {:.4f}", arm.name,
               pct(arm.memorization.exact_rate), pct(arm.memorization.mean_token_match),
               arm.memorization.mean_rouge_l, arm.val_loss);
    res.arms.push_back(std::move(arm));
  }
  res.seconds = total.seconds();
  write_file_atomic(opt.out / "summary.md", memorization_summary_markdown(res));
  write_file_atomic(opt.out / "summary.csv", memorization_summary_csv(res));
  return res;
}

std::string memorization_summary_markdown(const MemorizationStudyResult& r) {
  const auto& o = r.options;
  std::string s = fmt::format(
      "Memorization: {} documents x {} tokens (offset {} of {}), {} epochs ({} steps of {}), "
      "model L={} H={} C={}, lr {}, suffix {} tokens greedy; {:.0f} s in all.\n\n",
      o.docs, o.doc_tokens, r.corpus_offset, o.corpus.string(), o.epochs, r.steps, o.batch,
      o.n_layer, o.n_head, o.n_embd, o.lr, o.suffix, r.seconds);
  s += "| loss | exact match | token match | ROUGE-L | val loss (held-out) | final train loss | "
       "train time |\n|---|---|---|---|---|---|---|\n";
  for (const auto& a : r.arms)
    s += fmt::format(
        "| {} | {} ({}/{}) | {} | {:.3f} | {:.4f} | {:.4f} | {:.0f} s |\n",
        a.goldfish_k ? fmt::format("Goldfish k={} h={}", a.goldfish_k, o.goldfish_h)
                     : std::string("standard"),
        pct(a.memorization.exact_rate),
        static_cast<int>(std::lround(a.memorization.exact_rate * a.memorization.rows.size())),
        a.memorization.rows.size(), pct(a.memorization.mean_token_match),
        a.memorization.mean_rouge_l, a.val_loss, a.final_train_loss, a.train_seconds);
  return s;
}

std::string memorization_summary_csv(const MemorizationStudyResult& r) {
  std::string s =
      "arm,goldfish_k,documents,exact_rate,token_match,rouge_l,val_loss,train_loss,"
      "train_seconds\n";
  for (const auto& a : r.arms)
    s += fmt::format("{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.1f}\n", a.name, a.goldfish_k,
                     a.memorization.rows.size(), a.memorization.exact_rate,
                     a.memorization.mean_token_match, a.memorization.mean_rouge_l, a.val_loss,
                     a.final_train_loss, a.train_seconds);
  return s;
}

}  // namespace tessera::study
