#include "tessera/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

namespace tessera::io {
namespace {

constexpr std::uint64_t k_max_header_bytes = 100'000'000;  // as the reference implementation

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::size_t size;
};
constexpr DTypeEntry k_dtypes[] = {
    {DType::F64, "F64", 8},   {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},   {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
    {DType::U16, "U16", 2},   {DType::U32, "U32", 4}, {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1},
};

const DTypeEntry& entry_of(DType d) {
  for (const auto& e : k_dtypes)
    if (e.dtype == d) return e;
  TESSERA_CHECK(false, "unknown DType value {}", static_cast<int>(d));
  return k_dtypes[0];  // unreachable
}

std::string corrupt_hint() {
  return "the file is damaged or not a safetensors file; write it again or re-download it";
}

[[noreturn]] void fail_invalid(const std::filesystem::path& path, const std::string& detail) {
  throw Error(fmt::format("invalid safetensors file {}: {}", path.string(), detail),
              corrupt_hint());
}

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // +-0
    } else {        // subnormal: renormalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan (payload kept)
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// Reads a JSON value that must be a non-negative integer that fits in int64.
bool as_count(const nlohmann::json& v, std::uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<std::uint64_t>();
    return out <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  }
  if (v.is_number_integer()) {
    std::int64_t x = v.get<std::int64_t>();
    if (x < 0) return false;
    out = static_cast<std::uint64_t>(x);
    return true;
  }
  return false;
}

std::string json_type_name(const nlohmann::json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

std::string short_json(const nlohmann::json& v) {
  std::string s;
  try {
    s = v.dump();
  } catch (const nlohmann::json::exception&) {
    s = "<invalid utf-8>";
  }
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

void write_all(int fd, const void* data, std::size_t n, const std::filesystem::path& tmp) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)),
                  "is the disk full?");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

// ---- dtypes ----

std::size_t dtype_size(DType dtype) {
  return entry_of(dtype).size;
}
std::string_view dtype_name(DType dtype) {
  return entry_of(dtype).name;
}

bool parse_dtype(std::string_view name, DType& out) {
  for (const auto& e : k_dtypes)
    if (e.name == name) {
      out = e.dtype;
      return true;
    }
  return false;
}

bool is_float_dtype(DType d) {
  return d == DType::F64 || d == DType::F32 || d == DType::F16 || d == DType::BF16;
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_str(std::span<const std::int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- reading ----

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  return parse(FileBytes::map(path, "safetensors file"), path);
}

SafetensorsFile SafetensorsFile::from_bytes(std::string bytes, std::filesystem::path name) {
  return parse(FileBytes::own(std::move(bytes)), std::move(name));
}

namespace {

// The JSON header of n bytes at hbegin, an object without duplicate top-level keys (the JSON
// library would keep the last one).
nlohmann::json parse_header(const char* hbegin, std::uint64_t n,
                            const std::filesystem::path& path) {
  using nlohmann::json;
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) duplicate = k;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(hbegin, hbegin + n, cb);
  } catch (const json::exception& e) {
    fail_invalid(path, fmt::format("the header is not valid JSON ({})", library_message(e)));
  }
  if (!header.is_object())
    fail_invalid(
        path, fmt::format("the header is a JSON {}, expected an object", json_type_name(header)));
  if (!duplicate.empty()) fail_invalid(path, fmt::format("the header names '{}' twice", duplicate));
  return header;
}

// The element count and byte size of a tensor's shape, refusing overflow.
std::uint64_t tensor_bytes(const TensorInfo& t, const std::filesystem::path& p, bool overflow,
                           std::uint64_t numel) {
  const std::size_t esize = dtype_size(t.dtype);
  std::uint64_t nbytes = 0;
  // A zero dimension makes numel 0 even if an earlier product overflowed.
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
    overflow = false;
    numel = 0;
  }
  if (overflow || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<std::uint64_t>(esize), &nbytes))
    fail_invalid(p, fmt::format("shape {} of tensor '{}' is too large (element count overflows)",
                                shape_str(t.shape), t.name));
  return nbytes;
}

// The shape of tensor t (its dtype known) from the header's array js; returns its bytes.
std::uint64_t read_shape(TensorInfo& t, const nlohmann::json& js, const std::filesystem::path& p) {
  if (!js.is_array())
    fail_invalid(p, fmt::format("shape of tensor '{}' is a JSON {}, expected an array", t.name,
                                json_type_name(js)));
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : js) {
    std::uint64_t dim = 0;
    if (!as_count(d, dim))
      fail_invalid(p, fmt::format("shape of tensor '{}' has dimension {}, expected a "
                                  "non-negative integer",
                                  t.name, short_json(d)));
    t.shape.push_back(static_cast<std::int64_t>(dim));
    if (!overflow && __builtin_mul_overflow(numel, dim, &numel)) overflow = true;
  }
  return tensor_bytes(t, p, overflow, numel);
}

// The data offsets of tensor t from the header's jo: inside a data region of data_size bytes,
// and nbytes long.
void read_offsets(TensorInfo& t, const nlohmann::json& jo, std::size_t data_size,
                  std::uint64_t nbytes, const std::filesystem::path& p) {
  std::uint64_t b = 0, e = 0;
  if (!jo.is_array() || jo.size() != 2 || !as_count(jo[0], b) || !as_count(jo[1], e))
    fail_invalid(p, fmt::format("data_offsets of tensor '{}' is {}, expected [begin, end] with "
                                "non-negative integers",
                                t.name, short_json(jo)));
  if (b > e)
    fail_invalid(p, fmt::format("data_offsets of tensor '{}' are [{}, {}]: begin is after end",
                                t.name, b, e));
  if (e > data_size)
    fail_invalid(p, fmt::format("data_offsets of tensor '{}' are [{}, {}], outside the data "
                                "region of {} bytes (is the file truncated?)",
                                t.name, b, e, data_size));
  if (e - b != nbytes)
    fail_invalid(p, fmt::format("tensor '{}' has {} bytes of data but dtype {} and shape {} need "
                                "{}",
                                t.name, e - b, dtype_name(t.dtype), shape_str(t.shape), nbytes));
  t.begin = static_cast<std::size_t>(b);
  t.end = static_cast<std::size_t>(e);
}

// One tensor entry of the header: dtype, shape, and data offsets inside a data region of
// data_size bytes that match the dtype and shape.
TensorInfo read_tensor_entry(const std::string& name, const nlohmann::json& v,
                             std::size_t data_size, const std::filesystem::path& p) {
  if (!v.is_object())
    fail_invalid(p, fmt::format("entry '{}' is a JSON {}, expected an object with dtype, shape "
                                "and data_offsets",
                                name, json_type_name(v)));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) fail_invalid(p, fmt::format("tensor '{}' has no {}", name, field));
  TensorInfo t;
  t.name = name;
  const auto& jd = v["dtype"];
  if (!jd.is_string())
    fail_invalid(p, fmt::format("dtype of tensor '{}' is a JSON {}, expected a string", name,
                                json_type_name(jd)));
  if (!parse_dtype(jd.get_ref<const std::string&>(), t.dtype))
    fail_invalid(p, fmt::format("tensor '{}' has unknown dtype {}", name, short_json(jd)));
  const std::uint64_t nbytes = read_shape(t, v["shape"], p);
  read_offsets(t, v["data_offsets"], data_size, nbytes, p);
  return t;
}

// File order = order in the data region. The tensors must tile it exactly, as the reference
// implementation requires: no overlaps, no holes, nothing after the last tensor.
void check_tiling(std::vector<TensorInfo>& tensors, std::size_t data_size,
                  const std::filesystem::path& p) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t expect = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : tensors) {
    if (t.begin < expect)
      fail_invalid(
          p, fmt::format("tensors '{}' and '{}' overlap in the data region", prev->name, t.name));
    if (t.begin > expect)
      fail_invalid(p, fmt::format("bytes [{}, {}) of the data region belong to no tensor (before "
                                  "'{}')",
                                  expect, t.begin, t.name));
    expect = t.end;
    prev = &t;
  }
  if (expect != data_size)
    fail_invalid(p, fmt::format("the data region has {} bytes but the tensors cover only {}",
                                data_size, expect));
}

}  // namespace

SafetensorsFile SafetensorsFile::parse(std::shared_ptr<const FileBytes> storage,
                                       std::filesystem::path path) {
  const std::size_t size = storage->size();
  const std::byte* base = storage->data();
  if (size < 8)
    fail_invalid(path,
                 fmt::format("the file is {} bytes, shorter than the 8-byte header length", size));
  const std::uint64_t n = load<std::uint64_t>(base);
  if (n > k_max_header_bytes)
    fail_invalid(path, fmt::format("header length {} is larger than the {} byte limit", n,
                                   k_max_header_bytes));
  if (n > size - 8)
    fail_invalid(path,
                 fmt::format("header length {} runs past the end of the file ({} bytes)", n, size));
  if (n < 2) fail_invalid(path, fmt::format("header length {} is too short for a JSON object", n));
  const nlohmann::json header = parse_header(reinterpret_cast<const char*>(base + 8), n, path);

  SafetensorsFile f;
  f.path_ = std::move(path);
  f.data_ = base + 8 + n;
  f.data_size_ = size - 8 - static_cast<std::size_t>(n);
  const auto& p = f.path_;
  for (const auto& [name, v] : header.items()) {
    if (name != "__metadata__") {
      f.tensors_.push_back(read_tensor_entry(name, v, f.data_size_, p));
      continue;
    }
    if (!v.is_object())
      fail_invalid(p, fmt::format("__metadata__ is a JSON {}, expected an object of strings",
                                  json_type_name(v)));
    for (const auto& [mk, mv] : v.items()) {
      if (!mv.is_string())
        fail_invalid(p, fmt::format("__metadata__ value for '{}' is a JSON {}, expected a string",
                                    mk, json_type_name(mv)));
      f.metadata_[mk] = mv.get<std::string>();
    }
  }
  check_tiling(f.tensors_, f.data_size_, p);
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  f.storage_ = std::move(storage);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::require(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) {
    std::string hint = "the file holds no tensors";
    if (!tensors_.empty()) {
      std::vector<std::string_view> some;
      for (std::size_t i = 0; i < tensors_.size() && i < 4; ++i) some.push_back(tensors_[i].name);
      hint = fmt::format("the file holds {} tensors: {}{}", tensors_.size(), fmt::join(some, ", "),
                         tensors_.size() > some.size() ? ", ..." : "");
    }
    throw Error(fmt::format("tensor '{}' not found in {}", name, path_.string()), hint);
  }
  return *t;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  TESSERA_CHECK(t.begin <= t.end && t.end <= data_size_, "tensor '{}' outside {}", t.name,
                path_.string());
  return {data_ + t.begin, t.end - t.begin};
}

namespace {
void convert_to_f32(const TensorInfo& t, std::span<const std::byte> src, float* out,
                    const std::filesystem::path& path) {
  const std::size_t n = static_cast<std::size_t>(t.numel());
  const std::byte* s = src.data();
  switch (t.dtype) {
    case DType::F32:
      if (n) std::memcpy(out, s, n * 4);
      return;
    case DType::F16:
      for (std::size_t i = 0; i < n; ++i) out[i] = half_to_float(load<std::uint16_t>(s + 2 * i));
      return;
    case DType::BF16:
      for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(load<std::uint16_t>(s + 2 * i));
      return;
    case DType::F64:
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<double>(s + 8 * i));
      return;
    default:
      throw Error(fmt::format("tensor '{}' in {} has dtype {}, expected a float type", t.name,
                              path.string(), dtype_name(t.dtype)),
                  "this tensor holds integers; it cannot be loaded as weights");
  }
}
}  // namespace

void SafetensorsFile::read_f32(std::string_view name, std::span<const std::int64_t> expected_shape,
                               float* out) const {
  const TensorInfo& t = require(name);
  if (!std::equal(t.shape.begin(), t.shape.end(), expected_shape.begin(), expected_shape.end()))
    throw Error(fmt::format("shape mismatch for '{}' in {}: file has {}, expected {}", name,
                            path_.string(), shape_str(t.shape), shape_str(expected_shape)),
                "the checkpoint was written for a different model configuration");
  convert_to_f32(t, bytes(t), out, path_);
}

std::vector<float> SafetensorsFile::read_f32(std::string_view name) const {
  const TensorInfo& t = require(name);
  if (!is_float_dtype(t.dtype)) convert_to_f32(t, {}, nullptr, path_);  // throws the dtype error
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  convert_to_f32(t, bytes(t), out.data(), path_);
  return out;
}

std::vector<std::int64_t> SafetensorsFile::read_i64(std::string_view name) const {
  const TensorInfo& t = require(name);
  const std::size_t n = static_cast<std::size_t>(t.numel());
  const std::byte* s = bytes(t).data();
  std::vector<std::int64_t> out(n);
  switch (t.dtype) {
    case DType::I64:
      if (n) std::memcpy(out.data(), s, n * 8);
      break;
    case DType::I32:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::int32_t>(s + 4 * i);
      break;
    case DType::I16:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::int16_t>(s + 2 * i);
      break;
    case DType::I8:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::int8_t>(s + i);
      break;
    case DType::U8:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::uint8_t>(s + i);
      break;
    case DType::BOOL:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::uint8_t>(s + i) != 0;
      break;
    case DType::U16:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::uint16_t>(s + 2 * i);
      break;
    case DType::U32:
      for (std::size_t i = 0; i < n; ++i) out[i] = load<std::uint32_t>(s + 4 * i);
      break;
    case DType::U64:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint64_t v = load<std::uint64_t>(s + 8 * i);
        if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          throw Error(
              fmt::format("tensor '{}' in {} holds U64 value {} at index {}, too large "
                          "for int64",
                          name, path_.string(), v, i));
        out[i] = static_cast<std::int64_t>(v);
      }
      break;
    default:
      throw Error(fmt::format("tensor '{}' in {} has dtype {}, expected an integer type", name,
                              path_.string(), dtype_name(t.dtype)));
  }
  return out;
}

// ---- writing ----

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<std::int64_t> shape,
                            const void* data, std::size_t nbytes) {
  if (name.empty()) throw Error("safetensors: tensor name is empty");
  if (name == "__metadata__")
    throw Error("safetensors: '__metadata__' is reserved and cannot name a tensor");
  for (const auto& e : entries_)
    if (e.name == name) throw Error(fmt::format("safetensors: tensor '{}' added twice", name));
  std::uint64_t numel = 1;
  for (auto d : shape) {
    if (d < 0)
      throw Error(fmt::format("safetensors: tensor '{}' has negative dimension in shape {}", name,
                              shape_str(shape)));
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel))
      throw Error(
          fmt::format("safetensors: shape {} of tensor '{}' overflows", shape_str(shape), name));
  }
  std::uint64_t expect = 0;
  if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dtype_size(dtype)), &expect) ||
      expect != nbytes)
    throw Error(
        fmt::format("safetensors: tensor '{}' with dtype {} and shape {} needs {} bytes, "
                    "got {}",
                    name, dtype_name(dtype), shape_str(shape), expect, nbytes));
  TESSERA_CHECK(nbytes == 0 || data != nullptr, "null data for tensor '{}'", name);
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), data, nbytes, nullptr});
}

void SafetensorsWriter::add_copy(std::string name, DType dtype, std::vector<std::int64_t> shape,
                                 const void* data, std::size_t nbytes) {
  auto owned = std::make_shared<std::vector<std::byte>>(nbytes);
  if (nbytes) std::memcpy(owned->data(), data, nbytes);
  add(std::move(name), dtype, std::move(shape), owned->data(), nbytes);
  entries_.back().owned = std::move(owned);
}

void SafetensorsWriter::add_f32(std::string name, std::vector<std::int64_t> shape,
                                const float* data) {
  std::uint64_t numel = 1;
  for (auto d : shape)
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel)) {
      numel = 0;
      break;
    }
  std::uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, std::uint64_t{4}, &nbytes)) nbytes = 0;
  add(std::move(name), DType::F32, std::move(shape), data, static_cast<std::size_t>(nbytes));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::layout() const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  return order;
}

std::string SafetensorsWriter::header(const std::vector<const Entry*>& order) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    auto& m = h["__metadata__"];
    m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
  }
  std::size_t offset = 0;
  for (const Entry* e : order) {
    nlohmann::ordered_json t;
    t["dtype"] = dtype_name(e->dtype);
    t["shape"] = nlohmann::ordered_json::array();
    for (auto d : e->shape) t["shape"].push_back(d);
    t["data_offsets"] = {offset, offset + e->nbytes};
    offset += e->nbytes;
    h[e->name] = std::move(t);
  }
  std::string s;
  try {
    s = h.dump();
  } catch (const nlohmann::json::exception& ex) {
    throw Error(fmt::format("safetensors: cannot encode the header: {}", library_message(ex)),
                "tensor names and metadata must be valid UTF-8");
  }
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

std::string SafetensorsWriter::to_bytes() const {
  auto order = layout();
  std::string h = header(order);
  std::uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += h;
  for (const Entry* e : order) out.append(static_cast<const char*>(e->data), e->nbytes);
  return out;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  auto order = layout();
  std::string h = header(order);
  std::uint64_t n = h.size();

  auto tmp = path;
  tmp += fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)),
                "check that the directory exists and is writable");
  try {
    write_all(fd, &n, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    for (const Entry* e : order) write_all(fd, e->data, e->nbytes, tmp);
    if (::fsync(fd) != 0)
      throw Error(fmt::format("cannot flush {}: {}", tmp.string(), std::strerror(errno)),
                  "is the disk full?");
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot close {}: {}", tmp.string(), std::strerror(err)));
  }
  commit_temp_file(tmp, path);
}

}  // namespace tessera::io
