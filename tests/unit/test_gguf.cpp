// GGUF reader, writer, block formats and llama layout helpers.
//
// The reference values come from gguf-py (llama.cpp's own Python reader/writer), committed in
// tests/fixtures/gguf/ by tools/gguf_fixture.py: reference.gguf (metadata of every type, a
// tensor per ggml type tessera reads) and reference.expected.safetensors (gguf-py's dequantized
// values of each tensor and the fp32 sources it quantized). tessera's block formats evaluate
// gguf-py's formulas in the same order, in fp32, without fused multiply-adds, so every
// comparison with gguf-py below is exact (bit for bit), not within a tolerance.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/safetensors.hpp"

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

const fs::path k_dir = fs::path(TESSERA_FIXTURES) / "gguf";

// The tensors of the writer's fixture: what tessera encodes, from gguf-py's fp32 sources.
const char* const k_writable[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};
constexpr std::uint32_t k_written_alignment = 64;

GgmlType type_of(std::string_view name) {
  for (std::uint32_t n = 0; n < 64; ++n)
    if (const GgmlTypeInfo* t = find_ggml_type(n)) {
      std::string lower(t->name);
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(ch));
      if (lower == name) return t->type;
    }
  throw std::runtime_error(std::string("no ggml type ") + std::string(name));
}

const GgufFile& reference() {
  static const GgufFile f = GgufFile::open(k_dir / "reference.gguf");
  return f;
}
const SafetensorsFile& expected() {
  static const SafetensorsFile f = SafetensorsFile::open(k_dir / "reference.expected.safetensors");
  return f;
}

std::vector<std::int64_t> dims_of(const SafetensorsFile& st, const std::string& name) {
  const auto& shape = st.find(name)->shape;
  return {shape.rbegin(), shape.rend()};  // row-major shape -> GGUF dims (innermost first)
}

std::string bytes_of(std::span<const std::byte> s) {
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

using tessera::test::expect_error;

void expect_invalid(const std::string& bytes, const std::string& needle) {
  expect_error([&] { GgufFile::from_bytes(bytes, "bad.gguf"); }, needle);
}

// The metadata of reference.gguf, built with tessera's GgufValue factories (the values of
// METADATA in tools/gguf_fixture.py).
std::vector<GgufMetadata> fixture_metadata() {
  const std::uint8_t u8s[] = {1, 2, 255};
  const std::int8_t i8s[] = {-128, 0, 127};
  const std::uint16_t u16s[] = {0, 65535};
  const std::int16_t i16s[] = {-32768, 32767};
  const std::uint32_t u32s[] = {7, 4294967295u};
  const std::int32_t i32s[] = {std::numeric_limits<std::int32_t>::min(), 1, 2147483647};
  const std::uint64_t u64s[] = {0, std::numeric_limits<std::uint64_t>::max()};
  const std::int64_t i64s[] = {std::numeric_limits<std::int64_t>::min(),
                               std::numeric_limits<std::int64_t>::max()};
  const float f32s[] = {0.5f, -1.25f, 1e-3f};
  const double f64s[] = {1e300, -2.5e-300};
  const bool bools[] = {true, false, true};
  const std::string strings[] = {"a", "", "\u00fcn\u00efcode", "with space"};
  return {
      {"general.architecture", GgufValue::string("llama")},
      {"general.name", GgufValue::string("tessera gguf fixture")},
      {"test.u8", GgufValue::u8(200)},
      {"test.i8", GgufValue::i8(-100)},
      {"test.u16", GgufValue::u16(60000)},
      {"test.i16", GgufValue::i16(-30000)},
      {"test.u32", GgufValue::u32(4000000000u)},
      {"test.i32", GgufValue::i32(-2000000000)},
      {"test.u64", GgufValue::u64((1ull << 63) + 5)},
      {"test.i64", GgufValue::i64(-(1ll << 62) - 3)},
      {"test.f32", GgufValue::f32(3.14159f)},
      {"test.f64", GgufValue::f64(2.718281828459045)},
      {"test.bool", GgufValue::boolean(true)},
      {"test.string", GgufValue::string("h\u00e9llo, w\u00f6rld")},
      {"test.empty_string", GgufValue::string("")},
      {"test.array.u8", GgufValue::array_u8(u8s)},
      {"test.array.i8", GgufValue::array_i8(i8s)},
      {"test.array.u16", GgufValue::array_u16(u16s)},
      {"test.array.i16", GgufValue::array_i16(i16s)},
      {"test.array.u32", GgufValue::array_u32(u32s)},
      {"test.array.i32", GgufValue::array_i32(i32s)},
      {"test.array.u64", GgufValue::array_u64(u64s)},
      {"test.array.i64", GgufValue::array_i64(i64s)},
      {"test.array.f32", GgufValue::array_f32(f32s)},
      {"test.array.f64", GgufValue::array_f64(f64s)},
      {"test.array.bool", GgufValue::array_bool(bools)},
      {"test.array.string", GgufValue::array_string(strings)},
      {"llama.block_count", GgufValue::u32(2)},
  };
}

// tessera_written.gguf: the fixture metadata, alignment 64, and every writable type encoded by
// tessera from gguf-py's fp32 sources.
std::string tessera_written_bytes() {
  GgufWriter w;
  for (auto& m : fixture_metadata()) w.set_metadata(m.key, m.value);
  w.set_metadata("general.alignment", GgufValue::u32(k_written_alignment));
  for (const char* name : k_writable) {
    const std::string src = std::string("source.") + name;
    w.add_f32(name, type_of(name), dims_of(expected(), src), expected().read_f32(src));
  }
  return w.to_bytes();
}

// ---- raw bytes for malformed files ----

struct Raw {
  std::string b;
  Raw& u32(std::uint32_t v) {
    b.append(reinterpret_cast<const char*>(&v), 4);
    return *this;
  }
  Raw& u64(std::uint64_t v) {
    b.append(reinterpret_cast<const char*>(&v), 8);
    return *this;
  }
  Raw& str(std::string_view s) {
    u64(s.size());
    b.append(s);
    return *this;
  }
  Raw& pad(std::size_t alignment = 32) {
    b.append((alignment - b.size() % alignment) % alignment, '\0');
    return *this;
  }
};

Raw header(std::uint64_t n_tensors, std::uint64_t n_metadata, std::uint32_t version = 3) {
  Raw r;
  r.b = "GGUF";
  return r.u32(version).u64(n_tensors).u64(n_metadata);
}

// A file with one tensor info and `data` as the data section.
std::string one_tensor(std::uint32_t type, std::vector<std::uint64_t> dims, std::uint64_t offset,
                       const std::string& data) {
  Raw r = header(1, 0);
  r.str("t").u32(static_cast<std::uint32_t>(dims.size()));
  for (auto d : dims) r.u64(d);
  r.u32(type).u64(offset).pad();
  r.b += data;
  return r.b;
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("tessera_gguf_{}_{}", ::getpid(), info ? info->name() : "x");
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

// ---- block formats and conversions ----

TEST(GgufQuants, BlockSizesAreGgmls) {
  struct Want {
    GgmlType type;
    std::int64_t block, bytes;
  };
  for (Want w : {Want{GgmlType::F32, 1, 4},
                 {GgmlType::F16, 1, 2},
                 {GgmlType::BF16, 1, 2},
                 {GgmlType::Q4_0, 32, 18},
                 {GgmlType::Q4_1, 32, 20},
                 {GgmlType::Q5_0, 32, 22},
                 {GgmlType::Q5_1, 32, 24},
                 {GgmlType::Q8_0, 32, 34},
                 {GgmlType::Q4_K, 256, 144},
                 {GgmlType::Q5_K, 256, 176},
                 {GgmlType::Q6_K, 256, 210},
                 {GgmlType::Q2_K, 256, 84},
                 {GgmlType::Q3_K, 256, 110}}) {
    EXPECT_EQ(ggml_type_info(w.type).block_size, w.block) << ggml_type_name(w.type);
    EXPECT_EQ(ggml_type_info(w.type).block_bytes, w.bytes) << ggml_type_name(w.type);
    EXPECT_TRUE(can_dequantize(w.type));
  }
  EXPECT_EQ(find_ggml_type(4), nullptr);  // removed from ggml (Q4_2)
  EXPECT_EQ(find_ggml_type(1000), nullptr);
  EXPECT_FALSE(can_dequantize(GgmlType::Q8_1));
  EXPECT_FALSE(can_quantize(GgmlType::Q4_K));
}

TEST(GgufQuants, HalfRoundTripsEveryValue) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<std::uint16_t>(h));
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
    else
      ASSERT_EQ(fp32_to_fp16(f), h) << "half bits " << h;
    const float b = bf16_to_fp32(static_cast<std::uint16_t>(h));
    if (std::isnan(b))
      EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(b))));
    else
      ASSERT_EQ(fp32_to_bf16(b), h) << "bf16 bits " << h;
  }
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
}

#if defined(__FLT16_MAX__)
// The compiler's own float -> _Float16 conversion rounds to nearest even: compare on a spread of
// every exponent and many mantissas (a prime stride through all 2^32 patterns).
TEST(GgufQuants, HalfRoundingMatchesTheCompilers) {
  for (std::uint64_t bits = 0; bits < (1ull << 32); bits += 2053) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (std::isnan(f)) continue;
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(fp32_to_fp16(f), want) << "float bits " << bits;
  }
}
#endif

// ---- the fixture: gguf-py's values ----

TEST(GgufFixture, HeaderAndTensorInfos) {
  const GgufFile& f = reference();
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  ASSERT_EQ(f.tensors().size(), 13u);
  const GgufTensorInfo& q4k = f.tensor("q4_k");
  EXPECT_EQ(q4k.type, GgmlType::Q4_K);
  EXPECT_EQ(q4k.dims, (std::vector<std::int64_t>{512, 2}));
  EXPECT_EQ(q4k.shape(), (std::vector<std::int64_t>{2, 512}));
  EXPECT_EQ(q4k.nbytes, 4u * 144u);
  EXPECT_EQ(f.bytes(q4k).size(), 576u);
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_EQ(t.shape(), expected().find("dequant." + t.name)->shape) << t.name;
  }
  EXPECT_EQ(f.find("nope"), nullptr);
  expect_error([&] { (void)f.tensor("nope"); }, "tensor 'nope' not found");
}

TEST(GgufFixture, DequantizesEveryTypeBitExactlyAsGgufPy) {
  const GgufFile& f = reference();
  for (const auto& t : f.tensors()) {
    SCOPED_TRACE(t.name + " " + std::string(ggml_type_name(t.type)));
    const std::vector<float> got = f.dequantize(t);
    const std::vector<float> want = expected().read_f32("dequant." + t.name);
    ASSERT_EQ(got.size(), want.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
        if (++differ <= 3) ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
      }
    EXPECT_EQ(differ, 0u);
  }
}

// quantize_row from gguf-py's fp32 sources gives the bytes gguf-py wrote (F32, F16, BF16 and the
// reference rounding of Q8_0, Q4_0, Q4_1), including zero and constant blocks and f16 ties.
TEST(GgufFixture, QuantizesAsGgufPy) {
  const GgufFile& f = reference();
  for (const char* name : k_writable) {
    SCOPED_TRACE(name);
    const GgufTensorInfo& t = f.tensor(name);
    const std::vector<float> src = expected().read_f32(std::string("source.") + name);
    std::string got(t.nbytes, '\0');
    quantize_row(t.type, src.data(), reinterpret_cast<std::byte*>(got.data()), t.numel());
    EXPECT_EQ(got, bytes_of(f.bytes(t)));
  }
}

TEST(GgufFixture, MetadataOfEveryTypeEncodesAsGgufPy) {
  const GgufFile& f = reference();
  const auto want = fixture_metadata();
  ASSERT_EQ(f.metadata().size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].key, want[i].key);
    EXPECT_EQ(f.metadata()[i].value, want[i].value)
        << want[i].key << ": file has " << f.metadata()[i].value.describe();
  }
}

TEST(GgufFixture, TypedGetters) {
  const GgufFile& f = reference();
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("test.string"), "h\u00e9llo, w\u00f6rld");
  EXPECT_EQ(f.get_string("test.empty_string"), "");
  EXPECT_EQ(f.get_int("test.u8"), 200);
  EXPECT_EQ(f.get_int("test.i8"), -100);
  EXPECT_EQ(f.get_int("test.u16"), 60000);
  EXPECT_EQ(f.get_int("test.i16"), -30000);
  EXPECT_EQ(f.get_int("test.u32"), 4000000000);
  EXPECT_EQ(f.get_int("test.i32"), -2000000000);
  EXPECT_EQ(f.get_int("test.i64"), -(1ll << 62) - 3);
  EXPECT_EQ(f.get_float("test.f32"), static_cast<double>(3.14159f));
  EXPECT_EQ(f.get_float("test.f64"), 2.718281828459045);
  EXPECT_TRUE(f.get_bool("test.bool"));
  EXPECT_EQ(f.get_ints("test.array.u8"), (std::vector<std::int64_t>{1, 2, 255}));
  EXPECT_EQ(f.get_ints("test.array.i16"), (std::vector<std::int64_t>{-32768, 32767}));
  EXPECT_EQ(f.get_ints("test.array.i64"),
            (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(),
                                       std::numeric_limits<std::int64_t>::max()}));
  EXPECT_EQ(f.get_floats("test.array.f32"),
            (std::vector<double>{0.5, -1.25, static_cast<double>(1e-3f)}));
  EXPECT_EQ(f.get_floats("test.array.f64"), (std::vector<double>{1e300, -2.5e-300}));
  EXPECT_EQ(f.get_strings("test.array.string"),
            (std::vector<std::string>{"a", "", "\u00fcn\u00efcode", "with space"}));
  EXPECT_EQ(f.metadata("test.array.bool").describe(), "array of 3 bool");
  EXPECT_EQ(f.find_metadata("test.missing"), nullptr);

  expect_error([&] { f.get_int("test.missing"); }, "metadata 'test.missing' not found in");
  expect_error([&] { f.get_string("test.u32"); },
               "metadata 'test.u32' in " + f.path().string() + " is uint32, expected a string");
  expect_error([&] { f.get_int("test.f32"); }, "is float32, expected an integer");
  expect_error([&] { f.get_float("test.i32"); }, "is int32, expected a float32 or float64");
  expect_error([&] { f.get_bool("test.u8"); }, "is uint8, expected a bool");
  expect_error([&] { f.get_int("test.u64"); }, "9223372036854775813, larger than the largest");
  expect_error([&] { f.get_strings("test.array.i32"); },
               "is array of 3 int32, expected an array of string");
  expect_error([&] { f.get_ints("test.array.u64"); }, "element 1 is 18446744073709551615");
  expect_error([&] { f.get_floats("test.string"); }, "is string, expected an array of float");
}

// tessera_written.gguf is what tessera's writer makes of gguf-py's sources; tools/gguf_fixture.py
// check reads it with gguf-py (values, bytes against gguf-py's own quantization, and gguf-py's
// writer producing the identical file). Regenerate with TESSERA_UPDATE_FIXTURES=1.
TEST(GgufFixture, WriterOutputMatchesCommittedFile) {
  const std::string bytes = tessera_written_bytes();
  const fs::path path = k_dir / "tessera_written.gguf";
  if (std::getenv("TESSERA_UPDATE_FIXTURES")) write_file_atomic(path, bytes);
  EXPECT_EQ(bytes, read_file(path)) << "tessera's GGUF output changed; if intended, regenerate "
                                       "with TESSERA_UPDATE_FIXTURES=1 and run "
                                       "tools/gguf_fixture.py check";
  const GgufFile f = GgufFile::from_bytes(bytes, "written.gguf");
  EXPECT_EQ(f.alignment(), k_written_alignment);
  for (const char* name : k_writable) {
    SCOPED_TRACE(name);
    EXPECT_EQ(f.tensor(name).offset % k_written_alignment, 0u);
    EXPECT_EQ(bytes_of(f.bytes(f.tensor(name))),
              bytes_of(reference().bytes(reference().tensor(name))));
  }
}

// The fuzz target's seeds (gguf-py files, one per type) are valid and dequantize.
TEST(GgufFixture, FuzzSeedsLoad) {
  int n = 0;
  for (const auto& e :
       fs::directory_iterator(fs::path(TESSERA_FIXTURES) / ".." / "fuzz" / "corpus" / "gguf")) {
    SCOPED_TRACE(e.path().string());
    const GgufFile f = GgufFile::open(e.path());
    for (const auto& t : f.tensors())
      EXPECT_EQ(f.dequantize(t).size(), static_cast<std::size_t>(t.numel()));
    ++n;
  }
  EXPECT_GE(n, 12);
}

// ---- round trips ----

TEST(GgufRoundTrip, CopyingAParsedFileGivesTheSameBytes) {
  const GgufFile& f = reference();
  GgufWriter w;
  for (const auto& m : f.metadata()) w.set_metadata(m.key, m.value);
  for (const auto& t : f.tensors()) w.add_encoded(t.name, t.type, t.dims, f.bytes(t));
  // tessera lays a file out as gguf-py does: the copy is the file, byte for byte.
  const std::string bytes = w.to_bytes();
  EXPECT_EQ(bytes, read_file(k_dir / "reference.gguf"));

  TempDir dir;
  w.write(dir.path() / "copy.gguf");
  const GgufFile back = GgufFile::open(dir.path() / "copy.gguf");
  ASSERT_EQ(back.metadata().size(), f.metadata().size());
  for (std::size_t i = 0; i < f.metadata().size(); ++i) {
    EXPECT_EQ(back.metadata()[i].key, f.metadata()[i].key);
    EXPECT_EQ(back.metadata()[i].value, f.metadata()[i].value);
  }
  ASSERT_EQ(back.tensors().size(), f.tensors().size());
  for (std::size_t i = 0; i < f.tensors().size(); ++i) {
    EXPECT_EQ(back.tensors()[i].name, f.tensors()[i].name);
    EXPECT_EQ(back.tensors()[i].dims, f.tensors()[i].dims);
    EXPECT_EQ(bytes_of(back.bytes(back.tensors()[i])), bytes_of(f.bytes(f.tensors()[i])));
  }
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename(), "copy.gguf");  // no temporary left behind
}

// Dequantizing and encoding again is the identity for F32, F16, BF16 and Q8_0 blocks made by the
// reference quantizer (the largest |q| is 127, so the scale is recovered exactly: 127 * d is exact
// in fp32 for an 11-bit d, and so is its division by 127).
TEST(GgufRoundTrip, ReencodingDequantizedValuesIsBitExact) {
  const GgufFile& f = reference();
  GgufWriter w;
  for (const char* name : {"f32", "f16", "bf16", "q8_0"}) {
    const GgufTensorInfo& t = f.tensor(name);
    w.add_f32(name, t.type, t.dims, f.dequantize(t));
  }
  const GgufFile back = GgufFile::from_bytes(w.to_bytes(), "reencoded.gguf");
  for (const char* name : {"f32", "f16", "bf16", "q8_0"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(bytes_of(back.bytes(back.tensor(name))), bytes_of(f.bytes(f.tensor(name))));
  }
}

TEST(GgufRoundTrip, EmptyFileAndZeroSizedTensor) {
  GgufWriter w;
  w.add_encoded("empty", GgmlType::Q4_0, {32, 0}, {});
  const GgufFile f = GgufFile::from_bytes(w.to_bytes(), "empty.gguf");
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensor("empty").numel(), 0);
  EXPECT_TRUE(f.dequantize(f.tensor("empty")).empty());
  const GgufFile none = GgufFile::from_bytes(GgufWriter().to_bytes(), "none.gguf");
  EXPECT_TRUE(none.tensors().empty());
  EXPECT_TRUE(none.metadata().empty());
}

// ---- bad input ----

TEST(GgufBadInput, WrongMagic) {
  expect_invalid("", "bad.gguf is not a GGUF file: it starts with bytes [], not the magic");
  expect_invalid("PK\x03\x04 zip",
                 "bad.gguf is not a GGUF file: it starts with bytes [50 4b 03 04]");
  expect_invalid("GGML" + std::string(20, '\0'), "not a GGUF file");
}

TEST(GgufBadInput, UnsupportedVersion) {
  expect_invalid(header(0, 0, 2).b,
                 "GGUF file bad.gguf has format version 2; tessera reads version 3 only");
  expect_invalid(header(0, 0, 1).b, "format version 1");
  expect_invalid(header(0, 0, 4).b, "format version 4, which tessera does not know");
  expect_invalid(header(0, 0, 0x03000000).b, "GGUF file bad.gguf is big-endian");
}

TEST(GgufBadInput, UnknownTensorType) {
  expect_invalid(one_tensor(99, {32}, 0, std::string(32, '\0')),
                 "invalid GGUF file bad.gguf: tensor 't' has ggml type 99 (at byte");
  expect_invalid(one_tensor(4, {32}, 0, std::string(32, '\0')), "ggml type 4");
}

TEST(GgufBadInput, TruncatedAnywhere) {
  const std::string good = read_file(k_dir / "reference.gguf");
  const GgufFile& f = reference();
  std::uint64_t data_end = 0;
  for (const auto& t : f.tensors())
    data_end = std::max(data_end, f.data_offset() + t.offset + t.nbytes);
  for (std::size_t n = 0; n < good.size(); ++n) {
    if (n >= data_end) {  // only the last tensor's padding is cut: still a whole file
      EXPECT_NO_THROW(GgufFile::from_bytes(good.substr(0, n), "cut.gguf"));
      continue;
    }
    try {
      GgufFile::from_bytes(good.substr(0, n), "cut.gguf");
      ADD_FAILURE() << "a file cut to " << n << " bytes loaded";
    } catch (const Error& e) {
      const std::string what = e.what();
      ASSERT_NE(what.find("cut.gguf"), std::string::npos) << what;
      if (n >= 4) {  // past the magic: the message says what is cut
        EXPECT_TRUE(what.find("truncated") != std::string::npos ||
                    what.find("remain in the file") != std::string::npos ||
                    what.find("past the end of the file") != std::string::npos)
            << n << ": " << what;
      }
    }
  }
  expect_invalid(
      header(0, 0).b.substr(0, 10),
      "truncated: the tensor count at byte 8 needs 8 bytes, but the file ends at byte 10");
}

TEST(GgufBadInput, TensorDataPastTheEnd) {
  expect_invalid(one_tensor(0, {8}, 0, std::string(31, '\0') /* 32 needed */),
                 "tensor 't' (32 bytes at data offset 0) runs past the end of the file");
  expect_invalid(one_tensor(0, {8}, 64, std::string(64, '\0')), "at data offset 64) runs past");
  expect_invalid(one_tensor(0, {8}, ~0ull & ~31ull, std::string(64, '\0')), "runs past the end");
  // A zero-sized tensor still needs the data section to start inside the file.
  expect_invalid(
      header(1, 0).str("e").u32(1).u64(0).u32(0).u64(0).b,
      "truncated: the data section starts at byte 64 (after the padding to the alignment "
      "32), but the file ends at byte 57");
  expect_invalid(one_tensor(0, {8}, 16, std::string(64, '\0')),
                 "starts at data offset 16, not a multiple of the alignment 32");
}

TEST(GgufBadInput, StringLengthsAndCountsPastTheEnd) {
  expect_invalid(
      header(0, 1).u64(1000).b + std::string(20, 'x'),
      "the key of metadata entry 0 at byte 24 claims a length of 1000 bytes, but only 20 "
      "bytes remain");
  expect_invalid(header(0, 1).str("k").u32(8).u64(~0ull).b,
                 "metadata 'k': the string value at byte");
  expect_invalid(
      header(0, 1).str("k").u32(9).u32(8).u64(1ull << 60).b + std::string(40, 'x'),
      "the array at byte 49 claims 1152921504606846976 values of type string, at least 8 "
      "bytes each, but only 40 bytes remain");
  expect_invalid(header(0, 1).str("k").u32(9).u32(8).u64(2).str("ok").u64(50).b,
                 "string 1 of the array at byte");
  expect_invalid(header(0, 1).str("k").u32(9).u32(6).u64(3).u32(0).b,
                 "the array at byte 49 claims 3 values of type float32, at least 4 bytes each, but "
                 "only 4 bytes remain");
  expect_invalid(header(0, 1ull << 40).b, "the header claims 1099511627776 metadata entries");
  expect_invalid(
      header(1ull << 62, 0).b + std::string(100, '\0'),
      "the header claims 4611686018427387904 tensors, but only 100 bytes remain in the file");
  expect_invalid(header(1, 0).u64(500).b + std::string(20, 'x'),
                 "the name of tensor 0 at byte 24 claims a length of 500 bytes, but only 20 bytes "
                 "remain");
}

TEST(GgufBadInput, AbsurdDimensions) {
  expect_invalid(one_tensor(0, {1ull << 32, 1ull << 32}, 0, ""), "hold more than 2^63 elements");
  expect_invalid(one_tensor(0, {~0ull}, 0, ""),
                 "dimension 0 of tensor 't' is 18446744073709551615");
  expect_invalid(one_tensor(2, {33}, 0, std::string(64, '\0')),
                 "tensor 't' of type Q4_0: its rows of 33 elements (dims[0]) are not a multiple of "
                 "the Q4_0 block size 32");
  expect_invalid(one_tensor(12, {256, 1ull << 62}, 0, ""), "hold more than 2^63 elements");
  expect_invalid(one_tensor(0, {1, 1, 1, 1, 1}, 0, ""), "tensor 't' has 5 dimensions, at most 4");
  // 2^62 Q8_0 elements need 2^62 / 32 * 34 bytes: fits 64 bits, far past the file.
  expect_invalid(one_tensor(8, {1ull << 62}, 0, ""), "runs past the end of the file");
}

TEST(GgufBadInput, StructuralProblems) {
  Raw dup = header(2, 0);
  for (int i = 0; i < 2; ++i) dup.str("w").u32(1).u64(8).u32(0).u64(32 * i);
  expect_invalid(dup.pad().b + std::string(64, '\0'), "tensor 'w' appears twice");
  Raw overlap = header(2, 0);
  overlap.str("a").u32(1).u64(16).u32(0).u64(0);
  overlap.str("b").u32(1).u64(8).u32(0).u64(32);
  expect_invalid(overlap.pad().b + std::string(96, '\0'), "tensors 'a' and 'b' overlap");
  expect_invalid(header(0, 2).str("k").u32(7).b + "\1" + Raw().str("k").u32(7).b + "\0",
                 "metadata key 'k' appears twice");
  expect_invalid(header(0, 1).str("k").u32(13).b + "xxxx", "metadata 'k' has value type 13");
  expect_invalid(header(0, 1).str("k").u32(9).u32(9).u64(0).b, "nested arrays are not supported");
  expect_invalid(header(0, 1).str("k").u32(7).b + "\2", "the bool at byte 37 is 2, not 0 or 1");
  expect_invalid(header(0, 1).str("general.alignment").u32(4).u32(48).b,
                 "general.alignment is 48, it must be a power of two");
  expect_invalid(header(0, 1).str("general.alignment").u32(4).u32(0).b, "general.alignment is 0");
  expect_invalid(header(0, 1).str("general.alignment").u32(10).u64(64).b,
                 "general.alignment is uint64, it must be a uint32");
}

TEST(GgufBadInput, UndecodableTypeIsAnErrorOnDequantize) {
  const std::string bytes = one_tensor(16 /* IQ2_XXS */, {256}, 0, std::string(96, '\0'));
  const GgufFile f = GgufFile::from_bytes(bytes, "iq2.gguf");
  EXPECT_EQ(f.bytes(f.tensor("t")).size(), 66u);  // listed, raw bytes available
  expect_error([&] { (void)f.dequantize(f.tensor("t")); },
               "tensor 't' in iq2.gguf has type IQ2_XXS, which tessera cannot dequantize");
}

TEST(GgufBadInput, OpenRefusesMissingAndSpecialFiles) {
  expect_error([] { GgufFile::open("/nonexistent/model.gguf"); }, "GGUF file not found");
  expect_error([] { GgufFile::open("/"); }, "is a directory");
  TempDir dir;
  std::ofstream(dir.path() / "empty.gguf").close();
  expect_error([&] { GgufFile::open(dir.path() / "empty.gguf"); }, "is not a GGUF file");
}

// ---- writer ----

TEST(GgufWriterErrors, RefusesBadInput) {
  GgufWriter w;
  const float x[32] = {};
  expect_error([&] { w.set_metadata("general.alignment", GgufValue::u32(24)); },
               "general.alignment must be a power of two, got 24");
  expect_error([&] { w.set_metadata("general.alignment", GgufValue::i32(64)); },
               "general.alignment must be a uint32, got int32");
  expect_error([&] { w.set_metadata("", GgufValue::u8(1)); }, "a metadata key is empty");
  w.add_f32("a", GgmlType::F32, {32}, x);
  expect_error([&] { w.add_f32("a", GgmlType::F32, {32}, x); }, "tensor 'a' added twice");
  expect_error([&] { w.add_f32(std::string(64, 'n'), GgmlType::F32, {32}, x); },
               "is 64 bytes; llama.cpp reads names of at most 63");
  expect_error([&] { w.add_f32("b", GgmlType::F32, {31}, x); }, "has 31 elements, got 32 values");
  expect_error(
      [&] {
        w.add_f32("b", GgmlType::Q4_0, {16, 2}, x);
      },
      "its rows of 16 elements (dims[0]) are not a multiple of the Q4_0 block size 32");
  expect_error([&] { w.add_f32("b", GgmlType::Q4_K, {256}, x); }, "tessera cannot encode Q4_K");
  expect_error([&] { w.add_f32("b", GgmlType::F32, {-1}, x); }, "dimension 0 is negative");
  expect_error([&] { w.add_encoded("b", GgmlType::Q8_0, {32}, std::as_bytes(std::span(x))); },
               "takes 34 bytes, got 128");
  float bad[32] = {};
  bad[5] = 70000.0f;
  expect_error([&] { w.add_f32("b", GgmlType::F16, {32}, bad); },
               "value 70000 at index 5 cannot be stored as F16");
  expect_error([&] { w.add_f32("b", GgmlType::Q8_0, {32}, bad); }, "cannot be stored as Q8_0");
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { w.add_f32("b", GgmlType::BF16, {32}, bad); }, "cannot be stored as BF16");
  w.add_f32("b", GgmlType::F32, {32}, bad);  // F32 keeps any value
  EXPECT_EQ(w.tensor_count(), 2u);
  expect_error([&] { w.write("/nonexistent-dir/x.gguf"); }, "/nonexistent-dir/x.gguf");
}

TEST(GgufWriterErrors, ReplacingMetadataKeepsItsPlace) {
  GgufWriter w;
  w.set_metadata("a", GgufValue::u8(1));
  w.set_metadata("b", GgufValue::string("x"));
  w.set_metadata("a", GgufValue::f64(2.5));
  const GgufFile f = GgufFile::from_bytes(w.to_bytes(), "m.gguf");
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].key, "a");
  EXPECT_EQ(f.get_float("a"), 2.5);
  const std::string empty_strings[1] = {};
  w.set_metadata("c", GgufValue::array_string(std::span(empty_strings, 0)));
  EXPECT_TRUE(GgufFile::from_bytes(w.to_bytes(), "m.gguf").get_strings("c").empty());
}

// ---- llama layout ----

TEST(GgufLlama, NameMapBothWays) {
  const std::pair<const char*, const char*> pairs[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
      {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"},
      {"blk.12.attn_v.weight", "model.layers.12.self_attn.v_proj.weight"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
      {"blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"},
      {"blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"},
      {"blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"},
      {"blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight"},
      {"blk.7.attn_q.bias", "model.layers.7.self_attn.q_proj.bias"},
  };
  for (const auto& [gguf, hf] : pairs) {
    EXPECT_EQ(llama_gguf_to_hf_name(gguf), std::optional<std::string>(hf)) << gguf;
    EXPECT_EQ(llama_hf_to_gguf_name(hf), std::optional<std::string>(gguf)) << hf;
  }
  for (const char* unknown : {"rope_freqs.weight", "blk.1.attn_q", "blk.01.attn_q.weight",
                              "blk.x.attn_q.weight", "blk..attn_q.weight", "blk.1.attn_qq.weight",
                              "model.layers.1.self_attn.q_proj.weight", "", ".weight"})
    EXPECT_EQ(llama_gguf_to_hf_name(unknown), std::nullopt) << unknown;
  for (const char* unknown : {"model.layers.1.self_attn.rotary_emb.inv_freq", "blk.1.attn_q.weight",
                              "model.layers.-1.mlp.up_proj.weight", "transformer.wte.weight"})
    EXPECT_EQ(llama_hf_to_gguf_name(unknown), std::nullopt) << unknown;
}

// Two heads of head_dim 4, one column holding the row index: HF rows per head are
// [x0 x1 | y0 y1] (rotate-half pairs (x_i, y_i)); GGUF interleaves them as [x0 y0 x1 y1].
TEST(GgufLlama, PermutationHandWorkedExample) {
  const std::vector<float> hf = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(permute_qk_to_gguf(hf, 2, 8, 1), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  EXPECT_EQ(permute_qk_to_hf(std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}, 2, 8, 1), hf);
  // head_dim 6: [a0 a1 a2 | b0 b1 b2] -> [a0 b0 a1 b1 a2 b2]; whole rows move.
  const std::vector<float> m = {0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15};  // (6, 2)
  EXPECT_EQ(permute_qk_to_gguf(m, 1, 6, 2),
            (std::vector<float>{0, 10, 3, 13, 1, 11, 4, 14, 2, 12, 5, 15}));
}

TEST(GgufLlama, PermutationThenInverseIsIdentity) {
  Rng rng(7);
  struct Case {
    std::int64_t n_head, head_dim, cols;
  };
  for (auto [n_head, head_dim, cols] : {Case{1, 4, 3}, Case{3, 8, 5}, Case{9, 64, 4}}) {
    const std::int64_t rows = n_head * head_dim;
    std::vector<float> w(static_cast<std::size_t>(rows * cols));
    for (auto& v : w) v = rng.normal();
    const auto g = permute_qk_to_gguf(w, n_head, rows, cols);
    EXPECT_NE(g, w);
    EXPECT_EQ(permute_qk_to_hf(g, n_head, rows, cols), w);
    EXPECT_EQ(permute_qk_to_gguf(permute_qk_to_hf(w, n_head, rows, cols), n_head, rows, cols), w);
  }
  // Quantized rows move whole: permuting Q8_0 rows then dequantizing equals dequantizing then
  // permuting.
  const GgufTensorInfo& t = reference().tensor("q8_0");  // 4 rows of 64
  const auto bytes = reference().bytes(t);
  std::vector<std::byte> permuted(bytes.size());
  permute_qk_rows(bytes, permuted, 1, 4, false);
  std::vector<float> a(static_cast<std::size_t>(t.numel()));
  dequantize_row(t.type, permuted.data(), a.data(), t.numel());
  EXPECT_EQ(a, permute_qk_to_gguf(reference().dequantize(t), 1, 4, 64));
}

TEST(GgufLlama, PermutationRefusesBadShapes) {
  const std::vector<float> w(12);
  expect_error([&] { permute_qk_to_gguf(w, 4, 12, 1); },
               "12 rows cannot be split into 4 heads of an even head dimension");
  expect_error([&] { permute_qk_to_gguf(w, 0, 12, 1); }, "into 0 heads");
  expect_error([&] { permute_qk_to_hf(w, 2, 4, 2); }, "12 values for a (4, 2) matrix");
}

// ---- mutations ----

// Seeded random damage to the fixture (byte edits in the header, plausible counts and lengths,
// truncation, junk, spans deleted or repeated): every result loads or is refused with a
// tessera::Error naming the file; whatever loads can be read and dequantized within bounds.
TEST(GgufFuzz, MutationsLoadOrThrowError) {
  const std::string good = read_file(k_dir / "reference.gguf");
  const std::size_t head = reference().data_offset();
  Rng rng(20250611);
  int loaded = 0, rejected = 0;
  const std::uint64_t interesting[] = {
      0,  1,  2,  3,   4,   7,          8,          9,          12,    13,        31,
      32, 33, 64, 255, 256, 1ull << 31, 1ull << 32, 1ull << 62, ~0ull, ~0ull >> 1};
  for (int it = 0; it < 6000; ++it) {
    std::string b = good;
    auto pos = [&](std::size_t n) { return n ? static_cast<std::size_t>(rng.next_u64() % n) : 0; };
    const int edits = 1 + static_cast<int>(rng.next_u32() % 4);
    switch (rng.next_u32() % 6) {
      case 0:  // random bytes in the header
        for (int k = 0; k < edits; ++k) b[pos(head)] = static_cast<char>(rng.next_u32());
        break;
      case 1: {  // an interesting 4- or 8-byte value anywhere in the header
        const std::uint64_t v =
            interesting[rng.next_u32() % std::size(interesting)] +
            static_cast<std::uint64_t>(static_cast<std::int64_t>(rng.next_u32() % 3) - 1);
        const std::size_t n = rng.next_u32() % 2 ? 8 : 4, p = pos(head - n);
        std::memcpy(b.data() + p, &v, n);
        break;
      }
      case 2:  // truncation
        b.resize(pos(b.size() + 1));
        break;
      case 3:  // random bytes anywhere (the data: any bits decode)
        for (int k = 0; k < edits; ++k) b[pos(b.size())] = static_cast<char>(rng.next_u32());
        break;
      case 4: {  // delete or repeat a span of the header
        const std::size_t p = pos(head), n = 1 + pos(16);
        if (rng.next_u32() % 2)
          b.erase(p, n);
        else
          b.insert(p, b.substr(p, n));
        break;
      }
      default:  // junk appended
        for (int k = 0, n = 1 + static_cast<int>(rng.next_u32() % 64); k < n; ++k)
          b.push_back(static_cast<char>(rng.next_u32()));
        break;
    }
    try {
      const GgufFile f = GgufFile::from_bytes(b, "fuzz.gguf");
      ++loaded;
      for (const auto& t : f.tensors()) {
        ASSERT_LE(f.data_offset() + t.offset + t.nbytes, b.size());
        (void)f.bytes(t);
        try {
          if (t.numel() <= (1 << 20)) (void)f.dequantize(t);
        } catch (const Error&) {
        }
      }
      for (const auto& m : f.metadata()) (void)m.value.describe();
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find("fuzz.gguf"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(loaded, 100);
  EXPECT_GT(rejected, 1000);
}

// ---- the real pretrained models (scripts/setup --with-models); skipped when absent ----
namespace {
void expect_reads_and_dequantizes(const std::filesystem::path& file, const std::string& arch,
                                  std::int64_t min_tensors) {
  if (!std::filesystem::exists(file))
    GTEST_SKIP() << file << " is absent: run scripts/setup --with-models";
  const auto g = tessera::io::GgufFile::open(file);
  EXPECT_EQ(g.get_string("general.architecture"), arch);
  EXPECT_GE(static_cast<std::int64_t>(g.tensors().size()), min_tensors);
  // The tokenizer a later loader will read: a vocabulary as long as the embedding's rows.
  const auto vocab = g.get_strings("tokenizer.ggml.tokens");
  const auto& emb = g.tensor("token_embd.weight");
  EXPECT_EQ(static_cast<std::int64_t>(vocab.size()), emb.dims.at(1));
  std::size_t values = 0;
  for (const auto& t : g.tensors()) {
    const auto x = g.dequantize(t);
    ASSERT_EQ(static_cast<std::int64_t>(x.size()), t.numel()) << t.name;
    for (float v : x) ASSERT_TRUE(std::isfinite(v)) << t.name;
    values += x.size();
  }
  std::printf("%s: %zu tensors, %zu values, all finite\n", file.filename().c_str(),
              g.tensors().size(), values);
}
}  // namespace

TEST(GgufRealModels, SmolLM2ReadsAndEveryTensorDequantizes) {
  expect_reads_and_dequantizes(TESSERA_DATA "/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
                               "llama", 30 * 9 + 2);
}

TEST(GgufRealModels, Gemma3ReadsAndEveryTensorDequantizes) {
  expect_reads_and_dequantizes(TESSERA_DATA "/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf",
                               "gemma3", 18 * 9 + 2);
}
