// llama.cpp's quantized matrices read as tessera's quantized linears, so that a GGUF file decodes
// from its own blocks through the packed kernels (quant/packed.hpp) instead of from fp32 copies.
// Each block's sub-blocks map onto groups of 32 (Q2_K, Q3_K, Q6_K: 16; io::unpack_codes gives
// the codes):
//   Q4_0, Q5_0  w = d (q - 8), d (q - 16):  4- and 5-bit codes, scale d, symmetric.
//   Q8_0        w = d n:                     8-bit codes n + 128, scale d, symmetric (zero 128).
//   Q4_1, Q5_1  w = d q + m:                 codes q, scale d, real zero point -m / d (the
//                                            min_offset grid); exact up to fp32 roundings.
//   Q2_K, Q4_K, w = (d sc_j) q - dmin m_j:   the same, with the scale d sc_j (up to 17
//   Q5_K                                     significant bits) rounded to the packed form's fp16
//                                            (the zero point follows it, so q = 0 stays exact):
//                                            within 2^-11 |d sc_j| q of the file's value.
//   Q3_K, Q6_K  w = (d sc_j) (q - 4 | 32):   3- and 6-bit codes, groups of 16, symmetric, the
//                                            scale (up to 18 significant bits) rounded to fp16:
//                                            within 2^-11 |d sc_j| |q - zero| of the file's value.
// A group whose scale is 0 in fp16 (every value its min) is codes 0, scale 1, zero -min.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

#include "tessera/io/gguf.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::quant {

// The types read this way.
bool gguf_packable_type(io::GgmlType type);

// `rows` rows of `cols` values stored as `type` blocks (gguf_packable_type), as a quantized
// linear with groups of 32. Throws tessera::Error if the sizes disagree or a scale is not finite
// in fp16.
QuantizedLinear quantized_from_ggml(io::GgmlType type, std::span<const std::byte> blocks, int rows,
                                    int cols);

// A llama or gpt2 GGUF file whose block linears are all of those types (a linear's parts, q k v
// or gate up, may differ, as llama.cpp's Q4_K_M files mix Q5_0 and Q8_0: they are then joined on
// the widest codes, with real zero points where any part has them): hands each linear to
// sink.linear, and the token embedding (and an untied llama head) to sink.vocab where it is of
// those types too; out.model then holds the other tensors in fp32 (the handed ones stay zero
// pages), out.quantized is set and out.description names the types and what was rounded.
// Returns false, with `why` saying which tensor has which type, and out untouched, for any other
// file. Throws what io::load_gguf_model and quantized_from_ggml throw.
bool read_gguf_quantized(const io::GgufFile& f, const QuantizedSink& sink, AnyModel& out,
                         std::string& why);

}  // namespace tessera::quant
