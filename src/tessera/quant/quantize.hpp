// Model-level quantization: RTN, GPTQ (sequential, block by block), AWQ, SmoothQuant W8A8,
// naive W8A8 and LLM.int8() over a GPT-2 model; the quantized model file (safetensors with
// integer codes and quantization metadata) and a loader that any command can use.
//
// Quantized: the four linears of every block. Not quantized (as in the GPTQ/AWQ references):
// embeddings, the tied LM head, LayerNorms and biases.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/quant/calibration.hpp"
#include "tessera/quant/quantizer.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

enum class Method { Rtn, Gptq, Awq, SmoothQuant, W8A8, Int8 };
Method parse_method(const std::string& s);  // rtn gptq awq smoothquant w8a8 llm-int8
const char* method_name(Method m);
bool needs_calibration(Method m);  // all but rtn, w8a8 and llm-int8

struct QuantizeOptions {
  Method method = Method::Rtn;
  WeightQuant wq;  // weight-only methods (rtn, gptq, awq); W8A8 methods use INT8 per channel
  // GPTQ
  double damp = 0.01;
  int blocksize = 128;
  bool act_order = false;
  bool static_groups = false;
  // All calibration samples through each block in one call, each linear quantized inside it (one
  // block forward per layer) when their activations fit 1 GiB; false: the micro-batched passes.
  bool gptq_one_pass = true;
  // AWQ
  int awq_grid = 20;
  bool awq_clip = true;
  // SmoothQuant / W8A8 / LLM.int8()
  float alpha = 0.5f;
  ActMode act = ActMode::PerToken;  // smoothquant, w8a8
  float int8_threshold = 6.0f;
  int micro_batch = 8;
  bool verbose = false;
  // The token embedding and an untied LM head: 0 keeps them fp32 (the methods' references
  // quantize the block linears only); 8 rounds them to 8 bits per row (RTN, symmetric), which
  // the packed decoder reads as such (a tied head is the embedding, quantized once).
  int vocab_bits = 0;
};

struct QLinear {
  std::string name;  // "h.3.mlp.c_fc"
  int layer = 0;
  Lin kind = Lin::Qkv;
  QuantizedLinear q;
  // The linear's input was divided by in_fold (scales folded into the previous op) and its output
  // multiplied by 1/out_fold (v rows of c_attn scaled for AWQ): the effective weight in the
  // original model's coordinates is deq(q)[r, c] * out_fold[r] / in_fold[c]. Empty = ones.
  std::vector<float> in_fold, out_fold;
  double gptq_loss = 0, damp = 0;
  float alpha = 0;  // AWQ's chosen grid point
};

struct QuantizedModel {
  model::ModelConfig config;
  Buffer<float> params;  // fp32, dequantized linears, folded LayerNorms: ready for the forward
  std::vector<QLinear> linears;
  // The quantized (vocab_size, C) matrices when vocab_bits: name = the tensor's name without
  // ".weight", layer -1; their dequantized values are in params.
  std::vector<QLinear> vocab;
  ActQuant act;
  std::string method;
  std::map<std::string, std::string> info;  // calibration, options (written as metadata)
  // The effective weight (rows, cols) of linear i in the original model's coordinates.
  std::vector<float> effective_weight(std::size_t i) const;
};

QuantizedModel quantize_model(const model::ParamLayout& layout, const float* params,
                              const QuantizeOptions& opt, const CalibSet* calib);

// Files: DIR/model.safetensors (+ config.json).
void save_quantized(const std::filesystem::path& dir, const QuantizedModel& qm);

// Loads a tessera quantized file, a tessera checkpoint or a Hugging Face GPT-2 model (`path` as
// io::load_model takes it). For a quantized file the parameters are the dequantized weights and
// `act` the activation quantization to simulate.
struct AnyModel {
  io::LoadedModel model;
  ActQuant act;
  bool quantized = false;
  std::string description;  // "gptq W4 g128 asym" or "fp32"
  std::map<std::string, std::string> info;
  // Quantized files: the block linears as stored ((n_layer * 4), layer-major, in Lin order);
  // their dequantized weights are also in model.params.
  std::vector<QuantizedLinear> linears;
  // Quantized files with quantized vocabulary matrices: each one's offset in model.params (the
  // layout's wte, or head when untied) and its codes (vocab_size rows).
  struct VocabMatrix {
    std::size_t offset = 0;
    QuantizedLinear q;
  };
  std::vector<VocabMatrix> vocab;
};
// Where load_any_model hands a quantized file's matrices as it reads them, in place of keeping
// them in AnyModel::linears and ::vocab, so that a caller converting them (the packed loader)
// never holds the whole model's unpacked codes at once: linear(i, q) for block linear i
// (layer-major, in Lin order), vocab(offset, q) for the quantized embedding or head at that
// offset of the parameters.
struct QuantizedSink {
  std::function<void(std::size_t, QuantizedLinear&&)> linear;
  std::function<void(std::size_t, QuantizedLinear&&)> vocab;
};
// dequantize false: a quantized file's block linears (and quantized embedding and head) stay
// zero in model.params, their memory never touched, for callers that compute from the packed
// form (tessera sample); dequantize_weights fills them in later if needed (not after a sink
// took them).
AnyModel load_any_model(const std::filesystem::path& path, bool dequantize = true,
                        const QuantizedSink* sink = nullptr);
// Writes a loaded quantized file's dequantized matrices into its parameters.
void dequantize_weights(AnyModel& any);

// ||W X - W' X||^2 / ||W X||^2 on the calibration inputs of the unquantized model (rows of S =
// X^T X / N) for every quantized linear, in qm.linears order.
std::vector<double> relative_reconstruction_error(const model::ParamLayout& layout,
                                                  const float* params, const QuantizedModel& qm,
                                                  const Capture& fp_capture);

}  // namespace tessera::quant
