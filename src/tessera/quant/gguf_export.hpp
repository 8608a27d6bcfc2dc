// A tessera-quantized model written as one llama.cpp GGUF file (Q4_0, Q4_1 or Q8_0 matrices), its
// block linears carried onto GGUF's grid where the grid holds them:
//   Q4_0  w = d (n - 8), n in 0..15 per 32-block: symmetric codes of up to 4 bits (n = q - zero
//         + 8), d = the group's fp16 scale: the same values.
//   Q4_1  w = d n + m: codes of up to 4 bits, symmetric or not, or min_offset's real zero points
//         (n = q, d = the scale, m = -d zero rounded to fp16: the only change).
//   Q8_0  w = d n, n int8: symmetric codes of up to 8 bits (n = q - zero).
// A linear the grid cannot hold (act-order columns, AWQ input scales that no file field carries,
// an asymmetric grid in Q8_0 or Q4_0, more than 4 bits in a 4-bit type, a format the packed form
// refuses) is quantized again from its dequantized weights with llama.cpp's own rounding, and the
// report says which and what it costs. The embedding and head: quantize_row of their fp32
// weights (Q8_0 in 4-bit files), as `tessera convert` writes them.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tessera/data/bpe.hpp"
#include "tessera/io/gguf_quants.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::quant {

struct GgufExportReport {
  int linears = 0, exact = 0;       // exact: the codes carried over (scales as fp16)
  std::vector<std::string> redone;  // "layer 3 mlp.c_fc: act-order columns": quantized again
  // The file's linears dequantized (as llama.cpp and gguf-py decode them) against tessera's
  // dequantized weights: largest |difference| and RMS difference / RMS weight.
  double max_abs_diff = 0, rel_rms_diff = 0;
  double bits_per_weight = 0;  // of the linears in the file (blocks' bytes x 8 / weights)
  std::string summary() const;
};

// Writes `any` (a quantized file, load_any_model) to `out` with its linears as `type` (Q4_0,
// Q4_1 or Q8_0) and the quantization's description in tessera.quantization.* metadata.
// Throws tessera::Error for a model that also quantizes activations (GGUF stores weights only)
// or another type.
GgufExportReport save_quantized_gguf(const std::filesystem::path& out, const AnyModel& any,
                                     io::GgmlType type, const data::BpeVocab* vocab);

}  // namespace tessera::quant
