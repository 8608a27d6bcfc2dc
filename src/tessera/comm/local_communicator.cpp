#include "tessera/comm/local_communicator.hpp"

#include <algorithm>

#include "tessera/core/error.hpp"

namespace tessera::comm {

void LocalCommunicator::reduce_scatter_sum(const float* in, float* out, std::size_t n) {
  if (in != out) std::copy(in, in + n, out);
}
void LocalCommunicator::all_gather(const float* in, float* out, std::size_t n) {
  if (in != out) std::copy(in, in + n, out);
}
void LocalCommunicator::all_gather(const std::uint16_t* in, std::uint16_t* out, std::size_t n) {
  if (in != out) std::copy(in, in + n, out);
}
void LocalCommunicator::send(const float*, std::size_t, int, int) {
  throw InternalError("send on a single-rank communicator");
}
void LocalCommunicator::recv(float*, std::size_t, int, int) {
  throw InternalError("recv on a single-rank communicator");
}
Request LocalCommunicator::ireduce_scatter_sum(const float* in, float* out,
                                               const std::vector<std::size_t>& counts) {
  TESSERA_CHECK(counts.size() == 1);
  if (in != out) std::copy(in, in + counts[0], out);
  return {};
}
Request LocalCommunicator::ireduce_scatter_sum_bf16(const std::uint16_t* in, std::uint16_t* out,
                                                    const std::vector<std::size_t>& counts) {
  TESSERA_CHECK(counts.size() == 1);
  if (in != out) std::copy(in, in + counts[0], out);
  return {};
}
Request LocalCommunicator::iall_gather(const float* in, float* out,
                                       const std::vector<std::size_t>& counts) {
  TESSERA_CHECK(counts.size() == 1);
  if (in != out) std::copy(in, in + counts[0], out);
  return {};
}
Request LocalCommunicator::isend(const float*, std::size_t, int, int) {
  throw InternalError("isend on a single-rank communicator");
}
Request LocalCommunicator::irecv(float*, std::size_t, int, int) {
  throw InternalError("irecv on a single-rank communicator");
}
Request LocalCommunicator::isend(const std::uint16_t*, std::size_t, int, int) {
  throw InternalError("isend on a single-rank communicator");
}
Request LocalCommunicator::irecv(std::uint16_t*, std::size_t, int, int) {
  throw InternalError("irecv on a single-rank communicator");
}

}  // namespace tessera::comm
