#include "tessera/io/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian; this reader assumes a little-endian host");

namespace tessera::io {
namespace {

constexpr std::uint32_t k_gguf_version = 3;
constexpr std::size_t k_max_dims = 4;            // GGML_MAX_DIMS
constexpr std::size_t k_max_name_bytes = 63;     // GGML_MAX_NAME (64) less the terminator
constexpr std::uint64_t k_min_entry_bytes = 13;  // key length (8) + type (4) + a 1-byte value
constexpr std::uint64_t k_min_info_bytes = 24;   // name length, n_dims, type, offset

constexpr std::string_view k_corrupt_hint =
    "the file is damaged, truncated or not a GGUF file; download or convert it again";

struct ValueTypeEntry {
  GgufType type;
  std::string_view name;
  std::size_t size;  // bytes of a scalar; 0 for string and array
};
constexpr ValueTypeEntry k_value_types[] = {
    {GgufType::U8, "uint8", 1},    {GgufType::I8, "int8", 1},    {GgufType::U16, "uint16", 2},
    {GgufType::I16, "int16", 2},   {GgufType::U32, "uint32", 4}, {GgufType::I32, "int32", 4},
    {GgufType::F32, "float32", 4}, {GgufType::Bool, "bool", 1},  {GgufType::String, "string", 0},
    {GgufType::Array, "array", 0}, {GgufType::U64, "uint64", 8}, {GgufType::I64, "int64", 8},
    {GgufType::F64, "float64", 8},
};

const ValueTypeEntry* find_value_type(std::uint32_t number) {
  for (const auto& e : k_value_types)
    if (static_cast<std::uint32_t>(e.type) == number) return &e;
  return nullptr;
}

std::size_t scalar_size(GgufType type) {
  const ValueTypeEntry* e = find_value_type(static_cast<std::uint32_t>(type));
  TESSERA_CHECK(e != nullptr, "unknown GgufType {}", static_cast<std::uint32_t>(type));
  return e->size;
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64:
      return true;
    default:
      return false;
  }
}

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void append_string(std::string& out, std::string_view s) {
  append<std::uint64_t>(out, s.size());
  out.append(s);
}

void pad_to(std::string& out, std::uint64_t alignment) {
  out.append((alignment - out.size() % alignment) % alignment, '\0');
}

// Reads a span of the file front to back; every read is bounds-checked and a failure names `what`
// (the file), the item and its byte offset.
class Cursor {
 public:
  Cursor(std::span<const std::byte> data, std::uint64_t base, std::string_view what)
      : data_(data), base_(base), what_(what) {}

  std::size_t pos() const { return pos_; }
  std::uint64_t offset() const { return base_ + pos_; }  // in the file
  std::size_t remaining() const { return data_.size() - pos_; }
  std::span<const std::byte> rest() const { return data_.subspan(pos_); }

  const std::byte* take(std::uint64_t n, std::string_view item) {
    if (n > remaining())
      fail(fmt::format("truncated: {} at byte {} needs {} bytes, but the file ends at byte {}",
                       item, offset(), n, base_ + data_.size()));
    const std::byte* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::uint32_t u32(std::string_view item) { return load<std::uint32_t>(take(4, item)); }
  std::uint64_t u64(std::string_view item) { return load<std::uint64_t>(take(8, item)); }
  std::string_view string(std::string_view item) {
    const std::uint64_t at = offset();
    const std::uint64_t n = u64(item);
    if (n > remaining())
      fail(
          fmt::format("{} at byte {} claims a length of {} bytes, but only {} bytes remain in the "
                      "file",
                      item, at, n, remaining()));
    return {reinterpret_cast<const char*>(take(n, item)), static_cast<std::size_t>(n)};
  }
  // Skips a string if it lies inside the data; false (and nothing read) if it does not.
  bool try_skip_string() {
    if (remaining() < 8) return false;
    const auto n = load<std::uint64_t>(data_.data() + pos_);
    if (n > remaining() - 8) return false;
    pos_ += 8 + n;
    return true;
  }
  [[noreturn]] void fail(const std::string& detail) const {
    throw Error(fmt::format("{}: {}", what_, detail), std::string(k_corrupt_hint));
  }

 private:
  std::span<const std::byte> data_;
  std::size_t pos_ = 0;
  std::uint64_t base_;
  std::string_view what_;
};

// The element type of an array, checked.
GgufType array_element_type(Cursor& c, std::string_view item) {
  const std::uint64_t at = c.offset();
  const std::uint32_t raw = c.u32(item);
  const ValueTypeEntry* e = find_value_type(raw);
  if (!e)
    c.fail(fmt::format("{} at byte {} is {}, which is no GGUF value type (0-12)", item, at, raw));
  if (e->type == GgufType::Array)
    c.fail(fmt::format("{} at byte {} is array: nested arrays are not supported", item, at));
  return e->type;
}

// Skips `count` values of `type` (not Array), checking that they are inside the data and that
// bools are 0 or 1.
void skip_values(Cursor& c, GgufType type, std::uint64_t count, std::string_view item) {
  const std::uint64_t min_bytes = type == GgufType::String ? 8 : scalar_size(type);
  if (count > c.remaining() / min_bytes)
    c.fail(
        fmt::format("{} at byte {} claims {} values of type {}, at least {} bytes each, but only "
                    "{} bytes remain in the file",
                    item, c.offset(), count, gguf_type_name(type), min_bytes, c.remaining()));
  if (type == GgufType::String) {
    for (std::uint64_t i = 0; i < count; ++i)  // (tokenizer vocabularies: 10^5 strings)
      if (!c.try_skip_string()) (void)c.string(fmt::format("string {} of {}", i, item));
    return;
  }
  const std::uint64_t at = c.offset();
  const std::byte* p = c.take(count * min_bytes, item);
  if (type == GgufType::Bool)
    for (std::uint64_t i = 0; i < count; ++i)
      if (static_cast<std::uint8_t>(p[i]) > 1)
        c.fail(fmt::format("{}: the bool at byte {} is {}, not 0 or 1", item, at + i,
                           static_cast<int>(p[i])));
}

std::string describe_type(GgufType type, GgufType element, std::uint64_t count) {
  if (type != GgufType::Array) return std::string(gguf_type_name(type));
  return fmt::format("array of {} {}", count, gguf_type_name(element));
}

[[noreturn]] void wrong_type(const GgufValue& v, std::string_view what, std::string_view expected) {
  throw Error(fmt::format("{} is {}, expected {}", what, v.describe(), expected),
              "the file was written for another model architecture or by another converter");
}

// Value of the scalar integer type `t` at p, as int64; false for a uint64 above INT64_MAX.
bool integer_at(GgufType t, const std::byte* p, std::int64_t& out) {
  switch (t) {
    case GgufType::U8:
      out = load<std::uint8_t>(p);
      return true;
    case GgufType::I8:
      out = load<std::int8_t>(p);
      return true;
    case GgufType::U16:
      out = load<std::uint16_t>(p);
      return true;
    case GgufType::I16:
      out = load<std::int16_t>(p);
      return true;
    case GgufType::U32:
      out = load<std::uint32_t>(p);
      return true;
    case GgufType::I32:
      out = load<std::int32_t>(p);
      return true;
    case GgufType::I64:
      out = load<std::int64_t>(p);
      return true;
    case GgufType::U64: {
      const auto v = load<std::uint64_t>(p);
      out = static_cast<std::int64_t>(v);
      return v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    }
    default:
      TESSERA_CHECK(false, "integer_at of a non-integer type");
      return false;
  }
}

double float_at(GgufType t, const std::byte* p) {
  return t == GgufType::F32 ? static_cast<double>(load<float>(p)) : load<double>(p);
}

// The encoding of an array of fixed-size elements.
template <class T>
std::string array_encoding(GgufType element, std::span<const T> values) {
  std::string out;
  append<std::uint32_t>(out, static_cast<std::uint32_t>(element));
  append<std::uint64_t>(out, values.size());
  for (const T& v : values) append<T>(out, v);
  return out;
}

// The size of a tensor of `type` with `dims`, or what is wrong with them.
std::optional<std::string> tensor_size_problem(const GgmlTypeInfo& type,
                                               std::span<const std::int64_t> dims,
                                               std::uint64_t& nbytes) {
  if (dims.size() > k_max_dims)
    return fmt::format("it has {} dimensions, at most {} are allowed", dims.size(), k_max_dims);
  std::int64_t numel = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) return fmt::format("dimension {} is negative ({})", i, dims[i]);
    if (__builtin_mul_overflow(numel, dims[i], &numel))
      return fmt::format("its dimensions [{}] hold more than 2^63 elements", fmt::join(dims, ", "));
  }
  const std::int64_t row = dims.empty() ? 1 : dims[0];
  if (row % type.block_size != 0)
    return fmt::format(
        "its rows of {} elements (dims[0]) are not a multiple of the {} block size {}", row,
        type.name, type.block_size);
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(numel / type.block_size),
                             static_cast<std::uint64_t>(type.block_bytes), &nbytes))
    return fmt::format("its size in bytes overflows 64 bits");
  return std::nullopt;
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  const ValueTypeEntry* e = find_value_type(static_cast<std::uint32_t>(type));
  TESSERA_CHECK(e != nullptr, "unknown GgufType {}", static_cast<std::uint32_t>(type));
  return e->name;
}

// ---- values ----

#define TESSERA_GGUF_SCALAR(fn, T, tag)                                                           \
  GgufValue GgufValue::fn(T v) {                                                                  \
    std::string e;                                                                                \
    append<T>(e, v);                                                                              \
    return GgufValue(GgufType::tag, GgufType::U8, 1, std::move(e));                               \
  }                                                                                               \
  GgufValue GgufValue::array_##fn(std::span<const T> v) {                                         \
    return GgufValue(GgufType::Array, GgufType::tag, v.size(), array_encoding(GgufType::tag, v)); \
  }
TESSERA_GGUF_SCALAR(u8, std::uint8_t, U8)
TESSERA_GGUF_SCALAR(i8, std::int8_t, I8)
TESSERA_GGUF_SCALAR(u16, std::uint16_t, U16)
TESSERA_GGUF_SCALAR(i16, std::int16_t, I16)
TESSERA_GGUF_SCALAR(u32, std::uint32_t, U32)
TESSERA_GGUF_SCALAR(i32, std::int32_t, I32)
TESSERA_GGUF_SCALAR(u64, std::uint64_t, U64)
TESSERA_GGUF_SCALAR(i64, std::int64_t, I64)
TESSERA_GGUF_SCALAR(f32, float, F32)
TESSERA_GGUF_SCALAR(f64, double, F64)
#undef TESSERA_GGUF_SCALAR

GgufValue GgufValue::boolean(bool v) {
  return GgufValue(GgufType::Bool, GgufType::U8, 1, std::string(1, v ? '\1' : '\0'));
}

GgufValue GgufValue::array_bool(std::span<const bool> v) {
  std::string e;
  append<std::uint32_t>(e, static_cast<std::uint32_t>(GgufType::Bool));
  append<std::uint64_t>(e, v.size());
  for (bool b : v) e.push_back(b ? '\1' : '\0');
  return GgufValue(GgufType::Array, GgufType::Bool, v.size(), std::move(e));
}

GgufValue GgufValue::string(std::string_view v) {
  std::string e;
  append_string(e, v);
  return GgufValue(GgufType::String, GgufType::U8, 1, std::move(e));
}

GgufValue GgufValue::array_string(std::span<const std::string> v) {
  std::string e;
  append<std::uint32_t>(e, static_cast<std::uint32_t>(GgufType::String));
  append<std::uint64_t>(e, v.size());
  for (const auto& s : v) append_string(e, s);
  return GgufValue(GgufType::Array, GgufType::String, v.size(), std::move(e));
}

std::string GgufValue::describe() const {
  return describe_type(type_, element_type_, count_);
}

GgufValue GgufValue::decode(GgufType type, std::span<const std::byte> data, std::size_t& end,
                            std::string_view what, std::uint64_t base_offset) {
  Cursor c(data, base_offset, what);
  GgufType element = GgufType::U8;
  std::uint64_t count = 1;
  if (type == GgufType::Array) {
    element = array_element_type(c, "the element type of the array");
    count = c.u64("the length of the array");
    skip_values(c, element, count, "the array");
  } else if (type == GgufType::String) {
    (void)c.string("the string value");
  } else {
    TESSERA_CHECK(find_value_type(static_cast<std::uint32_t>(type)), "bad GgufType");
    skip_values(c, type, 1, fmt::format("the {} value", gguf_type_name(type)));
  }
  end = c.pos();
  return GgufValue(type, element, count,
                   std::string(reinterpret_cast<const char*>(data.data()), c.pos()));
}

void GgufValue::require(GgufType type, std::string_view what) const {
  if (type_ != type) wrong_type(*this, what, fmt::format("a {}", gguf_type_name(type)));
}

void GgufValue::require_array(std::string_view what) const {
  if (type_ != GgufType::Array) wrong_type(*this, what, "an array");
}

std::string GgufValue::as_string(std::string_view what) const {
  require(GgufType::String, what);
  return encoding_.substr(8);
}

std::int64_t GgufValue::as_int(std::string_view what) const {
  if (!is_integer(type_)) wrong_type(*this, what, "an integer");
  std::int64_t v = 0;
  if (!integer_at(type_, reinterpret_cast<const std::byte*>(encoding_.data()), v))
    throw Error(
        fmt::format("{} is {}, larger than the largest int64", what,
                    load<std::uint64_t>(reinterpret_cast<const std::byte*>(encoding_.data()))));
  return v;
}

double GgufValue::as_float(std::string_view what) const {
  if (type_ != GgufType::F32 && type_ != GgufType::F64)
    wrong_type(*this, what, "a float32 or float64");
  return float_at(type_, reinterpret_cast<const std::byte*>(encoding_.data()));
}

bool GgufValue::as_bool(std::string_view what) const {
  require(GgufType::Bool, what);
  return encoding_[0] != 0;
}

std::vector<std::string> GgufValue::as_strings(std::string_view what) const {
  if (type_ != GgufType::Array || element_type_ != GgufType::String)
    wrong_type(*this, what, "an array of string");
  std::vector<std::string> out;
  out.reserve(count_);  // validated: every string takes at least 8 bytes of the encoding
  const auto* p = reinterpret_cast<const std::byte*>(encoding_.data()) + 12;
  for (std::uint64_t i = 0; i < count_; ++i) {
    const auto n = load<std::uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), n);
    p += 8 + n;
  }
  return out;
}

std::vector<std::int64_t> GgufValue::as_ints(std::string_view what) const {
  if (type_ != GgufType::Array || !is_integer(element_type_))
    wrong_type(*this, what, "an array of integers");
  const std::size_t size = scalar_size(element_type_);
  const auto* p = reinterpret_cast<const std::byte*>(encoding_.data()) + 12;
  std::vector<std::int64_t> out(count_);
  for (std::uint64_t i = 0; i < count_; ++i)
    if (!integer_at(element_type_, p + i * size, out[i]))
      throw Error(fmt::format("{}: element {} is {}, larger than the largest int64", what, i,
                              load<std::uint64_t>(p + i * size)));
  return out;
}

std::vector<double> GgufValue::as_floats(std::string_view what) const {
  if (type_ != GgufType::Array ||
      (element_type_ != GgufType::F32 && element_type_ != GgufType::F64))
    wrong_type(*this, what, "an array of float32 or float64");
  const std::size_t size = scalar_size(element_type_);
  const auto* p = reinterpret_cast<const std::byte*>(encoding_.data()) + 12;
  std::vector<double> out(count_);
  for (std::uint64_t i = 0; i < count_; ++i) out[i] = float_at(element_type_, p + i * size);
  return out;
}

// ---- tensors ----

std::int64_t GgufTensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

std::vector<std::int64_t> GgufTensorInfo::shape() const {
  return {dims.rbegin(), dims.rend()};
}

// ---- reading ----

// Parses the file front to back: header, metadata, tensor infos, then places the tensors in the
// data section. Each step checks what it reads before anything depends on it.
class GgufFile::Parser {
 public:
  Parser(GgufFile& file, const FileBytes& storage)
      : f_(file),
        what_(fmt::format("invalid GGUF file {}", file.path_.string())),
        c_({storage.data(), storage.size()}, 0, what_),
        base_(storage.data()),
        size_(storage.size()) {}

  void run() {
    const auto [n_tensors, n_metadata] = header();
    metadata(n_metadata);
    alignment();
    tensor_infos(n_tensors);
    place_tensors();
  }

 private:
  std::pair<std::uint64_t, std::uint64_t> header() {
    const std::string& path = f_.path_.string();
    if (size_ < 4 || std::memcmp(base_, "GGUF", 4) != 0) {
      std::string start;
      for (std::size_t i = 0; i < std::min<std::size_t>(size_, 4); ++i)
        start += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned>(base_[i]));
      throw Error(fmt::format("{} is not a GGUF file: it starts with bytes [{}], not the magic "
                              "'GGUF' (47 47 55 46)",
                              path, start),
                  "give the path of a .gguf model file");
    }
    (void)c_.take(4, "the magic");
    const std::uint32_t version = c_.u32("the version");
    if (version != k_gguf_version) version_error(version);
    const std::uint64_t n_tensors = c_.u64("the tensor count");
    const std::uint64_t n_metadata = c_.u64("the metadata count");
    return {n_tensors, n_metadata};
  }

  [[noreturn]] void version_error(std::uint32_t version) const {
    const std::string& path = f_.path_.string();
    if ((version & 0xffffu) == 0 && __builtin_bswap32(version) == k_gguf_version)
      throw Error(
          fmt::format("GGUF file {} is big-endian; tessera reads little-endian files only", path),
          "convert the model again without --bigendian");
    if (version == 1 || version == 2)
      throw Error(fmt::format("GGUF file {} has format version {}; tessera reads version 3 only",
                              path, version),
                  "convert the model again with a current llama.cpp (convert_hf_to_gguf.py) or "
                  "gguf-py");
    throw Error(fmt::format("GGUF file {} has format version {}, which tessera does not know (it "
                            "reads version 3)",
                            path, version),
                std::string(k_corrupt_hint));
  }

  void metadata(std::uint64_t count) {
    if (count > c_.remaining() / k_min_entry_bytes)
      c_.fail(
          fmt::format("the header claims {} metadata entries, but only {} bytes remain in the "
                      "file, room for at most {}",
                      count, c_.remaining(), c_.remaining() / k_min_entry_bytes));
    f_.metadata_.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string key(c_.string(fmt::format("the key of metadata entry {}", i)));
      if (f_.metadata_index_.contains(key))
        c_.fail(fmt::format("metadata key '{}' appears twice", key));
      const std::uint64_t at = c_.offset();
      const std::uint32_t raw = c_.u32(fmt::format("the type of metadata '{}'", key));
      const ValueTypeEntry* type = find_value_type(raw);
      if (!type)
        c_.fail(
            fmt::format("metadata '{}' has value type {} (at byte {}), which is no GGUF value "
                        "type (0-12)",
                        key, raw, at));
      std::size_t used = 0;
      const std::string value_what = fmt::format("{}: metadata '{}'", what_, key);
      GgufValue value = GgufValue::decode(type->type, c_.rest(), used, value_what, c_.offset());
      (void)c_.take(used, "a metadata value");
      f_.metadata_index_.emplace(key, f_.metadata_.size());
      f_.metadata_.push_back({std::move(key), std::move(value)});
    }
  }

  void alignment() {
    const GgufValue* v = f_.find_metadata("general.alignment");
    if (!v) return;
    if (v->type() != GgufType::U32)
      c_.fail(fmt::format("general.alignment is {}, it must be a uint32", v->describe()));
    const std::int64_t a = v->as_int("general.alignment");
    if (a == 0 || !std::has_single_bit(static_cast<std::uint64_t>(a)))
      c_.fail(fmt::format("general.alignment is {}, it must be a power of two", a));
    f_.alignment_ = static_cast<std::uint64_t>(a);
  }

  void tensor_infos(std::uint64_t count) {
    if (count > c_.remaining() / k_min_info_bytes)
      c_.fail(
          fmt::format("the header claims {} tensors, but only {} bytes remain in the file "
                      "after the metadata, room for at most {} tensor infos",
                      count, c_.remaining(), c_.remaining() / k_min_info_bytes));
    f_.tensors_.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      GgufTensorInfo t = tensor_info(i);
      if (f_.tensor_index_.contains(t.name))
        c_.fail(fmt::format("tensor '{}' appears twice", t.name));
      f_.tensor_index_.emplace(t.name, f_.tensors_.size());
      f_.tensors_.push_back(std::move(t));
    }
  }

  GgufTensorInfo tensor_info(std::uint64_t i) {
    GgufTensorInfo t;
    t.name = c_.string(fmt::format("the name of tensor {}", i));
    const std::uint32_t n_dims = c_.u32(fmt::format("the dimension count of tensor '{}'", t.name));
    if (n_dims > k_max_dims)
      c_.fail(fmt::format("tensor '{}' has {} dimensions, at most {} are allowed", t.name, n_dims,
                          k_max_dims));
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t n = c_.u64(fmt::format("dimension {} of tensor '{}'", d, t.name));
      if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        c_.fail(
            fmt::format("dimension {} of tensor '{}' is {}, larger than 2^63 - 1", d, t.name, n));
      t.dims.push_back(static_cast<std::int64_t>(n));
    }
    const std::uint64_t type_at = c_.offset();
    const std::uint32_t raw = c_.u32(fmt::format("the type of tensor '{}'", t.name));
    const GgmlTypeInfo* type = find_ggml_type(raw);
    if (!type)
      throw Error(
          fmt::format("{}: tensor '{}' has ggml type {} (at byte {}), which tessera does not "
                      "know",
                      what_, t.name, raw, type_at),
          "the file may come from a newer llama.cpp; requantize it to a common type "
          "(F16, Q8_0, Q4_K) with llama-quantize, or report the type");
    t.type = type->type;
    t.offset = c_.u64(fmt::format("the data offset of tensor '{}'", t.name));
    if (auto problem = tensor_size_problem(*type, t.dims, t.nbytes))
      c_.fail(fmt::format("tensor '{}' of type {}: {}", t.name, type->name, *problem));
    return t;
  }

  // The data section starts at the first multiple of the alignment after the tensor infos; every
  // tensor lies inside it at an aligned offset, and no two tensors overlap.
  void place_tensors() {
    const std::uint64_t a = f_.alignment_;
    f_.data_offset_ = (c_.offset() + a - 1) / a * a;
    if (f_.tensors_.empty()) return;  // no data: the file may end before the padding
    if (f_.data_offset_ > size_)
      c_.fail(
          fmt::format("truncated: the data section starts at byte {} (after the padding to the "
                      "alignment {}), but the file ends at byte {}",
                      f_.data_offset_, a, size_));
    const std::uint64_t data_size = size_ - f_.data_offset_;
    std::vector<const GgufTensorInfo*> by_offset;
    for (const auto& t : f_.tensors_) {
      if (t.offset % a != 0)
        c_.fail(
            fmt::format("tensor '{}' starts at data offset {}, not a multiple of the alignment {}",
                        t.name, t.offset, a));
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        c_.fail(
            fmt::format("tensor '{}' ({} bytes at data offset {}) runs past the end of the file: "
                        "the data section (from byte {}) holds {} bytes",
                        t.name, t.nbytes, t.offset, f_.data_offset_, data_size));
      if (t.nbytes > 0) by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const auto* x, const auto* y) { return x->offset < y->offset; });
    for (std::size_t i = 1; i < by_offset.size(); ++i)
      if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->nbytes)
        c_.fail(fmt::format("tensors '{}' and '{}' overlap in the data section",
                            by_offset[i - 1]->name, by_offset[i]->name));
  }

  GgufFile& f_;
  std::string what_;
  Cursor c_;
  const std::byte* base_;
  std::size_t size_;
};

GgufFile GgufFile::open(const std::filesystem::path& path) {
  return parse(FileBytes::map(path, "GGUF file"), path);
}

GgufFile GgufFile::from_bytes(std::string bytes, std::filesystem::path name) {
  return parse(FileBytes::own(std::move(bytes)), std::move(name));
}

GgufFile GgufFile::parse(std::shared_ptr<const FileBytes> storage, std::filesystem::path path) {
  GgufFile f;
  f.path_ = std::move(path);
  Parser(f, *storage).run();
  f.storage_ = std::move(storage);
  return f;
}

std::size_t GgufFile::file_size() const {
  return storage_->size();
}

std::string GgufFile::what(std::string_view key) const {
  return fmt::format("metadata '{}' in {}", key, path_.string());
}

const GgufValue* GgufFile::find_metadata(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufValue& GgufFile::metadata(std::string_view key) const {
  const GgufValue* v = find_metadata(key);
  if (!v)
    throw Error(fmt::format("metadata '{}' not found in {}", key, path_.string()),
                "the file was written for another model architecture or by another converter");
  return *v;
}

std::string GgufFile::get_string(std::string_view key) const {
  return metadata(key).as_string(what(key));
}
std::int64_t GgufFile::get_int(std::string_view key) const {
  return metadata(key).as_int(what(key));
}
double GgufFile::get_float(std::string_view key) const {
  return metadata(key).as_float(what(key));
}
bool GgufFile::get_bool(std::string_view key) const {
  return metadata(key).as_bool(what(key));
}
std::vector<std::string> GgufFile::get_strings(std::string_view key) const {
  return metadata(key).as_strings(what(key));
}
std::vector<std::int64_t> GgufFile::get_ints(std::string_view key) const {
  return metadata(key).as_ints(what(key));
}
std::vector<double> GgufFile::get_floats(std::string_view key) const {
  return metadata(key).as_floats(what(key));
}

const GgufTensorInfo* GgufFile::find(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find(name);
  if (!t) {
    std::vector<std::string_view> some;
    for (std::size_t i = 0; i < tensors_.size() && i < 4; ++i) some.push_back(tensors_[i].name);
    throw Error(fmt::format("tensor '{}' not found in {}", name, path_.string()),
                tensors_.empty() ? "the file holds no tensors"
                                 : fmt::format("the file holds {} tensors: {}{}", tensors_.size(),
                                               fmt::join(some, ", "),
                                               tensors_.size() > some.size() ? ", ..." : ""));
  }
  return *t;
}

std::span<const std::byte> GgufFile::bytes(const GgufTensorInfo& t) const {
  TESSERA_CHECK(data_offset_ + t.offset + t.nbytes <= storage_->size(), "tensor '{}' outside {}",
                t.name, path_.string());
  return {storage_->data() + data_offset_ + t.offset, static_cast<std::size_t>(t.nbytes)};
}

void GgufFile::dequantize(const GgufTensorInfo& t, std::span<float> out) const {
  if (!can_dequantize(t.type))
    throw Error(fmt::format("tensor '{}' in {} has type {}, which tessera cannot dequantize",
                            t.name, path_.string(), ggml_type_name(t.type)),
                fmt::format("tessera dequantizes {}; requantize the model to one of these with "
                            "llama.cpp's llama-quantize",
                            dequantizable_type_names()));
  TESSERA_CHECK(out.size() == static_cast<std::size_t>(t.numel()),
                "{} floats for tensor '{}' of {}", out.size(), t.name, t.numel());
  dequantize_row(t.type, bytes(t).data(), out.data(), t.numel());
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  if (!can_dequantize(t.type)) dequantize(t, {});  // throws the type error before allocating
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  dequantize(t, out);
  return out;
}

// ---- writing ----

void GgufWriter::set_metadata(std::string key, GgufValue value) {
  if (key.empty()) throw Error("gguf: a metadata key is empty");
  if (key == "general.alignment") {
    if (value.type() != GgufType::U32)
      throw Error(
          fmt::format("gguf: general.alignment must be a uint32, got {}", value.describe()));
    const std::int64_t a = value.as_int("general.alignment");
    if (a == 0 || !std::has_single_bit(static_cast<std::uint64_t>(a)))
      throw Error(fmt::format("gguf: general.alignment must be a power of two, got {}", a));
    alignment_ = static_cast<std::uint64_t>(a);
  }
  for (auto& m : metadata_)
    if (m.key == key) {
      m.value = std::move(value);
      return;
    }
  metadata_.push_back({std::move(key), std::move(value)});
}

std::uint64_t GgufWriter::check_tensor(const std::string& name, GgmlType type,
                                       const std::vector<std::int64_t>& dims) const {
  if (name.empty()) throw Error("gguf: a tensor name is empty");
  if (name.size() > k_max_name_bytes)
    throw Error(
        fmt::format("gguf: tensor name '{}' is {} bytes; llama.cpp reads names of at most {}", name,
                    name.size(), k_max_name_bytes));
  for (const auto& t : tensors_)
    if (t.name == name) throw Error(fmt::format("gguf: tensor '{}' added twice", name));
  std::uint64_t nbytes = 0;
  if (auto problem = tensor_size_problem(ggml_type_info(type), dims, nbytes))
    throw Error(
        fmt::format("gguf: tensor '{}' of type {}: {}", name, ggml_type_name(type), *problem));
  return nbytes;
}

void GgufWriter::add_encoded(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                             std::span<const std::byte> data) {
  const std::uint64_t nbytes = check_tensor(name, type, dims);
  if (data.size() != nbytes)
    throw Error(fmt::format("gguf: tensor '{}' of type {} and dims [{}] takes {} bytes, got {}",
                            name, ggml_type_name(type), fmt::join(dims, ", "), nbytes,
                            data.size()));
  tensors_.push_back({std::move(name), type, std::move(dims),
                      std::string(reinterpret_cast<const char*>(data.data()), data.size())});
}

void GgufWriter::add_f32(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                         std::span<const float> values) {
  if (!can_quantize(type))
    throw Error(
        fmt::format("gguf: tensor '{}': tessera cannot encode {}", name, ggml_type_name(type)),
        fmt::format("tessera encodes {}", quantizable_type_names()));
  const std::uint64_t nbytes = check_tensor(name, type, dims);
  std::int64_t numel = 1;
  for (auto d : dims) numel *= d;
  if (values.size() != static_cast<std::size_t>(numel))
    throw Error(fmt::format("gguf: tensor '{}' with dims [{}] has {} elements, got {} values", name,
                            fmt::join(dims, ", "), numel, values.size()));
  const bool f16_range = type != GgmlType::F32 && type != GgmlType::BF16;
  for (std::size_t i = 0; i < values.size() && type != GgmlType::F32; ++i) {
    const float v = values[i];
    // F16 values and the F16 scales of Q8_0/Q4_0/Q4_1 stay finite below 65520 (which rounds to
    // infinity in F16).
    const bool ok = f16_range ? std::isfinite(fp16_to_fp32(fp32_to_fp16(v)))
                              : std::isfinite(bf16_to_fp32(fp32_to_bf16(v)));
    if (!ok)
      throw Error(fmt::format("gguf: tensor '{}': value {} at index {} cannot be stored as {}",
                              name, v, i, ggml_type_name(type)),
                  f16_range
                      ? "values must be finite and below 65520 in magnitude (F16 values and scales)"
                      : "values must be finite and within the range of bfloat16");
  }
  std::string data(nbytes, '\0');
  quantize_row(type, values.data(), reinterpret_cast<std::byte*>(data.data()), numel);
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(data)});
}

std::string GgufWriter::to_bytes() const {
  std::string out = "GGUF";
  append<std::uint32_t>(out, k_gguf_version);
  append<std::uint64_t>(out, tensors_.size());
  append<std::uint64_t>(out, metadata_.size());
  for (const auto& m : metadata_) {
    append_string(out, m.key);
    append<std::uint32_t>(out, static_cast<std::uint32_t>(m.value.type()));
    out += m.value.encoding();
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    append_string(out, t.name);
    append<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) append<std::uint64_t>(out, static_cast<std::uint64_t>(d));
    append<std::uint32_t>(out, static_cast<std::uint32_t>(t.type));
    append<std::uint64_t>(out, offset);
    offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  pad_to(out, alignment_);
  for (const auto& t : tensors_) {
    out += t.data;
    pad_to(out, alignment_);
  }
  return out;
}

void GgufWriter::write(const std::filesystem::path& path) const {
  write_file_atomic(path, to_bytes());
}

// ---- Llama layout ----

namespace {

struct NamePair {
  std::string_view gguf, hf;
};
// Tensors outside the blocks, and the per-block tensors (after "blk.N." / "model.layers.N.").
constexpr NamePair k_llama_global_names[] = {
    {"token_embd", "model.embed_tokens"},
    {"output_norm", "model.norm"},
    {"output", "lm_head"},
};
constexpr NamePair k_llama_block_names[] = {
    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},
    {"attn_norm", "input_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},
    {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
    {"ffn_norm", "post_attention_layernorm"},
};

constexpr NamePair k_gpt2_global_names[] = {
    {"token_embd", "wte"},
    {"position_embd", "wpe"},
    {"output_norm", "ln_f"},
};
constexpr NamePair k_gpt2_block_names[] = {
    {"attn_norm", "ln_1"}, {"attn_qkv", "attn.c_attn"}, {"attn_output", "attn.c_proj"},
    {"ffn_norm", "ln_2"},  {"ffn_up", "mlp.c_fc"},      {"ffn_down", "mlp.c_proj"},
};

// A family's names: the tensors outside the blocks, the blocks' tensors, and the Hugging Face
// prefix of block N (GGUF's is always "blk.N.").
struct NameMap {
  std::span<const NamePair> global, block;
  std::string_view hf_block;
};
constexpr NameMap k_llama_names{k_llama_global_names, k_llama_block_names, "model.layers."};
constexpr NameMap k_gpt2_names{k_gpt2_global_names, k_gpt2_block_names, "h."};

// Splits "<base>.weight" / "<base>.bias" into base and suffix (".weight").
bool split_param_suffix(std::string_view name, std::string_view& base, std::string_view& suffix) {
  for (std::string_view s : {std::string_view(".weight"), std::string_view(".bias")})
    if (name.size() > s.size() && name.ends_with(s)) {
      base = name.substr(0, name.size() - s.size());
      suffix = s;
      return true;
    }
  return false;
}

// "12.attn_q" after a block prefix -> layer "12", rest "attn_q". Layer numbers are decimal
// without leading zeros.
bool split_layer(std::string_view s, std::string_view& layer, std::string_view& rest) {
  const std::size_t dot = s.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9) return false;
  layer = s.substr(0, dot);
  rest = s.substr(dot + 1);
  if (layer.size() > 1 && layer[0] == '0') return false;
  return std::all_of(layer.begin(), layer.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::optional<std::string> map_name(std::string_view name, const NameMap& m, bool to_hf) {
  std::string_view base, suffix;
  if (!split_param_suffix(name, base, suffix)) return std::nullopt;
  const auto from = [&](const NamePair& p) { return to_hf ? p.gguf : p.hf; };
  const auto to = [&](const NamePair& p) { return to_hf ? p.hf : p.gguf; };
  for (const auto& p : m.global)
    if (base == from(p)) return fmt::format("{}{}", to(p), suffix);
  const std::string_view block_from = to_hf ? "blk." : m.hf_block;
  const std::string_view block_to = to_hf ? m.hf_block : "blk.";
  std::string_view layer, rest;
  if (!base.starts_with(block_from) || !split_layer(base.substr(block_from.size()), layer, rest))
    return std::nullopt;
  for (const auto& p : m.block)
    if (rest == from(p)) return fmt::format("{}{}.{}{}", block_to, layer, to(p), suffix);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> llama_gguf_to_hf_name(std::string_view gguf_name) {
  return map_name(gguf_name, k_llama_names, true);
}

std::optional<std::string> llama_hf_to_gguf_name(std::string_view hf_name) {
  return map_name(hf_name, k_llama_names, false);
}

std::optional<std::string> gpt2_gguf_to_hf_name(std::string_view gguf_name) {
  return map_name(gguf_name, k_gpt2_names, true);
}

std::optional<std::string> gpt2_hf_to_gguf_name(std::string_view hf_name) {
  return map_name(hf_name, k_gpt2_names, false);
}

void permute_qk_rows(std::span<const std::byte> in, std::span<std::byte> out, std::int64_t n_head,
                     std::int64_t rows, bool to_hf) {
  if (n_head <= 0 || rows <= 0 || rows % (2 * n_head) != 0)
    throw Error(fmt::format("q/k permutation: {} rows cannot be split into {} heads of an even "
                            "head dimension",
                            rows, n_head),
                "check num_attention_heads / num_key_value_heads against the weight's shape");
  if (in.size() != out.size() || in.size() % static_cast<std::uint64_t>(rows) != 0)
    throw Error(fmt::format("q/k permutation: {} input bytes and {} output bytes for {} rows",
                            in.size(), out.size(), rows));
  const std::size_t row_bytes = in.size() / static_cast<std::size_t>(rows);
  const std::int64_t head_dim = rows / n_head, half = head_dim / 2;
  for (std::int64_t h = 0; h < n_head; ++h)
    for (std::int64_t s = 0; s < 2; ++s)
      for (std::int64_t i = 0; i < half; ++i) {
        const auto hf = static_cast<std::size_t>(h * head_dim + s * half + i);
        const auto gguf = static_cast<std::size_t>(h * head_dim + 2 * i + s);
        const std::size_t src = to_hf ? gguf : hf, dst = to_hf ? hf : gguf;
        std::memcpy(out.data() + dst * row_bytes, in.data() + src * row_bytes, row_bytes);
      }
}

namespace {
std::vector<float> permute_qk_f32(std::span<const float> w, std::int64_t n_head, std::int64_t rows,
                                  std::int64_t cols, bool to_hf) {
  if (cols < 0 || rows < 0 ||
      w.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols))
    throw Error(
        fmt::format("q/k permutation: {} values for a ({}, {}) matrix", w.size(), rows, cols));
  std::vector<float> out(w.size());
  permute_qk_rows(std::as_bytes(w), std::as_writable_bytes(std::span<float>(out)), n_head, rows,
                  to_hf);
  return out;
}
}  // namespace

std::vector<float> permute_qk_to_gguf(std::span<const float> w, std::int64_t n_head,
                                      std::int64_t rows, std::int64_t cols) {
  return permute_qk_f32(w, n_head, rows, cols, false);
}

std::vector<float> permute_qk_to_hf(std::span<const float> w, std::int64_t n_head,
                                    std::int64_t rows, std::int64_t cols) {
  return permute_qk_f32(w, n_head, rows, cols, true);
}

}  // namespace tessera::io
