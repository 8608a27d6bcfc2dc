// Collective communication over a group of ranks. Backends: MPI (CPU runs, and the bootstrap of
// GPU runs) and a single-process one (size 1, no MPI) so that every code path is the same with
// and without a launcher. Buffers in GPU memory are summed by device_reduce.hpp (NCCL, or staged
// through this interface).
//
// Non-blocking calls return a Request. Open MPI does not progress non-blocking collectives by
// itself, so compute loops call progress() between ops (it tests every outstanding request).
// Every collective is recorded in the runtime's CollectiveLog (sequence number, op, group, bytes,
// start, end); a watchdog dumps the log and ends the job when one exceeds its timeout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::comm {

class CollectiveLog;

// A non-blocking operation in flight. Move-only; waiting twice or on an empty request is a no-op.
class Request {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;  // true once complete (drives progress)
    virtual void wait() = 0;
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool test() {
    if (!impl_) return true;
    if (impl_->test()) {
      impl_.reset();
      return true;
    }
    return false;
  }
  void wait() {
    if (impl_) impl_->wait();
    impl_.reset();
  }
  bool pending() const { return impl_ != nullptr; }
  // This request followed by f, run once when it completes (by test() or wait(); at once when
  // nothing is in flight): e.g. widening a bf16 result into its fp32 destination.
  Request then(std::function<void()> f) &&;

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "dp", "world"

  // ---- blocking ----
  virtual void all_reduce_sum(float* buf, std::size_t n) = 0;
  virtual void all_reduce_sum(double* buf, std::size_t n) = 0;
  virtual void all_reduce_max(double* buf, std::size_t n) = 0;
  // in: size() * n_per_rank floats; out: n_per_rank floats, the sum of every rank's slice rank().
  virtual void reduce_scatter_sum(const float* in, float* out, std::size_t n_per_rank) = 0;
  // in: n_per_rank floats; out: size() * n_per_rank floats, rank i's contribution at i*n_per_rank.
  virtual void all_gather(const float* in, float* out, std::size_t n_per_rank) = 0;
  // The same for bf16 bit patterns.
  virtual void all_gather(const std::uint16_t* in, std::uint16_t* out, std::size_t n_per_rank) = 0;
  virtual void broadcast(float* buf, std::size_t n, int root) = 0;
  virtual void broadcast_bytes(void* buf, std::size_t n, int root) = 0;
  virtual void send(const float* buf, std::size_t n, int dst, int tag) = 0;
  virtual void recv(float* buf, std::size_t n, int src, int tag) = 0;
  virtual void barrier() = 0;

  // ---- non-blocking (buffers must stay valid and untouched until the request completes) ----
  virtual Request iall_reduce_sum(float* buf, std::size_t n) = 0;
  // Variable-count reduce-scatter over one contiguous buffer: rank i receives the sum of
  // in[displs[i], displs[i] + counts[i]) into out (counts[rank()] floats). counts may be 0.
  virtual Request ireduce_scatter_sum(const float* in, float* out,
                                      const std::vector<std::size_t>& counts) = 0;
  // The same two in bf16 (bit patterns, the upper halves of fp32 values), half the bytes: every
  // addition in fp32 rounded to bf16 (to nearest even), so a sum over p ranks is rounded p - 1
  // times in an order the library picks.
  virtual Request iall_reduce_sum_bf16(std::uint16_t* buf, std::size_t n) = 0;
  virtual Request ireduce_scatter_sum_bf16(const std::uint16_t* in, std::uint16_t* out,
                                           const std::vector<std::size_t>& counts) = 0;
  // Variable-count all-gather: rank i contributes counts[i] floats (its `in`) placed at
  // out + sum(counts[0..i)).
  virtual Request iall_gather(const float* in, float* out,
                              const std::vector<std::size_t>& counts) = 0;
  virtual Request isend(const float* buf, std::size_t n, int dst, int tag) = 0;
  virtual Request irecv(float* buf, std::size_t n, int src, int tag) = 0;
  // The same for bf16 bit patterns (n values of 2 bytes).
  virtual Request isend(const std::uint16_t* buf, std::size_t n, int dst, int tag) = 0;
  virtual Request irecv(std::uint16_t* buf, std::size_t n, int src, int tag) = 0;
};

// ---- the collective log: a per-rank ring buffer, dumped when something hangs ----
struct CollectiveRecord {
  std::uint64_t seq = 0;
  std::string op;     // "all_reduce", "reduce_scatter", ...
  std::string group;  // communicator name
  int group_size = 1;
  std::size_t bytes = 0;
  double start = 0, end = -1;  // seconds since the log was created; end < 0 while in flight
};

class CollectiveLog {
 public:
  explicit CollectiveLog(std::size_t capacity = 256);
  std::uint64_t begin(std::string op, const std::string& group, int group_size, std::size_t bytes);
  void end(std::uint64_t seq);
  // The oldest record still in flight, if any (copy).
  bool oldest_in_flight(CollectiveRecord& out) const;
  std::vector<CollectiveRecord> snapshot() const;
  std::string dump() const;  // multi-line text, newest last

  // Cumulative traffic per (group, op) since the last reset_volumes(), whatever the ring keeps:
  // `bytes` is the buffer size of each call (the full buffer for all-gather / reduce-scatter),
  // `wire_bytes` what a ring algorithm sends per rank for it: 2(p-1)/p x bytes for an
  // all-reduce, (p-1)/p x bytes for all-gather / reduce-scatter, bytes for send / recv, 0 in a
  // group of one (the ring volume model of docs/performance-model.md).
  // `seconds`: summed start-to-completion time of the calls (for a blocking call, the time the
  // caller waited; for a non-blocking one, the time it was in flight).
  struct Volume {
    std::uint64_t calls = 0;
    double bytes = 0, wire_bytes = 0, seconds = 0;
  };
  std::map<std::pair<std::string, std::string>, Volume> volumes() const;  // (group, op) ->
  void reset_volumes();
  double now() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::deque<CollectiveRecord> ring_;
  std::map<std::pair<std::string, std::string>, Volume> volumes_;
  std::size_t capacity_;
  std::uint64_t next_seq_ = 0;
  double t0_;
};

}  // namespace tessera::comm
