// A weight-only quantized model for decoding from its packed form: the block linears packed
// (packed.hpp) and computed by the packed matrix-vector kernels inside model::Decoder, with int8
// activations by default; the token embedding and the head too when the file quantized them
// (quantize --vocab-bits 8). The norms and biases, and unquantized embeddings and heads, stay the
// loaded file's fp32 parameters.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/eval/perplexity.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/quant/packed.hpp"
#include "tessera/quant/quantize.hpp"

namespace tessera::quant {

struct PackedModel {
  model::ModelConfig config;
  std::vector<PackedLinear> linears;  // (n_layer * 4), layer-major, in Lin order
  // The quantized (vocab_size, C) token embedding and an untied head; rows == 0 where the file
  // keeps them fp32.
  PackedLinear embed, head;
  Isa isa = Isa::Portable;
  // Decode with packed_matvec_q8 (int8 activations, integer dot products; the default, as
  // llama.cpp does) or packed_matvec (fp32 activations: the dequantized-fp32 path up to
  // summation order).
  bool int8_activations = true;
  // How the block linears' inputs are scaled to int8: per block of 32 (weight-only files), or
  // per token for the files that quantize activations per token (W8A8, SmoothQuant): then the
  // packed decoder computes the model those files define (int8_activations must stay true). The
  // embedding and head are weight-only either way.
  ActScale act_scale = ActScale::PerBlock;

  std::int64_t bytes() const;      // of the packed block linears
  double bits_per_weight() const;  // over the packed block linears
  std::int64_t vocab_bytes() const;
  // The packed matrix the LM head reads: the embedding for a tied model, else the head; null
  // when the head is fp32.
  const PackedLinear* head_matrix() const;  // of the packed embedding and head (0 when fp32)
  // The decoder's kernels from the packed weights (model::Decoder). Reads *this, which must
  // outlive them.
  model::DecoderKernels decoder_kernels() const;
  // Logits of whole windows (eval, the studies) from the packed weights: every linear and the
  // head through packed_matmul (fp32 activations: the dequantized model up to summation order;
  // a per-token W8A8 file's inputs rounded as its simulation rounds them, act); the token
  // embedding's rows from the packed one where it is packed. Reads *this and params (the fp32
  // embeddings, norms, biases), which must outlive it.
  eval::LogitsFn logits_fn(const model::ParamLayout& layout, const float* params,
                           ActQuant act) const;
  // Writes every packed matrix's dequantized weight (with the packed, rounded scales) into
  // params: the fp32 model that the packed one computes with fp32 activations, up to
  // summation order.
  void dequantize_into(const model::ParamLayout& layout, float* params) const;
  // Gives the memory pages of params that hold only packed weights (the block linears', and the
  // embedding's and head's when packed) back to the system (they read as zeros afterwards;
  // decoding with decoder_kernels() never reads them), so a sampled model holds them packed
  // only. Returns the bytes released.
  std::int64_t release_packed_weights(const model::ParamLayout& layout, float* params) const;
};

// Packs the linears of a loaded quantized file. Throws tessera::Error for a model that is not a
// quantized file, for files whose activation quantization the decoder cannot reproduce one token
// at a time (per tensor: one scale over a whole sequence; LLM.int8(): outlier columns chosen over
// it) and for formats that pack() refuses.
PackedModel pack_model(const AnyModel& any, ScaleType scale_type = ScaleType::F16,
                       Isa isa = best_isa());
// The same for a model quantized in memory (the studies), under the same refusals.
PackedModel pack_model(const QuantizedModel& qm, ScaleType scale_type = ScaleType::F16,
                       Isa isa = best_isa());
// Loads a model file as load_any_model does, without the dequantized weights, and packs a
// quantized file's matrices as it reads them (each one's unpacked codes freed before the next is
// read), so that the unpacked model is never resident at once. `packed` is left empty (no
// linears) for a file that is not quantized, and for a quantized one that the packed kernels do
// not take (its activation quantization or a matrix's format), which `why_not` then explains:
// its matrices are not kept, so load it again with load_any_model to compute from them. Throws
// what load_any_model throws. The returned AnyModel's linears and vocab are empty.
AnyModel load_packed_model(const std::filesystem::path& path, PackedModel& packed,
                           std::string& why_not, ScaleType scale_type = ScaleType::F16,
                           Isa isa = best_isa());
// load_packed_model, and where the packed kernels do not take the quantized file, load_any_model
// (its dequantized weights) with `note` saying why; note is empty otherwise. What `tessera
// sample` and `eval` load with their packed kernels.
AnyModel load_packed_or_dequantized(const std::filesystem::path& path, PackedModel& packed,
                                    std::string& note);
// Whether the packed kernels reproduce this activation quantization: none, or per token (one
// scale per token, which a token alone determines).
bool packable(const ActQuant& act);

}  // namespace tessera::quant
