// Checks of option values that CLI11's types alone let through.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace tessera::app {

// A whole number from 0 to 2^64 - 1, for the unsigned options (seeds, counts): CLI11 reads "-1"
// into an unsigned integer as 2^64 - 1, and a number past the type's range without complaint.
inline const CLI::Validator k_unsigned_number(
    [](std::string& s) -> std::string {
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || end != s.data() + s.size())
        return "must be a whole number from 0 to 18446744073709551615, got " + s;
      return {};
    },
    "UINT", "unsigned number");

// A whole number of at least `min` (CLI11's own range checks print the whole range of a double).
inline CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        long long v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < min)
          return "must be a whole number of at least " + std::to_string(min) + ", got " + s;
        return {};
      },
      ">=" + std::to_string(min), "at least");
}

}  // namespace tessera::app
