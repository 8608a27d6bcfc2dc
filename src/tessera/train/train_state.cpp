#include "tessera/train/train_state.hpp"

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/paths.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/pretrained.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/optim/adamw.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// The run config a checkpoint was trained with (absent from checkpoints of other versions).
std::optional<RunConfig> checkpoint_config(const io::TrainState& st) {
  auto it = st.extra.find("config");
  if (it == st.extra.end()) return std::nullopt;
  try {
    return parse_run_config(it->second, "the checkpoint's config");
  } catch (const Error&) {
    return std::nullopt;  // written by another version: nothing to compare with
  }
}

std::int64_t sequences_per_step(const RunConfig& c) {
  return c.train.global_batch > 0
             ? c.train.global_batch
             : std::int64_t{c.train.batch_size} * c.train.grad_accum * c.parallel.dp;
}

// Resuming with another data shard, seed or sequence length changes the data order: allowed,
// but said.
void warn_if_data_order_changes(const RunConfig& cfg, const RunConfig& old) {
  auto warn = [](const char* what, const auto& now, const auto& then) {
    if (now != then)
      log_info(
          "warning: resuming with {} = {}, but the checkpoint was trained with {}: the data "
          "order differs from an uninterrupted run",
          what, now, then);
  };
  warn("data.train", cfg.data.train, old.data.train);
  warn("train.seed", cfg.train.seed, old.train.seed);
  warn("train.seq_len", cfg.train.seq_len, old.train.seq_len);
}

// A resume continues the learning-rate schedule and the batch the checkpoint was trained with. One
// that changes them (steps, warmup, peak or final learning rate, sequences per step) would make
// the learning rate jump at the resumed step: refused with what changed, unless
// `override_schedule`, which continues under the new schedule and says so.
void check_schedule_kept(const RunConfig& cfg, const RunConfig& old, std::int64_t seqs_now,
                         std::int64_t step, bool override_schedule, bool lead) {
  std::vector<std::string> changed;
  auto cmp = [&](const char* what, const auto& now, const auto& then) {
    if (now != then) changed.push_back(fmt::format("{} {} -> {}", what, then, now));
  };
  const auto &t = cfg.train, &o = old.train;
  cmp("train.steps", t.steps, o.steps);
  cmp("train.warmup_steps", t.warmup_steps, o.warmup_steps);
  cmp("train.lr", t.lr, o.lr);
  cmp("train.min_lr_ratio", t.min_lr_ratio, o.min_lr_ratio);
  cmp("sequences per step", seqs_now, sequences_per_step(old));
  if (changed.empty()) return;
  auto lr = [step](const TrainSection& s) {
    return optim::lr_at(step, s.steps, s.warmup_steps, static_cast<float>(s.lr),
                        static_cast<float>(s.min_lr_ratio));
  };
  const std::string what = fmt::format("{}", fmt::join(changed, ", "));
  if (!override_schedule)
    throw Error(
        fmt::format("resuming at step {} would change the training schedule ({}): the learning "
                    "rate would jump from {:.3g} to {:.3g}",
                    step, what, lr(o), lr(t)),
        "resume with the checkpoint's values, or add --override-schedule to continue under the "
        "new schedule");
  if (lead)
    log_info("schedule overridden at step {} ({}): learning rate {:.3g} -> {:.3g}", step, what,
             lr(o), lr(t));
}

// Checkpoints hold the full state; each rank reads the parameters and the moments of its own
// range, from whichever shards of the checkpoint hold them: any dp size and stage resumes any
// other.
io::TrainState load_into_model(const fs::path& checkpoint, RunModel& model) {
  const model::ParamLayout& layout = *model.layout;
  parallel::DataParallel& dp = *model.dp;
  if (!model.sliced()) {
    Buffer<float> p_full(layout.total()), m_s(dp.shard_size()), v_s(dp.shard_size());
    auto st = io::load_checkpoint(checkpoint, layout, p_full.data(), dp.shard_begin(),
                                  dp.shard_end(), m_s.data(), v_s.data());
    dp.load_shard(p_full.data(), m_s.data(), v_s.data());
    return st;
  }
  // Tensor parallelism: read the whole state and keep this rank's slices of it.
  Buffer<float> p_full(layout.total()), m_full(layout.total()), v_full(layout.total());
  auto st = io::load_checkpoint(checkpoint, layout, p_full.data(), 0, layout.total(), m_full.data(),
                                v_full.data());
  const std::size_t nl = model.local_layout().total();
  Buffer<float> p_l(nl), m_l(nl), v_l(nl);
  model.tensor->extract(p_full.data(), p_l.data());
  model.tensor->extract(m_full.data(), m_l.data());
  model.tensor->extract(v_full.data(), v_l.data());
  dp.load(p_l.data(), m_l.data(), v_l.data());
  return st;
}

// Random weights (init_params), or a pretrained model's (train.init_from) when given.
void initialize_params(RunModel& model, const RunConfig& cfg) {
  const model::ParamLayout& layout = *model.layout;
  Buffer<float> p_full(layout.total());
  if (cfg.train.init_from.empty()) {
    model::init_params(layout, p_full.data(), cfg.train.seed);
  } else {
    const auto path = io::resolve_model_path(cfg.train.init_from);
    io::LoadedModel pre = io::load_model(path);
    if (!(pre.config == layout.config()))
      throw Error(fmt::format("train.init_from {}: its model ({}) is not the run's ({})",
                              path.string(), model::describe(pre.config),
                              model::describe(layout.config())));
    std::copy(pre.params.data(), pre.params.data() + layout.total(), p_full.data());
    log_info("initialized from {} ({})", path.string(), model::describe(pre.config));
  }
  if (model.sliced()) {
    Buffer<float> p_l(model.local_layout().total());
    model.tensor->extract(p_full.data(), p_l.data());
    model.dp->load(p_l.data(), nullptr, nullptr);
  } else {
    model.dp->load(p_full.data(), nullptr, nullptr);
  }
}

// A run whose tokenizer is not GPT-2's default (a pretrained model's, or a tokenizer.json) saves
// it beside the model (tokenizer.json; SentencePiece: tokenizer.gguf), so that its checkpoints
// sample and evaluate with it and load into Hugging Face as complete models. A tokenizer that
// cannot be read leaves the checkpoint without one.
void write_run_tokenizer(const RunConfig& cfg, const fs::path& checkpoint_dir) {
  std::error_code ec;
  const fs::path path = find_data_path(io::resolve_pretrained(cfg.data.tokenizer));
  const fs::path gpt2 = find_data_path("data/gpt2");
  if (!fs::exists(path, ec) || fs::equivalent(path, gpt2, ec)) return;
  try {
    io::write_tokenizer_beside(checkpoint_dir, io::load_tokenizer(path).vocab());
  } catch (const Error& e) {
    log_info("note: the checkpoint has no tokenizer.json ({})", e.what());
  }
}

}  // namespace

TrainProgress resume_or_initialize(const RunConfig& cfg, const ResumeOptions& how, RunModel& model,
                                   data::TokenLoader& train_loader, const fs::path& ckpt_dir,
                                   bool lead, std::int64_t seqs_per_step) {
  const bool resume = how.resume, override_schedule = how.override_schedule;
  TrainProgress progress{0, 0, Rng(cfg.train.seed), false};
  if (resume) {
    if (auto latest = io::latest_checkpoint(ckpt_dir)) {
      const io::TrainState st = load_into_model(*latest, model);
      if (const auto old = checkpoint_config(st)) {  // every rank: all refuse together
        check_schedule_kept(cfg, *old, seqs_per_step, st.step, override_schedule, lead);
        if (lead) warn_if_data_order_changes(cfg, *old);
      }
      progress.step = st.step;
      progress.tokens_seen = st.tokens_seen;
      progress.rng.set_state(st.rng_state);
      train_loader.set_position(st.data_position);
      progress.resumed = true;
      log_info("resumed from {} (step {})", latest->string(), progress.step);
    } else {
      log_info("no checkpoint in {}: starting from scratch", ckpt_dir.string());
    }
  }
  if (!progress.resumed) initialize_params(model, cfg);
  return progress;
}

fs::path save_checkpoint(const RunConfig& cfg, RunModel& model, comm::Runtime& rt,
                         const fs::path& ckpt_dir, const TrainProgress& progress,
                         const data::TokenLoader& train_loader) {
  const bool lead = rt.world_rank() == 0;
  const model::ParamLayout& layout = *model.layout;
  parallel::DataParallel& dp = *model.dp;
  const std::int64_t step = progress.step;
  const float* full = full_params(model);  // collective at ZeRO-3 and under tensor parallelism
  auto shards = dp.state_shards();
  if (lead) write_run_tokenizer(cfg, io::begin_checkpoint(ckpt_dir, step));
  rt.world().barrier();
  if (model.sliced()) {
    // Tensor parallelism: the moments are assembled into whole-model tensors and written as
    // one shard, so that any grid (or one process) can resume from them.
    const std::size_t nl = model.local_layout().total();
    Buffer<float> m_l(nl), v_l(nl), m_g(layout.total()), v_g(layout.total());
    dp.gather_moments(m_l.data(), v_l.data());
    model.tensor->gather_full(m_l.data(), m_g.data());
    model.tensor->gather_full(v_l.data(), v_g.data());
    shards = {{0, layout.total()}};
    if (lead)
      io::write_state_shard(ckpt_dir, step, 0, 1,
                            io::StateShard{0, layout.total(), m_g.data(), v_g.data()});
  } else if (shards.size() > 1 || dp.dp_rank() == 0) {
    io::write_state_shard(
        ckpt_dir, step, dp.dp_rank(), static_cast<int>(shards.size()),
        io::StateShard{dp.shard_begin(), dp.shard_end(), dp.m_shard(), dp.v_shard()});
  }
  rt.world().barrier();
  fs::path written;
  if (lead) {
    io::TrainState st{step,
                      progress.rng.state(),
                      train_loader.position(),
                      progress.tokens_seen,
                      {{"config", to_toml(cfg)}}};
    written = io::commit_checkpoint(ckpt_dir, layout, full, st, shards, cfg.train.keep_checkpoints);
  }
  rt.world().barrier();  // nobody goes on (or exits) before the checkpoint is complete
  drop_full_params(model);
  return written;
}

}  // namespace tessera::train
