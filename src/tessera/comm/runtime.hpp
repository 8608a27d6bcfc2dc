// The process's parallel runtime: MPI when launched by a launcher (mpirun/mpiexec/srun), a single
// process otherwise; communicators for any subset of the grid's axes, created once and cached;
// the collective log and its watchdog. Created once by main() and passed down explicitly.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/topology.hpp"

namespace tessera::comm {

struct RuntimeOptions {
  double collective_timeout_s = 60.0;  // a collective longer than this ends the job (0 = never)
  bool force_mpi = false;              // initialise MPI even without a launcher (tests)
};

class Runtime {
 public:
  // Detects a launcher from its environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK,
  // SLURM_PROCID with SLURM_NTASKS > 1) and initialises MPI (MPI_THREAD_FUNNELED: only the
  // main thread calls MPI; the watchdog thread never does);
  // otherwise a single-process runtime with no MPI at all.
  static std::unique_ptr<Runtime> create(const RuntimeOptions& opt = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // This rank's index among the ranks on its machine (0 without MPI): which GPU it drives.
  int local_rank() const { return local_rank_; }
  bool uses_mpi() const { return mpi_; }
  Communicator& world();
  // The communicator of this rank's group over `axes` in `topo`; the first call for a
  // (grid, axes) pair creates it (collectively: every rank must ask in the same order).
  Communicator& group(const Topology& topo, AxisSet axes);
  CollectiveLog& log() { return *log_; }
  // A collective longer than this ends the job with its log (0 = never).
  void set_collective_timeout(double seconds) { timeout_s_ = seconds; }
  // Ends the job from any rank with a message (MPI_Abort under MPI, exit otherwise).
  [[noreturn]] void abort(const std::string& message, int code = 3);

 private:
  Runtime() = default;
  void start_watchdog();
  std::atomic<double> timeout_s_{60.0};
  bool mpi_ = false;
  int world_rank_ = 0, world_size_ = 1, local_rank_ = 0;
  std::unique_ptr<CollectiveLog> log_;
  std::unique_ptr<Communicator> world_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
};

}  // namespace tessera::comm
