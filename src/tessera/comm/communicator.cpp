#include "tessera/comm/communicator.hpp"

#include <chrono>
#include <utility>

#include <fmt/format.h>

namespace tessera::comm {

namespace {
double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

CollectiveLog::CollectiveLog(std::size_t capacity) : capacity_(capacity), t0_(steady_now()) {}

double CollectiveLog::now() const {
  return steady_now() - t0_;
}

std::uint64_t CollectiveLog::begin(std::string op, const std::string& group, int group_size,
                                   std::size_t bytes) {
  std::lock_guard lock(mu_);
  CollectiveRecord r;
  r.seq = next_seq_++;
  r.op = std::move(op);
  r.group = group;
  r.group_size = group_size;
  r.bytes = bytes;
  r.start = now();
  Volume& v = volumes_[{group, r.op}];
  ++v.calls;
  v.bytes += static_cast<double>(bytes);
  const double p = group_size;
  double factor = 0.0;
  if (group_size > 1) {
    if (r.op.rfind("all_reduce", 0) == 0)  // all_reduce, all_reduce_max
      factor = 2.0 * (p - 1) / p;
    else if (r.op == "all_gather" || r.op == "reduce_scatter")
      factor = (p - 1) / p;
    else if (r.op == "send" || r.op == "recv")
      factor = 1.0;
    else
      factor = (p - 1) / p;  // broadcast and others: one copy of the data per receiver
  }
  v.wire_bytes += factor * static_cast<double>(bytes);
  ring_.push_back(std::move(r));
  // Drop completed records beyond capacity (in-flight ones are kept until they end).
  while (ring_.size() > capacity_ && ring_.front().end >= 0) ring_.pop_front();
  return ring_.back().seq;
}

void CollectiveLog::end(std::uint64_t seq) {
  std::lock_guard lock(mu_);
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it)
    if (it->seq == seq) {
      it->end = now();
      auto v = volumes_.find({it->group, it->op});
      if (v != volumes_.end()) v->second.seconds += it->end - it->start;
      return;
    }
}

bool CollectiveLog::oldest_in_flight(CollectiveRecord& out) const {
  std::lock_guard lock(mu_);
  for (const auto& r : ring_)
    if (r.end < 0) {
      out = r;
      return true;
    }
  return false;
}

std::vector<CollectiveRecord> CollectiveLog::snapshot() const {
  std::lock_guard lock(mu_);
  return {ring_.begin(), ring_.end()};
}

std::map<std::pair<std::string, std::string>, CollectiveLog::Volume> CollectiveLog::volumes()
    const {
  std::lock_guard lock(mu_);
  return volumes_;
}

void CollectiveLog::reset_volumes() {
  std::lock_guard lock(mu_);
  volumes_.clear();
}

void CollectiveLog::clear() {
  std::lock_guard lock(mu_);
  ring_.clear();
}

std::string CollectiveLog::dump() const {
  auto recs = snapshot();
  std::string s;
  std::size_t first = recs.size() > 32 ? recs.size() - 32 : 0;
  for (std::size_t i = first; i < recs.size(); ++i) {
    const auto& r = recs[i];
    s += fmt::format("  #{:<6} {:<15} group {:<8} ({} ranks) {:>12} bytes  start {:9.3f}s  {}\n",
                     r.seq, r.op, r.group, r.group_size, r.bytes, r.start,
                     r.end >= 0 ? fmt::format("took {:.3f} ms", (r.end - r.start) * 1e3)
                                : std::string("IN FLIGHT"));
  }
  return s;
}

namespace {
struct Then final : Request::Impl {
  Then(Request r, std::function<void()> f) : inner(std::move(r)), after(std::move(f)) {}
  bool test() override {
    if (!inner.test()) return false;
    run();
    return true;
  }
  void wait() override {
    inner.wait();
    run();
  }
  void run() {
    if (after) std::exchange(after, nullptr)();
  }
  Request inner;
  std::function<void()> after;
};
}  // namespace

Request Request::then(std::function<void()> f) && {
  if (!impl_) {
    f();
    return {};
  }
  return Request(std::make_unique<Then>(std::move(*this), std::move(f)));
}

}  // namespace tessera::comm
