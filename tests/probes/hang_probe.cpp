// A hang on purpose, for the watchdog test (tests/parallel/test_watchdog.cpp). Rank 0 enters an
// all-reduce over the world at once, while every other rank sleeps 60 s before joining it: rank
// 0's collective stays in flight, and its watchdog must end the job with the collective log long
// before the others arrive.
//
// Usage: mpirun -n 2 tessera_hang_probe <timeout_s> [pid_dir]
//   timeout_s  the runtime's collective timeout (RuntimeOptions::collective_timeout_s)
//   pid_dir    if given, each rank writes its process id to <pid_dir>/<world rank>.pid, so that
//              the test can check that no rank outlives the job
//
// The probe prints nothing of its own before the collective, so that every line naming a rank or a
// collective in the job's output comes from the runtime.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/comm/runtime.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || std::atof(argv[1]) <= 0) {
    std::fprintf(stderr, "usage: mpirun -n 2 %s <timeout_s> [pid_dir]\n", argv[0]);
    return 2;
  }
  tessera::comm::RuntimeOptions opt;
  opt.collective_timeout_s = std::atof(argv[1]);
  opt.force_mpi = true;
  auto rt = tessera::comm::Runtime::create(opt);
  const int me = rt->world_rank();
  if (argc > 2) {
    std::ofstream(std::string(argv[2]) + "/" + std::to_string(me) + ".pid") << ::getpid() << "\n";
  }
  if (rt->world_size() < 2) {
    std::fprintf(stderr, "hang_probe: needs at least 2 processes (run it under mpirun -n 2)\n");
    return 2;
  }
  if (me != 0) std::this_thread::sleep_for(std::chrono::seconds(60));
  std::vector<float> buf(16, 1.0f);
  rt->world().all_reduce_sum(buf.data(), buf.size());
  // Reached only if the watchdog did not end the job: the test fails on its deadline.
  std::fprintf(stderr, "hang_probe: process %d: the collective completed (sum %g)\n", me, buf[0]);
  return 0;
}
