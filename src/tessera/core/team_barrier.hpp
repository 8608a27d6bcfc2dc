#pragma once
// A barrier for the threads of one team (an OpenMP parallel region) that lets a waiting thread
// do something useful until the others arrive: the decoder's threads fetch the weights of their
// next product into cache there, where an OpenMP barrier would only spin.
#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessera {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

class TeamBarrier {
 public:
  static constexpr std::chrono::microseconds k_spin{50};
  // `spin`: how long a waiting thread with nothing left to do spins before it sleeps.
  explicit TeamBarrier(std::chrono::microseconds spin = k_spin) : spin_(spin) {}

  // Outside any parallel region, before a team first waits (arrivals are counted from here).
  void reset() { arrived_.store(0, std::memory_order_relaxed); }

  // Returns once all `team` threads (every thread of the calling team, each calling wait the
  // same number of times) have arrived; what each wrote before it arrived is visible to all
  // after. A thread that waits calls idle() meanwhile until it returns false (no more to do),
  // then spins; after `spin` in all (or at once when idle() runs out with a spin of 0) it sleeps
  // (a futex, through std::atomic::wait), so that a team with more threads than free cores does
  // not hold the cores that the late ones need.
  template <typename Idle>
  void wait(int team, Idle&& idle) {
    const auto n = static_cast<std::uint32_t>(team);
    const std::uint32_t mine = arrived_.fetch_add(1, std::memory_order_seq_cst) + 1;
    const std::uint32_t all = (mine + n - 1) / n * n;  // this barrier's last arrival
    if (mine == all) {
      if (sleepers_.load(std::memory_order_seq_cst) > 0) arrived_.notify_all();
      return;
    }
    using clock = std::chrono::steady_clock;
    clock::time_point until{};  // read only once a wait is long (most last a few microseconds)
    for (unsigned i = 1; arrived_.load(std::memory_order_acquire) < all; ++i) {
      if (!idle()) {
        if (spin_.count() == 0) return sleep_until(all);
        cpu_relax();
      }
      if (i % 64 == 0) {
        const auto now = clock::now();
        if (until == clock::time_point{})
          until = now + spin_;
        else if (now > until)
          return sleep_until(all);
      }
    }
  }

  // The spin that follows OpenMP's setting for its own threads: none under
  // OMP_WAIT_POLICY=passive (they sleep at once), else k_spin.
  static std::chrono::microseconds openmp_spin();

 private:
  // The sleeper counts itself before it reads the count it sleeps on, and the last arrival
  // counts itself before it reads the sleepers (all sequentially consistent): either the
  // sleeper sees the barrier complete or the last arrival sees the sleeper and wakes it.
  void sleep_until(std::uint32_t all) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    for (std::uint32_t v; (v = arrived_.load(std::memory_order_seq_cst)) < all;) arrived_.wait(v);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }

  std::chrono::microseconds spin_;
  alignas(64) std::atomic<std::uint32_t> arrived_{0};
  alignas(64) std::atomic<int> sleepers_{0};
};

}  // namespace tessera
