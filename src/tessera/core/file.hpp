// File helpers with clear errors, and atomic writes (temporary name + fsync + rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Every file the CLI reads as input is opened here: it must exist and be a regular file. A FIFO,
// device or socket is refused before anything reads it (reading a FIFO blocks until a writer
// comes, a device may never end), and so are directories and symbolic-link loops. Returns a
// read-only file descriptor (close-on-exec) that the caller closes. Throws tessera::Error naming
// `what` and the path; `missing_hint` is the hint when the file does not exist.
int open_input_file(const std::filesystem::path& path, std::string_view what,
                    std::string_view missing_hint = {});

// What is at an input path, following symbolic links. A path that cannot be looked at (a
// symbolic-link loop, no permission to search a folder on it) is a tessera::Error naming `what`.
enum class InputKind { Missing, Directory, RegularFile, Other };
InputKind input_kind(const std::filesystem::path& path, std::string_view what);

// Reads a whole file (opened by open_input_file); throws tessera::Error naming the path when it
// is missing, unreadable or not a regular file.
std::string read_file(const std::filesystem::path& path, std::string_view what = "file");

// Calls fn(line, line_no) for each line of `text`: split at '\n', numbered from 1, the last one
// also when no newline ends it; a line keeps a '\r' that preceded its '\n'.
template <typename F>
void for_each_line(std::string_view text, F&& fn) {
  std::size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    fn(text.substr(pos, eol - pos), ++line_no);
    pos = eol + 1;
  }
}

// A file's bytes, read-only, for the readers of binary formats (safetensors, GGUF), whose parsed
// views point into them: mapped (mmap) when the file is a non-empty regular file, read into
// memory otherwise (or when mapping is refused), or bytes handed over in memory. Shared: copies
// of a parsed file share one FileBytes.
class FileBytes {
 public:
  // Opens `path` with open_input_file (so only a regular file); errors name `what`.
  static std::shared_ptr<const FileBytes> map(const std::filesystem::path& path,
                                              std::string_view what);
  static std::shared_ptr<const FileBytes> own(std::string bytes);
  FileBytes() = default;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();
  const std::byte* data() const { return ptr_; }
  std::size_t size() const { return size_; }

 private:
  const std::byte* ptr_ = nullptr;
  std::size_t size_ = 0;
  std::string owned_;        // when read into memory
  void* map_ = nullptr;      // when mapped
  std::size_t map_len_ = 0;  //
};

// Writes `data` to `path` atomically: the bytes go to "<path>.tmp.<pid>", are flushed to disk,
// and the temporary is renamed over `path`. A crash leaves either the old file or the new one.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);
// The last step of an atomic write: renames the written and flushed temporary file `tmp` to
// `path` (removing tmp if that fails) and flushes the directory entry.
void commit_temp_file(const std::filesystem::path& tmp, const std::filesystem::path& path);

// An output folder made ready before any long work: created with its parents if missing, and
// shown to take a new file (one is created and removed). Throws tessera::Error naming `option`
// (such as "--out") when the path is empty, is not a folder, or cannot be written.
void prepare_output_dir(const std::filesystem::path& dir, std::string_view option);

// fsync a file or directory by path (best effort on directories).
void fsync_path(const std::filesystem::path& path);

}  // namespace tessera
