// A request to stop a long job cleanly: SIGTERM (what a scheduler sends before it kills a job,
// and Slurm's default on preemption and time limit) or SIGUSR1 (Slurm's `--signal` warning).
// While a StopSignals object lives, those signals only record that they arrived; the job polls
// requested() at a safe point (between training steps), saves, and exits. A signal handler can
// only reach process-wide state, so the flag is one static per process (the one exception to the
// project's no-global-state rule); the object installs the handlers and restores the previous
// ones when it is destroyed.
#pragma once

#include <csignal>

namespace tessera {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked to stop (SIGTERM or SIGUSR1), or 0.
  int requested() const;
  // "SIGTERM", "SIGUSR1".
  static const char* name(int signal);

 private:
  struct sigaction old_term_ {
  }, old_usr1_{};
};

}  // namespace tessera
