// GPT-2 architecture hyperparameters.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::model {

inline constexpr int k_vocab_pad_multiple = 128;

struct ModelConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 256;
  int block_size = 128;    // max sequence length (rows of the position embedding)
  int vocab_size = 50257;  // real vocabulary; the embedding is padded to padded_vocab()

  int head_dim() const { return n_embd / n_head; }
  int padded_vocab() const {
    return (vocab_size + k_vocab_pad_multiple - 1) / k_vocab_pad_multiple * k_vocab_pad_multiple;
  }
  bool operator==(const ModelConfig&) const = default;
};

// Throws tessera::Error when the shape is not a valid GPT (positive sizes, heads divide width).
void validate(const ModelConfig& cfg);

// FLOPs of one forward pass over T tokens of context, per token (matmuls + attention scores and
// values, full T x T counted as the GPU kernels compute it). Training (fwd + bwd) is 3x this.
double forward_flops_per_token(const ModelConfig& cfg, int T);

std::string describe(const ModelConfig& cfg);  // "L=4 H=4 C=256 T=128 V=50257 (16.1M params)"

}  // namespace tessera::model
