#include "tessera/core/error.hpp"

namespace tessera {

std::string format_error_line(const Error& e) {
  std::string line = fmt::format("error: {}", e.what());
  if (!e.hint().empty()) line += fmt::format(" (hint: {})", e.hint());
  // Keep it one line whatever the message holds.
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  return line;
}

}  // namespace tessera
