// Data parallelism with ZeRO sharding over the dp group.
//  stage 0: gradients all-reduced, every rank runs the whole optimizer.
//  stage 1: gradients reduce-scattered, each rank owns 1/dp of the flat buffer (its shard):
//           AdamW moments exist for the shard only, the rank updates its shard, and the updated
//           parameters are all-gathered.
// Gradients are reduced per bucket (ln_f, each layer, the embeddings) as soon as backward has
// finished them, non-blocking, with progress driven between backward's ops (Open MPI has no
// progress thread), so communication overlaps the rest of backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"

namespace tessera::parallel {

class DataParallel {
 public:
  DataParallel(comm::Communicator& dp, const model::ParamLayout& layout, int zero_stage,
               bool overlap);

  int stage() const { return stage_; }
  int dp_size() const { return comm_.size(); }
  int dp_rank() const { return comm_.rank(); }
  // The part of the flat buffer this rank owns: the whole buffer at stage 0.
  std::size_t shard_begin() const { return shard_begin_; }
  std::size_t shard_end() const { return shard_end_; }
  std::size_t shard_size() const { return shard_end_ - shard_begin_; }
  std::size_t shard_begin_of(int rank) const;
  // Elements of AdamW moment buffers this rank needs (each of m and v).
  std::size_t moment_size() const { return stage_ == 0 ? layout_.total() : shard_size(); }

  // Hooks for the backward of the LAST micro-batch of a step (the gradients are then final).
  model::BackwardHooks hooks(float* grads);
  // Completes the reduction: afterwards grads[shard] holds the sum over dp ranks (stage 0: all
  // of grads). Issues whatever backward did not (overlap off, or no hooks used).
  void finish(float* grads);

  double grad_norm(const float* grads);  // global L2 norm of the reduced gradient
  void clip(float* grads, double norm, double max_norm);
  // AdamW on this rank's shard (m, v hold moment_size() elements), then (stage 1) all-gather.
  void step(float* params, const float* grads, float* m, float* v, const optim::AdamWConfig& cfg,
            float lr, std::int64_t step);
  double mean(double x);  // average of a scalar over the dp group

  // Full moment buffers (layout.total()) from the shards, on every rank (checkpoints).
  void gather_moments(const float* m_shard, const float* v_shard, float* m_full, float* v_full);

  // Bytes of communication issued during the last finish() and step() (for reports/tests).
  double overlap_fraction() const { return overlapped_fraction_; }

 private:
  struct Bucket {
    std::size_t begin, end;
  };
  void issue(float* grads, std::size_t b, std::size_t e);
  void progress();
  std::vector<std::size_t> counts_in(std::size_t b, std::size_t e) const;

  comm::Communicator& comm_;
  const model::ParamLayout& layout_;
  int stage_;
  bool overlap_;
  std::size_t shard_begin_ = 0, shard_end_ = 0, per_rank_ = 0;
  struct Pending {
    comm::Request req;
    std::size_t begin, end;
  };
  std::vector<Pending> pending_;
  std::vector<Bucket> deferred_;
  std::size_t covered_ = 0;  // elements issued this step (checks the buckets tile the buffer)
  double overlapped_fraction_ = 0;
  std::size_t done_during_backward_ = 0;
};

}  // namespace tessera::parallel
