#include "tessera/io/gguf_quants.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "tessera/core/error.hpp"

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little-endian; this code assumes a little-endian host");

// Every formula below is evaluated as written: a*b + c rounds the product and then the sum, as
// numpy does in gguf-py. GCC and clang would otherwise fuse such pairs into FMAs (one rounding)
// on FMA-capable targets, and the results would differ from gguf-py's in the last bit.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera::io {
namespace {

constexpr GgmlTypeInfo k_types[] = {
    {GgmlType::F32, "F32", 1, 4},
    {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},
    {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},
    {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},
    {GgmlType::Q8_1, "Q8_1", 32, 40},
    {GgmlType::Q2_K, "Q2_K", 256, 84},
    {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},
    {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},
    {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::I8, "I8", 1, 1},
    {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},
    {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56},
    {GgmlType::BF16, "BF16", 1, 2},
    {GgmlType::TQ1_0, "TQ1_0", 256, 54},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66},
    {GgmlType::MXFP4, "MXFP4", 32, 17},
    {GgmlType::NVFP4, "NVFP4", 64, 36},
    {GgmlType::Q1_0, "Q1_0", 128, 18},
};

std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint8_t u8_at(const std::byte* p, std::int64_t i) {
  return static_cast<std::uint8_t>(p[i]);
}
float f16_at(const std::byte* p) {
  return fp16_to_fp32(load_u16(p));
}
void store_f16(std::byte* p, float v) {
  const std::uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// ---- the block formats as codes ----
// Each unpack_* writes a block's codes q (unsigned, below 2^bits), and each sub-block's scale and
// min (ggml_codes(type) says how many); dequantize_row turns them into values.

// Q4_0 block (18 bytes): d (f16), qs[16]; element j is qs[j] & 15, element j + 16 is qs[j] >> 4;
// value (q - 8) d.
void unpack_q4_0(const std::byte* b, std::uint8_t* q, float* scale, float*) {
  scale[0] = f16_at(b);
  for (int j = 0; j < 16; ++j) {
    q[j] = u8_at(b + 2, j) & 0x0F;
    q[j + 16] = u8_at(b + 2, j) >> 4;
  }
}

// Q4_1 block (20 bytes): d (f16), m (f16), qs[16] as Q4_0; value d q + m.
void unpack_q4_1(const std::byte* b, std::uint8_t* q, float* scale, float* min) {
  float unused;
  unpack_q4_0(b + 2, q, &unused, nullptr);  // the nibbles, as Q4_0's
  scale[0] = f16_at(b);
  min[0] = f16_at(b + 2);
}

// The fifth bits of a Q5 block: bit j of qh (u32) is the fifth bit of element j.
void add_fifth_bits(const std::byte* qh_at, std::uint8_t* q) {
  const std::uint32_t qh = load_u32(qh_at);
  for (int j = 0; j < 32; ++j) q[j] |= static_cast<std::uint8_t>(((qh >> j) & 1u) << 4);
}

// Q5_0 block (22 bytes): d (f16), qh (u32), qs[16] (the low nibbles as Q4_0); value (q - 16) d.
void unpack_q5_0(const std::byte* b, std::uint8_t* q, float* scale, float*) {
  float unused;
  unpack_q4_0(b + 4, q, &unused, nullptr);
  scale[0] = f16_at(b);
  add_fifth_bits(b + 2, q);
}

// Q5_1 block (24 bytes): d (f16), m (f16), qh (u32), qs[16]; value d q + m.
void unpack_q5_1(const std::byte* b, std::uint8_t* q, float* scale, float* min) {
  float unused;
  unpack_q4_0(b + 6, q, &unused, nullptr);
  scale[0] = f16_at(b);
  min[0] = f16_at(b + 2);
  add_fifth_bits(b + 4, q);
}

// Q8_0 block (34 bytes): d (f16), qs[32] (int8 n); q = n + 128, value (q - 128) d = n d.
void unpack_q8_0(const std::byte* b, std::uint8_t* q, float* scale, float*) {
  scale[0] = f16_at(b);
  for (int j = 0; j < 32; ++j) q[j] = static_cast<std::uint8_t>(u8_at(b + 2, j) ^ 0x80);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block, packed in 12 bytes:
// bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same
// for the mins; bytes 8-11 the low 4 bits of scale (low nibble) and min (high nibble) 4-7.
void scale_min_k4(int j, const std::byte* q, int& scale, int& min) {
  if (j < 4) {
    scale = u8_at(q, j) & 63;
    min = u8_at(q, j + 4) & 63;
  } else {
    scale = (u8_at(q, j + 4) & 0x0F) | ((u8_at(q, j - 4) >> 6) << 4);
    min = (u8_at(q, j + 4) >> 4) | ((u8_at(q, j) >> 6) << 4);
  }
}

// The sub-block scales and mins of a Q4_K / Q5_K block (d, dmin as f16, then the 12 bytes):
// sub-block j has scale d * scale_j and min -(dmin * min_j), its value (d scale_j) q - dmin min_j.
void unpack_k4_scales(const std::byte* b, float* scale, float* min) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, b + 4, sc, m);
    scale[j] = d * static_cast<float>(sc);
    min[j] = -(dmin * static_cast<float>(m));
  }
}

// Q4_K block (144 bytes): d (f16), dmin (f16), scales[12], qs[128]. Each 64 elements share 32
// bytes of qs: the low nibbles are sub-block 2c, the high nibbles sub-block 2c + 1.
void unpack_q4_k(const std::byte* b, std::uint8_t* q, float* scale, float* min) {
  unpack_k4_scales(b, scale, min);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = u8_at(b + 16, 32 * c + l) & 0x0F;
      q[64 * c + 32 + l] = u8_at(b + 16, 32 * c + l) >> 4;
    }
}

// Q5_K block (176 bytes): d, dmin, scales[12] as Q4_K, qh[32], qs[128] as Q4_K; the fifth bit of
// element l of sub-block s is bit s of qh[l].
void unpack_q5_k(const std::byte* b, std::uint8_t* q, float* scale, float* min) {
  unpack_k4_scales(b, scale, min);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int qs = u8_at(b + 48, 32 * c + l), h = u8_at(b + 16, l);
      q[64 * c + l] = static_cast<std::uint8_t>((qs & 0x0F) | (((h >> (2 * c)) & 1) << 4));
      q[64 * c + 32 + l] = static_cast<std::uint8_t>((qs >> 4) | (((h >> (2 * c + 1)) & 1) << 4));
    }
}

// Q6_K block (210 bytes): ql[128], qh[64], scales[16] (int8), d (f16). Each half of 128 elements
// uses 64 bytes of ql, 32 of qh and 8 scales: element 32s + l of the half (s = 0..3) takes the
// low (s < 2) or high nibble of ql[32 (s % 2) + l] and bits 2s, 2s+1 of qh[l] as its top two
// bits; its sub-block (16 elements) has scale d * scales[(32s + l) / 16]; value (q - 32) scale.
void unpack_q6_k(const std::byte* b, std::uint8_t* q, float* scale, float*) {
  const float d = f16_at(b + 208);
  for (int j = 0; j < 16; ++j)
    scale[j] = d * static_cast<float>(static_cast<std::int8_t>(u8_at(b + 192, j)));
  for (int half = 0; half < 2; ++half) {
    const std::byte* ql = b + 64 * half;
    const std::byte* qh = b + 128 + 32 * half;
    for (int l = 0; l < 32; ++l) {
      const int lo = u8_at(ql, l), hi = u8_at(ql, l + 32), h = u8_at(qh, l);
      std::uint8_t* out = q + 128 * half + l;
      out[0] = static_cast<std::uint8_t>((lo & 0x0F) | ((h & 3) << 4));
      out[32] = static_cast<std::uint8_t>((hi & 0x0F) | (((h >> 2) & 3) << 4));
      out[64] = static_cast<std::uint8_t>((lo >> 4) | (((h >> 4) & 3) << 4));
      out[96] = static_cast<std::uint8_t>((hi >> 4) | (((h >> 6) & 3) << 4));
    }
  }
}

// Q2_K block (84 bytes): scales[16] (sub-block j's scale in the low nibble, its min in the high
// one), qs[128 / 2], d (f16), dmin (f16). Each half of 128 elements uses 32 bytes of qs: element
// 32s + l of the half (s = 0..3) is bits 2s, 2s+1 of qs[l]; its sub-block of 16 is (32s + l) / 16
// of the half. Value (d sc_j) q - (dmin m_j).
void unpack_q2_k(const std::byte* b, std::uint8_t* q, float* scale, float* min) {
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int j = 0; j < 16; ++j) {
    scale[j] = d * static_cast<float>(u8_at(b, j) & 0x0F);
    min[j] = -(dmin * static_cast<float>(u8_at(b, j) >> 4));
  }
  for (int half = 0; half < 2; ++half)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l)
        q[128 * half + 32 * s + l] =
            static_cast<std::uint8_t>((u8_at(b + 16 + 32 * half, l) >> (2 * s)) & 3);
}

// Q3_K block (110 bytes): hmask[32], qs[64], scales[12] (16 6-bit scales, biased by 32), d (f16).
// Element 32s + l of each half of 128 (s = 0..3) takes bits 2s, 2s+1 of qs[32 half + l] and, as
// its third bit, bit 4 half + s of hmask[l]; q = those two bits + 4 x the third, value
// (d (scale_j - 32)) (q - 4) (llama.cpp subtracts 4 where the third bit is clear).
void unpack_q3_k(const std::byte* b, std::uint8_t* q, float* scale, float*) {
  const float d = f16_at(b + 108);
  const std::byte* sc = b + 96;
  for (int j = 0; j < 16; ++j) {  // low 4 bits: bytes 0-7 (nibbles), high 2 bits: bytes 8-11
    const int low = (u8_at(sc, j % 8) >> (4 * (j / 8))) & 0x0F;
    const int high = (u8_at(sc, 8 + j % 4) >> (2 * (j / 4))) & 3;
    scale[j] = d * static_cast<float>((low | (high << 4)) - 32);
  }
  for (int half = 0; half < 2; ++half)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int lo = (u8_at(b + 32 + 32 * half, l) >> (2 * s)) & 3;
        const int hi = (u8_at(b, l) >> (4 * half + s)) & 1;
        q[128 * half + 32 * s + l] = static_cast<std::uint8_t>(lo | (hi << 2));
      }
}

using Unpack = void (*)(const std::byte*, std::uint8_t*, float*, float*);

struct CodesType {
  GgmlType type;
  GgmlCodes codes;
  Unpack unpack;
};

// bits, sub-block, zero, has_min
constexpr CodesType k_codes[] = {
    {GgmlType::Q4_0, {4, 32, 8, false}, unpack_q4_0},
    {GgmlType::Q4_1, {4, 32, 0, true}, unpack_q4_1},
    {GgmlType::Q5_0, {5, 32, 16, false}, unpack_q5_0},
    {GgmlType::Q5_1, {5, 32, 0, true}, unpack_q5_1},
    {GgmlType::Q8_0, {8, 32, 128, false}, unpack_q8_0},
    {GgmlType::Q4_K, {4, 32, 0, true}, unpack_q4_k},
    {GgmlType::Q5_K, {5, 32, 0, true}, unpack_q5_k},
    {GgmlType::Q6_K, {6, 16, 32, false}, unpack_q6_k},
    {GgmlType::Q2_K, {2, 16, 0, true}, unpack_q2_k},
    {GgmlType::Q3_K, {3, 16, 4, false}, unpack_q3_k},
};

const CodesType* find_codes(GgmlType type) {
  for (const CodesType& c : k_codes)
    if (c.type == type) return &c;
  return nullptr;
}

// ---- quantization (ggml's quantize_row_*_ref) ----

// Q8_0: d = max|x| / 127, q = round-half-away(x / d).
void quantize_q8_0(const float* x, std::byte* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, d);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = static_cast<std::byte>(static_cast<std::int8_t>(std::round(x[j] * id)));
}

// Q4_0: d = m / -8 where m is the element of largest magnitude (the first, on ties), q =
// min(15, trunc(x / d + 8.5)).
void quantize_q4_0(const float* x, std::byte* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, d);
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
    b[2 + j] = static_cast<std::byte>(q0 | (q1 << 4));
  }
}

// Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)).
void quantize_q4_1(const float* x, std::byte* b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, d);
  store_f16(b + 2, min);
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
    const int q1 = std::min(15, static_cast<int>((x[j + 16] - min) * id + 0.5f));
    b[4 + j] = static_cast<std::byte>(q0 | (q1 << 4));
  }
}

}  // namespace

const GgmlTypeInfo* find_ggml_type(std::uint32_t number) {
  for (const auto& t : k_types)
    if (static_cast<std::uint32_t>(t.type) == number) return &t;
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  const GgmlTypeInfo* t = find_ggml_type(static_cast<std::uint32_t>(type));
  TESSERA_CHECK(t != nullptr, "unknown GgmlType value {}", static_cast<std::uint32_t>(type));
  return *t;
}

std::string_view ggml_type_name(GgmlType type) {
  return ggml_type_info(type).name;
}

bool can_dequantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
      return true;
    default:
      return false;
  }
}

bool can_quantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return true;
    default:
      return false;
  }
}

std::string_view dequantizable_type_names() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";
}
std::string_view quantizable_type_names() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q8_0";
}

void dequantize_row(GgmlType type, const std::byte* src, float* dst, std::int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  TESSERA_CHECK(n >= 0 && n % info.block_size == 0, "{} elements of {}", n, info.name);
  switch (type) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(src + 2 * i));
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(src + 2 * i));
      return;
    default:
      break;
  }
  const CodesType* c = find_codes(type);
  TESSERA_CHECK(c != nullptr, "dequantize_row called for {}", info.name);
  const int subs = static_cast<int>(info.block_size) / c->codes.sub;
  std::uint8_t q[256];
  float scale[16], min[16];
  for (std::int64_t i = 0; i < n / info.block_size; ++i) {
    c->unpack(src + i * info.block_bytes, q, scale, min);
    float* y = dst + i * info.block_size;
    for (int s = 0; s < subs; ++s)
      for (int j = s * c->codes.sub; j < (s + 1) * c->codes.sub; ++j)
        y[j] = c->codes.has_min ? scale[s] * static_cast<float>(q[j]) + min[s]
                                : scale[s] * static_cast<float>(q[j] - c->codes.zero);
  }
}

const GgmlCodes* ggml_codes(GgmlType type) {
  const CodesType* c = find_codes(type);
  return c ? &c->codes : nullptr;
}

void unpack_codes(GgmlType type, const std::byte* src, std::int64_t n, std::uint8_t* q,
                  float* scale, float* min) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  const CodesType* c = find_codes(type);
  TESSERA_CHECK(c != nullptr, "unpack_codes called for {}", info.name);
  TESSERA_CHECK(n >= 0 && n % info.block_size == 0, "{} elements of {}", n, info.name);
  const std::int64_t subs = info.block_size / c->codes.sub;
  if (!c->codes.has_min) std::fill(min, min + n / c->codes.sub, 0.0f);
  for (std::int64_t i = 0; i < n / info.block_size; ++i)
    c->unpack(src + i * info.block_bytes, q + i * info.block_size, scale + i * subs,
              min + i * subs);
}

void quantize_row(GgmlType type, const float* src, std::byte* dst, std::int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  TESSERA_CHECK(n >= 0 && n % info.block_size == 0, "{} elements of {}", n, info.name);
  const auto blocks = [&](auto fn) {
    for (std::int64_t i = 0; i < n / info.block_size; ++i)
      fn(src + i * info.block_size, dst + i * info.block_bytes);
  };
  switch (type) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q4_0:
      return blocks(quantize_q4_0);
    case GgmlType::Q4_1:
      return blocks(quantize_q4_1);
    case GgmlType::Q8_0:
      return blocks(quantize_q8_0);
    default:
      TESSERA_CHECK(false, "quantize_row called for {}", info.name);
  }
}

// ---- half and bfloat16 ----

float fp16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);  // +-0
    exp = 127 - 15 + 1;                                // subnormal: normalize
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    return std::bit_cast<float>(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

std::uint16_t fp32_to_fp16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u)  // NaN: keep the top payload bits, make it quiet
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return sign | 0x7c00u;   // >= 65520 rounds to infinity (and infinity)
  if (a >= 0x38800000u) {                        // normal half (>= 2^-14)
    std::uint32_t h = (a >> 13) - (112u << 10);  // rebias the exponent 127 -> 15
    const std::uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<std::uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 itself ties to even 0)
  // Subnormal half: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - e;  // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (q & 1u))) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

float bf16_to_fp32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

std::uint16_t fp32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 64u);
  return static_cast<std::uint16_t>((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

}  // namespace tessera::io
