// Data parallelism with ZeRO sharding over the dp group. DataParallel owns the parameter,
// gradient and AdamW buffers of this rank and is the ParamStore forward/backward run on.
//
//  stage 0: everything replicated; gradients all-reduced.
//  stage 1: AdamW moments sharded: gradients reduce-scattered (in place), each rank updates its
//           shard of the flat buffer, the updated shards are all-gathered.
//  stage 2: gradients sharded as well: backward writes each block into a transient buffer that
//           is reduce-scattered as soon as the block is final and accumulated into the shard.
//  stage 3: parameters sharded as well: each block is all-gathered just before use, with the
//           next block prefetched, and released after; the embeddings stay gathered for the
//           step (they are used at both ends of forward and of backward).
// Shards: rank r owns elements [r*ceil(P/N), min(P, (r+1)*ceil(P/N))) of the flat buffer
// (parallel/sharding.hpp, the convention shared with the tensor-parallel weight shards).
// Reductions are non-blocking, issued per block as backward finishes it, with progress driven
// between backward's ops (Open MPI has no progress thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"

namespace tessera::parallel {

struct MemoryReport {
  std::size_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;  // persistent
  std::size_t transient_bytes = 0;  // gather / gradient staging buffers (stages 2, 3)
};

class DataParallel final : public model::ParamStore {
 public:
  DataParallel(comm::Communicator& dp, const model::ParamLayout& layout, int zero_stage,
               bool overlap);

  int stage() const { return stage_; }
  int dp_size() const { return comm_.size(); }
  int dp_rank() const { return comm_.rank(); }
  std::size_t shard_begin() const { return shard_begin_; }
  std::size_t shard_end() const { return shard_end_; }
  std::size_t shard_size() const { return shard_end_ - shard_begin_; }
  std::size_t shard_begin_of(int rank) const;
  MemoryReport memory() const;

  // ---- state ----
  // Sets every rank's state from full (layout.total()) buffers: parameters, and optionally
  // moments (null: zero). Each rank keeps what its stage needs.
  void load(const float* params_full, const float* m_full, const float* v_full);
  // Same, with the moments of this rank's range only ([shard_begin, shard_end): state_size()).
  void load_shard(const float* params_full, const float* m_shard, const float* v_shard);
  const float* m_shard() const { return m_.data(); }
  const float* v_shard() const { return v_.data(); }
  // The flat ranges the ranks' moments cover: one (the whole buffer) at stage 0, dp shards
  // otherwise.
  std::vector<std::pair<std::size_t, std::size_t>> state_shards() const;
  // The full parameters: the replicated buffer (stages 0-2), or all-gathered into a transient
  // buffer (stage 3; valid until the next call that changes parameters).
  const float* full_params();
  // Full moments on every rank (checkpoints).
  void gather_moments(float* m_full, float* v_full);

  // ---- a training step ----
  void begin_step();                  // zero gradients
  void begin_micro_batch(bool last);  // gradients become final in this micro-batch's backward
  void end_micro_batch();             // complete the reductions this backward issued
  double grad_norm();                 // global L2 norm of the reduced gradient
  // This rank's share of the squared norm of the reduced gradient, counting element i only where
  // mask[i] != 0 (mask over the whole flat buffer; null: all). Summed over the dp group (or the
  // world, for a tensor-parallel model whose mask marks the elements this rank owns) it is the
  // squared global norm: at stage 0 only dp rank 0 contributes, otherwise each rank its shard.
  double grad_sumsq(const std::uint8_t* mask) const;
  // AdamW on this rank's shard, reading the gradients times grad_scale (the clipping factor,
  // optim::clip_scale), then the parameter gathers of ZeRO 1 and 2.
  void step(const optim::AdamWConfig& cfg, float lr, std::int64_t step, float grad_scale = 1.0f);
  double mean(double x);  // average of a scalar over the dp group
  // Gradient reductions in bf16 (false: fp32, the default): each block is rounded to bf16, summed
  // as bf16 over the group (comm::Communicator's bf16 collectives, half the bytes) and widened
  // back into the fp32 gradients. The sum is rounded at every addition, so the reduced gradient
  // differs from the fp32 one by a few bf16 ulps; the optimizer and its state stay fp32.
  void set_bf16_reduction(bool on) { bf16_reduce_ = on; }
  double overlap_fraction() const { return overlapped_fraction_; }

  // ---- model::ParamStore ----
  void begin_forward() override;
  void begin_backward() override;
  const float* params(int block) override;
  float* grads(int block) override;
  void release(int block) override;
  void grads_done(int block) override;
  void progress() override;

 private:
  struct Pending {
    comm::Request req;
    int block;
    float* staging;                   // stages 2-3: the transient buffer being reduce-scattered
    float* data = nullptr;            // the block's gradient being reduced
    std::vector<std::uint16_t> half;  // bf16 reduction: the block rounded, reduced in place
  };
  std::vector<std::size_t> counts_in(std::size_t b, std::size_t e) const;
  void issue_reduction(int block, float* data);
  void complete(Pending& p);
  float* take_staging(int block);
  // stage 3
  void start_gather(int block);
  float* gathered(int block);

  comm::Communicator& comm_;
  const model::ParamLayout& layout_;
  int stage_;
  bool overlap_;
  bool bf16_reduce_ = false;
  int nblocks_;
  std::size_t shard_begin_ = 0, shard_end_ = 0, max_block_ = 0;

  Buffer<float> params_;    // full (0-2) or shard (3)
  Buffer<float> grads_;     // full (0-1) or shard (2-3)
  Buffer<float> m_, v_;     // full (0) or shard (1-3)
  Buffer<float> full_tmp_;  // stage 3: full parameters for eval and checkpoints

  bool last_micro_ = true;
  std::deque<Pending> pending_;
  std::vector<int> deferred_;  // stages 0-1 with overlap off: blocks to reduce after backward
  std::size_t covered_ = 0, issued_ = 0;
  double overlapped_fraction_ = 0;

  // stages 2-3: gradient staging (block 0 has its own buffer; layers share a small pool)
  Buffer<float> grad_stage0_;
  std::vector<Buffer<float>> grad_pool_;
  std::vector<float*> free_grad_bufs_;
  std::map<int, float*> grad_of_block_;

  // stage 3: gathered parameters (block 0 has its own buffer; layers share a pool of two)
  struct Gather {
    comm::Request req;
    float* buf;
  };
  Buffer<float> param_stage0_;
  std::vector<Buffer<float>> param_pool_;
  std::vector<float*> free_param_bufs_;
  std::map<int, Gather> gathers_;
  int direction_ = 1;
};

}  // namespace tessera::parallel
