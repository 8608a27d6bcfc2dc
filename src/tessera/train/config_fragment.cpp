#include "tessera/train/config_fragment.hpp"

#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::train {

std::vector<std::string> fragment_overrides(const std::filesystem::path& file) {
  const std::string text = read_file(file, "config fragment");
  toml::table root;
  try {
    root = toml::parse(text, file.string());
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{} is not valid TOML: {}", file.string(), e.description()),
                "a fragment holds [section] headers and key = value lines");
  }
  std::vector<std::string> keys;
  for (const auto& [section, node] : root) {
    const toml::table* table = node.as_table();
    if (!table)
      throw Error(fmt::format("{}: '{}' is not in a section", file.string(), section.str()),
                  "write the key under its [section] header, e.g. [parallel]");
    for (const auto& [key, value] : *table) {
      std::ostringstream repr;
      value.visit([&](const auto& v) { repr << v; });
      keys.push_back(fmt::format("{}.{}={}", section.str(), key.str(), repr.str()));
    }
  }
  return keys;
}

}  // namespace tessera::train
