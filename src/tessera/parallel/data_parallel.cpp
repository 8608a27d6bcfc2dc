#include "tessera/parallel/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/parallel/sharding.hpp"

namespace tessera::parallel {

namespace {
constexpr int k_grad_pool = 3;   // staging buffers for layer gradients in flight (stages 2-3)
constexpr int k_param_pool = 2;  // gathered layers: the one in use and the prefetched one (stage 3)
}  // namespace

DataParallel::DataParallel(comm::Communicator& dp, const model::ParamLayout& layout, int zero_stage,
                           bool overlap)
    : comm_(dp),
      layout_(layout),
      stage_(zero_stage),
      overlap_(overlap),
      nblocks_(model::num_blocks(layout)) {
  if (zero_stage < 0 || zero_stage > 3)
    throw Error(fmt::format("parallel.zero={} is not a ZeRO stage", zero_stage),
                "use 0, 1, 2 or 3");
  const std::size_t P = layout.total();
  shard_begin_ = stage_ == 0 ? 0 : shard_begin_of(comm_.rank());
  shard_end_ = stage_ == 0 ? P : shard_begin_of(comm_.rank() + 1);
  for (int b = 1; b < nblocks_; ++b)
    max_block_ = std::max(max_block_, model::block_end(layout, b) - model::block_begin(layout, b));
  const std::size_t block0 = model::block_end(layout, 0);
  params_.resize(stage_ < 3 ? P : shard_size());
  grads_.resize(stage_ < 2 ? P : shard_size());
  m_.resize(stage_ == 0 ? P : shard_size());
  v_.resize(stage_ == 0 ? P : shard_size());
  if (stage_ >= 2) {
    grad_stage0_.resize(block0);
    for (int i = 0; i < k_grad_pool; ++i) {
      grad_pool_.emplace_back(max_block_);
      free_grad_bufs_.push_back(grad_pool_.back().data());
    }
  }
  if (stage_ == 3) {
    param_stage0_.resize(block0);
    for (int i = 0; i < k_param_pool; ++i) {
      param_pool_.emplace_back(max_block_);
      free_param_bufs_.push_back(param_pool_.back().data());
    }
  }
}

std::size_t DataParallel::shard_begin_of(int rank) const {
  return parallel::shard_begin(layout_.total(), comm_.size(), rank);
}

std::vector<std::size_t> DataParallel::counts_in(std::size_t b, std::size_t e) const {
  return parallel::shard_counts(layout_.total(), comm_.size(), b, e);
}

MemoryReport DataParallel::memory() const {
  MemoryReport r;
  r.params_bytes = params_.bytes();
  r.grads_bytes = grads_.bytes();
  r.optimizer_bytes = m_.bytes() + v_.bytes();
  r.transient_bytes = grad_stage0_.bytes() + param_stage0_.bytes() + full_tmp_.bytes();
  for (const auto& b : grad_pool_) r.transient_bytes += b.bytes();
  for (const auto& b : param_pool_) r.transient_bytes += b.bytes();
  return r;
}

// ------------------------------------------------------------------ state
void DataParallel::load(const float* pf, const float* mf, const float* vf) {
  const std::size_t P = layout_.total();
  if (stage_ < 3)
    std::copy(pf, pf + P, params_.data());
  else
    std::copy(pf + shard_begin_, pf + shard_end_, params_.data());
  full_tmp_ = Buffer<float>();
  if (mf)
    std::copy(mf + shard_begin_, mf + shard_end_, m_.data());
  else
    m_.zero();
  if (vf)
    std::copy(vf + shard_begin_, vf + shard_end_, v_.data());
  else
    v_.zero();
}

void DataParallel::load_shard(const float* pf, const float* ms, const float* vs) {
  load(pf, nullptr, nullptr);
  std::copy(ms, ms + shard_size(), m_.data());
  std::copy(vs, vs + shard_size(), v_.data());
}

std::vector<std::pair<std::size_t, std::size_t>> DataParallel::state_shards() const {
  if (stage_ == 0) return {{0, layout_.total()}};
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (int r = 0; r < comm_.size(); ++r) out.emplace_back(shard_begin_of(r), shard_begin_of(r + 1));
  return out;
}

const float* DataParallel::full_params() {
  if (stage_ < 3) return params_.data();
  if (full_tmp_.size() != layout_.total()) {
    full_tmp_.resize(layout_.total());
    comm_.iall_gather(params_.data(), full_tmp_.data(), counts_in(0, layout_.total())).wait();
  }
  return full_tmp_.data();
}

void DataParallel::gather_moments(float* mf, float* vf) {
  if (stage_ == 0) {
    std::copy(m_.data(), m_.data() + m_.size(), mf);
    std::copy(v_.data(), v_.data() + v_.size(), vf);
    return;
  }
  auto counts = counts_in(0, layout_.total());
  comm_.iall_gather(m_.data(), mf, counts).wait();
  comm_.iall_gather(v_.data(), vf, counts).wait();
}

// ------------------------------------------------------------------ step
void DataParallel::begin_step() {
  grads_.zero();
}

void DataParallel::begin_micro_batch(bool last) {
  last_micro_ = last;
  covered_ = issued_ = 0;
}

void DataParallel::issue_reduction(int block, float* data) {
  const std::size_t bb = model::block_begin(layout_, block), be = model::block_end(layout_, block);
  covered_ += be - bb;
  Pending p{comm::Request(), block, stage_ >= 2 ? data : nullptr, data, {}};
  if (comm_.size() > 1 && bf16_reduce_) {
    p.half.resize(be - bb);
    kernels::cpu::to_bf16(p.half.data(), data, static_cast<std::int64_t>(be - bb));
    if (stage_ == 0)
      p.req = comm_.iall_reduce_sum_bf16(p.half.data(), be - bb);
    else  // in place: this rank's sum lands at half[0..)
      p.req = comm_.ireduce_scatter_sum_bf16(p.half.data(), p.half.data(), counts_in(bb, be));
    issued_ += be - bb;
  } else if (comm_.size() > 1) {
    if (stage_ == 0)
      p.req = comm_.iall_reduce_sum(data, be - bb);
    else  // in place: this rank's sum lands at data[0..)
      p.req = comm_.ireduce_scatter_sum(data, data, counts_in(bb, be));
    issued_ += be - bb;
  }
  pending_.push_back(std::move(p));
}

void DataParallel::complete(Pending& p) {
  p.req.wait();
  const std::size_t bb = model::block_begin(layout_, p.block),
                    be = model::block_end(layout_, p.block);
  const std::size_t mine = counts_in(bb, be)[comm_.rank()];
  if (!p.half.empty()) {  // bf16: the reduced values back where the fp32 reduction leaves them
    const std::size_t n = stage_ == 0 ? be - bb : mine;
    kernels::cpu::from_bf16(p.data, p.half.data(), static_cast<std::int64_t>(n));
    std::vector<std::uint16_t>().swap(p.half);
  }
  const std::size_t at = std::max(bb, shard_begin_);  // where this rank's part starts (flat index)
  if (stage_ == 1 && comm_.size() > 1 && mine) {
    std::memmove(grads_.data() + at, grads_.data() + bb, mine * sizeof(float));
  } else if (stage_ >= 2) {
    // accumulate this micro-batch's reduced part into the gradient shard
    float* dst = grads_.data() + (at - shard_begin_);
    const float* src = p.staging;
    const std::int64_t n = static_cast<std::int64_t>(mine);
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
    grad_of_block_.erase(p.block);
    if (p.block != 0) free_grad_bufs_.push_back(p.staging);
  }
}

void DataParallel::end_micro_batch() {
  if (stage_ < 2 && !last_micro_) return;  // stages 0-1 reduce once per step
  for (int b : deferred_) issue_reduction(b, grads_.data() + model::block_begin(layout_, b));
  deferred_.clear();
  TESSERA_CHECK(covered_ == layout_.total(), "gradient blocks covered {} of {} elements", covered_,
                layout_.total());
  std::size_t done = 0;
  for (auto& p : pending_)
    if (!p.req.pending())
      done += model::block_end(layout_, p.block) - model::block_begin(layout_, p.block);
  std::size_t all = 0;
  for (auto& p : pending_)
    all += model::block_end(layout_, p.block) - model::block_begin(layout_, p.block);
  if (last_micro_)
    overlapped_fraction_ = all ? static_cast<double>(done) / static_cast<double>(all) : 1.0;
  for (auto& p : pending_) complete(p);
  pending_.clear();
}

double DataParallel::grad_norm() {
  const float* g = stage_ < 2 ? grads_.data() + shard_begin_ : grads_.data();
  double local = optim::global_norm(g, shard_size());
  if (stage_ == 0) return local;
  double sq = local * local;
  comm_.all_reduce_sum(&sq, 1);
  return std::sqrt(sq);
}

double DataParallel::grad_sumsq(const std::uint8_t* mask) const {
  if (stage_ == 0 && comm_.rank() != 0) return 0.0;
  const float* g = stage_ < 2 ? grads_.data() + shard_begin_ : grads_.data();
  const std::size_t n = shard_size();
  if (!mask) {
    const double norm = optim::global_norm(g, n);
    return norm * norm;
  }
  return optim::masked_sumsq(g, mask + shard_begin_, n);
}

void DataParallel::step(const optim::AdamWConfig& cfg, float lr, std::int64_t step,
                        float grad_scale) {
  const std::size_t sb = shard_begin_;
  for (const auto& t : layout_.tensors()) {
    std::size_t lo = std::max(t.offset, sb), hi = std::min(t.offset + t.numel, shard_end_);
    if (hi <= lo) continue;
    float* p = stage_ < 3 ? params_.data() + lo : params_.data() + (lo - sb);
    const float* g = stage_ < 2 ? grads_.data() + lo : grads_.data() + (lo - sb);
    optim::adamw_update_range(p, g, m_.data() + (lo - sb), v_.data() + (lo - sb), hi - lo, cfg, lr,
                              t.decay, step, grad_scale);
  }
  if ((stage_ == 1 || stage_ == 2) && comm_.size() > 1)
    comm_.iall_gather(params_.data() + sb, params_.data(), counts_in(0, layout_.total())).wait();
  full_tmp_ = Buffer<float>();  // stage 3: the gathered copy is stale now
}

double DataParallel::mean(double x) {
  comm_.all_reduce_sum(&x, 1);
  return x / comm_.size();
}

// ------------------------------------------------------------------ ParamStore
void DataParallel::begin_forward() {
  direction_ = 1;
  if (stage_ == 3 && !gathers_.count(0)) start_gather(0);
}

void DataParallel::begin_backward() {
  direction_ = -1;
}

void DataParallel::start_gather(int block) {
  const std::size_t bb = model::block_begin(layout_, block), be = model::block_end(layout_, block);
  float* buf;
  if (block == 0) {
    buf = param_stage0_.data();
  } else {
    TESSERA_CHECK(!free_param_bufs_.empty(), "no free buffer to gather block {}", block);
    buf = free_param_bufs_.back();
    free_param_bufs_.pop_back();
  }
  const std::size_t lo = std::max(bb, shard_begin_);
  const float* in = lo < shard_end_ ? params_.data() + (lo - shard_begin_) : params_.data();
  gathers_[block] = Gather{comm_.iall_gather(in, buf, counts_in(bb, be)), buf};
}

float* DataParallel::gathered(int block) {
  auto it = gathers_.find(block);
  if (it == gathers_.end()) {
    start_gather(block);
    it = gathers_.find(block);
  }
  it->second.req.wait();
  return it->second.buf;
}

const float* DataParallel::params(int block) {
  if (stage_ < 3) return params_.data() + model::block_begin(layout_, block);
  float* buf = gathered(block);
  // Prefetch the block that comes next in this pass (the embeddings stay gathered).
  const int L = nblocks_ - 2;
  int next = -1;
  if (direction_ > 0 && block >= 0 && block <= L) next = block + 1;
  if (direction_ < 0 && block >= 2) next = block - 1;
  if (next > 0 && !gathers_.count(next) && !free_param_bufs_.empty()) start_gather(next);
  return buf;
}

void DataParallel::release(int block) {
  if (stage_ < 3) return;
  if (block == 0 && direction_ > 0) return;  // the embeddings are needed again by backward
  auto it = gathers_.find(block);
  if (it == gathers_.end()) return;
  it->second.req.wait();
  if (block != 0) free_param_bufs_.push_back(it->second.buf);
  gathers_.erase(it);
}

float* DataParallel::take_staging(int block) {
  if (block == 0) return grad_stage0_.data();
  while (free_grad_bufs_.empty()) {
    TESSERA_CHECK(!pending_.empty(), "gradient staging pool exhausted");
    complete(pending_.front());
    pending_.pop_front();
  }
  float* b = free_grad_bufs_.back();
  free_grad_bufs_.pop_back();
  return b;
}

float* DataParallel::grads(int block) {
  const std::size_t bb = model::block_begin(layout_, block);
  if (stage_ < 2) return grads_.data() + bb;
  auto it = grad_of_block_.find(block);
  if (it != grad_of_block_.end()) return it->second;
  float* buf = take_staging(block);
  std::fill(buf, buf + (model::block_end(layout_, block) - bb), 0.0f);
  grad_of_block_[block] = buf;
  return buf;
}

void DataParallel::grads_done(int block) {
  if (stage_ < 2) {
    if (!last_micro_) return;  // gradients keep accumulating in the full buffer
    if (!overlap_) {
      deferred_.push_back(block);  // the measured baseline: reduce after backward
      return;
    }
    issue_reduction(block, grads_.data() + model::block_begin(layout_, block));
    progress();
    return;
  }
  issue_reduction(block, grad_of_block_.at(block));
  if (!overlap_) {
    complete(pending_.back());
    pending_.pop_back();
  }
  progress();
}

void DataParallel::progress() {
  if (!overlap_) return;
  for (auto& p : pending_) p.req.test();
}

}  // namespace tessera::parallel
