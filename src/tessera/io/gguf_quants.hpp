// ggml's tensor types, as GGUF files store them: the type numbers, the block sizes, and the block
// formats tessera decodes to fp32 (dequantize_row) and encodes from fp32 (quantize_row).
//
// A ggml tensor is a sequence of blocks; a block holds `block_size` elements in `block_bytes`
// bytes (F32: 1 element in 4 bytes; Q4_0: 32 elements in 18 bytes). Rows never share a block:
// the row length (ggml's ne[0]) is a multiple of the block size. The formulas are those of
// ggml's reference code (dequantize_row_* and quantize_row_*_ref) and of gguf-py's numpy port
// (gguf/quants.py), evaluated in the same order in fp32 without fused multiply-adds, so that
// tessera's results equal gguf-py's bit for bit (tests/unit/test_gguf.cpp checks every type
// against values gguf-py computed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::io {

// The numbers are those of the file format (ggml's enum ggml_type); numbers missing here were
// removed from ggml and appear in no current file.
enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;    // "Q4_K", as ggml and gguf-py spell it
  std::int64_t block_size;  // elements per block
  std::int64_t block_bytes;
};

// nullptr when `number` is no ggml type tessera knows.
const GgmlTypeInfo* find_ggml_type(std::uint32_t number);
const GgmlTypeInfo& ggml_type_info(GgmlType type);
std::string_view ggml_type_name(GgmlType type);

// Types dequantize_row decodes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K.
bool can_dequantize(GgmlType type);
// Types quantize_row encodes: F32, F16, BF16, Q4_0, Q4_1, Q8_0.
bool can_quantize(GgmlType type);
// "F32, F16, ..." for messages.
std::string_view dequantizable_type_names();
std::string_view quantizable_type_names();

// Decodes n elements (a multiple of the type's block size) from n / block_size blocks at `src`
// (any alignment) into dst[0, n). The type must be one can_dequantize accepts.
void dequantize_row(GgmlType type, const std::byte* src, float* dst, std::int64_t n);

// A block type's elements as unsigned codes: those of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (q = n + 128),
// Q2_K, Q3_K, Q4_K, Q5_K and Q6_K. Each sub-block of `sub` elements has a scale and, where has_min,
// a min (the K-quants' d * scale_j and -(dmin * min_j), exact in fp32); dequantize_row's value of
// element q of sub-block s is scale[s] * (q - zero), or scale[s] * q + min[s] where has_min,
// each rounded once (the same bits).
struct GgmlCodes {
  int bits;  // codes below 2^bits
  int sub;   // elements per sub-block: 32 (Q2_K, Q3_K, Q6_K: 16)
  int zero;  // the code of 0 (0 where has_min)
  bool has_min;
};
// nullptr for a type unpack_codes does not take.
const GgmlCodes* ggml_codes(GgmlType type);
// Unpacks n elements (a multiple of the block size) from n / block_size blocks at `src`: q (n),
// scale and min (n / sub each; min all 0 where !has_min). The type must be one ggml_codes knows.
void unpack_codes(GgmlType type, const std::byte* src, std::int64_t n, std::uint8_t* q,
                  float* scale, float* min);

// Encodes src[0, n) (n a multiple of the block size) into n / block_size blocks at `dst`, with the
// rounding of ggml's quantize_row_*_ref (= gguf-py's gguf.quants.quantize). The type must be one
// can_quantize accepts. Inputs are expected finite (a NaN makes a garbage block, as in ggml).
void quantize_row(GgmlType type, const float* src, std::byte* dst, std::int64_t n);

// IEEE half <-> float. fp32_to_fp16 rounds to nearest, ties to even (like numpy's
// astype(float16) and ggml's GGML_FP32_TO_FP16); values of magnitude >= 65520 become infinity,
// NaN stays NaN (quiet).
float fp16_to_fp32(std::uint16_t h);
std::uint16_t fp32_to_fp16(float f);
// bfloat16 <-> float. fp32_to_bf16 is ggml's ggml_compute_fp32_to_bf16: round to nearest even,
// NaN made quiet.
float bf16_to_fp32(std::uint16_t h);
std::uint16_t fp32_to_bf16(float f);

}  // namespace tessera::io
