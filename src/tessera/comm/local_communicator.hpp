// The communicator of a group of one rank: every collective is a copy or nothing.
#pragma once

#include "tessera/comm/communicator.hpp"

namespace tessera::comm {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  void all_reduce_sum(float*, std::size_t) override {}
  void all_reduce_sum(double*, std::size_t) override {}
  void all_reduce_max(double*, std::size_t) override {}
  void reduce_scatter_sum(const float* in, float* out, std::size_t n) override;
  void all_gather(const float* in, float* out, std::size_t n) override;
  void broadcast(float*, std::size_t, int) override {}
  void broadcast_bytes(void*, std::size_t, int) override {}
  void send(const float*, std::size_t, int, int) override;
  void recv(float*, std::size_t, int, int) override;
  void barrier() override {}
  Request iall_reduce_sum(float*, std::size_t) override { return {}; }
  Request ireduce_scatter_sum(const float* in, float* out,
                              const std::vector<std::size_t>& counts) override;
  Request iall_reduce_sum_bf16(std::uint16_t*, std::size_t) override { return {}; }
  Request ireduce_scatter_sum_bf16(const std::uint16_t* in, std::uint16_t* out,
                                   const std::vector<std::size_t>& counts) override;
  Request iall_gather(const float* in, float* out, const std::vector<std::size_t>& counts) override;
  Request isend(const float*, std::size_t, int, int) override;
  Request irecv(float*, std::size_t, int, int) override;
  void all_gather(const std::uint16_t* in, std::uint16_t* out, std::size_t n) override;
  Request isend(const std::uint16_t*, std::size_t, int, int) override;
  Request irecv(std::uint16_t*, std::size_t, int, int) override;

 private:
  std::string name_;
};

}  // namespace tessera::comm
