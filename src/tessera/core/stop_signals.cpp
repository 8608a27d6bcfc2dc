#include "tessera/core/stop_signals.hpp"

namespace tessera {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;  // written by the handler only

extern "C" void record_stop_signal(int signal) {
  g_stop_signal = signal;
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
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

int StopSignals::requested() const {
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
