// Shared by the unit tests of parsers: "this must be refused with a tessera::Error that says".
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tessera/core/error.hpp"

namespace tessera::test {

// Expects `f` to throw tessera::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected tessera::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

}  // namespace tessera::test
