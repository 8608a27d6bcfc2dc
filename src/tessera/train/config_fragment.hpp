// A run-config fragment: a TOML file holding some keys of some sections of a run config (tessera
// tune writes its winner as one), read as the --set overrides that set those keys.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tessera::train {

// "section.key=value" for every key of every section of the file (sorted by section and key), the
// value as TOML writes it. Throws tessera::Error for a file that is missing, not TOML, or holds a
// key outside a section; the keys themselves are checked where the overrides are applied.
std::vector<std::string> fragment_overrides(const std::filesystem::path& file);

}  // namespace tessera::train
