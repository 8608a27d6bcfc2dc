// Parameter layout: every parameter is a slice of ONE contiguous buffer, carved by offsets.
// The same layout serves gradients and AdamW moments. Layers are contiguous
// ([wte, wpe, layer 0, ..., layer L-1, ln_f, (lm_head)]) so that a layer can later be sharded,
// gathered or sent as one range (ZeRO-3, pipeline stages). Matrices are stored (out, in) as the
// GEMMs consume them; Hugging Face GPT-2 files store Conv1D weights (in, out), so io/ transposes at
// the boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/model/config.hpp"

namespace tessera::model {

// The offset of a tensor the family does not have (gpt2's biases and positions for llama).
inline constexpr std::size_t k_absent = static_cast<std::size_t>(-1);

struct ParamTensor {
  // The Hugging Face name: GPT2LMHeadModel's ("h.3.attn.c_attn.weight") or LlamaForCausalLM's
  // ("model.layers.3.self_attn.q_proj.weight").
  std::string name;
  std::vector<std::int64_t> shape;  // shape as tessera stores it
  std::size_t offset = 0;           // into the flat buffer (elements)
  std::size_t numel = 0;
  bool decay = false;             // weight decay applies (2-D weights only)
  bool transposed_in_hf = false;  // HF Conv1D: stored (in, out) in HF files
  int layer = -1;                 // -1 for embeddings and the final LayerNorm
  // A (padded vocabulary, C) matrix (the token embedding, an untied head): files hold only its
  // first vocab_size rows.
  bool vocab_rows = false;
};

// A layer's tensors; k_absent where the family has none (llama: every bias). llama's q, k and v
// projections are three tensors that lie back to back from qkv_w, read as one (qkv_rows, C)
// matrix; likewise gate and up from fc_w, one (2 ffn, C) matrix.
struct LayerOffsets {
  std::size_t ln1_w, ln1_b;          // (C)
  std::size_t qkv_w, qkv_b;          // (qkv_rows, C), (qkv_rows)
  std::size_t attproj_w, attproj_b;  // (C, C), (C)
  std::size_t ln2_w, ln2_b;          // (C)
  std::size_t fc_w, fc_b;            // (fc_rows, C), (fc_rows)
  std::size_t fcproj_w, fcproj_b;    // (C, ffn), (C)
  std::size_t begin, end;            // the layer's range in the flat buffer
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& cfg);
  // The layout of one rank's slice of the model (tensor parallelism): the same tensors, names,
  // order, blocks and alignment, each holding local_numel(global tensor) elements as a 1-D shape.
  // Buffers, ZeRO sharding and AdamW then work on it as on a whole model.
  using LocalNumel = std::function<std::size_t(const ParamTensor& global)>;
  ParamLayout(const ModelConfig& cfg, const LocalNumel& local_numel);
  bool is_local() const { return local_; }

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor* find(const std::string& name) const;
  std::size_t total() const { return total_; }
  // Parameters that count for FLOPs/size reporting: excludes the vocabulary padding rows.
  std::size_t count_unpadded() const;

  std::size_t wte = 0;  // (Vp, C)
  std::size_t wpe = 0;  // (block_size, C); k_absent for llama
  std::vector<LayerOffsets> layers;
  std::size_t lnf_w = 0, lnf_b = 0;  // (C); lnf_b k_absent for llama
  // The LM head (Vp, C): wte when tied, else its own tensor after the final norm (same block).
  std::size_t head = 0;

 private:
  template <class Add>
  void add_llama(const ModelConfig& cfg, Add& add);

  ModelConfig cfg_;
  bool local_ = false;
  std::vector<ParamTensor> tensors_;
  std::size_t total_ = 0;
};

// A layer's four block linears by number, as the decoder and the quantizers number them (0 qkv,
// 1 attention projection, 2 fc: gate and up for llama, 3 fc projection): each one's weight is
// (rows, cols), out features by in features, from block_linear_weight.
struct LinearShape {
  int rows, cols;
};
LinearShape block_linear_shape(const ModelConfig& cfg, int which);
std::size_t block_linear_weight(const ParamLayout& layout, int layer, int which);

}  // namespace tessera::model
