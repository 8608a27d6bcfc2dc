// Shared pieces of the tests that run inside mpirun (tessera_mpi_tests): the process's Runtime,
// created once by main (tests/mpi/main.cpp) with force_mpi, and a fixture that makes a failure on
// any rank a failure on every rank, so that rank 0's report (the only one printed in full) is the
// verdict of the whole job.
//
// Every rank runs every test, and the tests themselves must make the same collective calls in the
// same order on every rank.
#pragma once

#include "tessera/core/rng.hpp"

#include <vector>

#include <tuple>

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

// Every (tx, ty, tz) with tx*ty*tz == p, in a fixed order (the same on every rank).
inline std::vector<std::tuple<int, int, int>> factorizations(int p) {
  std::vector<std::tuple<int, int, int>> f;
  for (int tx = 1; tx <= p; ++tx)
    for (int ty = 1; tx * ty <= p; ++ty)
      if (p % (tx * ty) == 0) f.emplace_back(tx, ty, p / (tx * ty));
  return f;
}

// n values drawn from U(-1, 1).
inline std::vector<float> random_vec(::tessera::Rng& rng, std::size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * rng.uniform() - 1.0f;  // U(-1, 1)
  return v;
}

}  // namespace tessera::test
