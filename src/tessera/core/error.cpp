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

std::string_view library_message(const std::exception& e) {
  std::string_view why = e.what();
  if (auto p = why.find("] "); why.starts_with("[json.") && p != std::string_view::npos)
    why.remove_prefix(p + 2);
  return why;
}

}  // namespace tessera
