// Parameter layout: every parameter is a slice of ONE contiguous buffer, carved by offsets.
// The same layout serves gradients and AdamW moments. Layers are contiguous
// ([wte, wpe, layer 0, ..., layer L-1, ln_f]) so that a layer can later be sharded, gathered or
// sent as one range (ZeRO-3, pipeline stages).
// Matrices are stored (out, in) as the GEMMs consume them; Hugging Face GPT-2 files store
// Conv1D weights (in, out), so io/ transposes at the boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/model/config.hpp"

namespace tessera::model {

struct ParamTensor {
  std::string name;                 // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  // shape as tessera stores it
  std::size_t offset = 0;           // into the flat buffer (elements)
  std::size_t numel = 0;
  bool decay = false;             // weight decay applies (2-D weights only)
  bool transposed_in_hf = false;  // HF Conv1D: stored (in, out) in HF files
  int layer = -1;                 // -1 for embeddings and the final LayerNorm
};

struct LayerOffsets {
  std::size_t ln1_w, ln1_b;          // (C)
  std::size_t qkv_w, qkv_b;          // (3C, C), (3C)
  std::size_t attproj_w, attproj_b;  // (C, C), (C)
  std::size_t ln2_w, ln2_b;          // (C)
  std::size_t fc_w, fc_b;            // (4C, C), (4C)
  std::size_t fcproj_w, fcproj_b;    // (C, 4C), (C)
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
  std::size_t wpe = 0;  // (block_size, C)
  std::vector<LayerOffsets> layers;
  std::size_t lnf_w = 0, lnf_b = 0;  // (C)

 private:
  ModelConfig cfg_;
  bool local_ = false;
  std::vector<ParamTensor> tensors_;
  std::size_t total_ = 0;
};

}  // namespace tessera::model
