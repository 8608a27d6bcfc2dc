// Shared pieces of the tests that run inside mpirun (tessera_mpi_tests): the process's Runtime,
// created once by main (tests/mpi/main.cpp) with force_mpi, and a fixture that makes a failure on
// any rank a failure on every rank, so that rank 0's report (the only one printed in full) is the
// verdict of the whole job.
//
// Every rank runs every test, and the tests themselves must make the same collective calls in the
// same order on every rank.
#pragma once

#include <gtest/gtest.h>

#include "tessera/comm/runtime.hpp"

namespace tessera::test {

comm::Runtime& runtime();  // defined in main.cpp

class MpiTest : public ::testing::Test {
 protected:
  comm::Runtime& runtime() { return ::tessera::test::runtime(); }
  void TearDown() override {
    double failed = HasFailure() ? 1.0 : 0.0;
    runtime().world().all_reduce_sum(&failed, 1);
    if (failed > 0 && !HasFailure())
      ADD_FAILURE() << failed << " rank(s) failed this test (their messages are on stderr)";
  }
};

}  // namespace tessera::test
