#include "tessera/parallel/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

DataParallel::DataParallel(comm::Communicator& dp, const model::ParamLayout& layout, int zero_stage,
                           bool overlap)
    : comm_(dp), layout_(layout), stage_(zero_stage), overlap_(overlap) {
  if (zero_stage < 0 || zero_stage > 1)
    throw Error(
        fmt::format("parallel.zero={} is not supported by this version of tessera", zero_stage),
        "use parallel.zero=0 (replicated) or 1 (sharded AdamW moments)");
  const std::size_t total = layout.total(), n = static_cast<std::size_t>(comm_.size());
  per_rank_ = (total + n - 1) / n;
  if (stage_ == 0) {
    shard_begin_ = 0;
    shard_end_ = total;
  } else {
    shard_begin_ = shard_begin_of(comm_.rank());
    shard_end_ = shard_begin_of(comm_.rank() + 1);
  }
}

std::size_t DataParallel::shard_begin_of(int rank) const {
  return std::min(layout_.total(), per_rank_ * static_cast<std::size_t>(rank));
}

std::vector<std::size_t> DataParallel::counts_in(std::size_t b, std::size_t e) const {
  std::vector<std::size_t> c(comm_.size());
  for (int r = 0; r < comm_.size(); ++r) {
    std::size_t lo = std::max(b, shard_begin_of(r)), hi = std::min(e, shard_begin_of(r + 1));
    c[r] = hi > lo ? hi - lo : 0;
  }
  return c;
}

void DataParallel::issue(float* grads, std::size_t b, std::size_t e) {
  covered_ += e - b;
  if (comm_.size() == 1 || e == b) return;
  if (stage_ == 0) {
    pending_.push_back({comm_.iall_reduce_sum(grads + b, e - b), b, e});
  } else {
    // In place: the sum of this rank's part of [b, e) lands at grads[b..); finish() moves it.
    pending_.push_back({comm_.ireduce_scatter_sum(grads + b, grads + b, counts_in(b, e)), b, e});
  }
}

void DataParallel::progress() {
  for (auto& p : pending_) p.req.test();
}

model::BackwardHooks DataParallel::hooks(float* grads) {
  covered_ = 0;
  deferred_.clear();
  done_during_backward_ = 0;
  model::BackwardHooks h;
  h.grads_ready = [this, grads](std::size_t b, std::size_t e) {
    if (overlap_) {
      issue(grads, b, e);
      progress();
    } else {
      deferred_.push_back({b, e});
    }
  };
  h.progress = [this] {
    if (overlap_) progress();
  };
  return h;
}

void DataParallel::finish(float* grads) {
  if (covered_ == 0 && deferred_.empty())
    deferred_.push_back({0, layout_.total()});  // no hooks were used
  for (const auto& d : deferred_) issue(grads, d.begin, d.end);
  deferred_.clear();
  TESSERA_CHECK(covered_ == layout_.total(), "gradient buckets covered {} of {} elements", covered_,
                layout_.total());
  // How much was already reduced when backward ended (overlap measure).
  std::size_t done = 0, all = 0;
  for (auto& p : pending_) {
    all += p.end - p.begin;
    if (!p.req.pending()) done += p.end - p.begin;
  }
  overlapped_fraction_ = all ? static_cast<double>(done) / static_cast<double>(all) : 1.0;
  for (auto& p : pending_) {
    p.req.wait();
    if (stage_ >= 1) {
      auto c = counts_in(p.begin, p.end);
      std::size_t mine = c[comm_.rank()];
      if (mine)
        std::memmove(grads + std::max(p.begin, shard_begin_), grads + p.begin,
                     mine * sizeof(float));
    }
  }
  pending_.clear();
}

double DataParallel::grad_norm(const float* grads) {
  double local = optim::global_norm(grads + shard_begin_, shard_size());
  if (stage_ == 0) return local;  // every rank holds the whole reduced gradient
  double sq = local * local;
  comm_.all_reduce_sum(&sq, 1);
  return std::sqrt(sq);
}

void DataParallel::clip(float* grads, double norm, double max_norm) {
  optim::clip_by_global_norm(grads + shard_begin_, shard_size(), norm, max_norm);
}

void DataParallel::step(float* params, const float* grads, float* m, float* v,
                        const optim::AdamWConfig& cfg, float lr, std::int64_t step) {
  for (const auto& t : layout_.tensors()) {
    std::size_t lo = std::max(t.offset, shard_begin_),
                hi = std::min(t.offset + t.numel, shard_end_);
    if (hi <= lo) continue;
    optim::adamw_update_range(params + lo, grads + lo, m + (lo - shard_begin_),
                              v + (lo - shard_begin_), hi - lo, cfg, lr, t.decay, step);
  }
  if (stage_ >= 1 && comm_.size() > 1) {
    auto counts = counts_in(0, layout_.total());
    comm_.iall_gather(params + shard_begin_, params, counts).wait();
  }
}

double DataParallel::mean(double x) {
  comm_.all_reduce_sum(&x, 1);
  return x / comm_.size();
}

void DataParallel::gather_moments(const float* m_shard, const float* v_shard, float* m_full,
                                  float* v_full) {
  if (stage_ == 0) {
    std::copy(m_shard, m_shard + layout_.total(), m_full);
    std::copy(v_shard, v_shard + layout_.total(), v_full);
    return;
  }
  auto counts = counts_in(0, layout_.total());
  comm_.iall_gather(m_shard, m_full, counts).wait();
  comm_.iall_gather(v_shard, v_full, counts).wait();
}

}  // namespace tessera::parallel
