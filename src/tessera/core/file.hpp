// File helpers with clear errors, and atomic writes (temporary name + fsync + rename).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Reads a whole file; throws tessera::Error naming the path when it is missing or unreadable.
std::string read_file(const std::filesystem::path& path, std::string_view what = "file");

// Writes `data` to `path` atomically: the bytes go to "<path>.tmp.<pid>", are flushed to disk,
// and the temporary is renamed over `path`. A crash leaves either the old file or the new one.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

// fsync a file or directory by path (best effort on directories).
void fsync_path(const std::filesystem::path& path);

}  // namespace tessera
