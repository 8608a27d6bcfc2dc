#include "tessera/study/memorization.hpp"

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/paths.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/pretrained.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::study {

namespace fs = std::filesystem;

namespace {

using Documents = std::vector<std::vector<std::int32_t>>;  // (D, doc_tokens)

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
  if (o.family != "gpt2" && o.family != "llama")
    throw Error(fmt::format("--family {} is not a model family", o.family),
                "use gpt2 or llama (with --model the family is the model's)");
  for (const auto& [p, flag] : {std::pair{o.corpus, "--corpus"}, {o.val, "--val"}}) {
    if (p.empty())
      throw Error(fmt::format("--model {} has no default {}", o.model.string(), flag),
                  "pass --corpus and --val: token shards made with the model's tokenizer "
                  "(tessera prepare --tokenizer MODEL --out DIR)");
    if (!fs::exists(find_data_path(p)))
      throw Error(fmt::format("{} {} does not exist", flag, p.string()),
                  o.model.empty()
                      ? "run 'tessera prepare' (or make demo) for the default Brown corpus shards"
                      : "make the Brown shards with the model's tokenizer: tessera prepare "
                        "--tokenizer smollm2-135m --out data/brown-smollm2 (or pass --corpus, "
                        "--val)");
  }
}

// A pretrained model's shape, checked against the options and the shards: every token id of the
// corpus and held-out shards must be a row of its embedding, and a document must fit its context.
model::ModelConfig check_pretrained(const MemorizationStudyOptions& o) {
  const auto cfg = io::read_model_config(io::resolve_model_path(o.model));
  for (const auto& [p, flag] : {std::pair{o.corpus, "--corpus"}, {o.val, "--val"}})
    if (const auto bad = data::first_id_outside(data::ShardReader(p),
                                                static_cast<std::uint32_t>(cfg.vocab_size)))
      throw Error(
          fmt::format("{} {} holds the token id {} at position {}, outside the vocabulary "
                      "of --model {} ({} tokens)",
                      flag, p.string(), bad->id, bad->position, o.model.string(), cfg.vocab_size),
          "the shard was made with another tokenizer: make one with the model's, e.g. "
          "tessera prepare --tokenizer smollm2-135m --out data/brown-smollm2");
  if (o.doc_tokens > cfg.block_size)
    throw Error(fmt::format("--doc-tokens {} is longer than the context of --model {} ({})",
                            o.doc_tokens, o.model.string(), cfg.block_size),
                "use shorter documents");
  return cfg;
}

struct DocumentSets {
  Documents targets, control;  // control empty without a control arm
};

// The targets (D windows at a seeded offset), then the control's D windows right after them;
// writes each set as a training shard (the windows back to back and the token that follows the
// last one: a loader window needs one token beyond its last input).
DocumentSets pick_documents(const MemorizationStudyOptions& o, bool control, int vocab,
                            MemorizationStudyResult& res) {
  data::ShardReader corpus(o.corpus);
  const std::size_t set = static_cast<std::size_t>(o.docs) * o.doc_tokens;
  const std::size_t need = set * (control ? 2 : 1);
  if (corpus.size() < need + 1)
    throw Error(fmt::format("{} has {} tokens; {} documents of {} tokens{} need {}",
                            o.corpus.string(), corpus.size(), o.docs, o.doc_tokens,
                            control ? " and as many for the control" : "", need + 1),
                "use fewer or shorter documents, or a larger corpus");
  Rng rng(o.seed * 0x9E3779B97F4A7C15ull + 1);
  const std::size_t span = corpus.size() - need - 1;
  res.corpus_offset = static_cast<std::int64_t>(span ? rng.next_u64() % (span + 1) : 0);
  std::vector<std::uint32_t> stream(need + 1);
  corpus.read(static_cast<std::size_t>(res.corpus_offset), need + 1, stream.data());
  for (std::size_t i = 0; i < stream.size(); ++i)  // before any shard of them is written
    if (stream[i] >= static_cast<std::uint32_t>(vocab))
      throw Error(fmt::format("{} holds token id {} at position {}, outside the model's "
                              "vocabulary of {}",
                              o.corpus.string(), stream[i], res.corpus_offset + i, vocab),
                  "prepare the corpus with the model's tokenizer (tessera prepare --tokenizer)");
  DocumentSets sets;
  prepare_output_dir(o.out, "--out");
  auto take = [&](std::size_t first, Documents& docs, const fs::path& shard) {
    for (int d = 0; d < o.docs; ++d) {
      const auto begin = stream.begin() + static_cast<std::ptrdiff_t>(first + d * o.doc_tokens);
      docs.emplace_back(begin, begin + o.doc_tokens);
    }
    const auto begin = stream.begin() + static_cast<std::ptrdiff_t>(first);
    data::write_shard(shard, std::vector<std::uint32_t>(begin, begin + set + 1));
  };
  take(0, sets.targets, o.out / "docs.bin");
  if (control) {
    take(set, sets.control, o.out / "control_docs.bin");
    res.control_offset = res.corpus_offset + static_cast<std::int64_t>(set);
  }
  return sets;
}

struct ArmSpec {
  std::string name, trained_on;
  int goldfish_k = 0;
  std::string strategy;
  fs::path shard;
};

std::vector<ArmSpec> arm_specs(const MemorizationStudyOptions& o, bool control) {
  const fs::path targets = o.out / "docs.bin";
  std::vector<ArmSpec> arms{{"standard", "targets", 0, "", targets},
                            {"goldfish", "targets", o.goldfish_k, "hash", targets}};
  if (o.all_masks) {
    arms.push_back({"goldfish-static", "targets", o.goldfish_k, "static", targets});
    arms.push_back({"goldfish-random", "targets", o.goldfish_k, "random", targets});
  }
  if (control) arms.push_back({"control", "other documents", 0, "", o.out / "control_docs.bin"});
  return arms;
}

train::RunConfig arm_run_config(const MemorizationStudyOptions& o, const ArmSpec& arm,
                                std::int64_t steps) {
  train::RunConfig cfg;
  cfg.source = "tessera study memorization";
  if (o.model.empty()) {
    cfg.model.family = o.family;
    cfg.model.n_layer = o.n_layer;
    cfg.model.n_head = o.n_head;
    cfg.model.n_embd = o.n_embd;
    cfg.model.n_kv_head = o.n_kv_head;
    cfg.model.block_size = o.doc_tokens;
  } else {
    cfg.train.init_from = o.model.string();  // the model's shape; [model] is not used
  }
  cfg.data.train = arm.shard.string();
  cfg.data.val = o.val.string();
  cfg.train.batch_size = o.batch;
  cfg.train.seq_len = o.doc_tokens;
  cfg.train.steps = static_cast<int>(steps);
  cfg.train.lr = o.lr;
  cfg.train.weight_decay = o.weight_decay;
  cfg.train.warmup_steps = std::min<int>(o.warmup, static_cast<int>(steps));
  cfg.train.seed = o.seed;
  cfg.train.val_every = 0;
  cfg.train.ckpt_every = 0;
  cfg.train.keep_checkpoints = 1;
  cfg.train.log_every = 1000000;
  cfg.train.threads = o.threads;
  cfg.train.out_dir = (o.out / arm.name).string();
  cfg.sample.tokens = 0;
  cfg.goldfish.k = arm.goldfish_k;
  cfg.goldfish.h = o.goldfish_h;
  cfg.goldfish.strategy = arm.strategy.empty() ? "hash" : arm.strategy;
  cfg.goldfish.seed = o.seed;
  train::validate(cfg);
  return cfg;
}

// Memorization of the targets and the held-out loss of one model; memorization.csv in `dir`.
void score_model(const model::ModelConfig& mcfg, const float* params, const Documents& targets,
                 const MemorizationStudyOptions& o, const data::Tokenizer* tok,
                 MemorizationArm& arm, const fs::path& dir) {
  model::ParamLayout layout(mcfg);
  arm.memorization =
      eval::score_documents(layout, params, targets, o.suffix, kernels::GemmLibrary::OneDnn, tok);
  model::Activations acts;
  arm.val_loss = eval::evaluate_shard(layout, params, acts, o.val, o.batch, o.doc_tokens,
                                      o.val_batches, kernels::GemmLibrary::OneDnn)
                     .loss;
  std::string csv = "document,exact,token_match,rouge_l,rouge_l_words\n";
  for (const auto& row : arm.memorization.rows)
    csv += fmt::format("{},{},{:.4f},{:.4f},{:.4f}\n", row.index, row.exact ? 1 : 0,
                       row.token_match, row.rouge_l, row.rouge_l_words);
  fs::create_directories(dir);
  write_file_atomic(dir / "memorization.csv", csv);
  if (!o.quiet)
    log_info(
        "{}: exact match {:.1f}%, token match {:.1f}%, ROUGE-L {:.3f} (words {:.3f}), "
        "held-out loss {:.4f} (perplexity {:.2f})",
        arm.name, 100 * arm.memorization.exact_rate, 100 * arm.memorization.mean_token_match,
        arm.memorization.mean_rouge_l, arm.memorization.mean_rouge_l_words, arm.val_loss,
        std::exp(arm.val_loss));
}

MemorizationArm train_arm(const MemorizationStudyOptions& o, const ArmSpec& spec,
                          std::int64_t steps, comm::Runtime& rt) {
  MemorizationArm arm;
  arm.name = spec.name;
  arm.trained_on = spec.trained_on;
  arm.goldfish_k = spec.goldfish_k;
  arm.strategy = spec.strategy;
  arm.steps = steps;
  const auto cfg = arm_run_config(o, spec, steps);
  fs::remove_all(cfg.train.out_dir);  // a fresh run: no resume from an earlier study
  train::TrainOptions to;
  to.quiet = true;
  to.resumable = false;
  std::unique_ptr<Progress> bar;
  if (!o.quiet) bar = std::make_unique<Progress>("train " + arm.name, steps);
  to.on_step = [&](std::int64_t step, std::int64_t, double loss) {
    arm.final_train_loss = loss;
    if (bar) bar->update(step, fmt::format("loss {:.3f}", loss));
  };
  Timer t;
  const auto summary = train::run_training(cfg, to, rt);
  if (!summary.stopped_by.empty())
    throw Error(fmt::format("the study stopped by {} while training {} (step {} of {})",
                            summary.stopped_by, arm.name, summary.last_step, steps),
                "the study starts afresh when run again");
  arm.train_seconds = t.seconds();
  arm.tokens_per_s = summary.tokens_per_s;
  if (bar)
    bar->finish(fmt::format("loss {:.3f}, {:.0f} s, {:.0f} tokens/s", arm.final_train_loss,
                            arm.train_seconds, arm.tokens_per_s));
  arm.checkpoint = summary.last_checkpoint;
  return arm;
}

}  // namespace

MemorizationStudyOptions pretrained_study_defaults(const fs::path& model) {
  MemorizationStudyOptions o;
  o.model = model;
  const fs::path shards = io::pretrained_brown_shards(model);
  o.corpus = shards.empty() ? fs::path() : shards / "train.bin";
  o.val = shards.empty() ? fs::path() : shards / "val.bin";
  o.docs = 8;
  o.doc_tokens = 64;
  o.suffix = 32;
  o.epochs = 20;
  o.batch = 8;
  o.lr = 1e-4;
  o.warmup = 2;
  o.val_batches = 4;
  return o;
}

MemorizationStudyResult run_memorization_study(const MemorizationStudyOptions& opt,
                                               comm::Runtime& rt) {
  check_options(opt);
  const bool pretrained = !opt.model.empty();
  const bool control = pretrained || opt.control;
  std::optional<model::ModelConfig> base;
  if (pretrained) base = check_pretrained(opt);
  std::optional<data::Tokenizer> tok;
  if (!opt.tokenizer.empty()) tok = io::load_tokenizer(opt.tokenizer);
  const int vocab = base ? base->vocab_size : model::ModelConfig{}.vocab_size;
  if (tok && static_cast<std::size_t>(vocab) > tok->vocab_size())  // it decodes the model's ids
    throw Error(fmt::format("--tokenizer {} has {} tokens, fewer than the model's vocabulary of {}",
                            opt.tokenizer.string(), tok->vocab_size(), vocab),
                "pass the model's own tokenizer with --tokenizer");
  Timer total;
  MemorizationStudyResult res;
  res.options = opt;
  res.steps = static_cast<std::int64_t>(opt.epochs) * opt.docs / opt.batch;
  const auto docs = pick_documents(opt, control, vocab, res);
  const auto specs = arm_specs(opt, control);
  res.model_description =
      base ? fmt::format("{} ({})", opt.model.string(), model::describe(*base))
           : model::describe(train::model_config(arm_run_config(opt, specs.front(), res.steps)));
  if (!opt.quiet)
    log_info(
        "memorization study: {} documents of {} tokens (corpus offset {}), {} epochs = {} "
        "steps of {} documents, model {}; {} arms, Goldfish k={} h={}",
        opt.docs, opt.doc_tokens, res.corpus_offset, opt.epochs, res.steps, opt.batch,
        res.model_description, specs.size(), opt.goldfish_k, opt.goldfish_h);
  const data::Tokenizer* words = tok ? &*tok : nullptr;
  if (pretrained) {  // the "before" row: the pretrained model itself
    MemorizationArm before;
    before.name = "before";
    before.trained_on = std::string("-");  // (GCC 12 -O3 wrongly warns -Wrestrict on = "-")
    auto loaded = io::load_model(io::resolve_model_path(opt.model));
    score_model(loaded.config, loaded.params.data(), docs.targets, opt, words, before,
                opt.out / "before");
    res.arms.push_back(std::move(before));
  }
  for (const auto& spec : specs) {
    auto arm = train_arm(opt, spec, res.steps, rt);
    auto loaded = io::load_model(arm.checkpoint);
    score_model(loaded.config, loaded.params.data(), docs.targets, opt, words, arm,
                opt.out / arm.name);
    res.arms.push_back(std::move(arm));
  }
  res.seconds = total.seconds();
  write_file_atomic(opt.out / "summary.md", memorization_summary_markdown(res));
  write_file_atomic(opt.out / "summary.csv", memorization_summary_csv(res));
  plot::draw(memorization_summary_charts(res), opt.out / "summary.svg", {900, 900, 1});
  return res;
}

}  // namespace tessera::study
