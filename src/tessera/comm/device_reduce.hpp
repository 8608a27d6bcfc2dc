// Sums fp32 buffers in GPU memory over the ranks of a group, in place: what data parallelism on
// GPUs needs (the gradients, after a step's last backward). Two ways, chosen collectively:
//
// - NCCL: libnccl.so.2 loaded at run time (a CUDA installation, or the nvidia-nccl wheel that
//   PyTorch depends on), one NCCL communicator per group, bootstrapped through the group's MPI
//   communicator (rank 0's unique id broadcast), the sum queued on the caller's stream. Needs
//   every rank of the group on its own GPU: NCCL refuses two ranks on one device.
// - host-staged: the buffer copied into pinned host memory, summed by the group's MPI
//   communicator, copied back. Used where ranks share a GPU or the machine has no NCCL; slower
//   (two PCIe copies and a host all-reduce) but the same sum.
//
// The CPU build has neither: make_device_reducer throws.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tessera/comm/communicator.hpp"

namespace tessera::comm {

class DeviceReducer {
 public:
  virtual ~DeviceReducer() = default;
  // device_buf: n floats in the current device's memory, read and written by the work queued on
  // `stream` (a cudaStream_t; null is the legacy default stream). Returns once the sum is in
  // device_buf on every rank, or queued on `stream` ahead of anything queued after this call.
  virtual void all_reduce_sum(float* device_buf, std::size_t n, void* stream) = 0;
  // "NCCL 2.27.7" or "host-staged through MPI (ranks 0 and 1 share a GPU)"
  virtual const std::string& describe() const = 0;
};

enum class DeviceReduce {
  Auto,  // NCCL where every rank has its own GPU and NCCL loads, host-staged otherwise
  Nccl,  // NCCL or an error saying why not
  Host,  // host-staged
};

// Collective over `group` (every rank calls it, with the same `how`); the current CUDA device
// must be the one this rank trains on. Throws tessera::Error when `how` cannot be honoured.
std::unique_ptr<DeviceReducer> make_device_reducer(Communicator& group, DeviceReduce how);

}  // namespace tessera::comm
