#include "tessera/core/stop_signals.hpp"

#include <pthread.h>

#include <ctime>

namespace tessera {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;  // written by the handler and requested() only

extern "C" void record_stop_signal(int signal) {
  g_stop_signal = signal;
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

// `how` (SIG_BLOCK or SIG_UNBLOCK) the stop signals on every thread of the OpenMP team.
void mask_team(int how) {
  const sigset_t set = stop_set();
#pragma omp parallel
  pthread_sigmask(how, &set, nullptr);
}

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read or collective resumes; the step ends normally
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGUSR1, &sa, &old_usr1_);
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
  mask_team(SIG_BLOCK);
}

StopSignals::~StopSignals() {
  // Unblocked first, while the handler still records: a signal pending now is taken as a stop
  // request rather than given the previous disposition (for SIGTERM, the end of the process).
  mask_team(SIG_UNBLOCK);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

int StopSignals::requested() const {
  if (g_stop_signal == 0) {
    const sigset_t set = stop_set();
    const timespec now{};
    const int taken = sigtimedwait(&set, nullptr, &now);  // a pending one, without waiting
    if (taken > 0) g_stop_signal = taken;
  }
  return g_stop_signal;
}

const char* StopSignals::name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace tessera
