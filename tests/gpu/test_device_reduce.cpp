// The device gradient sum of data parallelism on one rank: the NCCL communicator (loaded at run
// time, bootstrapped through a communicator of one) and the host-staged sum each leave the
// buffer as it was, on the stream the model uses. The sums over two ranks are the multi-rank
// tests' (tests/parallel/test_gpu_data_parallel.cpp).
#include <gtest/gtest.h>

#include "gpu_test_util.hpp"
#include "tessera/comm/device_reduce.hpp"
#include "tessera/comm/local_communicator.hpp"
#include "tessera/core/error.hpp"

namespace {

using gpu_test::download;
using gpu_test::upload;
namespace comm = tessera::comm;

void expect_sum_of_one_rank_is_identity(comm::DeviceReduce how) {
  tessera::Rng rng(3);
  const auto h = gpu_test::randn(rng, 100003);
  auto d = upload(h);
  comm::LocalCommunicator group("dp");
  auto reducer = comm::make_device_reducer(group, how);
  reducer->all_reduce_sum(d.as<float>(), h.size(), nullptr);
  reducer->all_reduce_sum(d.as<float>(), h.size(), nullptr);  // the staging buffer reused
  EXPECT_EQ(download<float>(d, h.size()), h) << reducer->describe();
}

TEST(DeviceReduce, HostStagedOneRankLeavesTheBuffer) {
  REQUIRE_GPU();
  expect_sum_of_one_rank_is_identity(comm::DeviceReduce::Host);
}

TEST(DeviceReduce, NcclOneRankLeavesTheBuffer) {
  REQUIRE_GPU();
  try {
    expect_sum_of_one_rank_is_identity(comm::DeviceReduce::Nccl);
  } catch (const tessera::Error& e) {
    if (std::string(e.what()).find("libnccl.so.2 could not be loaded") != std::string::npos)
      GTEST_SKIP() << e.what();
    throw;
  }
}

}  // namespace
