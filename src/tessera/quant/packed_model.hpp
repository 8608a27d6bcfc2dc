// A weight-only quantized model for decoding from its packed linears: the block linears packed
// (packed.hpp) and computed by the packed matrix-vector kernel inside model::Decoder; the
// embeddings, norms, biases and head stay the loaded file's fp32 parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/model/gpt.hpp"
#include "tessera/quant/packed.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::quant {

struct PackedModel {
  model::ModelConfig config;
  std::vector<PackedLinear> linears;  // (n_layer * 4), layer-major, in Lin order
  Isa isa = Isa::Portable;

  std::int64_t bytes() const;      // of the packed linears
  double bits_per_weight() const;  // over the packed linears
  // The decoder's block linears from the packed weights (model::Decoder's `linear`). Reads
  // *this, which must outlive it.
  model::DecoderLinear decoder_linear() const;
  // Writes every linear's dequantized weight (with the packed, rounded scales) into params:
  // the fp32 model that the packed one computes, up to summation order.
  void dequantize_into(const model::ParamLayout& layout, float* params) const;
  // Gives the memory pages of params that hold only block-linear weights back to the system
  // (they read as zeros afterwards; decoding with decoder_linear() never reads them), so a
  // sampled model holds its linears packed only. Returns the bytes released.
  std::int64_t release_linear_weights(const model::ParamLayout& layout, float* params) const;
};

// Packs the linears of a loaded quantized file. Throws tessera::Error for a model that is not a
// quantized file, for files that also quantize activations (W8A8 methods) and for formats that
// pack() refuses.
PackedModel pack_model(const AnyModel& any, ScaleType scale_type = ScaleType::F16,
                       Isa isa = best_isa());

}  // namespace tessera::quant
