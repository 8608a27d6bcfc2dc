// Shared by the fuzz targets: how an input is judged.
//
// A parser of untrusted input may refuse it with tessera::Error (the user sees one line and exit
// code 2). Anything else is a defect that the target lets escape: another exception type (the CLI
// would report "a bug in tessera"), a crash, a sanitizer report, a hang, or an allocation past
// libFuzzer's limit. Each target is linked twice: with libFuzzer (TESSERA_FUZZ builds, `make
// fuzz`) and with replay_main.cpp, which runs the committed seeds and regression inputs in
// `make test`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::fuzz {

// Runs `body`, swallowing the one exception type a refused input may throw.
template <class Body>
int judge(Body&& body) {
  try {
    body();
  } catch (const tessera::Error&) {
  }
  return 0;
}

// Splits an input at NUL bytes: the first part and the rest (used as a main text plus a list of
// extra arguments, like a config file and its --set overrides).
inline std::vector<std::string> split_nul(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> parts(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0)
      parts.emplace_back();
    else
      parts.back().push_back(static_cast<char>(data[i]));
  }
  return parts;
}

// A property a successful parse must have; a violation aborts (a finding).
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace tessera::fuzz
