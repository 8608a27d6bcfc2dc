#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>
#include <vector>

#include "tessera/core/stop_signals.hpp"
#include "tessera/kernels/gemm.hpp"

using namespace tessera;

namespace {

// Whether the calling thread blocks SIGTERM and SIGUSR1.
bool blocks_stop_signals() {
  sigset_t now;
  pthread_sigmask(SIG_SETMASK, nullptr, &now);
  return sigismember(&now, SIGTERM) == 1 && sigismember(&now, SIGUSR1) == 1;
}

// How many threads of the OpenMP team block both stop signals.
int team_threads_blocking() {
  int n = 0;
#pragma omp parallel reduction(+ : n)
  n += blocks_stop_signals() ? 1 : 0;
  return n;
}

// Unblocks the stop signals on the calling thread and its OpenMP team, as a process started
// with them blocked (a mask inherited across exec) would not have them; the test's subject is
// what StopSignals changes.
void unblock_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
#pragma omp parallel
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

// requested() once a signal sent to the process has arrived (it may be handled on another
// thread a moment later), or 0 after a few seconds.
int requested_soon(const StopSignals& s) {
  for (int i = 0; i < 5000 && s.requested() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s.requested();
}

}  // namespace

// While a StopSignals lives, the stop signals are blocked on the thread that made it and on its
// whole OpenMP team (they reach only threads doing no arithmetic, or wait to be taken), yet a
// signal sent to the process is still reported; afterwards the threads' masks are as before.
TEST(StopSignals, BlockedOnTheComputingThreadsAndStillReported) {
  unblock_stop_signals();
  const int team = omp_get_max_threads();
  for (int sig : {SIGUSR1, SIGTERM}) {
    {
      StopSignals s;
      EXPECT_TRUE(blocks_stop_signals());
      EXPECT_EQ(team_threads_blocking(), team);
      EXPECT_EQ(s.requested(), 0);
      kill(getpid(), sig);
      EXPECT_EQ(requested_soon(s), sig);
    }
    EXPECT_FALSE(blocks_stop_signals());
    EXPECT_EQ(team_threads_blocking(), 0);
  }
}

// A storm of stop signals while the team runs fp32 GEMMs. oneDNN's f32 GEMM kernels (before
// 3.11.2) move the stack pointer into a heap buffer while they run, so a signal handled on a
// computing thread writes its frame into the heap: the process crashed or freed corrupt memory
// in about half of 20-second runs of this loop. With the signals blocked there, every product is
// exact (small integers) and the process survives.
TEST(StopSignals, SignalsDuringGemmsLeaveTheHeapIntact) {
  constexpr std::int64_t n = 256;
  std::vector<float> a(n * n, 1.0f), b(n * n, 2.0f), c(n * n);
  StopSignals s;
  std::atomic<bool> done{false};
  std::thread storm([&] {
    while (!done.load()) {
      kill(getpid(), SIGUSR1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  bool exact = true;
  for (int it = 0; it < 200 && exact; ++it) {
    std::vector<float> scratch(1000 + it);  // heap traffic beside the GEMM's own buffers
    kernels::gemm(kernels::GemmLibrary::OneDnn, it % 2 == 1, it % 3 == 1, n, n, n, 1.0f, a.data(),
                  n, b.data(), n, 0.0f, c.data(), n);
    for (float v : c) exact = exact && v == 2.0f * n;
  }
  done = true;
  storm.join();
  EXPECT_TRUE(exact);
  EXPECT_EQ(requested_soon(s), SIGUSR1);
}
