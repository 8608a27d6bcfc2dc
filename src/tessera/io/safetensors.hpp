// safetensors: the Hugging Face tensor file format, used for model checkpoints (GPT-2
// compatible), optimizer state and test fixtures.
//
// Layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, little-endian u64: length of the JSON header
//   N bytes   UTF-8 JSON object {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//             ..., "__metadata__": {"key": "value", ...}}, padded with spaces to a multiple of 8
//   rest      the data region; data_offsets are relative to its start, tensors are row-major,
//             little-endian, and together cover the region exactly (no holes, no overlaps)
//
// SafetensorsFile validates everything on open and never reads outside the file; every problem
// is a tessera::Error naming the file. SafetensorsWriter streams the tensors into a temporary
// file that is flushed and renamed over the target, so a crash never leaves a half-written file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/file.hpp"

namespace tessera::io {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, BOOL };

// Bytes per element (BOOL is one byte).
std::size_t dtype_size(DType dtype);
// The safetensors spelling: "F32", "BF16", "BOOL", ...
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; false if `name` is not a dtype this reader supports.
bool parse_dtype(std::string_view name, DType& out);
bool is_float_dtype(DType dtype);  // F64, F32, F16, BF16

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;  // [] is a scalar (one element)
  std::size_t begin = 0, end = 0;   // byte offsets into the data region, end - begin = nbytes
  std::int64_t numel() const;       // product of shape (1 for a scalar)
  std::size_t nbytes() const { return end - begin; }
};

// "[2, 3]"
std::string shape_str(std::span<const std::int64_t> shape);

class SafetensorsFile {
 public:
  // Maps the file read-only (mmap) and validates header and offsets; throws tessera::Error.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Same validation over bytes already in memory (tests, network); `name` is used in messages.
  static SafetensorsFile from_bytes(std::string bytes, std::filesystem::path name);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file (offset) order
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The raw little-endian bytes of a tensor (no alignment guarantee: copy, don't cast).
  std::span<const std::byte> bytes(const TensorInfo& t) const;
  // Total bytes of the data region.
  std::size_t data_size() const { return data_size_; }

  // Copies a tensor into `out` (numel floats) as fp32, converting from F32/F16/BF16/F64.
  // Throws tessera::Error if it is absent, if its shape differs from expected_shape, or if its
  // dtype is not a float type.
  void read_f32(std::string_view name, std::span<const std::int64_t> expected_shape,
                float* out) const;
  void read_f32(std::string_view name, std::initializer_list<std::int64_t> expected_shape,
                float* out) const {
    read_f32(name, std::span<const std::int64_t>(expected_shape.begin(), expected_shape.size()),
             out);
  }
  // The whole tensor as fp32, any float dtype, any shape.
  std::vector<float> read_f32(std::string_view name) const;
  // The whole tensor as int64, from any integer dtype or BOOL (U64 values above INT64_MAX are
  // an error).
  std::vector<std::int64_t> read_i64(std::string_view name) const;

  const std::filesystem::path& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  static SafetensorsFile parse(std::shared_ptr<const FileBytes> storage,
                               std::filesystem::path path);
  const TensorInfo& require(std::string_view name) const;

  std::shared_ptr<const FileBytes> storage_;  // shared: copies of a SafetensorsFile are cheap
  const std::byte* data_ = nullptr;           // start of the data region inside storage_
  std::size_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  std::filesystem::path path_;
};

class SafetensorsWriter {
 public:
  // Adds a tensor WITHOUT copying: `data` must stay valid and unchanged until write() returns
  // (checkpoints of 500 MB models are streamed straight from the parameter buffers).
  // Checks that nbytes == numel(shape) * dtype_size(dtype), that dimensions are non-negative and
  // that the name is new, non-empty and not "__metadata__".
  void add(std::string name, DType dtype, std::vector<std::int64_t> shape, const void* data,
           std::size_t nbytes);
  // Same, but the writer keeps its own copy of the bytes (small tensors, temporaries).
  void add_copy(std::string name, DType dtype, std::vector<std::int64_t> shape, const void* data,
                std::size_t nbytes);
  // add() for fp32 data of numel(shape) floats (not copied).
  void add_f32(std::string name, std::vector<std::int64_t> shape, const float* data);
  void set_metadata(std::string key, std::string value);

  std::size_t size() const { return entries_.size(); }

  // Writes the file atomically: "<path>.tmp.<pid>", fsync, rename over `path`, fsync the
  // directory. Tensors are laid out by descending dtype size (so each is aligned to its element
  // size, as the reference implementation does), otherwise in the order they were added.
  void write(const std::filesystem::path& path) const;
  // The complete file as bytes (tests, small files).
  std::string to_bytes() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    const void* data;
    std::size_t nbytes;
    std::shared_ptr<std::vector<std::byte>> owned;  // set by add_copy
  };
  std::vector<const Entry*> layout() const;
  std::string header(const std::vector<const Entry*>& order) const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera::io
