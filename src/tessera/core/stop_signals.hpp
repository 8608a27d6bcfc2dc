// A request to stop a long job cleanly: SIGTERM (what a scheduler sends before it kills a job,
// and Slurm's default on preemption and time limit) or SIGUSR1 (Slurm's `--signal` warning).
// While a StopSignals object lives, those signals only record that they arrived; the job polls
// requested() at a safe point (between training steps), saves, and exits. A signal handler can
// only reach process-wide state, so the flag is one static per process (the one exception to the
// project's no-global-state rule); the object installs the handlers and restores the previous
// ones when it is destroyed.
//
// The signals are also blocked, while the object lives, in the thread that made it and in every
// thread of its OpenMP team (threads the team starts later inherit the mask), so they are never
// delivered to a thread doing the job's arithmetic: oneDNN's f32 GEMM kernels (before 3.11.2)
// point the stack pointer into a heap buffer while they run, and a signal handled on such a
// thread writes its frame over the heap. The signal then reaches a thread that does not block it
// (an idle library thread) or stays pending until requested() takes it.
#pragma once

#include <csignal>

namespace tessera {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked to stop (SIGTERM or SIGUSR1), or 0. Takes a pending one.
  int requested() const;
  // "SIGTERM", "SIGUSR1".
  static const char* name(int signal);

 private:
  struct sigaction old_term_ {
  }, old_usr1_{};
  sigset_t old_mask_{};  // the making thread's mask before
};

}  // namespace tessera
