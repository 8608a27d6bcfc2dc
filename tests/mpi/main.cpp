// main of tessera_mpi_tests: initialises MPI once (force_mpi, so the binary also runs as a single
// process), runs the tests on every rank, and finalises MPI when the Runtime is destroyed. Rank 0
// prints gtest's usual report; the other ranks print only their failures, prefixed by the rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "mpi_env.hpp"
#include "tessera/comm/runtime.hpp"

namespace tessera::test {
namespace {
std::unique_ptr<comm::Runtime> g_runtime;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    std::fflush(stderr);
  }

 private:
  int rank_;
};
}  // namespace

comm::Runtime& runtime() {
  return *g_runtime;
}

}  // namespace tessera::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tessera::comm::RuntimeOptions opt;
  opt.force_mpi = true;
  opt.collective_timeout_s = 120;  // a rank that skipped a collective ends the job with the log
  tessera::test::g_runtime = tessera::comm::Runtime::create(opt);
  const int rank = tessera::test::g_runtime->world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new tessera::test::FailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  tessera::test::g_runtime.reset();  // MPI_Finalize, once
  return rc;
}
