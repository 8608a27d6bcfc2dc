// llama.cpp's quantized matrices read as tessera's quantized linears, so that a GGUF file decodes
// from its own blocks through the packed kernels (quant/packed.hpp) instead of from fp32 copies.
// Each 32-value block maps onto a group of 32 exactly:
//   Q4_0  w = d (n - 8):  4-bit codes n, scale d, symmetric (zero 8).
//   Q8_0  w = d n:        8-bit codes n + 128, scale d, symmetric (zero 128).
//   Q4_1  w = d n + m:    4-bit codes n, scale d, real zero point -m / d (the min_offset grid);
//                         a block with d = 0 (all its values m) as codes 0, scale m, zero -1.
// The scales are fp16 in the file and stay so when packed; a Q4_1 value is then d n + m up to
// the fp32 rounding of d (n + m / d), a few units in the last place of m.
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
// linear with groups of 32. Throws tessera::Error if the sizes disagree.
QuantizedLinear quantized_from_ggml(io::GgmlType type, std::span<const std::byte> blocks, int rows,
                                    int cols);

// A llama or gpt2 GGUF file whose block linears are all Q4_0, Q4_1 or Q8_0 (each linear's parts,
// q k v or gate up, of one type): hands each linear to sink.linear, and the token embedding (and
// an untied llama head) to sink.vocab where it is of those types too; out.model then holds the
// other tensors in fp32 (the handed ones stay zero pages), out.quantized is set and
// out.description names the types. Returns false, with `why` saying which tensor has which
// type, and out untouched, for any other file. Throws what io::load_gguf_model throws.
bool read_gguf_quantized(const io::GgufFile& f, const QuantizedSink& sink, AnyModel& out,
                         std::string& why);

}  // namespace tessera::quant
