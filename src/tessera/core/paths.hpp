// Where tessera finds its data and configuration files. Default paths are relative
// ("data/gpt2", "data/brown/val.bin", "configs/models"); a relative path that does not exist under
// the working directory is looked up, in order, under
//   1. $TESSERA_HOME (a data directory: its data/ and configs/ folders),
//   2. <prefix>/share/tessera, where <prefix>/bin holds the running binary (`cmake --install`),
//   3. the folder above the running binary's (the repository, for the build tree's build/tessera),
// so that commands work from any directory. Absolute paths and paths that exist are used as
// given; a path found nowhere is returned unchanged, for the caller's "not found" error.
#pragma once

#include <filesystem>
#include <vector>

namespace tessera {

// The folders searched after the working directory, in order (those that exist).
std::vector<std::filesystem::path> data_roots();

// `p` itself, or the first data root holding it (see above).
std::filesystem::path find_data_path(const std::filesystem::path& p);

}  // namespace tessera
