// comm::Request::then: the continuation runs exactly once, when the request completes, whether
// completion is seen by test() or by wait(), and at once on a request with nothing in flight.
#include <gtest/gtest.h>

#include <memory>

#include "tessera/comm/communicator.hpp"

using tessera::comm::Request;

namespace {

// Completes on the k-th test(), or on wait().
struct Countdown final : Request::Impl {
  explicit Countdown(int k) : left(k) {}
  bool test() override { return --left <= 0; }
  void wait() override { left = 0; }
  int left;
};

TEST(Request, ThenRunsOnceWhenTheRequestCompletes) {
  int ran = 0;
  Request r = Request(std::make_unique<Countdown>(3)).then([&] { ++ran; });
  EXPECT_TRUE(r.pending());
  EXPECT_FALSE(r.test());
  EXPECT_FALSE(r.test());
  EXPECT_EQ(ran, 0);
  EXPECT_TRUE(r.test());
  EXPECT_EQ(ran, 1);
  r.wait();  // completed: a no-op
  EXPECT_TRUE(r.test());
  EXPECT_EQ(ran, 1);

  Request w = Request(std::make_unique<Countdown>(100)).then([&] { ++ran; });
  w.wait();
  EXPECT_EQ(ran, 2);
  EXPECT_FALSE(w.pending());

  Request done = Request().then([&] { ++ran; });  // nothing in flight: at once
  EXPECT_EQ(ran, 3);
  EXPECT_FALSE(done.pending());
}

}  // namespace
