#include "tessera/parallel/plan.hpp"

#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

std::vector<int> divisors(int n) {
  // d runs to sqrt(n) only, in a long (d * d never overflows); each small divisor d pairs with
  // n / d, collected backwards for the increasing order.
  std::vector<int> small, large;
  for (long d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    small.push_back(static_cast<int>(d));
    if (d * d != n) large.push_back(static_cast<int>(n / d));
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

namespace {

// "choose ty among the divisors of 12: 1, 2, 3, 4, 6, 12"
std::string choose_among(const char* what, int n) {
  return n >= 1 ? fmt::format("choose {} among the divisors of {}: {}", what, n,
                              fmt::join(divisors(n), ", "))
                : fmt::format("choose {} dividing {}", what, n);
}

// The grid, the ZeRO stage and the batch.
void grid_problems(const ParallelPlan& p, std::vector<PlanProblem>& out) {
  const auto& g = p.grid;
  if (g.dp < 1 || g.pp < 1 || g.tx < 1 || g.ty < 1 || g.tz < 1)
    out.push_back({"axis size < 1", fmt::format("grid {}: every axis must be >= 1", g.describe()),
                   "every axis of the grid has size >= 1 (1 = that parallelism is off)"});
  if (p.zero < 0 || p.zero > 3)
    out.push_back({"ZeRO stage not in 0-3", fmt::format("parallel.zero={} is not 0-3", p.zero),
                   "use 0 (replicated), 1 (moments), 2 (+ gradients) or 3 (+ parameters)"});
  if (p.micro_batch < 1)
    out.push_back({"micro-batch < 1",
                   fmt::format("the micro-batch of {} sequences must be >= 1", p.micro_batch),
                   "train.batch_size is the micro-batch of one data-parallel rank"});
  if (p.micro_batches < 1)
    out.push_back({"micro-batches < 1",
                   fmt::format("train.grad_accum={} must be >= 1", p.micro_batches),
                   "grad_accum is the number of micro-batches per optimizer step (1 = none)"});
  if (g.tz >= 1 && p.micro_batch >= 1 && p.micro_batch % g.tz != 0)
    out.push_back({"micro-batch not divisible by tz",
                   fmt::format("the micro-batch of {} sequences is not divisible by parallel.tz={}",
                               p.micro_batch, g.tz),
                   "tz splits each micro-batch by whole sequences: choose train.batch_size (or "
                   "global_batch) so that it is"});
}

// The tensor axes against the model's shape (parallel/tensor_attention.hpp, tensor_linear.hpp,
// vocab_parallel.hpp).
void tensor_problems(const model::ModelConfig& m, const ParallelPlan& p,
                     std::vector<PlanProblem>& out) {
  const auto& g = p.grid;
  if (g.tx < 1 || g.ty < 1 || g.tz < 1) return;
  if (m.n_head % g.ty != 0)
    out.push_back({"heads not divisible by ty",
                   fmt::format("model.n_head={} is not divisible by ty={} (tensor-parallel "
                               "attention splits heads over ty)",
                               m.n_head, g.ty),
                   choose_among("ty", m.n_head)});
  if (m.kv_heads() % g.ty != 0)
    out.push_back({"key-value heads not divisible by ty",
                   fmt::format("model.n_kv_head={} is not divisible by ty={} (the key-value heads "
                               "are split over ty with their query heads)",
                               m.kv_heads(), g.ty),
                   choose_among("ty", m.kv_heads())});
  if (m.n_embd % g.tx != 0)
    out.push_back({"hidden not divisible by tx",
                   fmt::format("model.n_embd={} is not divisible by tx={} (the residual stream is "
                               "split over tx by channels)",
                               m.n_embd, g.tx),
                   choose_among("tx", m.n_embd)});
  if (m.ffn() % g.ty != 0)
    out.push_back({"MLP width not divisible by ty",
                   fmt::format("the MLP width {} is not divisible by ty={} (the MLP's hidden "
                               "features are split over ty)",
                               m.ffn(), g.ty),
                   choose_among("ty", m.ffn())});
  const long vocab_parts = static_cast<long>(g.tx) * g.ty;
  if (m.padded_vocab() % vocab_parts != 0)
    out.push_back(
        {"vocabulary not divisible by tx*ty",
         fmt::format("padded vocabulary {} (model.vocab_size={} rounded up to a "
                     "multiple of {}) is not divisible by tx*ty={} (the embedding is "
                     "split over the vocabulary)",
                     m.padded_vocab(), m.vocab_size, model::k_vocab_pad_multiple, vocab_parts),
         "choose tx*ty dividing the padded vocabulary (any power of two up to 128 "
         "always does)"});
  if (p.sequence_parallel && (g.tx < 2 || g.ty != 1 || g.tz != 1))
    out.push_back({"sequence parallelism needs tx > 1 alone",
                   fmt::format("parallel.sequence_parallel needs 1D tensor parallelism over tx "
                               "(tx > 1, ty = tz = 1); the grid is {}",
                               g.describe()),
                   "set parallel.sequence_parallel = false, or use parallel.tx alone"});
  else if (p.sequence_parallel && p.micro_batch >= 1 && p.micro_batch % g.tx != 0)
    out.push_back({"micro-batch not divisible by tx (sequence parallelism)",
                   fmt::format("sequence parallelism splits the micro-batch of {} sequences over "
                               "parallel.tx={}: it is not divisible",
                               p.micro_batch, g.tx),
                   "choose a micro-batch divisible by parallel.tx"});
}

// The layer split of a pipeline: one count per chunk, each >= 0, adding up to the model's layers.
// `chunks` (pp x virtual stages) is a long: their product must not wrap around to a small count.
std::optional<PlanProblem> split_problem(const std::vector<int>& split, int n_layer, long chunks) {
  if (split.empty()) {
    if (n_layer >= chunks) return std::nullopt;
    return PlanProblem{"layers fewer than pp x chunks",
                       fmt::format("model.n_layer={} cannot be split into {} pipeline chunks (pp x "
                                   "virtual stages): every chunk needs a layer",
                                   n_layer, chunks),
                       "use fewer stages or virtual stages, a deeper model, or give "
                       "parallel.pp_layers"};
  }
  if (static_cast<long>(split.size()) != chunks)
    return PlanProblem{"layer split does not match the chunks",
                       fmt::format("parallel.pp_layers ({}) has {} entries; the pipeline has {} "
                                   "chunks (pp x virtual stages)",
                                   fmt::join(split, ","), split.size(), chunks),
                       "give one layer count per chunk, in model order"};
  long sum = 0;
  for (int v : split) {
    if (v < 0)
      return PlanProblem{
          "layer split has a negative count",
          fmt::format("parallel.pp_layers ({}) has a negative layer count", fmt::join(split, ",")),
          "write non-negative whole numbers separated by commas, e.g. \"3,5\""};
    sum += v;
  }
  if (sum != n_layer)
    return PlanProblem{"layer split does not add up to the layers",
                       fmt::format("parallel.pp_layers ({}) adds up to {} layers; the model has {}",
                                   fmt::join(split, ","), sum, n_layer),
                       "the counts must add up to model.n_layer"};
  return std::nullopt;
}

// Pipeline parallelism: the schedule, its chunks and the layer split (parallel/schedule.hpp,
// pipeline.hpp).
void pipeline_problems(const model::ModelConfig& m, const ParallelPlan& p,
                       std::vector<PlanProblem>& out) {
  const auto& g = p.grid;
  if (g.pp < 1) return;
  const bool interleaved = p.schedule == ScheduleKind::Interleaved;
  if (g.pp == 1 && p.schedule != ScheduleKind::OneF1B)
    out.push_back({"schedule needs pp > 1",
                   fmt::format("the {} schedule needs pipeline parallelism (parallel.pp > 1)",
                               schedule_name(p.schedule)),
                   "use schedule = \"1f1b\" without a pipeline"});
  if (interleaved && p.virtual_stages < 2)
    out.push_back({"interleaved schedule needs virtual stages >= 2",
                   fmt::format("parallel.virtual_stages={} must be >= 2 with the interleaved "
                               "schedule",
                               p.virtual_stages),
                   "set parallel.virtual_stages = 2 (chunks per stage), or use schedule = "
                   "\"1f1b\""});
  if (!interleaved && p.virtual_stages != 1)
    out.push_back({"virtual stages need the interleaved schedule",
                   fmt::format("parallel.virtual_stages={} must be 1 with the {} schedule",
                               p.virtual_stages, schedule_name(p.schedule)),
                   "virtual stages (chunks per stage) need schedule = \"interleaved\""});
  if (g.pp > 1 && p.zero >= 2)
    out.push_back({"ZeRO-2/3 with pipeline (gradients re-reduced per micro-batch)",
                   fmt::format("parallel.zero={} with parallel.pp={}: ZeRO-2 and -3 reduce or "
                               "gather each layer's block once per forward/backward sweep, and a "
                               "pipeline schedule interleaves the sweeps of its micro-batches",
                               p.zero, g.pp),
                   "use parallel.zero = 1 (the AdamW moments, the largest state, sharded over dp) "
                   "or 0"});
  if (interleaved && p.micro_batches >= 1 && p.micro_batches % g.pp != 0)
    out.push_back({"schedule: micro-batches not divisible by pp (interleaved)",
                   fmt::format("the interleaved schedule needs the micro-batches per step "
                               "(train.grad_accum={}) divisible by parallel.pp={}",
                               p.micro_batches, g.pp),
                   fmt::format("use train.grad_accum = {}, or schedule = \"1f1b\"",
                               (p.micro_batches / g.pp + 1) * g.pp)});
  if (g.pp > 1 && m.n_layer < g.pp)
    out.push_back({"layers fewer than pp",
                   fmt::format("model.n_layer={} is smaller than pp={}: every stage needs a layer",
                               m.n_layer, g.pp),
                   fmt::format("use parallel.pp <= {} or a deeper model", m.n_layer)});
  else if ((g.pp > 1 || !p.layer_split.empty()) && p.virtual_stages >= 1)
    if (auto why = split_problem(p.layer_split, m.n_layer, long{g.pp} * p.chunks()))
      out.push_back(*why);
}

}  // namespace

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw Error(fmt::format("unknown recomputation '{}'", s), "use none, selective or full");
}

std::string ParallelPlan::describe() const {
  std::string sched = grid.pp > 1 ? std::string(schedule_name(schedule)) : "-";
  if (grid.pp > 1 && schedule == ScheduleKind::Interleaved)
    sched += fmt::format(":{}", virtual_stages);
  std::string out = fmt::format("dp={} pp={} tx={} ty={} tz={} zero={} mb={} sched={} rc={}{}",
                                grid.dp, grid.pp, grid.tx, grid.ty, grid.tz, zero, micro_batch,
                                sched, recompute_name(recompute), sequence_parallel ? " sp" : "");
  if (!layer_split.empty()) out += fmt::format(" split={}", fmt::join(layer_split, ","));
  return out;
}

std::vector<PlanProblem> plan_problems(const model::ModelConfig& m, const ParallelPlan& p) {
  std::vector<PlanProblem> out;
  grid_problems(p, out);
  tensor_problems(m, p, out);
  pipeline_problems(m, p, out);
  return out;
}

std::optional<PlanProblem> plan_infeasible_reason(const model::ModelConfig& m,
                                                  const ParallelPlan& p) {
  auto all = plan_problems(m, p);
  if (all.empty()) return std::nullopt;
  return std::move(all.front());
}

std::vector<int> plan_layer_split(const model::ModelConfig& m, const ParallelPlan& p) {
  if (!p.layer_split.empty()) return p.layer_split;
  return balanced_layer_split(m.n_layer, p.grid.pp * p.chunks());
}

int stage_layers(const std::vector<int>& split, int pp, int stage) {
  int n = 0;
  for (std::size_t c = static_cast<std::size_t>(stage); c < split.size();
       c += static_cast<std::size_t>(pp))
    n += split[c];
  return n;
}

std::vector<int> balanced_layer_split(int n_layer, int chunks) {
  TESSERA_CHECK(chunks >= 1, "{} pipeline chunks", chunks);
  if (auto why = split_problem({}, n_layer, chunks)) throw Error(why->message, why->hint);
  std::vector<int> split(chunks, n_layer / chunks);
  int rem = n_layer % chunks;
  std::vector<int> order;  // middle chunks first, then the last, then the first
  for (int c = 1; c + 1 < chunks; ++c) order.push_back(c);
  if (chunks > 1) order.push_back(chunks - 1);
  order.push_back(0);
  for (int i = 0; rem > 0; ++i, --rem) ++split[order[i % order.size()]];
  return split;
}

std::vector<int> parse_layer_counts(const std::string& text) {
  std::vector<int> split;
  if (text.empty()) return split;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    const std::string t = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    std::size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size() || v < 0)
      throw Error(fmt::format("parallel.pp_layers = \"{}\": '{}' is not a layer count", text, t),
                  "write non-negative whole numbers separated by commas, e.g. \"3,5\"");
    split.push_back(v);
  }
  return split;
}

std::vector<int> parse_layer_split(const std::string& text, int n_layer, int chunks) {
  const auto split = parse_layer_counts(text);
  if (split.empty()) return balanced_layer_split(n_layer, chunks);
  if (auto why = split_problem(split, n_layer, chunks)) throw Error(why->message, why->hint);
  return split;
}

}  // namespace tessera::parallel
