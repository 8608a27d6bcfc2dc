#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
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
#include "tessera/io/safetensors.hpp"

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           fmt::format("tessera_st_{}_{}", ::getpid(), info ? info->name() : "x");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string u64_le(std::uint64_t n) {
  return std::string(reinterpret_cast<const char*>(&n), 8);
}

// A file from a literal header and a data region (header length taken from the header as is).
std::string make_file(const std::string& header, const std::string& data = {}) {
  return u64_le(header.size()) + header + data;
}

using tessera::test::expect_error;

void expect_invalid(const std::string& bytes, const std::string& needle) {
  expect_error([&] { SafetensorsFile::from_bytes(bytes, "bad.safetensors"); }, needle);
}

std::string valid_file_bytes() {
  static const float w[6] = {1, 2, 3, 4, 5, 6};
  static const std::uint16_t h[3] = {0x3E00, 0xC000, 0x3C00};  // f16 1.5, -2, 1
  static const std::int64_t ids[2] = {7, -9};
  static const std::uint8_t flags[3] = {1, 0, 1};
  SafetensorsWriter wr;
  wr.add_f32("w", {2, 3}, w);
  wr.add("h", DType::F16, {3}, h, sizeof(h));
  wr.add("ids", DType::I64, {2}, ids, sizeof(ids));
  wr.add("flags", DType::BOOL, {3}, flags, sizeof(flags));
  wr.add("empty", DType::F32, {0, 5}, nullptr, 0);
  wr.set_metadata("format", "pt");
  return wr.to_bytes();
}

}  // namespace

TEST(SafetensorsDType, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::F32), "F32");
  EXPECT_EQ(dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(dtype_name(DType::BOOL), "BOOL");
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
  EXPECT_EQ(dtype_size(DType::U32), 4u);
  for (DType d :
       {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16,
        DType::I8, DType::U8, DType::U16, DType::U32, DType::U64, DType::BOOL}) {
    DType back{};
    ASSERT_TRUE(parse_dtype(dtype_name(d), back));
    EXPECT_EQ(back, d);
  }
  DType x{};
  EXPECT_FALSE(parse_dtype("float32", x));
}

TEST_F(Safetensors, RoundTripManyDtypes) {
  const float f32[6] = {1.f, -2.5f, 3.25f, 0.f, 1e-30f, 65504.f};
  const double f64[2] = {3.5, -1e300};
  const std::int32_t i32[4] = {1, -2, 2147483647, -2147483647 - 1};
  const std::int16_t i16[2] = {-32768, 123};
  const std::int8_t i8[3] = {-128, 0, 127};
  const std::uint8_t u8[3] = {0, 200, 255};
  const std::uint16_t u16[2] = {65535, 1};
  const std::uint32_t u32[2] = {4294967295u, 5};
  const std::uint64_t u64[2] = {9223372036854775807ull, 0};
  const std::int64_t i64[3] = {-1, 0, 1LL << 40};
  const float scalar = 42.f;

  SafetensorsWriter wr;
  wr.add_f32("model.w", {2, 3}, f32);
  wr.add("d", DType::F64, {2}, f64, sizeof(f64));
  wr.add("i32", DType::I32, {2, 2}, i32, sizeof(i32));
  wr.add("i16", DType::I16, {2}, i16, sizeof(i16));
  wr.add("i8", DType::I8, {3}, i8, sizeof(i8));
  wr.add("u8", DType::U8, {3}, u8, sizeof(u8));
  wr.add("u16", DType::U16, {2}, u16, sizeof(u16));
  wr.add("u32", DType::U32, {2}, u32, sizeof(u32));
  wr.add("u64", DType::U64, {2}, u64, sizeof(u64));
  wr.add("i64", DType::I64, {3, 1}, i64, sizeof(i64));
  wr.add_f32("scalar", {}, &scalar);
  wr.add("empty", DType::F32, {0, 3}, nullptr, 0);
  {
    std::vector<float> temp = {9.f, 8.f};
    wr.add_copy("copied", DType::F32, {2}, temp.data(), 8);
    temp.assign(2, -1.f);  // the writer kept its own copy
  }
  wr.set_metadata("format", "pt");
  wr.set_metadata("step", "17");
  EXPECT_EQ(wr.size(), 13u);

  const auto path = dir_ / "all.safetensors";
  wr.write(path);
  // Atomic write: no temporary left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.tensors().size(), 13u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "17");
  EXPECT_TRUE(f.contains("model.w"));
  EXPECT_FALSE(f.contains("model"));
  EXPECT_EQ(f.find("nope"), nullptr);

  // File order is data order: by descending element size, then in the order added.
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  std::vector<std::string> expect_order = {"d",   "u64",    "i64",   "model.w", "i32",
                                           "u32", "scalar", "empty", "copied",  "i16",
                                           "u16", "i8",     "u8"};
  EXPECT_EQ(names, expect_order);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.begin % dtype_size(t.dtype), 0u) << t.name;

  EXPECT_EQ(f.read_f32("model.w"), std::vector<float>(f32, f32 + 6));
  std::vector<float> w(6);
  f.read_f32("model.w", {2, 3}, w.data());
  EXPECT_EQ(w, std::vector<float>(f32, f32 + 6));
  EXPECT_EQ(f.read_f32("d"), (std::vector<float>{3.5f, static_cast<float>(-1e300)}));
  EXPECT_EQ(f.read_i64("i32"), (std::vector<std::int64_t>{1, -2, 2147483647, -2147483648LL}));
  EXPECT_EQ(f.read_i64("i16"), (std::vector<std::int64_t>{-32768, 123}));
  EXPECT_EQ(f.read_i64("i8"), (std::vector<std::int64_t>{-128, 0, 127}));
  EXPECT_EQ(f.read_i64("u8"), (std::vector<std::int64_t>{0, 200, 255}));
  EXPECT_EQ(f.read_i64("u16"), (std::vector<std::int64_t>{65535, 1}));
  EXPECT_EQ(f.read_i64("u32"), (std::vector<std::int64_t>{4294967295LL, 5}));
  EXPECT_EQ(f.read_i64("u64"), (std::vector<std::int64_t>{9223372036854775807LL, 0}));
  EXPECT_EQ(f.read_i64("i64"), (std::vector<std::int64_t>{-1, 0, 1LL << 40}));
  EXPECT_EQ(f.find("i64")->shape, (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(f.find("i64")->dtype, DType::I64);

  const TensorInfo* s = f.find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  float sv = 0;
  f.read_f32("scalar", {}, &sv);
  EXPECT_EQ(sv, 42.f);

  const TensorInfo* e = f.find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(e->begin, e->end);
  EXPECT_TRUE(f.read_f32("empty").empty());
  f.read_f32("empty", {0, 3}, nullptr);

  EXPECT_EQ(f.read_f32("copied"), (std::vector<float>{9.f, 8.f}));
  auto raw = f.bytes(*f.find("u16"));
  ASSERT_EQ(raw.size(), 4u);
  EXPECT_EQ(std::memcmp(raw.data(), u16, 4), 0);

  // Copies share the mapped bytes and stay valid after the original is gone.
  SafetensorsFile copy = f;
  f = SafetensorsFile::from_bytes(valid_file_bytes(), "other");
  EXPECT_EQ(copy.read_i64("u8"), (std::vector<std::int64_t>{0, 200, 255}));

  // Overwriting an existing file works (rename over it).
  SafetensorsWriter wr2;
  wr2.add_f32("only", {1}, &scalar);
  wr2.write(path);
  EXPECT_EQ(SafetensorsFile::open(path).tensors().size(), 1u);
}

TEST_F(Safetensors, EmptyFileWithNoTensors) {
  SafetensorsWriter wr;
  auto p = dir_ / "none.safetensors";
  wr.write(p);
  auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.data_size(), 0u);
}

// The exact bytes of the reference implementation (safetensors' own doc example, and the layout
// `safetensors.torch.save_file` produces: compact JSON, fields dtype/shape/data_offsets,
// __metadata__ first, header padded with spaces to a multiple of 8).
TEST(SafetensorsReference, ReadsReferenceBytes) {
  std::string doc_example = std::string("<\0\0\0\0\0\0\0", 8) +
                            R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" +
                            std::string(16, '\0');
  auto f = SafetensorsFile::from_bytes(doc_example, "doc.safetensors");
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].name, "test");
  EXPECT_EQ(f.tensors()[0].dtype, DType::I32);
  EXPECT_EQ(f.read_i64("test"), (std::vector<std::int64_t>{0, 0, 0, 0}));

  // Header order need not follow data order; whitespace and unknown fields are allowed.
  std::string h =
      R"({"__metadata__":{"format":"pt"}, "b": {"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
      R"( "a":{"data_offsets":[0,4],"shape":[],"dtype":"F32","extra":1}}   )";
  float vals[2] = {1.25f, -3.f};
  auto g = SafetensorsFile::from_bytes(make_file(h, std::string(reinterpret_cast<char*>(vals), 8)),
                                       "mixed");
  EXPECT_EQ(g.tensors()[0].name, "a");
  EXPECT_EQ(g.read_f32("a"), std::vector<float>{1.25f});
  EXPECT_EQ(g.read_f32("b"), std::vector<float>{-3.f});
}

TEST(SafetensorsReference, WritesReferenceLayout) {
  const float z[4] = {0, 0, 0, 0};
  SafetensorsWriter wr;
  wr.add_f32("test", {2, 2}, z);
  std::string bytes = wr.to_bytes();
  std::string json = R"({"test":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(bytes, u64_le(padded.size()) + padded + std::string(16, '\0'));

  SafetensorsWriter wm;
  wm.add_f32("x", {1}, z);
  wm.set_metadata("format", "pt");
  std::string b2 = wm.to_bytes();
  std::uint64_t n = 0;
  std::memcpy(&n, b2.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(b2.substr(8, 33), R"({"__metadata__":{"format":"pt"},")");
}

TEST(SafetensorsConvert, F16AndBF16ToF32) {
  // f16: 1.5, -2, 0, -0, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal), inf
  const std::uint16_t h[8] = {0x3E00, 0xC000, 0x0000, 0x8000, 0x7BFF, 0x0001, 0x0400, 0x7C00};
  // bf16: 1.5, -2, 1, 3.140625, -inf
  const std::uint16_t b[5] = {0x3FC0, 0xC000, 0x3F80, 0x4049, 0xFF80};
  SafetensorsWriter wr;
  wr.add("h", DType::F16, {2, 4}, h, sizeof(h));
  wr.add("b", DType::BF16, {5}, b, sizeof(b));
  wr.add("nan", DType::F16, {1}, "\x00\x7E", 2);
  auto f = SafetensorsFile::from_bytes(wr.to_bytes(), "conv");

  std::vector<float> hv(8);
  f.read_f32("h", {2, 4}, hv.data());
  EXPECT_EQ(hv[0], 1.5f);
  EXPECT_EQ(hv[1], -2.0f);
  EXPECT_EQ(hv[2], 0.0f);
  EXPECT_EQ(hv[3], 0.0f);
  EXPECT_TRUE(std::signbit(hv[3]));
  EXPECT_EQ(hv[4], 65504.0f);
  EXPECT_EQ(hv[5], std::ldexp(1.0f, -24));
  EXPECT_EQ(hv[6], std::ldexp(1.0f, -14));
  EXPECT_EQ(hv[7], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f.read_f32("nan")[0]));

  auto bv = f.read_f32("b");
  EXPECT_EQ(bv, (std::vector<float>{1.5f, -2.0f, 1.0f, 3.140625f,
                                    -std::numeric_limits<float>::infinity()}));

  // Every f16 bit pattern agrees with the hardware conversion of the same value, computed here
  // independently from the definition (sign, exponent, mantissa).
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  SafetensorsWriter wa;
  wa.add("all", DType::F16, {65536}, all.data(), all.size() * 2);
  auto fa = SafetensorsFile::from_bytes(wa.to_bytes(), "all");
  auto av = fa.read_f32("all");
  for (std::uint32_t i = 0; i < 65536; ++i) {
    int sign = (i >> 15) ? -1 : 1;
    int exp = (i >> 10) & 31;
    int mant = i & 1023;
    double ref;
    if (exp == 0)
      ref = sign * std::ldexp(mant, -24);
    else if (exp == 31)
      ref = mant ? std::nan("") : sign * std::numeric_limits<double>::infinity();
    else
      ref = sign * std::ldexp(1024 + mant, exp - 25);
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(av[i])) << i;
    else
      ASSERT_EQ(av[i], static_cast<float>(ref)) << i;
  }
}

TEST(SafetensorsRead, ReadErrors) {
  auto f = SafetensorsFile::from_bytes(valid_file_bytes(), "ckpt.safetensors");
  std::vector<float> buf(16);
  expect_error(
      [&] {
        f.read_f32("missing", {2, 3}, buf.data());
      },
      "tensor 'missing' not found in ckpt.safetensors");
  expect_error([&] { f.read_f32("missing"); }, "tensor 'missing' not found in ckpt.safetensors");
  expect_error([&] { f.read_i64("missing"); }, "not found");
  expect_error(
      [&] {
        f.read_f32("w", {3, 2}, buf.data());
      },
      "shape mismatch for 'w' in ckpt.safetensors: file has [2, 3], expected [3, 2]");
  expect_error([&] { f.read_f32("w", {6}, buf.data()); }, "expected [6]");
  expect_error([&] { f.read_f32("w", {}, buf.data()); }, "expected []");
  expect_error([&] { f.read_f32("ids", {2}, buf.data()); },
               "tensor 'ids' in ckpt.safetensors has dtype I64, expected a float type");
  expect_error([&] { f.read_f32("ids"); }, "has dtype I64, expected a float type");
  expect_error([&] { f.read_i64("w"); }, "has dtype F32, expected an integer type");
  EXPECT_EQ(f.read_i64("flags"), (std::vector<std::int64_t>{1, 0, 1}));
  std::vector<float> hv(3);
  f.read_f32("h", {3}, hv.data());
  EXPECT_EQ(hv, (std::vector<float>{1.5f, -2.f, 1.f}));

  const std::uint64_t big[1] = {~0ull};
  SafetensorsWriter wr;
  wr.add("big", DType::U64, {1}, big, 8);
  auto g = SafetensorsFile::from_bytes(wr.to_bytes(), "u64");
  expect_error([&] { g.read_i64("big"); }, "too large for int64");
}

TEST_F(Safetensors, OpenErrors) {
  expect_error([&] { SafetensorsFile::open(dir_ / "nope.safetensors"); },
               "safetensors file not found");
  expect_error([&] { SafetensorsFile::open(dir_); }, "is a directory");
  write_file_atomic(dir_ / "empty.safetensors", "");
  expect_error([&] { SafetensorsFile::open(dir_ / "empty.safetensors"); },
               "the file is 0 bytes, shorter than the 8-byte header length");
  write_file_atomic(dir_ / "short.safetensors", "abc");
  expect_error([&] { SafetensorsFile::open(dir_ / "short.safetensors"); }, "short.safetensors");
  // A truncated real file, through the mmap path.
  std::string good = valid_file_bytes();
  write_file_atomic(dir_ / "trunc.safetensors", good.substr(0, good.size() - 3));
  expect_error([&] { SafetensorsFile::open(dir_ / "trunc.safetensors"); },
               "outside the data region");
}

TEST(SafetensorsValidate, EachErrorIsDistinct) {
  const std::string t4 = R"("dtype":"F32","shape":[1],"data_offsets":[0,4])";
  const std::string d4(4, '\0');
  // the valid baseline
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(make_file("{\"a\":{" + t4 + "}}", d4), "ok"));

  expect_invalid("", "0 bytes, shorter than the 8-byte header length");
  expect_invalid("1234567", "7 bytes, shorter than the 8-byte header length");
  expect_invalid(u64_le(100) + "{}", "header length 100 runs past the end of the file");
  expect_invalid(u64_le(~0ull) + "{}", "larger than the 100000000 byte limit");
  expect_invalid(u64_le(200'000'000) + "{}", "larger than the 100000000 byte limit");
  expect_invalid(u64_le(0), "header length 0 is too short");
  expect_invalid(make_file("{\"a\":"), "the header is not valid JSON");
  expect_invalid(make_file("{\"a\":1}garbage"), "the header is not valid JSON");
  expect_invalid(make_file(std::string("{\"\xff\":1}")), "the header is not valid JSON");
  expect_invalid(make_file("[1, 2]"), "the header is a JSON array, expected an object");
  expect_invalid(make_file("\"x\""), "the header is a JSON string, expected an object");
  expect_invalid(make_file("{\"a\":{" + t4 + "},\"a\":{" + t4 + "}}", d4),
                 "the header names 'a' twice");
  expect_invalid(make_file("{\"a\":[1]}"), "entry 'a' is a JSON array, expected an object");
  expect_invalid(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", d4),
                 "tensor 'a' has no dtype");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", d4),
                 "tensor 'a' has no shape");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1]}})", d4),
                 "tensor 'a' has no data_offsets");
  expect_invalid(make_file(R"({"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", d4),
                 "dtype of tensor 'a' is a JSON integer, expected a string");
  expect_invalid(make_file(R"({"a":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})", d4),
                 "tensor 'a' has unknown dtype \"float32\"");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", d4),
                 "shape of tensor 'a' is a JSON integer, expected an array");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", d4),
                 "has dimension -1, expected a non-negative integer");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", d4),
                 "has dimension 1.5");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", d4),
                 "has dimension \"1\"");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[18446744073709551615],)"
                           R"("data_offsets":[0,4]}})",
                           d4),
                 "has dimension 18446744073709551615");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                           R"("data_offsets":[0,4]}})",
                           d4),
                 "is too large (element count overflows)");
  expect_invalid(make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904],)"
                           R"("data_offsets":[0,4]}})",
                           d4),
                 "is too large");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", d4),
                 "data_offsets of tensor 'a' is [0], expected [begin, end]");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":"0,4"}})", d4),
                 "data_offsets of tensor 'a' is \"0,4\"");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", d4),
                 "data_offsets of tensor 'a' is [-4,0]");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", d4),
                 "are [4, 0]: begin is after end");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", d4),
                 "outside the data region of 4 bytes");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,)"
                           R"(18446744073709551615]}})",
                           d4),
                 "data_offsets of tensor 'a' is");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", d4),
                 "tensor 'a' has 4 bytes of data but dtype F32 and shape [2] need 8");
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                           std::string(6, '\0')),
                 "tensors 'a' and 'b' overlap");
  expect_invalid(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0')),
      "bytes [0, 4) of the data region belong to no tensor");
  expect_invalid(make_file("{\"a\":{" + t4 + "}}", std::string(12, '\0')),
                 "the data region has 12 bytes but the tensors cover only 4");
  expect_invalid(make_file(R"({"__metadata__":[1]})"), "__metadata__ is a JSON array");
  expect_invalid(make_file(R"({"__metadata__":{"k":1}})"),
                 "__metadata__ value for 'k' is a JSON integer, expected a string");

  // Every message names the file and has a hint.
  try {
    SafetensorsFile::from_bytes("x", "named.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("named.safetensors"), std::string::npos);
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(SafetensorsWrite, WriterErrors) {
  const float x[4] = {};
  SafetensorsWriter wr;
  expect_error([&] { wr.add("a", DType::F32, {2}, x, 4); }, "needs 8 bytes, got 4");
  expect_error([&] { wr.add("a", DType::F16, {2, 2}, x, 16); }, "needs 8 bytes, got 16");
  expect_error([&] { wr.add("a", DType::F32, {-1}, x, 4); }, "negative dimension");
  expect_error([&] { wr.add_f32("", {1}, x); }, "name is empty");
  expect_error([&] { wr.add_f32("__metadata__", {1}, x); }, "reserved");
  wr.add_f32("a", {1}, x);
  expect_error([&] { wr.add_f32("a", {1}, x); }, "tensor 'a' added twice");
  expect_error([&] { wr.write("/nonexistent-dir-tessera/x.safetensors"); }, "cannot write");
  SafetensorsWriter bad;
  bad.add_f32(std::string("\xff\xfe"), {1}, x);
  expect_error([&] { bad.to_bytes(); }, "cannot encode the header");
}

// Random damage to a valid file must give either a file that loads or a tessera::Error, never
// a crash, an out-of-bounds read (run under ASan to see those) or another exception type.
TEST_F(Safetensors, FuzzMutationsLoadOrThrowError) {
  const std::string good = valid_file_bytes();
  std::uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  Rng rng(20240611);
  int loaded = 0, rejected = 0;
  const int iters = 10000;
  for (int it = 0; it < iters; ++it) {
    std::string b = good;
    int kind = static_cast<int>(rng.next_u32() % 8);
    auto pos = [&](std::size_t n) { return n ? rng.next_u64() % n : 0; };
    int edits = 1 + static_cast<int>(rng.next_u32() % 4);
    switch (kind) {
      case 0:  // random bytes anywhere
        for (int k = 0; k < edits; ++k) b[pos(b.size())] = static_cast<char>(rng.next_u32());
        break;
      case 1:  // random bytes inside the JSON header
        for (int k = 0; k < edits; ++k) b[8 + pos(hlen)] = static_cast<char>(rng.next_u32());
        break;
      case 2: {  // plausible JSON characters inside the header (keeps it parseable more often)
        const char* alphabet = "0123456789[]{},:\"-. eE";
        for (int k = 0; k < edits; ++k) b[8 + pos(hlen)] = alphabet[rng.next_u32() % 22];
        break;
      }
      case 3:  // truncation
        b.resize(pos(b.size() + 1));
        break;
      case 4:  // extension with junk
        for (int k = 0, n = 1 + static_cast<int>(rng.next_u32() % 16); k < n; ++k)
          b.push_back(static_cast<char>(rng.next_u32()));
        break;
      case 5: {  // header length edits: small deltas, random values, edge values
        std::uint64_t n = hlen;
        switch (rng.next_u32() % 4) {
          case 0:
            n = hlen + static_cast<std::int64_t>(rng.next_u32() % 33) - 16;
            break;
          case 1:
            n = rng.next_u64();
            break;
          case 2:
            n = rng.next_u64() % (b.size() + 16);
            break;
          default:
            n = std::uint64_t{1} << (rng.next_u32() % 64);
            break;
        }
        std::memcpy(b.data(), &n, 8);
        break;
      }
      case 6: {  // bit flips in the digits of the header (offsets, shapes)
        for (int k = 0; k < edits; ++k) {
          std::size_t p = 8 + pos(hlen);
          if (b[p] >= '0' && b[p] <= '9') b[p] = static_cast<char>('0' + rng.next_u32() % 10);
        }
        break;
      }
      default: {  // delete or duplicate a span of the header
        std::size_t p = 8 + pos(hlen), n = 1 + pos(8);
        if (rng.next_u32() % 2)
          b.erase(p, n);
        else
          b.insert(p, b.substr(p, n));
        break;
      }
    }
    try {
      auto f = (it % 20 == 0) ? [&] {
        auto p = dir_ / "fuzz.safetensors";  // through the mmap path now and then
        std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), b.size());
        return SafetensorsFile::open(p);
      }()
                              : SafetensorsFile::from_bytes(b, "fuzz");
      ++loaded;
      // Whatever loaded must be readable within bounds.
      for (const auto& t : f.tensors()) {
        ASSERT_LE(t.end, f.data_size());
        try {
          if (is_float_dtype(t.dtype))
            (void)f.read_f32(t.name);
          else
            (void)f.read_i64(t.name);
        } catch (const Error&) {
        }
      }
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find("fuzz"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << " (kind " << kind
             << ") threw a non-tessera exception: " << e.what();
    }
  }
  EXPECT_EQ(loaded + rejected, iters);
  std::printf("fuzz: %d of %d damaged files loaded, %d rejected\n", loaded, iters, rejected);
  EXPECT_GT(rejected, iters / 2);  // most damage is detected
  EXPECT_GT(loaded, 0);            // some damage is harmless (e.g. data bytes)
}
