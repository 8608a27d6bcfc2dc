// Errors: what went wrong and what to do about it.
// User-facing failures throw tessera::Error; `main` prints it as one line and exits 2.
// Internal invariants use TESSERA_CHECK, which throws tessera::InternalError (a bug in tessera).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string what, std::string hint = {})
      : std::runtime_error(std::move(what)), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }

 private:
  std::string hint_;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// One line: "error: <what> (hint: <hint>)".
std::string format_error_line(const Error& e);

// A library exception's message for an error line: without the JSON library's
// "[json.exception.parse_error.101] " prefix, which says nothing to a user.
std::string_view library_message(const std::exception& e);

}  // namespace tessera

#define TESSERA_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      throw ::tessera::InternalError(fmt::format("internal check failed at {}:{}: {} {}", \
                                                 __FILE__, __LINE__, #cond,               \
                                                 fmt::format("" __VA_ARGS__)));           \
  } while (0)
