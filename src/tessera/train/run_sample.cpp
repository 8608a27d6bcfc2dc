#include "tessera/train/run_sample.hpp"

#include <filesystem>
#include <optional>
#include <vector>

#include "tessera/core/log.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/io/pretrained.hpp"
#include "tessera/io/tokenizer_files.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// The run's tokenizer, or none (logged on the lead) when its file is missing.
std::optional<data::Tokenizer> sample_tokenizer(const RunConfig& cfg, int vocab_size, bool lead) {
  const fs::path tok_path = io::resolve_pretrained(cfg.data.tokenizer);
  std::error_code ec;
  if (!fs::exists(tok_path, ec)) {
    if (lead) log_info("(no sample: tokenizer not found at {})", tok_path.string());
    return std::nullopt;
  }
  auto tok = io::load_tokenizer(tok_path);
  io::require_tokenizer_fits(tok, vocab_size);
  return tok;
}

// The logits after `context` (T tokens) from the model's own slices, the same on every rank.
class SliceLogits {
 public:
  explicit SliceLogits(RunModel& model)
      : model_(model), logits_(static_cast<std::size_t>(model.layout->config().vocab_size)) {
    opt_.gemm = kernels::GemmLibrary::OneDnn;
  }
  const float* operator()(const std::int32_t* context, int T) {
    parallel::TensorModel& tm = *model_.tensor;
    const int B = tm.min_batch();  // the grid splits sequences: each holds the context
    ids_.resize(static_cast<std::size_t>(B) * T);
    for (int b = 0; b < B; ++b) std::copy(context, context + T, ids_.begin() + b * T);
    if (model_.pipelined()) {
      model_.executor->evaluate(*model_.dp, ids_.data(), nullptr, B, T, opt_);
    } else {
      tm.forward(*model_.dp, ids_.data(), nullptr, B, T, opt_);
      tm.end_forward(0, 0);
    }
    const int head_stage = model_.executor->spec().pp - 1;
    if (model_.pipe_comm->rank() == head_stage) tm.logits_row(T - 1, logits_.data());
    const std::size_t bytes = logits_.size() * sizeof(float);
    model_.pipe_comm->broadcast_bytes(logits_.data(), bytes, head_stage);
    model_.dp_comm->broadcast_bytes(logits_.data(), bytes, 0);  // replicas pick alike
    return logits_.data();
  }

 private:
  RunModel& model_;
  model::ForwardOptions opt_;
  std::vector<std::int32_t> ids_;
  std::vector<float> logits_;
};

}  // namespace

void check_sample_tokenizer(const RunConfig& cfg, int vocab_size) {
  if (cfg.sample.tokens > 0) sample_tokenizer(cfg, vocab_size, false);
}

void log_sample(const RunConfig& cfg, RunModel& model, comm::Communicator& world, Rng& rng,
                std::int64_t step, bool lead) {
  if (cfg.sample.tokens <= 0) return;
  const model::ModelConfig& mc = model.layout->config();
  const bool whole = !model.tensor || (model.tensor->whole() && model.dp->stage() < 3);
  if (whole && !lead) return;
  const auto tok = sample_tokenizer(cfg, mc.vocab_size, lead);
  if (!tok) return;
  const std::vector<std::int32_t> prompt = tok->prompt(cfg.sample.prompt);
  eval::SampleOptions so;
  so.max_new_tokens = cfg.sample.tokens;
  so.temperature = static_cast<float>(cfg.sample.temperature);
  so.top_k = cfg.sample.top_k;
  std::vector<std::int32_t> out;
  if (whole) {
    out = eval::generate(*model.layout, model.dp->full_params(), prompt, so, rng);
  } else {
    std::uint64_t state = rng.state();
    world.broadcast_bytes(&state, sizeof state, 0);
    rng.set_state(state);
    SliceLogits logits(model);
    out = eval::generate_recompute(mc.vocab_size, mc.block_size, prompt, so, rng, std::ref(logits));
  }
  if (!lead) return;
  std::vector<std::uint32_t> ids;
  for (auto t : out)
    if (t < static_cast<std::int32_t>(tok->vocab_size()))
      ids.push_back(static_cast<std::uint32_t>(t));
  log_info("---- sample at step {} ----\n{}{}\n----", step, cfg.sample.prompt, tok->decode(ids));
}

}  // namespace tessera::train
