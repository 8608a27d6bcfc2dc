#include "tessera/eval/evaluate.hpp"

#include <cmath>
#include <memory>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/data/loader.hpp"

namespace tessera::eval {

EvalResult evaluate_shard(const model::ParamLayout& layout, const float* params,
                          model::Activations& acts, const std::filesystem::path& shard, int B,
                          int T, int batches, kernels::GemmLibrary gemm, bool show_progress) {
  model::ForwardOptions opt;
  opt.gemm = gemm;
  return evaluate_shard(
      layout.config().vocab_size, shard, B, T, batches,
      [&](const std::int32_t* x, const std::int32_t* y, int b, int t) {
        return model::forward(layout, params, acts, x, y, b, t, opt);
      },
      show_progress);
}

EvalResult evaluate_shard(int vocab_size, const std::filesystem::path& shard, int B, int T,
                          int batches, const ScoreFn& score, bool show_progress) {
  data::TokenLoader loader(shard, B, T);
  std::int64_t per_batch = static_cast<std::int64_t>(B) * T;
  int fit = static_cast<int>((loader.num_tokens() - 1) / per_batch);
  if (batches <= 0 || batches > fit) batches = fit;
  // Every id scored must be in the vocabulary (read as int32, ids >= 2^31 would turn negative and
  // pass as ignored targets).
  loader.check_ids(static_cast<std::uint32_t>(vocab_size),
                   static_cast<std::size_t>(per_batch) * batches + 1);
  std::vector<std::int32_t> x(per_batch), y(per_batch);
  double sum = 0;
  std::unique_ptr<Progress> bar;
  if (show_progress) bar = std::make_unique<Progress>("eval", batches);
  for (int i = 0; i < batches; ++i) {
    loader.next(x.data(), y.data());
    sum += score(x.data(), y.data(), B, T);
    if (bar) bar->update(i + 1, fmt::format("loss {:.4f}", sum / (i + 1)));
  }
  if (bar) bar->finish();
  if (!std::isfinite(sum))
    throw Error(fmt::format("the loss on {} is not a finite number", shard.string()),
                "the model's weights hold NaN or infinity, or its predictions overflow");
  EvalResult r;
  r.batches = batches;
  r.tokens = per_batch * batches;
  r.loss = batches ? sum / batches : 0.0;
  r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace tessera::eval
